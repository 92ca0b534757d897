"""The clock base a truncation leaves behind (DESIGN.md §7, §9; ``dlctl.replication.clock``).

A local record carries no timestamp: every reader derives it by counting the location's local
records from the log's beginning (``causal.SourceClock``). A truncation to T deletes what lies
before T, so a reader that starts at T (a bootstrap of a new sink, a new stream, ``dr``) would
count from zero there while the sinks that streamed from the beginning counted every record: the
same record would get two timestamps, and causality filters and the owner's origin-event dedup
would skip records or let duplicates through.

So before T moves, ``prepare`` computes the version vector a reader from the beginning holds
just before T and records it as a clock step at T (``ClockStore.set_truncation_base``). It reads
only the records between the previous truncation base (or the beginning) and T — they are still
there — so every record is read once in its life, by the truncation that deletes it.

A point T after the start of its segment S leaves S in place (storage deletes segments whole),
partially truncated from T's entry on. The same scan also records, as derived steps, the vector
before T's entry (T inside an entry) and before S's first record, with the data records of S
before T's entry and before T (``segment_base``): a bootstrap copies S from its first active
entry and needs both the vector there and how many of S's records it leaves out
(``dlctl.spark.clockbase``). A scan that starts at a previous base inside S continues the counts
that base recorded, so no record is read twice for them.

When no reading is needed:

* nothing lies between the previous base and T (no data record in the segments' metadata): the
  vector at T is the previous one with the clock steps in between — no read;
* the log takes part in no replication (no retention pin of a stream from it, no stream into
  this cluster carrying it now or in the network history, no clock steps): no other location holds a timestamp of its records,
  and every reader that ever starts at T or later finds the same base (none), so stamps stay
  consistent — nothing is written. A log that is replicated later is counted from its first
  truncation after that.

Unreadable segments refuse the truncation (``RefusedError`` naming the segment and entry), and
nothing is moved: the caller prepares before it moves anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import DlctlError, NotFoundError, RefusedError
from ..log.auth import Credentials
from ..log.dlsn import DLSN, INITIAL
from ..log.pool import AgentPool
from ..log.records import CorruptRecords, decode_records
from ..log.speculative import ReplicaReader
from ..meta.pins import PinStore
from ..meta.records import SegmentRecord, SegmentState
from ..meta.store import MetaStore
from .causal import SourceClock, merge
from .clock import ClockStore, SegmentBase, floor_at
from .history import HistoryStore
from .origin import ORIGIN_CLUSTER, Origin, OriginHeaderError

WINDOW = 64  # entries read at once while scanning


# -- pure decisions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntryRange:
    """Entries ``first``..``last`` (inclusive) of one segment to count, with the slots of the
    first entry from ``from_slot`` on and of the last one before ``to_slot`` (None: all)."""

    seq: int
    first: int
    last: int
    from_slot: int = 0
    to_slot: int | None = None


def ranges(segments: Sequence[SegmentRecord], start: DLSN, point: DLSN) -> list[EntryRange]:
    """The entries holding the records in [``start``, ``point``): what a reader from ``start``
    reads before it reaches ``point``. Truncated segments hold nothing readable; an in-progress
    one is never before a truncation point (the point may only sit at its start)."""
    out = []
    for seg in sorted(segments, key=lambda s: s.seq):
        if seg.state is SegmentState.TRUNCATED or seg.seq < start.segment_seq or seg.seq > point.segment_seq:
            continue
        if seg.state is SegmentState.INPROGRESS:
            if seg.seq < point.segment_seq or point.entry_id > 0 or point.slot > 0:
                raise ValueError(f"segment {seg.seq} is in progress: a truncation point may not lie inside or after it")
            continue
        first, from_slot = max(seg.min_active_entry, 0), 0
        if seg.seq == start.segment_seq and (start.entry_id, start.slot) > (first, 0):
            first, from_slot = start.entry_id, start.slot
        last, to_slot = seg.last_entry_id, None
        if seg.seq == point.segment_seq and point.entry_id <= seg.last_entry_id:
            if point.slot > 0:
                last, to_slot = point.entry_id, point.slot
            else:
                last = min(last, point.entry_id - 1)
        if last < first or (last == first and to_slot is not None and to_slot <= from_slot):
            continue
        out.append(EntryRange(seg.seq, first, last, from_slot, to_slot))
    return out


def may_hold_records(segments: Sequence[SegmentRecord], start: DLSN, point: DLSN) -> bool:
    """Does the metadata allow a data record in [``start``, ``point``)? (False: certainly none.)"""
    by_seq = {s.seq: s for s in segments}
    return any(by_seq[r.seq].records > 0 for r in ranges(segments, start, point))


def base_without_reading(previous_vv: Mapping[str, int], previous_at: DLSN, steps: Sequence[tuple[DLSN, Mapping[str, int]]], point: DLSN) -> dict[str, int]:
    """The vector before ``point`` when no record lies between ``previous_at`` and it: the
    previous one with every step up to ``point`` (as ``SourceClock`` merges them)."""
    out = dict(previous_vv)
    for at, step in steps:
        if previous_at < at <= point:
            out = merge(out, step)
    return out


def segment_base(seg_start: DLSN, entry: DLSN, start: DLSN, counted: int, found: Mapping[DLSN, tuple[dict[str, int], int]], known: SegmentBase | None) -> SegmentBase | None:
    """What to record about the start of the point's segment, from one scan from ``start``:
    ``counted`` data records before the point, ``found`` the vector and count before each mark
    (``seg_start``, ``entry``) the scan passed. A scan that started inside the segment (the
    previous base lies in it) continues what the previous base recorded (``known``); None
    when nothing tells the vector at the segment's start."""
    if seg_start in found:
        vv, at_start = found[seg_start]
        before_point = counted - at_start
        before_entry = found[entry][1] - at_start if entry in found else before_point
        return SegmentBase(seg_start, dict(vv), before_entry, before_point)
    if known is None or known.start != seg_start:
        return None
    if known.before_point is None:
        return SegmentBase(seg_start, dict(known.vv), None, None)
    before_point = known.before_point + counted
    if entry in found:
        before_entry: int | None = known.before_point + found[entry][1]
    elif entry < start:
        before_entry = known.before_entry  # the previous point lies in the same entry
    else:
        before_entry = before_point  # the point is the entry's start
    return SegmentBase(seg_start, dict(known.vv), before_entry, before_point)


@dataclass
class Evidence:
    """Why a log's clock matters beyond this location (empty: it does not)."""

    pins: list[str] = field(default_factory=list)  # streams reading it from here
    streams_in: list[str] = field(default_factory=list)  # streams writing into it here
    steps: int = 0  # clock steps (dr recover raised its clock)
    truncation_base: bool = False  # an earlier truncation recorded a base
    fed_before: list[str] = field(default_factory=list)  # streams that wrote into it once (network history)

    @property
    def replicated(self) -> bool:
        return bool(self.pins or self.streams_in or self.steps or self.truncation_base or self.fed_before)

    def describe(self) -> str:
        parts = []
        if self.pins:
            parts.append("read by stream(s) " + ", ".join(self.pins))
        if self.streams_in:
            parts.append("written by stream(s) " + ", ".join(self.streams_in))
        if self.steps:
            parts.append(f"{self.steps} clock step(s)")
        if self.truncation_base:
            parts.append("a truncation base")
        if self.fed_before:
            parts.append("a location fed by deleted stream(s) " + ", ".join(self.fed_before))
        return "; ".join(parts) or "not replicated"


# -- I/O ------------------------------------------------------------------------------------------------


def evidence(meta: MetaStore, name: str, steps: Sequence[Any], has_base: bool) -> Evidence:
    out = Evidence(steps=len(steps), truncation_base=has_base)
    out.pins = sorted({p.value.holder for p in PinStore(meta).pins_of_log(name)})
    from .store import StreamStore  # the sink side of streams into this cluster

    store = StreamStore(meta)
    for stream_id in store.list_streams():
        try:
            if name in store.get_config(stream_id).value.logs:
                out.streams_in.append(stream_id)
        except (NotFoundError, ValueError):
            continue
    # A stream deleted since still left other locations' records in the log: what a truncation
    # deletes of them is part of this location's deletion vector (``dlctl.replication.network``),
    # which must be known, or a new connection out of here could start without it. Any stream
    # that ever wrote into this location counts (a log can join a stream after its ``connect``
    # event named the stream's logs): at worst a log it never carried is read once. The history
    # is read only when nothing else says the log is replicated.
    if not out.replicated:
        out.fed_before = sorted({e.stream for e in HistoryStore(meta).events() if e.kind == "connect" and e.sink == meta.cluster})
    return out


async def scan(pool: AgentPool, log_id: int, name: str, location: str, segments: Sequence[SegmentRecord], start: DLSN, start_vv: Mapping[str, int], steps: Sequence[tuple[DLSN, Mapping[str, int]]], point: DLSN, window: int = WINDOW, marks: Sequence[DLSN] = ()) -> tuple[dict[str, int], int, dict[DLSN, tuple[dict[str, int], int]]]:
    """Read the records in [``start``, ``point``) and stamp them as a reader from the beginning
    does (from ``start_vv``, the vector before ``start``); returns the vector before ``point``,
    the number of data records read, and for each of ``marks`` (positions in between) the
    vector before it and the data records read before it — in the same pass, so every record
    is still read once. Raises ``RefusedError`` naming what could not be read."""
    at_marks: dict[DLSN, tuple[dict[str, int], int]] = {}
    pending = sorted(m for m in marks if start <= m <= point)
    by_seq = {s.seq: s for s in segments}
    clock = SourceClock(location, start_vv, base=[s for s in steps if s[0] > start], start=start)
    replicas = ReplicaReader(pool)
    counted = 0

    async def read(seg: SegmentRecord, entry_id: int) -> Any:
        return await replicas.read(log_id, seg, entry_id)

    for r in ranges(segments, start, point):
        seg = by_seq[r.seq]
        for chunk_start in range(r.first, r.last + 1, window):  # ``window`` entries in memory at a time
            ids = list(range(chunk_start, min(r.last, chunk_start + window - 1) + 1))
            try:
                entries = await asyncio.gather(*(read(seg, e) for e in ids))
            except (TimeoutError, DlctlError, OSError) as exc:
                raise RefusedError(
                    f"refused: log {name!r} cannot be truncated to {point}: segment {seg.seq} could not be read to establish "
                    f"the clock base at the truncation point ({exc})",
                    hint="nothing was changed; bring the segment's agents back (or re-replicate it) and retry",
                    details={"log": name, "point": str(point), "segment": seg.seq},
                ) from None
            for entry_id, entry in zip(ids, entries):
                try:
                    records = list(decode_records(entry.payload))
                except CorruptRecords as exc:
                    raise _unreadable(name, point, seg.seq, entry_id, f"malformed records: {exc}") from None
                for slot, record in enumerate(records):
                    if entry_id == r.first and slot < r.from_slot:
                        continue
                    if entry_id == r.last and r.to_slot is not None and slot >= r.to_slot:
                        break
                    here = DLSN(seg.seq, entry_id, slot)
                    while pending and here >= pending[0]:
                        mark = pending.pop(0)
                        at_marks[mark] = (base_without_reading(clock.vv, start, steps, mark), counted)
                    if record.control:
                        continue
                    try:
                        origin = Origin.from_headers(record.headers) if ORIGIN_CLUSTER in record.headers else None
                    except OriginHeaderError as exc:
                        raise _unreadable(name, point, seg.seq, entry_id, str(exc)) from None
                    clock.stamp(origin, here)
                    counted += 1
    for mark in pending:  # no record between it and the point
        at_marks[mark] = (base_without_reading(clock.vv, start, steps, mark), counted)
    # Steps after the last record, up to the point, apply before the record at the point.
    return base_without_reading(clock.vv, start, steps, point), counted, at_marks


def _unreadable(name: str, point: DLSN, seq: int, entry_id: int, why: str) -> RefusedError:
    return RefusedError(
        f"refused: log {name!r} cannot be truncated to {point}: entry {entry_id} of segment {seq} cannot be decoded "
        f"to establish the clock base at the truncation point ({why})",
        hint="nothing was changed; the records before the point must be readable so that readers starting at it stamp them as before",
        details={"log": name, "point": str(point), "segment": seq, "entry": entry_id},
    )


def prepare(meta: MetaStore, name: str, point: DLSN, *, secret: bytes | None = None, pool: AgentPool | None = None, segments: Sequence[SegmentRecord] | None = None, previous: DLSN | None = None) -> dict[str, Any]:
    """Make sure the clock base at ``point`` is recorded before the log's truncation point moves
    there (idempotent). ``previous``: the truncation point in place (read when not given);
    ``segments``: a snapshot of the log's segments (read when not given). Reading the agents needs
    ``pool`` or ``secret``. Returns what was done, for the operation's result."""
    from ..meta.truncation import TruncationStore, read_segments

    store = ClockStore(meta)
    steps = store.steps(name)
    base = store.truncation_base(name)
    if base is not None and base[0] >= point:
        return {"clock_base": "in place", "at": str(base[0]), "vv": base[1]}
    derived = store.derived_steps(name)  # a truncation's own steps are no evidence of a raised clock
    ev = evidence(meta, name, [s for s in steps if s not in derived and (base is None or s != (base[0], base[1]))], base is not None)
    if not ev.replicated:
        return {"clock_base": "not needed (the log is not replicated)"}
    if previous is None:
        current = TruncationStore(meta).get(name)
        previous = current.value.point if current is not None else None
    if base is not None:
        start, start_vv = base
    elif previous is not None:
        # Truncated before truncation bases existed: readers from there counted from its steps.
        start, start_vv = previous, floor_at(steps, previous)
    else:
        start, start_vv = INITIAL, {}
    plain = list(segments) if segments is not None else [v.value for v in read_segments(meta, name)]
    try:
        holds = may_hold_records(plain, start, point)
    except ValueError as exc:
        raise RefusedError(f"refused: log {name!r} cannot be truncated to {point}: {exc}") from None
    # A point inside an entry: the vector before the entry's start too (storage keeps the entry).
    # A point after its segment's start: the vector before the segment and its record counts
    # (storage keeps the segment; a bootstrap copies it from its first active entry).
    entry = DLSN(point.segment_seq, point.entry_id, 0)
    seg_start = DLSN(point.segment_seq, 0, 0)
    marks = [m for m in (seg_start, entry) if start <= m < point]
    if not holds:
        found = {m: (base_without_reading(start_vv, start, steps, m), 0) for m in marks}
        vv, counted = base_without_reading(start_vv, start, steps, point), 0
        how = "no record between the previous base and the point"
    else:
        log_id = meta.get_log(name).value.log_id

        async def go() -> tuple[dict[str, int], int, dict[DLSN, tuple[dict[str, int], int]]]:
            own = pool is None
            p = pool if pool is not None else AgentPool(meta, _need(secret, name))
            try:
                return await scan(p, log_id, name, meta.cluster, plain, start, start_vv, steps, point, marks=marks)
            finally:
                if own:
                    await p.close()

        vv, counted, found = _run(go())
        how = f"counted {counted} record(s) from {start}"
    entry_vv = found[entry][0] if entry in found else None
    segment = None
    if point > seg_start:
        known = store.truncation_segment(name) if start > seg_start else None
        if entry_vv is None and point.slot > 0:
            # The entry starts before the previous base, inside the same entry: recorded then.
            was = store.truncation_entry(name)
            entry_vv = was[1] if was is not None and was[0] == entry else None
        segment = segment_base(seg_start, entry, start, counted, found, known)
    store.set_truncation_base(name, point, vv, reason="truncation base", entry_vv=entry_vv, segment=segment)
    return {"clock_base": how, "at": str(point), "vv": vv, "why": ev.describe()}


def describe(meta: MetaStore, name: str, point: DLSN, segments: Sequence[SegmentRecord], previous: DLSN | None) -> str:
    """What ``prepare`` will do, for a plan (reads metadata only)."""
    store = ClockStore(meta)
    steps = store.steps(name)
    base = store.truncation_base(name)
    if base is not None and base[0] >= point:
        return f"the clock base at {base[0]} is recorded already"
    derived = store.derived_steps(name)  # a truncation's own steps are no evidence of a raised clock
    ev = evidence(meta, name, [s for s in steps if s not in derived and (base is None or s != (base[0], base[1]))], base is not None)
    if not ev.replicated:
        return "clock base: none needed (the log is not replicated: no pin, no stream into it now or before, no clock step)"
    start = base[0] if base is not None else (previous or INITIAL)
    try:
        todo = ranges(segments, start, point)
    except ValueError:
        return "clock base: the point lies inside an in-progress segment"
    by_seq = {s.seq: s for s in segments}
    records = sum(by_seq[r.seq].records for r in todo)
    if not records:
        return f"the clock base at {point} is recorded first (no record lies between {start} and it: nothing to read)"
    return (f"the clock base at {point} is recorded first, before anything moves: up to {records} record(s) in "
            f"segment(s) {todo[0].seq}..{todo[-1].seq} are read once from the agents ({ev.describe()})")


def _need(secret: Credentials | bytes | None, name: str) -> Credentials | bytes:
    if secret is None:
        raise RefusedError(
            f"refused: log {name!r} is replicated, and its clock base at the truncation point must be read from the agents, "
            "but no cluster secret was given to this truncation",
            hint="truncate it with `dlctl truncate` (or let the agents' housekeeping apply retention)",
        )
    return secret


def _run(coro: Any) -> Any:
    """Run ``coro`` to completion from synchronous code (also from inside a running loop's thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def base_at(meta: MetaStore, name: str, first: DLSN) -> dict[str, int] | None:
    """The version vector before ``first`` (where the log's retained records start) from the
    recorded truncation base, or None when no base tells it. A base at T up to ``first`` holds
    when no record lies between them (only clock steps); for a point inside the entry ``first``
    starts, the vector recorded for the entry's start."""
    from ..meta.truncation import read_segments

    store = ClockStore(meta)
    base = store.truncation_base(name)
    if base is None:
        return None
    at, vv = base
    if at == first:
        return dict(vv)
    if at > first:
        # A point inside the entry ``first`` starts: the vector before the entry (a reader from
        # ``first`` meets the step at the point before the first record it gets).
        entry = store.truncation_entry(name)
        return dict(entry[1]) if entry is not None and entry[0] == first else None
    if may_hold_records([v.value for v in read_segments(meta, name)], at, first):
        return None
    return base_without_reading(vv, at, store.steps(name), first)


def covered(meta: MetaStore, name: str) -> DLSN | None:
    base = ClockStore(meta).truncation_base(name)
    return base[0] if base is not None else None


__all__ = ["EntryRange", "Evidence", "base_at", "base_without_reading", "covered", "describe", "evidence", "may_hold_records", "prepare", "ranges", "scan", "segment_base"]
