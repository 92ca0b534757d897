"""``dlctl truncate LOG (--to DLSN | --before-txid T | --older-than DURATION)`` (DESIGN.md §9).

The target is resolved to a DLSN (a txid by reading entries, an age by completion times), then
checked: an in-progress segment is never truncated, the point may not pass the end of the log,
and a live retention pin refuses a point past its position unless ``--force`` (the stream is
then marked as needing a bootstrap). The plan's steps re-read and re-check everything when
they run, so a change between ``--dry-run`` and apply is caught, never overwritten.

Applying: the log's clock base at the point is recorded first, while every record before it is
still there (``dlctl.replication.truncation_base``: a replicated log's records since the previous
base are read once, so that readers starting at the point derive the vector timestamps readers
from the beginning derived; unreadable segments refuse the truncation, nothing changed); then
pins the point overruns are marked (a stream never silently skips data), then the truncation
point moves forward by CAS (the commit point readers honour), then segments are marked by CAS. Nothing touches the writer's in-progress segment or the log record, so a writer
appending meanwhile is never fenced or slowed. Records and files go later (``dlctl gc`` or
the agents' housekeeping).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, RefusedError, UsageError
from ..log.auth import Credentials
from ..log.dlsn import DLSN
from ..log.pool import AgentPool
from ..log.readpolicy import (
    bisect_first,
    entry_max_txid,
    live_segments,
    segment_index_for_txid,
    start_of_log,
)
from ..log.records import decode_records
from ..log.speculative import ReplicaReader
from ..log.timeindex import iso, locate_time, to_ms
from ..meta.pins import PinRecord, PinStore, mark_pins
from ..meta.records import NO_TXID, SegmentRecord, SegmentState, Versioned
from ..meta.store import MetaStore
from ..meta.truncation import (
    TruncationStore,
    apply_marks,
    check_target,
    marks_for,
    normalize,
    overrun_pins,
    read_segments,
    refresh,
    retention_point,
    truncated_txid,
)
from ..plan import Plan, Step
from ..replication.truncation_base import describe as describe_clock_base
from ..replication.truncation_base import prepare as prepare_clock_base
from ..session import ClusterSession


@dataclass(frozen=True)
class Target:
    point: DLSN
    truncated_txid: int
    reason: str


# -- resolving the target ------------------------------------------------------------------------


async def _point_for_txid(pool: AgentPool, log_id: int, segments: list[SegmentRecord], txid: int) -> DLSN | None:
    """The position of the first record with txid >= ``txid`` (what the reader would start at),
    or None when no segment holds one yet. Binary search over segments by their metadata, then
    over the chosen segment's entries by reading them, then the slot within the entry."""
    live = live_segments(segments)
    index = segment_index_for_txid(live, txid)
    if index == len(live):
        return DLSN(live[-1].seq + 1, 0, 0) if live else None
    seg = live[index]
    if 0 <= seg.first_txid and seg.first_txid >= txid:
        return DLSN(seg.seq, 0, 0)
    replicas = ReplicaReader(pool)
    end = seg.last_entry_id if seg.state is not SegmentState.INPROGRESS else await replicas.read_lac(log_id, seg)

    async def reaches(entry_id: int) -> bool:
        entry = await replicas.read(log_id, seg, entry_id)
        top = entry_max_txid(decode_records(entry.payload))
        return top is not None and top >= txid

    first = await bisect_first(seg.min_active_entry, end, reaches)
    if first > end:
        return DLSN(seg.seq, first, 0)  # past what is written: inside (or after) this segment
    entry = await replicas.read(log_id, seg, first)
    for slot, record in enumerate(decode_records(entry.payload)):
        if record.txid >= txid:
            return DLSN(seg.seq, first, slot)
    return DLSN(seg.seq, first + 1, 0)  # not reached: bisect says this entry reaches it


def resolve_target(
    session: ClusterSession,
    name: str,
    segments: list[SegmentRecord],
    *,
    to: DLSN | None = None,
    before_txid: int | None = None,
    older_than: float | None = None,
    before_time: float | None = None,
    now: float | None = None,
) -> Target | None:
    """The truncation point asked for, or None when it asks for nothing (no segment is old enough)."""
    if sum(x is not None for x in (to, before_txid, older_than, before_time)) != 1:
        raise UsageError("give exactly one of --to DLSN, --before-txid TXID, --older-than DURATION, --before TIME")
    now = time.time() if now is None else now
    if to is not None:
        point = normalize(segments, to)
        return Target(point, truncated_txid(segments, point), f"explicit: to {to}")
    if older_than is not None:
        decision = retention_point(segments, now, ttl=older_than)
        if decision is None:
            return None
        return Target(decision.point, decision.truncated_txid, f"explicit: segments last appended to more than {older_than:g}s ago ({len(decision.segments)})")
    if before_time is not None:
        log = session.meta.get_log(name).value
        found, _ = session.with_pool(lambda pool: locate_time(ReplicaReader(pool), log.log_id, live_segments(segments), to_ms(before_time), log.max_segment_seq))
        point = normalize(segments, found)
        if point <= start_of_log(live_segments(segments), log.max_segment_seq):
            return None  # nothing was appended before it
        return Target(point, truncated_txid(segments, point), f"explicit: before {iso(to_ms(before_time))}")
    assert before_txid is not None
    if before_txid <= 0:
        return None  # nothing lies before txid 0
    log_id = session.meta.get_log(name).value.log_id
    point = session.with_pool(lambda pool: _point_for_txid(pool, log_id, segments, before_txid))
    if point is None:
        return None
    return Target(normalize(segments, point), before_txid - 1, f"explicit: before txid {before_txid}")


# -- checks and application (shared with gc and the agents' housekeeping) ---------------------------


def refusal(name: str, check: Any, point: DLSN) -> RefusedError | None:
    """The error an explicit truncation gets for what ``check_target`` found (pins aside)."""
    if check.in_progress is not None:
        seg = check.in_progress
        writer = f" (its writer {seg.writer} is appending to it)" if seg.writer else ""
        return RefusedError(
            f"refused: truncating log {name!r} to {point} would cut into segment {seg.seq}, which is in progress{writer}; "
            "an in-progress segment is never truncated",
            hint=f"truncate to at most {seg.seq}/0/0 (everything before it), or wait until the segment rolls",
        )
    if check.beyond_end is not None:
        return RefusedError(
            f"refused: {point} is past the end of log {name!r} (the next segment it will have is {check.beyond_end})",
            hint=f"the furthest truncation point is {check.beyond_end}/0/0 (everything written so far)",
        )
    return None


def blocking_candidates(pins: list[PinRecord], current: Versioned[Any] | None) -> list[PinRecord]:
    """Pins that may refuse a truncation: not those set below the point already in place (set
    after that truncation: their data is gone anyway; they are marked for bootstrap instead)."""
    if current is None:
        return pins
    return [p for p in pins if not p.position < current.value.point]


def pin_refusal(name: str, point: DLSN, pins: list[PinRecord]) -> RefusedError:
    held = "; ".join(
        f"stream {p.holder} still needs everything from {p.position}" + (f" (replicating to cluster {p.sink_cluster})" if p.sink_cluster else "")
        for p in pins
    )
    return RefusedError(
        f"refused: truncating log {name!r} to {point} passes a replication pin: {held}",
        hint="wait until the stream has caught up past that point, delete the stream, or pass --force "
        "(the stream is then marked as needing a bootstrap)",
        details={"log": name, "point": str(point), "pins": [{"holder": p.holder, "position": str(p.position), "sink_cluster": p.sink_cluster} for p in pins]},
    )


def apply_truncation(
    meta: MetaStore,
    name: str,
    point: DLSN,
    *,
    reason: str,
    by: str,
    txid: int = NO_TXID,
    force: str | None = None,
    now: float | None = None,
    segments: list[Versioned[SegmentRecord]] | None = None,
    secret: bytes | None = None,
) -> dict[str, Any]:
    """Check against fresh metadata, then: record the clock base at the point, mark overrun pins,
    move the truncation point forward, mark the segments. ``force`` (a reason) lets the point pass
    live pins; without it they refuse.

    The clock base (``dlctl.replication.truncation_base``) comes first, while every record before
    the point is still there: a replicated log's records between the previous base and the point
    are read once (with ``secret``) so that readers starting at the point stamp records exactly as
    readers from the beginning did. When they cannot be read, the truncation is refused and
    nothing is changed (``--force`` only passes pins, never this).

    ``segments``: a snapshot read earlier (the plan's); only what a truncation decision depends
    on is read again (new and in-progress segments), the rest is guarded by the CAS of the marks."""
    now = time.time() if now is None else now
    log = meta.get_log(name)
    segments = refresh(meta, name, segments) if segments is not None else read_segments(meta, name)
    plain = [s.value for s in segments]
    pin_store = PinStore(meta)
    pins = pin_store.pins_of_log(name)
    truncations = TruncationStore(meta)
    before = truncations.get(name)
    check = check_target(plain, point, log.value.max_segment_seq, blocking_candidates([p.value for p in pins], before), now)
    problem = refusal(name, check, point)
    if problem is not None:
        raise problem
    if check.pins and not force:
        raise pin_refusal(name, point, list(check.pins))
    previous = before.value.point if before else None
    clock = prepare_clock_base(meta, name, point, secret=secret, segments=plain, previous=previous) if previous is None or point > previous else None
    overrun = [p for p in pins if p.value in overrun_pins([q.value for q in pins], point)]
    marked = mark_pins(pin_store, overrun, point, now, force)

    def clock_again(at: DLSN, prev: DLSN | None) -> None:
        # The point changed meanwhile (a racing truncation): establish the base for ours again
        # (idempotent: a base at or past ``at`` stays as it is).
        prepare_clock_base(meta, name, at, secret=secret, previous=prev)

    record, moved = truncations.advance(name, point, truncated_txid=txid, reason=reason, by=by, clock=clock_again)
    # Mark for the point in place (ours, or a later one a racing truncation set): a mark never
    # goes backwards, so marking for the larger point is right either way.
    marks = apply_marks(meta, name, record.value.point, segments)
    return {
        "log": name,
        "point": str(record.value.point),
        "previous": str(before.value.point) if before else None,
        "moved": moved,
        "pins_marked_for_bootstrap": marked,
        **({"clock_base": clock} if clock else {}),
        **marks.to_dict(),
    }


# -- the plan --------------------------------------------------------------------------------------


def truncate_plan(
    session: ClusterSession,
    name: str,
    *,
    to: DLSN | None = None,
    before_txid: int | None = None,
    older_than: float | None = None,
    before_time: float | None = None,
    force: bool = False,
    now: float | None = None,
) -> Plan:
    meta = session.meta
    now = time.time() if now is None else now
    log = meta.get_log(name)  # NotFound (exit 1) first
    versioned = read_segments(meta, name)
    segments = [s.value for s in versioned]
    current = TruncationStore(meta).get(name)
    target = resolve_target(session, name, segments, to=to, before_txid=before_txid, older_than=older_than, before_time=before_time, now=now)
    where = f"{session.cluster.name}/{name}"
    if target is None:
        return Plan.of("truncate", [], notes=[f"nothing of log {name!r} matches: no record or completed segment lies before the point asked for"])
    pins = [p.value for p in PinStore(meta).pins_of_log(name)]
    check = check_target(segments, target.point, log.value.max_segment_seq, blocking_candidates(pins, current), now)
    problem = refusal(name, check, target.point)
    if problem is not None:
        raise problem
    if check.pins and not force:
        raise pin_refusal(name, target.point, list(check.pins))

    if current is not None and current.value.point >= target.point:
        # Idempotent, and never backwards; but finish marking if an earlier run was cut short.
        leftover = marks_for(segments, current.value.point)
        notes = [f"log {name!r} is already truncated to {current.value.point} (the truncation point never moves backwards)"]
        if not leftover:
            return Plan.of("truncate", [], notes=notes)
        return Plan.of(
            "truncate",
            [Step("mark-segments", where, f"finish marking {len(leftover)} segment(s) before {current.value.point} truncated",
                  params={"point": str(current.value.point)},
                  run=lambda: apply_marks(meta, name, current.value.point, refresh(meta, name, versioned)).to_dict())],
            notes=notes,
        )

    marks = marks_for(segments, target.point)
    whole = [m.seq for m in marks if m.state is SegmentState.TRUNCATED]
    partial = [m for m in marks if m.state is SegmentState.PARTIALLY_TRUNCATED]
    by_seq = {s.seq: s for s in segments}
    records = sum(by_seq[s].records for s in whole)
    nbytes = sum(by_seq[s].bytes for s in whole)
    what = []
    if whole:
        what.append(f"mark {len(whole)} segment(s) truncated ({_span(whole)}: {records} record(s), {nbytes} bytes)")
    for m in partial:
        what.append(f"mark segment {m.seq} partially truncated (entries before {m.min_active_entry} gone)")
    notes = [
        f"readers positioned before {target.point} start at {target.point}",
        describe_clock_base(meta, name, target.point, segments, current.value.point if current else None),
        "segment records and replica files are removed by `dlctl gc` or the agents' housekeeping",
    ]
    forced = None
    if check.pins:
        forced = "forced truncation by an operator"
        notes.append("--force: stream(s) " + ", ".join(sorted({p.holder for p in check.pins})) + " lose data they still need and are marked as needing a bootstrap")
    expired = [p for p in overrun_pins(pins, target.point) if p not in check.pins]
    if expired:
        notes.append("expired pin(s) of " + ", ".join(sorted({p.holder for p in expired})) + " are passed: marked as needing a bootstrap")
    reason = target.reason + (" (--force past pins)" if forced else "")
    return Plan.of(
        "truncate",
        [
            Step(
                "truncate",
                where,
                f"move the truncation point of {name} to {target.point}" + (f" (from {current.value.point})" if current else "") + ("; " + "; ".join(what) if what else ""),
                params={"point": str(target.point), "previous": str(current.value.point) if current else None, "segments_truncated": len(whole),
                        "partially_truncated": {str(m.seq): m.min_active_entry for m in partial}, "records": records, "bytes": nbytes},
                run=lambda: apply_truncation(meta, name, target.point, reason=reason, by="dlctl truncate", txid=target.truncated_txid, force=forced, now=time.time(), segments=versioned, secret=_secret(session)),
            )
        ],
        notes=notes,
    )


def _secret(session: ClusterSession) -> Credentials | None:
    """The cluster's credentials when configured (reading a replicated log's records needs
    them; the truncation refuses with a clear error when it does and there are none)."""
    try:
        return session.credentials
    except ConfigError:
        return None


def _span(seqs: list[int]) -> str:
    if not seqs:
        return "none"
    return f"segment {seqs[0]}" if len(seqs) == 1 else f"segments {seqs[0]}..{seqs[-1]}"
