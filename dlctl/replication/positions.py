"""Positions in live logs, read from the agents: where a stream's records end in the sink log,
where the source log ends, and how many records and bytes lie between a position and the end.

Every entry ends with a totals record (records and bytes of its segment so far; see
``dlctl.log.recovery``), so counting needs one entry read per segment boundary, not a scan.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..log import format as fmt
from ..log.dlsn import DLSN
from ..log.pool import AgentPool
from ..log.records import Record, decode_records
from ..log.recovery import entry_summary
from ..log.speculative import ReplicaReader
from ..log.tail import last_entry, log_segments, records_in_tail
from ..meta.records import SegmentRecord, SegmentState
from ..meta.store import MetaStore
from .origin import decode_source_position, origin_event


@dataclass(frozen=True)
class AppliedPosition:
    source: DLSN  # the last source position applied by the stream
    sink: DLSN  # where that record sits in the sink log


async def find_applied(meta: MetaStore, pool: AgentPool, log: str, source_cluster: str, floor: DLSN | None = None, region: str | None = None) -> AppliedPosition | None:
    """The last record of the sink log ``log`` that stream source ``source_cluster`` applied
    (its ``dl.src`` header), scanning back from the end of the log to ``floor`` (a sink position
    known to hold an applied record, or None to scan down to the start)."""
    log_id, segments = await log_segments(meta, log)
    replicas = ReplicaReader(pool, region=region)
    await pool.refresh()
    for seg in reversed(segments):
        if floor is not None and seg.seq < floor.segment_seq:
            return None
        last = await last_entry(replicas, log_id, seg)
        for entry_id in range(last, seg.min_active_entry - 1, -1):
            if floor is not None and (seg.seq, entry_id) < (floor.segment_seq, floor.entry_id):
                return None
            entry = await replicas.read(log_id, seg, entry_id)
            records = list(decode_records(entry.payload))
            for slot in range(len(records) - 1, -1, -1):
                record = records[slot]
                if record.control:
                    continue
                position = decode_source_position(record.headers)
                if position is not None and position[0] == source_cluster:
                    return AppliedPosition(position[1], DLSN(seg.seq, entry_id, slot))
    return None


@dataclass(frozen=True)
class LogEnd:
    next: DLSN | None  # the position just after the last data record (None: the log is empty)
    records: int  # data records held (live segments)
    bytes: int


async def log_end(meta: MetaStore, pool: AgentPool, log: str, region: str | None = None, *, quorum: bool = False) -> LogEnd:
    """Where log ``log`` ends right now (in-progress segments up to their LAC; ``quorum``: a
    quorum LAC read, for a target that must include every record acknowledged before the call,
    e.g. ``wait-drain``'s)."""
    log_id, segments = await log_segments(meta, log)
    replicas = ReplicaReader(pool, region=region)
    await pool.refresh()
    total_records = total_bytes = 0
    end: DLSN | None = None
    for seg in reversed(segments):
        last = await last_entry(replicas, log_id, seg, quorum=quorum)
        if seg.state is SegmentState.INPROGRESS:
            summary = await _summary(replicas, log_id, seg, last)
            total_records += summary[0]
            total_bytes += summary[1]
        else:
            total_records += seg.records
            total_bytes += seg.bytes
        if end is None and last >= seg.min_active_entry and (seg.state is SegmentState.INPROGRESS or seg.records > 0):
            end = await _last_data(replicas, log_id, seg, last)
    return LogEnd(end, total_records, total_bytes)


async def quorum_end(meta: MetaStore, pool: AgentPool, log: str, region: str | None = None, timeout: float = 10.0) -> DLSN | None:
    """Where log ``log`` ends, for a claim that it held nothing after this when the call began
    (the safe time, ``dlctl.replication.safetime``); None: it holds no data record.

    As ``log_end``, except that an in-progress segment's LAC must come from at least E - A + 1
    replicas of its current ensemble: that many meet every ack quorum, so one of them stored the
    newest acknowledged entry, and the LAC that entry carries (everything acknowledged before
    the writer sent it). ``log_end`` takes the LAC of whichever replicas answer in time, none
    (an empty segment) or one behind the others; a claim cannot. Raises
    ``AgentUnavailableError`` when too few answer within ``timeout`` seconds."""
    log_id, segments = await log_segments(meta, log)
    replicas = ReplicaReader(pool, region=region)
    await pool.refresh()
    for seg in reversed(segments):
        inprogress = seg.state is SegmentState.INPROGRESS
        last = await replicas.read_lac(log_id, seg, quorum=True, timeout=timeout) if inprogress else seg.last_entry_id
        if last >= seg.min_active_entry and (inprogress or seg.records > 0):
            end = await _last_data(replicas, log_id, seg, last)
            if end is not None:
                return end
    return None


async def _summary(replicas: ReplicaReader, log_id: int, seg: SegmentRecord, entry_id: int) -> tuple[int, int]:
    """(records, bytes) of the segment up to and including ``entry_id``."""
    if entry_id < 0:
        return 0, 0
    entry = await replicas.read(log_id, seg, entry_id, summary=True)  # its totals, not its payloads
    summary = entry_summary(fmt.encode(entry))
    if summary is None:
        raise ValueError(f"entry {entry_id} of segment {seg.seq} carries no totals record")
    return summary.records, summary.bytes


async def _last_data(replicas: ReplicaReader, log_id: int, seg: SegmentRecord, last: int) -> DLSN | None:
    for entry_id in range(last, seg.min_active_entry - 1, -1):
        entry = await replicas.read(log_id, seg, entry_id, summary=True)  # which slots hold data, not the data
        records = list(decode_records(entry.payload))
        for slot in range(len(records) - 1, -1, -1):
            if not records[slot].control:
                return DLSN(seg.seq, entry_id, slot + 1)
    return None


async def records_from(meta: MetaStore, pool: AgentPool, log: str, position: DLSN, region: str | None = None, *, quorum: bool = False) -> tuple[int, int]:
    """(records, bytes) at or after ``position`` in log ``log``: a stream's lag (``quorum``: to
    a quorum-read LAC, for ``replication status``; a worker's estimate reads it best effort)."""
    log_id, segments = await log_segments(meta, log)
    replicas = ReplicaReader(pool, region=region)
    await pool.refresh()
    records = nbytes = 0
    for seg in segments:
        if seg.seq < position.segment_seq:
            continue
        last = await last_entry(replicas, log_id, seg, quorum=quorum)
        if seg.state is SegmentState.INPROGRESS:
            seg_records, seg_bytes = await _summary(replicas, log_id, seg, last)
        else:
            seg_records, seg_bytes = seg.records, seg.bytes
        if seg.seq == position.segment_seq and (position.entry_id > 0 or position.slot > 0):
            before_records, before_bytes = await _summary(replicas, log_id, seg, min(position.entry_id, last + 1) - 1)
            seg_records -= before_records + position.slot
            seg_bytes -= before_bytes
        if seg_records > 0:  # (an entry's bytes count until its last record is applied)
            records += seg_records
            nbytes += max(0, seg_bytes)
    return records, nbytes


async def records_between(meta: MetaStore, pool: AgentPool, log: str, start: DLSN | None = None, stop: DLSN | None = None, region: str | None = None) -> int:
    """How many data records log ``log`` holds at positions >= ``start`` and < ``stop`` (None:
    from its first live record; to its end, an in-progress segment's quorum-read LAC): the
    difference of two sequence ids, from the segments' totals and entries' summaries, no
    records read."""
    log_id, segments = await log_segments(meta, log)
    replicas = ReplicaReader(pool, region=region)
    await pool.refresh()
    total = 0
    for seg in segments:
        if start is not None and seg.seq < start.segment_seq:
            continue
        if stop is not None and seg.seq > stop.segment_seq:
            break
        last = await last_entry(replicas, log_id, seg, quorum=True)
        held = seg.records if seg.state is not SegmentState.INPROGRESS else (await _summary(replicas, log_id, seg, last))[0]
        upto = held if stop is None or seg.seq < stop.segment_seq else await _records_before(replicas, log_id, seg, stop, last)
        since = 0 if start is None or seg.seq > start.segment_seq else await _records_before(replicas, log_id, seg, start, last)
        total += max(0, upto - since)
    return total


async def _records_before(replicas: ReplicaReader, log_id: int, seg: SegmentRecord, position: DLSN, last: int) -> int:
    """Data records of ``seg`` before ``position`` (a position in it; ``last``: its last entry)."""
    if position.entry_id > last:
        return (await _summary(replicas, log_id, seg, last))[0]
    records, _ = await _summary(replicas, log_id, seg, position.entry_id - 1)
    return records + position.slot


async def origin_events_in_tail(
    meta: MetaStore, pool: AgentPool, log: str, *, max_entries: int = 1024, region: str | None = None, concurrency: int = 32
) -> tuple[dict[str, tuple[int, DLSN]], DLSN | None]:
    """For each origin location found in the last ``max_entries`` entries of log ``log``: the
    highest of its own event counters (its component of a replicated record's vector time) and
    where that record sits; and the position of the newest record read. A location's events
    reach every log in their order, so this is how far each origin is present in the tail."""
    tail = await records_in_tail(meta, pool, log, max_entries=max_entries, region=region, concurrency=concurrency)
    return origin_events_of(tail), (tail[-1][0] if tail else None)


def origin_events_of(tail: list[tuple[DLSN, Record]]) -> dict[str, tuple[int, DLSN]]:
    """``origin_events_in_tail``'s answer for records already read (in log order)."""
    found: dict[str, tuple[int, DLSN]] = {}
    for here, record in tail:
        event = origin_event(record.headers) if record.headers else None
        if event is not None and (event[0] not in found or found[event[0]][0] < event[1]):
            found[event[0]] = (event[1], here)
    return found
