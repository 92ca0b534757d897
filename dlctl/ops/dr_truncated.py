"""``dr recover`` when a peer no longer holds the beginning of a log (issue 11; DESIGN.md §7, §8).

Event recovery restarts every stream P -> X from P's beginning with the unfiltered causality
filter. When P truncated log L (its first retained position is T), P cannot give X what lay
before T: those records come back only if X kept them (or another stream into X brings them),
and the rest is **reported as a gap** (peer, log, range, an estimate of the record count) —
never silently dropped. From T on, P still has everything, and X must get it exactly once.

Two things make that hard, and this module decides them per (stream, log):

* **The clock at T.** A stream stamps P's local records by counting from P's version vector
  before where it starts reading. From T, that vector is not {} (P counted the records it
  deleted): starting from {} would hand P's records *lower* counters than they always had, and
  other locations' causality filters would then skip records they never saw. P's own counter at
  T is derived backwards from a checkpoint of a stream from P at or after T (X's own one from
  before the loss, saved when ``dr recover`` began — P's retention pin kept T at or before it —
  or any other sink's) and the records read between (``dlctl.replication.dr.clock_at``), then
  checked forward with P's clock steps. No usable checkpoint: refused, nothing changed. When P
  recorded its clock base at its truncation point (``dlctl.replication.truncation_base``: every
  truncation does, before it deletes anything), that base is used instead: exact, no estimate.

* **Duplicates.** The Spark bootstrap (``dlctl.ops.bootstrap``) copies whole segments
  without the causality filter. X may still hold part of its log (records that are also in P's
  retained segments: X's own records that reached P, records X had received), so a copy into a
  log that holds anything would duplicate them. Hence:

  - X's log holds **nothing** (wiped, or everything dropped as lost): **bootstrap** P's
    retained completed segments into it (``start_vv`` = the clock at T, so copied records get
    their true counters), then the stream continues from the snapshot point, unfiltered. At
    most one stream per log copies; every stream carrying that log stays paused and the log
    frozen until the copy is committed, and their filters then start from what X holds.
  - X's log holds **something**: no copy; the stream reads P from T (with the clock at T)
    through the unfiltered causality filter, which skips every record X already holds.
  - Another stream into X comes from a peer that holds the whole log (it can bring back what P
    deleted): no copy either; P's stream waits until X holds everything P deleted (the
    location-addition rule, re-checked as X's other streams deliver: #314's recovery in rounds),
    then reads P from T like the case above.

Resumable: the decisions are kept in ``dr recover``'s operation record; a log whose copy
finished has its stream checkpoint's ``needs_bootstrap`` cleared (by ``stream_hook`` together
with the commit), so a re-run never copies it twice; an interrupted copy resumes (same holder).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError, RefusedError
from ..log.dlsn import DLSN, INITIAL
from ..replication import dr, truncation_base
from ..replication.decision import first_retained
from ..replication.records import StreamConfig
from ..replication.store import StreamStore
from ..session import ClusterSession

if TYPE_CHECKING:  # types only: the copy engines are imported when a copy runs
    from ..spark.engines import Engines

PENDING = "dr recover: a bootstrap copy from {first} is pending"


def _async(session: ClusterSession, fn: Any) -> Any:
    return session.with_pool(fn)


def first_of(session: ClusterSession, name: str) -> DLSN | None:
    """The first position ``session``'s log still holds; None when it holds all it ever had."""
    try:
        record = session.meta.get_log(name)
    except NotFoundError:
        return None
    return first_retained([s.value for s in session.meta.segments(name)], record.value.max_segment_seq)


def anchors_of(target: ClusterSession, incoming: list[tuple[StreamConfig, Any]]) -> dict[str, dict[str, Any]]:
    """X's checkpoints of its incoming streams as they are before ``dr recover`` resets them:
    ``{"stream/log": {"next", "source_vv", "processed"}}`` (kept in the operation record)."""
    streams = StreamStore(target.meta)
    out = {}
    for c, _ in incoming:
        for name in c.logs:
            try:
                cp = streams.get_checkpoint(c.stream_id, name).value
            except NotFoundError:
                continue
            out[f"{c.stream_id}/{name}"] = {"next": str(cp.next), "source_vv": dict(cp.source_vv), "processed": cp.processed_records}
    return out


def _other_anchors(sessions: list[ClusterSession], source: str, name: str, exclude: str) -> list[tuple[DLSN, dict[str, int]]]:
    """Checkpoints of every other stream from ``source`` carrying ``name`` (other sinks)."""
    out = []
    for session in sessions:
        streams = StreamStore(session.meta)
        for stream_id in streams.list_streams():
            if stream_id == exclude:
                continue
            try:
                config = streams.get_config(stream_id).value
                if config.source_cluster != source or name not in config.logs:
                    continue
                cp = streams.get_checkpoint(stream_id, name).value
            except (NotFoundError, ValueError):
                continue
            if not cp.needs_bootstrap:
                out.append((cp.next, dict(cp.source_vv)))
    return out


@dataclass
class Incoming:
    """What ``dr recover`` does with one (stream, log) into X."""

    stream: str
    log: str
    mode: str  # "start" (the source holds everything), "stream" (from T, filtered), "bootstrap" (copy, then stream), "cold" (``dr_cold``: replay, then stream)
    first: DLSN  # where the source's log starts now (INITIAL: nothing deleted)
    vv: dict[str, int]  # the source's version vector before ``first``
    gap: dict[str, Any] | None = None
    # Another stream into X may bring back what the source deleted: this one starts only once X
    # holds it (the location-addition rule, ``dlctl.replication.network``; #314's recovery in
    # rounds), else the source's retained records would arrive ahead of the deleted ones and
    # X's owner would take those for duplicates.
    gated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "log": self.log, "mode": self.mode, "first": str(self.first), "vv": dict(self.vv), "gap": self.gap, "gated": self.gated}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Incoming:
        return cls(raw["stream"], raw["log"], raw["mode"], DLSN.parse(raw["first"]), {str(k): int(v) for k, v in raw["vv"].items()}, raw.get("gap"), bool(raw.get("gated")))


def decide(
    target: ClusterSession,
    source: ClusterSession,
    config: StreamConfig,
    name: str,
    *,
    saved: dict[str, Any] | None,
    others: list[ClusterSession],
    x_holds: int,
    copying: set[str],
    complete_sources: list[str],
) -> Incoming:
    """Decide for stream ``config`` (source P -> X) and log ``name`` (see the module doc).
    ``x_holds``: records X's log holds now; ``copying``: logs another stream copies already
    (this one then streams); ``complete_sources``: other streams' sources into X that hold all
    of ``name`` (they may bring back what P deleted). Raises ``RefusedError`` when P's clock at
    its first retained position cannot be established."""
    p, x = config.source_cluster, target.cluster.name
    first = first_of(source, name)
    if first is None:
        return Incoming(config.stream_id, name, "start", INITIAL, {})
    anchors = []
    saved_anchor = None
    if saved and saved.get("next"):
        saved_anchor = (DLSN.parse(saved["next"]), {str(k): int(v) for k, v in (saved.get("source_vv") or {}).items()})
        anchors.append(saved_anchor)
    anchors += _other_anchors(others, p, name, exclude=config.stream_id)
    persisted = truncation_base.base_at(source.meta, name, first)
    try:
        if persisted is not None:
            # P recorded its clock at its truncation point before it deleted anything: exact. X's
            # saved checkpoint still tells how many records the gap holds (records read between).
            vv, used, between = persisted, None, 0
            if saved_anchor is not None and saved_anchor[0] >= first:
                records = _async(source, lambda pool: dr.read_range(source.meta, pool, name, first, saved_anchor[0]))
                used, between = saved_anchor[0], len(records)
        else:
            vv, used, between = _async(source, lambda pool: dr.clock_before(source.meta, pool, name, p, first, anchors))
    except ValueError as exc:
        raise RefusedError(
            f"{p} no longer holds the beginning of {name} (it starts at {first}) and its clock there cannot be established: {exc}",
            hint=f"nothing of this step was changed; {p}'s records from {first} on can only be copied with their true counters once a stream from {p} has a checkpoint at or after {first}",
        ) from None
    estimate = None
    if saved_anchor is not None and used == saved_anchor[0] and int(saved.get("processed") or 0) >= between:  # type: ignore[union-attr]
        # The stream read every record of P before its checkpoint: those before T are gone at P.
        estimate = int(saved["processed"]) - between  # type: ignore[index]
    gap = {
        "peer": p,
        "log": name,
        "stream": config.stream_id,
        "from": str(INITIAL),
        "to": str(first),
        "records_estimate": estimate,
        "peer_own_records_before": vv.get(p, 0),
        "x_kept_records": x_holds,
        "covered_by": complete_sources,
        "note": (
            f"{p} deleted {name} before {first}: what of it {x} did not keep"
            + (f" may come back from {', '.join(complete_sources)}" if complete_sources else f" is lost for {x} (no other stream into {x} holds it)")
        ),
    }
    if complete_sources:
        # What P deleted comes back from those sources: P's stream waits until X holds it, then
        # reads P from T skipping what X holds (no copy: a copy would land ahead of it).
        return Incoming(config.stream_id, name, "stream", first, vv, gap, gated=True)
    mode = "bootstrap" if x_holds == 0 and name not in copying else "stream"
    return Incoming(config.stream_id, name, mode, first, vv, gap)


def bootstrap(target: ClusterSession, source: ClusterSession, item: Incoming, shared: Engines | None = None) -> dict[str, Any]:
    """Copy P's retained completed segments of ``item.log`` into X's (empty) log (on Spark, or
    in-process when small; ``shared``: the recovery's engines, one Spark context for its copies), with
    P's clock at the first copied position; ``stream_hook`` sets the stream's checkpoint to the
    snapshot point (and clears ``needs_bootstrap``) before the copy's pin goes. A log whose
    checkpoint no longer needs the copy was copied by an earlier run: skipped."""
    from .bootstrap import bootstrap_logs, plan, stream_hook

    streams = StreamStore(target.meta)
    cp = streams.get_checkpoint(item.stream, item.log).value
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
    """The stream's filter starts from what X's log holds now (after a copy into it)."""
    held = _async(target, lambda pool: dr.held_vv(target.meta, pool, name, target.cluster.name))
    streams = StreamStore(target.meta)
    current = streams.get_checkpoint(stream_id, name)
    if current.value.sink_vv != held:
        streams.update_checkpoint(stream_id, current, replace(current.value, sink_vv=held))
    return held


def gap_note(gap: dict[str, Any]) -> str:
    count = f"about {gap['records_estimate']} record(s)" if gap.get("records_estimate") is not None else "an unknown number of records"
    return f"GAP {gap['peer']}/{gap['log']}: {gap['peer']} no longer holds {gap['from']}..{gap['to']} ({count}); {gap['note']}"


__all__ = ["PENDING", "Incoming", "anchors_of", "bootstrap", "decide", "first_of", "gap_note", "set_sink_vv"]
