"""Positioning in a log by time (issue 24; DESIGN.md §4).

Every entry carries its append time (``dlctl.log.recovery``: the owner's clock, in ms, never below
the log's previous entry), the append time of each of its records, and completed segments record
the times of their first and last entries. So the log is sorted by time as it is by txid, and
the first record appended at or after T is found the same way: a binary search over the
completed segments' last times (metadata only), then over the chosen segment's entries by
reading them (one entry per probe: log2 of the segment's entries).

What carries no time — entries written before they did, segments completed before their times
were recorded (their completion time bounds them from above) — is taken as reaching T: the
search may start earlier than it must, never later, so it never skips a record appended at or
after T.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from datetime import datetime, timezone

from ..meta.records import SegmentRecord, SegmentState
from .dlsn import DLSN
from .readpolicy import bisect_first
from .records import decode_records
from .recovery import append_time
from .speculative import ReplicaReader


def to_ms(when: float) -> int:
    """Seconds since the epoch (as ``time.time()``) -> the milliseconds entries carry."""
    return int(when * 1000)


def iso(ms: int | None) -> str | None:
    """An append time for people and JSON: ISO 8601 in UTC, to the millisecond (None: unknown)."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def segment_index_for_time(segments: Sequence[SegmentRecord], at_ms: int) -> int:
    """Index of the first live segment that may hold an entry appended at or after ``at_ms``
    (``segments``: live, in order; an in-progress one, always last, is always a candidate).
    ``len(segments)`` when every segment ends before it. Keys are running maxima, so the
    searched sequence stays sorted even where an upper bound stands in for a last time."""
    closed_end = len(segments)
    while closed_end > 0 and segments[closed_end - 1].state is SegmentState.INPROGRESS:
        closed_end -= 1
    running: float = 0
    keys: list[float] = []
    for seg in segments[:closed_end]:
        last = seg.last_append_ms
        running = max(running, last if last is not None else 0)
        keys.append(running)
    return bisect.bisect_left(keys, at_ms)


async def locate_time(replicas: ReplicaReader, log_id: int, live: list[SegmentRecord], at_ms: int, max_segment_seq: int) -> tuple[DLSN, int | None]:
    """(the position of the first record appended at or after ``at_ms``, the LAC read when the
    search ended in the in-progress segment) — the next segment's start when there is none."""
    index = segment_index_for_time(live, at_ms)
    while index < len(live):
        seg = live[index]
        if seg.first_time is not None and seg.first_time >= at_ms:
            return DLSN(seg.seq, seg.min_active_entry, 0), None
        lac = await replicas.read_lac(log_id, seg) if seg.state is SegmentState.INPROGRESS else None
        end = seg.last_entry_id if lac is None else lac

        async def reaches(entry_id: int, seg: SegmentRecord = seg) -> bool:
            entry = await replicas.read(log_id, seg, entry_id)
            when = append_time(list(decode_records(entry.payload)))
            return when is None or when >= at_ms

        first = await bisect_first(seg.min_active_entry, end, reaches)
        if first <= end or seg.state is SegmentState.INPROGRESS:
            return DLSN(seg.seq, first, 0), lac
        index += 1  # only an upper bound placed it here: every entry of it is earlier
    return DLSN(live[-1].seq + 1 if live else max_segment_seq + 1, 0, 0), None
