"""Replication streams between clusters, once set up (DESIGN.md §7): list and inspect them
(lag, positions, workers, what needs a bootstrap), check them against limits, pause, resume and
delete them, and wait for one to drain. Setting one up is ``dlctl.ops.replication``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import (
    NotFoundError,
    RefusedError,
    TimeoutExpired,
    UsageError,
)
from ..log.dlsn import DLSN
from ..meta.pins import PinRecord, PinStore
from ..meta.zk import UNREADABLE, why_unreadable
from ..plan import Plan, Step
from ..replication import positions
from ..replication.causal import describe_missing
from ..replication.history import NetworkEvent
from ..replication.records import (
    Checkpoint,
    StreamState,
    lag_seconds,
)
from ..replication.safetime import stream_safe_time
from ..replication.store import StreamStore
from . import network_rules as rules
from ..session import ClusterSession

if TYPE_CHECKING:  # types only: the copy engines are imported when a copy runs
    pass


# -- inspecting ------------------------------------------------------------------------------


def list_streams(sessions: Iterable[ClusterSession]) -> list[dict[str, Any]]:
    rows = []
    for session in sessions:
        streams = StreamStore(session.meta)
        for stream_id in streams.list_streams():
            try:
                config = streams.get_config(stream_id).value
                state = streams.get_state(stream_id).value
            except (NotFoundError, ValueError):
                continue
            claims = streams.claims(stream_id)
            rows.append(
                {
                    "stream": stream_id,
                    "source": config.source_cluster,
                    "sink": config.sink_cluster,
                    "state": state.state.value,
                    "logs": len(config.logs),
                    "workers": len(claims),
                    "bidirectional": config.bidirectional,
                }
            )
    return rows


def _age(epoch: float, now: float) -> float | None:
    return round(now - epoch, 1) if epoch else None


async def _lags(source: ClusterSession, checkpoints: dict[str, Checkpoint], region: str | None) -> dict[str, tuple[int, int] | str]:
    pool = await source.pool()
    out: dict[str, tuple[int, int] | str] = {}
    for name, cp in checkpoints.items():
        try:
            out[name] = await asyncio.wait_for(positions.records_from(source.meta, pool, name, cp.next, region=region, quorum=True), 15.0)
        except Exception as exc:  # noqa: BLE001 - status shows what could not be measured
            out[name] = f"unknown ({getattr(exc, 'message', None) or exc!r})"
    return out


def stream_ids(sink: ClusterSession) -> list[str]:
    """The streams into ``sink``."""
    return StreamStore(sink.meta).list_streams()


def source_of(sink: ClusterSession, stream_id: str) -> str:
    """The source cluster of stream ``stream_id`` into ``sink`` (NotFoundError: no such stream)."""
    return StreamStore(sink.meta).get_config(stream_id).value.source_cluster


def stream_status(sink: ClusterSession, source: ClusterSession | None, stream_id: str) -> dict[str, Any]:
    """Per log: lag (records, bytes, seconds), last applied source position, last contact, last
    error, worker and where it runs, state; loud when a log needs a bootstrap."""
    streams = StreamStore(sink.meta)
    config = streams.get_config(stream_id).value
    state = streams.get_state(stream_id).value
    claims = streams.claims(stream_id)
    nodes = sink.meta.available_nodes()
    checkpoints = {}
    unreadable: dict[str, str] = {}  # log -> why its checkpoint or pin cannot be read: that row says so, the others are shown
    for name in config.logs:
        try:
            checkpoints[name] = streams.get_checkpoint(stream_id, name).value
        except NotFoundError:
            pass
        except UNREADABLE as exc:
            unreadable[name] = why_unreadable(exc)
    pins: dict[str, PinRecord] = {}
    lags: dict[str, Any] = {}
    if source is not None:
        pin_store = PinStore(source.meta)
        for name in config.logs:
            try:
                pins[name] = pin_store.get(stream_id, name).value
            except NotFoundError:
                pass
            except UNREADABLE as exc:
                unreadable.setdefault(name, why_unreadable(exc))
        lags = source.run(_lags(source, checkpoints, None))
    now = time.time()
    rows = []
    for name in config.logs:
        cp = checkpoints.get(name)
        claim = claims.get(name)
        pin = pins.get(name)
        needs = (cp.needs_bootstrap if cp else "") or (pin.reason or "the source deleted pinned data" if pin and pin.needs_bootstrap else "")
        if pin is not None and not needs and pin.expired(now):
            needs = f"its retention pin expired (not refreshed for {now - pin.updated:.0f}s > {pin.max_age_seconds:.0f}s): the source may delete what it needs"
        lag = lags.get(name)
        lag_records = lag[0] if isinstance(lag, tuple) else None
        lag_bytes = lag[1] if isinstance(lag, tuple) else None
        behind = lag_seconds(lag_records, cp.caught_up_at if cp else 0.0, config.created, now)  # the rule the agents' metric uses too
        if name in unreadable:
            log_state = "unreadable"
        elif cp is None:
            log_state = "no checkpoint"
        elif needs:
            log_state = "NEEDS BOOTSTRAP"
        elif state.state is not StreamState.RUNNING:
            log_state = state.state.value
        elif cp.gated:
            log_state = "waiting-for-causal-past"
        else:
            log_state = "running" if claim else "waiting for a worker"
        last = cp.next if cp else None
        rows.append(
            {
                "log": name,
                "state": log_state,
                "lag_records": lag_records if lag_records is not None else (lag if isinstance(lag, str) else None),
                "lag_bytes": lag_bytes,
                "lag_seconds": round(behind, 1) if behind is not None else None,
                "last_applied": str(DLSN(last.segment_seq, last.entry_id, last.slot - 1)) if last and last.slot > 0 else None,
                "next": str(last) if last else None,
                "applied_records": cp.applied_records if cp else 0,
                "left_at_source": cp.left_at_source if cp else 0,
                # Everything the source held at this (Unix) time is at the sink (dlctl.replication.safetime).
                "safe_time": (cp.safe_time if cp else 0.0) or None,
                "safe_time_ago": _age(cp.safe_time, now) if cp else None,
                # In effect as the worker found it (the stream's setting until a worker ran), and
                # the source's answers' bytes decoded / on the wire (issue 23).
                "compression": (cp.compression if cp else "") or config.compression,
                "compression_ratio": round(cp.wire_payload_bytes / cp.wire_bytes, 2) if cp and cp.wire_bytes else None,
                "wire_bytes": cp.wire_bytes if cp else 0,
                "wire_payload_bytes": cp.wire_payload_bytes if cp else 0,
                "last_contact_ago": _age(cp.last_contact, now) if cp else None,
                "worker": (claim or {}).get("node"),
                "worker_region": nodes.get((claim or {}).get("node", ""), {}).get("region") if claim else None,
                "last_error": unreadable.get(name) or (cp.last_error if cp else "") or None,
                "last_error_ago": _age(cp.last_error_at, now) if cp and cp.last_error else None,
                "needs_bootstrap": needs or None,
                "waiting_for": describe_missing(cp.waiting_for) if cp and cp.gated and cp.waiting_for else None,
            }
        )
    safe = stream_safe_time(r["safe_time"] for r in rows)  # the oldest of its logs' (None while one has none)
    return {
        "stream": stream_id,
        "source": config.source_cluster,
        "sink": config.sink_cluster,
        "state": state.state.value,
        "bidirectional": config.bidirectional,
        "throttle_bytes_per_second": config.throttle_bytes_per_second,
        "compression": config.compression,
        "patterns": list(config.patterns),
        "safe_time": safe,
        "safe_time_ago": _age(safe or 0.0, now),
        "logs": rows,
        # What the stream's upkeep found (dlctl.replication.upkeep): logs not joined, deleted at
        # the source, settings that differ on a causal stream.
        "drift": [{"log": log, **entry} for log, entry in sorted(streams.get_drift(stream_id).items())],
    }


def check(status: dict[str, Any], *, max_lag_seconds: float | None, max_lag_records: int | None) -> tuple[int, list[str]]:
    """Monitoring verdict: 0 ok, 1 warning (paused, no worker, a recent error, lag unknown,
    waiting for the causal past),
    2 critical (a threshold exceeded, a log needs a bootstrap, its checkpoint or pin cannot be
    read)."""
    critical, warning = [], []
    for row in status["logs"]:
        name = row["log"]
        if row["needs_bootstrap"]:
            critical.append(f"{name}: needs bootstrap: {row['needs_bootstrap']}")
            continue
        if row["state"] == "unreadable":  # its checkpoint or pin: whether it moves, or needs a bootstrap, is unknown
            critical.append(f"{name}: a record cannot be read: {row['last_error']}")
            continue
        if isinstance(row["lag_records"], int):
            if max_lag_records is not None and row["lag_records"] > max_lag_records:
                critical.append(f"{name}: lag {row['lag_records']} records > {max_lag_records}")
        else:
            warning.append(f"{name}: lag unknown: {row['lag_records']}")
        if max_lag_seconds is not None and row["lag_seconds"] is not None and row["lag_seconds"] > max_lag_seconds:
            critical.append(f"{name}: lag {row['lag_seconds']}s > {max_lag_seconds}s")
        if row["state"] in ("paused", "setting-up", "waiting for a worker", "no checkpoint"):
            warning.append(f"{name}: {row['state']}")
        if row["state"] == "waiting-for-causal-past":
            warning.append(f"{name}: waiting for the causal past: the sink lacks {row['waiting_for'] or 'events the source deleted'}")
        if row["last_error"] and (row["last_error_ago"] or 0) < 60:
            warning.append(f"{name}: recent error: {row['last_error']}")
    for entry in status.get("drift", ()):
        warning.append(f"{entry['log']}: {entry['kind']}: {entry['detail']}")
    if critical:
        return 2, critical + warning
    return (1, warning) if warning else (0, [])


# -- pause, resume, delete -------------------------------------------------------------------


def _set_state_plan(sink: ClusterSession, stream_id: str, target: StreamState, verb: str) -> Plan:
    streams = StreamStore(sink.meta)
    current = streams.get_state(stream_id)
    if current.value.state is StreamState.FAILED_OVER:
        raise RefusedError(
            f"stream {stream_id!r} was failed over ({current.value.reason or 'dlctl failover'}); it can never {verb}",
            hint="set up the reverse direction with `dlctl failback`, or delete the stream",
            details=current.value.details or None,
        )
    if current.value.state is target:
        return Plan.of(f"replication {verb} {stream_id}", [], notes=[f"stream {stream_id} is already {target.value}"])
    if current.value.state is StreamState.SETTING_UP:
        raise RefusedError(f"stream {stream_id!r} is still being set up", hint="re-run init-replication to finish it first")
    return Plan.of(
        f"replication {verb} {stream_id}",
        [Step(verb, f"{sink.cluster.name}/{stream_id}", f"{verb} stream {stream_id} ({current.value.state.value} -> {target.value})", run=lambda: streams.set_state(stream_id, current, target, reason=verb).value.state.value)],
    )


def pause_plan(sink: ClusterSession, stream_id: str) -> Plan:
    return _set_state_plan(sink, stream_id, StreamState.PAUSED, "pause")


def resume_plan(sink: ClusterSession, stream_id: str) -> Plan:
    return _set_state_plan(sink, stream_id, StreamState.RUNNING, "resume")


def delete_plan(sink: ClusterSession, source: ClusterSession | None, stream_id: str, *, wait_workers: float = 60.0) -> Plan:
    """Pause, wait for the workers to stop (they write a last checkpoint and pin), delete the
    pins at the source, then the stream at the sink. Idempotent: re-run after any failure."""
    streams = StreamStore(sink.meta)
    config = streams.get_config(stream_id).value
    if source is not None and source.cluster.name != config.source_cluster:
        raise UsageError(f"stream {stream_id!r} replicates from {config.source_cluster!r}, not {source.cluster.name!r}")
    steps = []

    def pause() -> str:
        try:
            state = streams.get_state(stream_id)
        except NotFoundError:
            return "gone"
        if state.value.state not in (StreamState.PAUSED, StreamState.FAILED_OVER):
            streams.set_state(stream_id, state, StreamState.PAUSED, reason="delete")
        return "paused"

    def workers_stopped() -> int:
        if not streams.wait_released(stream_id, wait_workers):
            raise TimeoutExpired(f"workers of stream {stream_id!r} still hold {sorted(streams.claims(stream_id))} after {wait_workers:g}s", hint="check the sink agents; re-run delete")
        return 0

    steps.append(Step("pause", f"{sink.cluster.name}/{stream_id}", f"pause stream {stream_id} so no worker runs", run=pause))
    steps.append(Step("wait-workers", f"{sink.cluster.name}/{stream_id}", "wait until every worker stopped", run=workers_stopped))
    if source is not None:
        pins = PinStore(source.meta)
        steps.append(Step("delete-pins", f"{source.cluster.name}/pins/{stream_id}", f"delete the retention pins of {stream_id} in {source.cluster.name}", run=lambda: pins.delete(stream_id)))
    # Recorded before the stream goes (a re-run can no longer read what it was).
    steps.append(rules.history_step(source, sink, NetworkEvent("disconnect", config.source_cluster, config.sink_cluster, stream_id, config.bidirectional, config.logs, filter=config.filter)))
    steps.append(Step("delete-stream", f"{sink.cluster.name}/{stream_id}", f"delete stream {stream_id} (config, state, checkpoints) in {sink.cluster.name}", run=lambda: streams.delete(stream_id)))
    notes = [] if source is not None else [f"source cluster {config.source_cluster!r} is not in the inventory: its pins stay (they expire after {config.pin_max_age_seconds:.0f}s)"]
    if not config.bidirectional:
        notes.append(f"the sink logs stay replicas of {stream_id} (they refuse application writes); promote them with `dlctl dr promote --cluster {config.sink_cluster}`")
    return Plan.of(f"replication delete {stream_id}", steps, notes)


# -- waiting ---------------------------------------------------------------------------------


def wait_drain(sink: ClusterSession, source: ClusterSession, stream_id: str, *, timeout: float | None = None, on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Return once the sink has applied everything the source held when this started."""
    streams = StreamStore(sink.meta)
    config = streams.get_config(stream_id).value
    started = time.monotonic()

    async def ends() -> dict[str, DLSN | None]:
        pool = await source.pool()
        # Quorum LAC reads: the target includes every record acknowledged before the call.
        return {name: (await positions.log_end(source.meta, pool, name, quorum=True)).next for name in config.logs}

    targets = source.run(ends())
    pending = {n: t for n, t in targets.items() if t is not None}
    total = len(pending)
    while True:
        for name in list(pending):
            cp = streams.get_checkpoint(stream_id, name).value
            if cp.needs_bootstrap:
                raise RefusedError(f"stream {stream_id!r}, log {name!r} needs a bootstrap: {cp.needs_bootstrap}; it will not drain")
            if cp.next >= pending[name]:
                del pending[name]
        if on_progress is not None:
            on_progress(total - len(pending), total)
        if not pending:
            return {"stream": stream_id, "drained": True, "seconds": round(time.monotonic() - started, 3), "targets": {n: str(t) if t else None for n, t in targets.items()}}
        if timeout is not None and time.monotonic() - started > timeout:
            raise TimeoutExpired(
                f"stream {stream_id!r} did not drain within {timeout:g}s; behind: " + ", ".join(f"{n} (target {t})" for n, t in pending.items()),
                hint="see `dlctl replication status`",
            )
        time.sleep(0.1)
