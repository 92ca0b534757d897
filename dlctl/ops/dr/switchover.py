"""``switchover``: planned, RPO 0. A's logs freeze (read-only, owners released or fenced), the
stream A -> B drains, B is promoted, B -> A starts at B's end (no copy), A -> B is retired, and
both sides are compared: 0 records lost, none twice. Re-running after a failure continues."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ...errors import RefusedError, TimeoutExpired
from ...meta.access import AccessMode
from ...plan import Plan, Step, apply
from ...replication.records import StreamConfig, StreamState, default_stream_id
from ...replication.store import StreamStore
from ...session import ClusterSession
from .. import replication as repl
from .. import streams as stream_ops
from .decide import STANDBY_STATES, copy_report, only_one_way_source, reverse_exists, still_behind, stream_into, switchover_start
from .facts import read_checkpoints, read_ends, read_identities, read_progress, read_status, read_streams
from .fencing import freeze_logs, promote_logs


def switchover_plan(source: ClusterSession, sink: ClusterSession, *, drain_timeout: float = 300.0, wait_workers: float = 30.0, verify: bool = True) -> Plan:
    unreadable: dict[str, str] = {}  # stream records that cannot be read: named if no stream is found
    config = stream_into(sink.cluster.name, read_streams(sink, unreadable), source.cluster.name, STANDBY_STATES, unreadable).config
    stream_id, src, snk = config.stream_id, config.source_cluster, sink.cluster.name
    names = list(config.logs)
    started = time.monotonic()
    timings: dict[str, float] = {}  # when the promotion happened, for the verify step's report

    def promote() -> dict[str, Any]:
        out = promote_logs(sink, names, reason=f"switchover from {src}")
        timings["promoted"] = time.monotonic() - started
        return {"promoted": out, "promoted_after_seconds": round(timings["promoted"], 3)}

    def check() -> dict[str, Any]:
        out = verify_copy(source, sink, names)
        out["promoted_after_seconds"] = round(timings.get("promoted", 0.0), 3)
        return out

    where_src, where_snk = f"{src}/{','.join(names)}", f"{snk}/{','.join(names)}"
    steps = [
        Step("freeze-source", where_src, f"make {src}'s logs read-only and take them from their writers (agents release them; others are fenced)",
             run=lambda: freeze_logs(source, names, mode=AccessMode.READ_ONLY, reason=f"switchover to {snk}")),
        Step("drain", f"{snk}/{stream_id}", f"wait until {snk} has applied everything {src} holds (timeout {drain_timeout:g}s)", run=lambda: _drain(source, sink, stream_id, drain_timeout)),
        Step("stop-stream", f"{snk}/{stream_id}", f"pause {stream_id}, wait for its workers to stop, check nothing is left behind", run=lambda: _stop(source, sink, config, wait_workers)),
        Step("promote", where_snk, f"promote {snk}'s logs to read-write: applications write at {snk}", run=promote),
        Step("reverse", f"{src}/{default_stream_id(snk, src)}", f"start {snk} -> {src} at {snk}'s current end (no copy); {src}'s logs become its replicas", run=lambda: _reverse(source, sink, config)),
        Step("retire", f"{snk}/{stream_id}", f"delete {stream_id} (its pins at {src} and its state at {snk})", run=lambda: _retire(source, sink, stream_id, wait_workers)),
    ]
    if verify:
        steps.append(Step("verify", where_snk, f"compare {src}'s and {snk}'s records: 0 lost, no duplicate", run=check))
    notes = [f"RPO 0: {src} stops taking writes at the first step; producers there get a read-only error and must move to {snk}"]
    return Plan.of(f"switchover {src} -> {snk}", steps, notes)


def one_way_source(sink: ClusterSession) -> str:
    """The source of the one running or paused one-way stream into ``sink`` (``UsageError``
    unless there is exactly one)."""
    return only_one_way_source(sink.cluster.name, read_streams(sink))


def verify_copy(source: ClusterSession, sink: ClusterSession, names: Iterable[str]) -> dict[str, Any]:
    """Every record of the source's logs is in the sink's, none twice (``RefusedError`` else)."""
    identities = {name: (read_identities(source, name), read_identities(sink, name)) for name in names}
    return copy_report(source.cluster.name, sink.cluster.name, identities)


def _drain(source: ClusterSession, sink: ClusterSession, stream_id: str, timeout: float) -> dict[str, Any]:
    # A paused stream must run to drain.
    streams = StreamStore(sink.meta)
    current = streams.get_state(stream_id)
    if current.value.state is StreamState.PAUSED:
        streams.set_state(stream_id, current, StreamState.RUNNING, reason="switchover drain")
    return stream_ops.wait_drain(sink, source, stream_id, timeout=timeout)


def _stop(source: ClusterSession, sink: ClusterSession, config: StreamConfig, wait_workers: float) -> dict[str, Any]:
    streams, stream_id = StreamStore(sink.meta), config.stream_id
    current = streams.get_state(stream_id)
    if current.value.state is StreamState.RUNNING:
        streams.set_state(stream_id, current, StreamState.PAUSED, reason=f"switchover to {sink.cluster.name}")
    if not streams.wait_released(stream_id, wait_workers):
        raise TimeoutExpired(f"the workers of {stream_id} did not stop within {wait_workers:g}s", hint="re-run the switchover: it continues")
    ends = read_ends(source, config.logs)
    behind = still_behind(read_checkpoints(sink, stream_id, config.logs), ends)
    if behind:
        streams.set_state(stream_id, streams.get_state(stream_id), StreamState.RUNNING, reason="switchover: drain again")
        raise RefusedError(f"{sink.cluster.name} is still behind {config.source_cluster}: {behind}", hint="re-run the switchover: it drains again")
    return {"stopped": True, "source_ends": {n: str(e) if e else None for n, e in ends.items()}}


def _reverse(source: ClusterSession, sink: ClusterSession, config: StreamConfig) -> dict[str, Any]:
    src, snk = config.source_cluster, sink.cluster.name
    starts = {name: switchover_start(read_progress(sink, config, name)) for name in config.logs}
    stream_back = default_stream_id(snk, src)
    if reverse_exists(read_status(source, stream_back)):
        return {"stream": stream_back, "existed": True}
    apply(Plan.of("reverse", repl.register_at_steps(sink, source, starts, pin_max_age=config.pin_max_age_seconds, compression=config.compression, why=f"switchover from {src}")))
    return {"stream": stream_back, "starts": {n: str(p) for n, (p, _) in starts.items()}}


def _retire(source: ClusterSession, sink: ClusterSession, stream_id: str, wait_workers: float) -> dict[str, Any]:
    apply(stream_ops.delete_plan(sink, source, stream_id, wait_workers=wait_workers))
    return {"deleted": stream_id}


__all__ = ["one_way_source", "switchover_plan", "verify_copy"]
