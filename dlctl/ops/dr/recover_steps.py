"""The side effects of ``dr recover``'s steps: each reads the facts it needs now
(``recover_facts``), asks ``recover_decide`` what to do, does it, and records it in the
operation record so that a re-run continues after the last step done."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ...errors import ConflictError, RefusedError
from ...meta.access import AccessMode, AccessStore
from ...meta.operations import OperationRecord
from ...meta.pins import PinRecord, PinStore
from ...meta.records import LogConfig, SegmentRecord, SegmentState, Versioned
from ...meta.store import MetaStore
from ...replication import dr
from ...replication.clock import ClockStore
from ...replication.records import StreamConfig, StreamState
from ...replication.store import StreamStore
from ...session import ClusterSession
from .. import replication as repl
from .. import streams as stream_ops
from .cold import cover, replay
from .fencing import freeze_logs
from .recover_decide import (
    StreamIn,
    decide_incoming,
    end_states,
    held_back,
    incoming_description,
    logs_copied,
    mode_restores,
    modes_before,
    outgoing_start,
    raised_clock,
    recovered_records,
    refuse_gaps,
    reset_outgoing,
    restarted,
    running_before,
    segments_to_drop,
    streams_carrying,
)
from .recover_facts import (
    Outgoing,
    anchors_of,
    count_records,
    first_of,
    read_clock_evidence,
    read_end,
    read_incoming_facts,
    read_live_segments,
)
from .truncated import PENDING, Incoming, gap_note

if TYPE_CHECKING:  # types only: the copy engines are imported when a copy runs
    from ...spark.engines import Engines

OP_ID = "dr-recover"


class OpRecord:
    """``dr recover``'s operation record in X's ZooKeeper (``ops/dr-recover``, written through
    ``dlctl.meta.operations``): the access modes and running streams to restore, the decisions
    of ``reset-incoming`` and the steps done. A run that finds it continues where it stopped."""

    def __init__(self, meta: MetaStore, current: Versioned[dict] | None) -> None:
        self._meta = meta
        self._record = OperationRecord(meta, OP_ID, current) if current is not None else None

    @property
    def exists(self) -> bool:
        return self._record is not None

    @property
    def value(self) -> dict[str, Any]:
        return self._opened().value

    def create(self, value: dict[str, Any]) -> None:
        self._record = OperationRecord.create(self._meta, OP_ID, value)

    def save(self, step: str, **extra: Any) -> None:
        """Record ``step`` as done with ``extra`` fields (idempotent: a lost answer is settled)."""
        self._opened().update(lambda value: {**value, **extra, "done": sorted({*value.get("done", []), step})}, idempotent=True)

    def delete(self) -> None:
        self._opened().delete()

    def _opened(self) -> OperationRecord:
        if self._record is None:
            self._record = OperationRecord(self._meta, OP_ID, self._meta.get_op(OP_ID))
        return self._record


@dataclass(frozen=True)
class Recovery:
    """One ``dr recover`` of X as planned: the clusters, the streams and logs it covers (with
    their states before the loss), the access modes a metadata rebuild recorded, and its record."""

    target: ClusterSession
    peers: Mapping[str, ClusterSession]
    incoming: tuple[StreamIn, ...]
    outgoing: tuple[Outgoing, ...]
    logs: tuple[str, ...]
    rebuilt_modes: Mapping[str, str]
    record: OpRecord
    wait_workers: float
    drain_timeout: float
    started: float  # ``time.monotonic()`` when planned

    @property
    def x(self) -> str:
        return self.target.cluster.name

    def config_of(self, stream_id: str) -> StreamConfig:
        return next(c for c, _ in self.incoming if c.stream_id == stream_id)

    def items(self, mode: str) -> list[Incoming]:
        """The (stream, log) decisions of ``reset-incoming`` of one mode, from the record."""
        return [i for i in (Incoming.from_dict(raw) for raw in self.record.value.get("incoming") or []) if i.mode == mode]


def begin(r: Recovery) -> dict[str, Any]:
    target, x = r.target, r.x
    access = AccessStore(target.meta)
    modes = modes_before({n: access.get(n).value.mode.value for n in r.logs if n in target.meta.list_logs()}, r.rebuilt_modes)
    if not r.record.exists:
        r.record.create({"kind": "dr-recover", "cluster": x, "started": time.time(), "modes": modes, "running": running_before(x, r.incoming, r.outgoing), "anchors": anchors_of(target, r.incoming), "done": []})
    for c, _ in r.incoming:
        _pause(StreamStore(target.meta), c.stream_id)
    for o in r.outgoing:
        _pause(StreamStore(r.peers[o.peer].meta), o.config.stream_id)
    stopped = all(StreamStore(target.meta).wait_released(c.stream_id, r.wait_workers) for c, _ in r.incoming)
    stopped = all([StreamStore(r.peers[o.peer].meta).wait_released(o.config.stream_id, r.wait_workers) for o in r.outgoing]) and stopped
    # (No recovery of in-progress segments here: their replicas may be the lost data.)
    frozen = freeze_logs(target, [n for n in r.logs if n in target.meta.list_logs()], mode=AccessMode.READ_ONLY, reason="dr recover", close=False)
    r.record.save("begin")
    return {"paused": len(r.incoming) + len(r.outgoing), "workers_stopped": stopped, "frozen": sorted(frozen)}


def drop_lost(r: Recovery) -> dict[str, Any]:
    target, donor = r.target, next(iter(r.peers.values()))
    out: dict[str, Any] = {}
    for name in r.logs:
        if name not in target.meta.list_logs():
            repl.create_if_missing(target, name, donor.meta.get_log(name).value.config if name in donor.meta.list_logs() else LogConfig())
            AccessStore(target.meta).set(name, AccessMode.READ_ONLY, reason="dr recover")
            out[name] = {"recreated": True}
            continue
        dropped = segments_to_drop(*read_live_segments(target, name))
        for seg in dropped:
            _drop_segment(target, name, seg)
        out[name] = {"dropped_segments": [s.value.seq for s in reversed(dropped)], "dropped_records": sum(s.value.records for s in dropped)}
    r.record.save("drop-lost", kept={n: count_records(target, n) for n in r.logs})
    return out


def raise_clock(r: Recovery) -> dict[str, Any]:
    out = {}
    for name in r.logs:
        floor, start = raised_clock(r.x, read_clock_evidence(r.target, r.peers, r.incoming, r.outgoing, name))
        steps = ClockStore(r.target.meta).raise_to(name, {r.x: floor}, start, reason="dr recover")
        out[name] = {"counter": floor, "from": str(start), "steps": len(steps)}
    r.record.save("raise-clock")
    return out


def reset_outgoing_streams(r: Recovery) -> dict[str, Any]:
    target, out = r.target, {}
    for name in r.logs:
        end = read_end(target, name)
        position = outgoing_start(end, first_of(target, name) if end is None else None)
        # (Nothing before an emptied log's position: the stream's clock starts from the base.)
        vv = target.with_pool(lambda pool, name=name, position=position: dr.vv_before(target.meta, pool, name, r.x, position)) if end is not None else {}
        for o in r.outgoing:
            if name not in o.config.logs:
                continue
            streams = StreamStore(r.peers[o.peer].meta)
            current = streams.get_checkpoint(o.config.stream_id, name)
            streams.update_checkpoint(o.config.stream_id, current, reset_outgoing(current.value, position, vv))
            PinStore(target.meta).reset(PinRecord(holder=o.config.stream_id, log=name, position=position, sink_cluster=o.peer, max_age_seconds=o.config.pin_max_age_seconds))
            out[f"{o.config.stream_id}/{name}"] = str(position)
    r.record.save("reset-outgoing")
    return out


def reset_incoming_streams(r: Recovery) -> dict[str, Any]:
    target, x = r.target, r.x
    # Decide everything first (a refusal changes nothing), then apply.
    facts = read_incoming_facts(target, r.peers, r.incoming, r.logs, r.record.value.get("anchors") or {})
    decided = decide_incoming(x, r.incoming, facts)
    copying = logs_copied(decided, "bootstrap")
    waiting = held_back(r.incoming, copying | logs_copied(decided, "cold"))
    # The clock is raised and the peers reset: the logs may take writes again (the streams
    # into X write through its agents like any producer) — except those a copy goes into.
    restore_modes(r, skip=copying)
    streams = StreamStore(target.meta)
    for c, _ in r.incoming:
        current_config = streams.get_config(c.stream_id)
        if not current_config.value.unfiltered:
            streams.update_config(current_config, replace(current_config.value, unfiltered=True))
    out: dict[str, Any] = {}
    for c, item in decided:
        held = target.with_pool(lambda pool, name=item.log: dr.held_vv(target.meta, pool, name, x))
        current = streams.get_checkpoint(c.stream_id, item.log)
        streams.update_checkpoint(c.stream_id, current, restarted(current.value, item, held, PENDING.format(first=item.first) if item.mode == "bootstrap" else ""))
        PinStore(r.peers[c.source_cluster].meta).reset(PinRecord(holder=c.stream_id, log=item.log, position=item.first, sink_cluster=x, max_age_seconds=c.pin_max_age_seconds))
        out[f"{c.stream_id}/{item.log}"] = incoming_description(x, c.source_cluster, item)
    for c, _ in r.incoming:
        if c.stream_id not in waiting:
            _resume(streams, c.stream_id)
    items = [item.to_dict() for _, item in decided]
    r.record.save("reset-incoming", incoming=items, gaps=[i["gap"] for i in items if i["gap"]])
    return out


def cold_restore(r: Recovery) -> dict[str, Any]:
    out: dict[str, Any] = {}
    replayed = r.items("cold")
    for item in replayed:
        config = r.config_of(item.stream)
        found, why = cover(r.peers[config.source_cluster], item.log, item.first)
        if found is None:
            raise RefusedError(f"{config.source_cluster}'s cold store no longer covers {item.log} before {item.first}: {why}", hint="make it reachable again and re-run `dlctl dr recover`")
        out[f"{item.stream}/{item.log}"] = r.target.with_pool(lambda pool, c=config, i=item, f=found: replay(r.target, pool, c.source_cluster, c, i.log, f, i.first))
    for stream_id, name in streams_carrying(r.incoming, {i.log for i in replayed}):
        set_sink_vv(r.target, stream_id, name)
    r.record.save("cold-restore")
    return out


def bootstrap(r: Recovery) -> dict[str, Any]:
    from ..bootstrap import engines, prestart_for

    copies = r.items("bootstrap")
    sources = {i.stream: r.peers[r.config_of(i.stream).source_cluster] for i in copies}
    out: dict[str, Any] = {}
    # One Spark context for every copy that needs it (small ones run in-process), its start
    # begun now, while the first copy is still being planned; stopped however this ends.
    with engines() as shared:
        for stream_id, source in sources.items():
            prestart_for(shared, source, [i.log for i in copies if i.stream == stream_id])
        for item in copies:
            out[f"{item.stream}/{item.log}"] = copy_retained(r.target, sources[item.stream], item, shared)
    # Every stream carrying a copied log filters from what X holds now, then runs.
    for stream_id, name in streams_carrying(r.incoming, {i.log for i in copies}):
        set_sink_vv(r.target, stream_id, name)
    restore_modes(r)
    streams = StreamStore(r.target.meta)
    for c, _ in r.incoming:
        _resume(streams, c.stream_id)
    r.record.save("bootstrap")
    return out


def events(r: Recovery) -> dict[str, Any]:
    record = r.record.value
    t0 = record.get("events_started") or time.time()
    if "events_started" not in record:
        r.record.save("events-started", events_started=t0)
    gaps = {}
    for c, _ in r.incoming:
        try:
            stream_ops.wait_drain(r.target, r.peers[c.source_cluster], c.stream_id, timeout=r.drain_timeout)
        except RefusedError as exc:  # the peer deleted what X needs: a bootstrap, or the gap stays
            gaps[c.stream_id] = exc.message
    refuse_gaps(r.x, gaps)
    seconds = time.time() - t0
    now = {n: count_records(r.target, n) for n in r.logs}
    recovered = recovered_records(record.get("kept") or {}, now)
    r.record.save("events", recovered=recovered, seconds=seconds)
    return {
        "recovered_records": recovered, "seconds": round(seconds, 3), "records_per_second": round(recovered / seconds, 1) if seconds > 0 else None, "records": now,
        "gaps": record.get("gaps") or [],
    }


def finish(r: Recovery) -> dict[str, Any]:
    streams = StreamStore(r.target.meta)
    for c, _ in r.incoming:
        current = streams.get_config(c.stream_id)
        if current.value.unfiltered:
            streams.update_config(current, replace(current.value, unfiltered=False))
    record = r.record.value
    pause, resume = end_states(r.x, r.incoming, r.outgoing, record.get("running", []))
    for stream_id in pause:
        _pause(streams, stream_id)
    for o in resume:
        _resume(StreamStore(r.peers[o.peer].meta), o.config.stream_id)
    restore_modes(r)
    r.record.delete()
    gaps = record.get("gaps") or []
    return {"total_seconds": round(time.monotonic() - r.started, 3), "recovered_records": record.get("recovered"), "event_seconds": record.get("seconds"), "gaps": gaps, "notes": [gap_note(g) for g in gaps]}


def restore_modes(r: Recovery, skip: Iterable[str] = ()) -> None:
    access = AccessStore(r.target.meta)
    current = {name: access.get(name) for name in r.logs}
    restores = mode_restores(r.logs, r.record.value.get("modes", {}), {n: v.value.mode for n, v in current.items()}, r.incoming, skip)
    for name, mode, stream in restores:
        access.set(name, mode, stream=stream, reason="dr recover: metadata recovered", current=current[name])


def copy_retained(target: ClusterSession, source: ClusterSession, item: Incoming, shared: Engines | None = None) -> dict[str, Any]:
    """Copy P's retained completed segments of ``item.log`` into X's (empty) log (on Spark, or
    in-process when small; ``shared``: the recovery's engines, one Spark context for its copies), with
    P's clock at the first copied position; ``stream_hook`` sets the stream's checkpoint to the
    snapshot point (and clears ``needs_bootstrap``) before the copy's pin goes. A log whose
    checkpoint no longer needs the copy was copied by an earlier run: skipped."""
    from ..bootstrap import bootstrap_logs, plan, stream_hook

    cp = StreamStore(target.meta).get_checkpoint(item.stream, item.log).value
    if not cp.needs_bootstrap:
        return {"skipped": "copied by an earlier run", "next": str(cp.next)}
    holder = f"bootstrap-{item.stream}"
    job = plan(source, target, logs=[item.log], holder=holder)
    for lp in job.logs:
        lp.start_vv = dict(item.vv)
    result = bootstrap_logs(source, target, [item.log], holder=holder, before_release=stream_hook(source, target, item.stream), job=job, shared=shared)
    res = result.logs[item.log]
    return {
        "snapshot": str(res.snapshot), "records": res.records, "segments": res.segments, "bytes_copied": result.bytes_copied, "seconds": round(result.seconds, 3),
        "engine": result.engine, "spark_starts": result.spark_starts,
    }


def set_sink_vv(target: ClusterSession, stream_id: str, name: str) -> dict[str, int]:
    """The stream's filter starts from what X's log holds now (after a copy or replay into it)."""
    held = target.with_pool(lambda pool: dr.held_vv(target.meta, pool, name, target.cluster.name))
    streams = StreamStore(target.meta)
    current = streams.get_checkpoint(stream_id, name)
    if current.value.sink_vv != held:
        streams.update_checkpoint(stream_id, current, replace(current.value, sink_vv=held))
    return held


def _pause(streams: StreamStore, stream_id: str) -> None:
    current = streams.get_state(stream_id)
    if current.value.state is StreamState.RUNNING:
        streams.set_state(stream_id, current, StreamState.PAUSED, reason="dr recover")


def _resume(streams: StreamStore, stream_id: str) -> None:
    current = streams.get_state(stream_id)
    if current.value.state is StreamState.PAUSED:
        streams.set_state(stream_id, current, StreamState.RUNNING, reason="dr recover")


def _drop_segment(session: ClusterSession, name: str, seg: Versioned[SegmentRecord]) -> None:
    """Forget a segment whose data is gone from every replica. An in-progress one too: no writer
    can recover it, and a new writer would wait on it for ever (``MetaStore.delete_segment``
    keeps in-progress segments for every other purpose)."""
    from ...meta import cas, paths

    if seg.value.state is not SegmentState.INPROGRESS:
        session.meta.delete_segment(name, seg)
        return
    path = paths.segment(session.cluster.name, name, seg.value.seq)
    cas.delete(session.meta.client, path, seg.version, conflict=lambda: ConflictError(f"aborted: {path} changed concurrently", hint="re-run dr recover"))


__all__ = [
    "OP_ID", "OpRecord", "Recovery", "begin", "bootstrap", "cold_restore", "copy_retained", "drop_lost", "events", "finish", "raise_clock",
    "reset_incoming_streams", "reset_outgoing_streams", "restore_modes", "set_sink_vv",
]
