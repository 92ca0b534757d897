"""The clock a segment copy carries (issue 25 item 4; ``dlctl.replication.clock``).

A local record has no timestamp of its own: every reader derives it by counting the location's
records from the log's beginning, from the log's clock base. A restore appends the records at
new positions of a new log, whose reader would count from zero — and hand out timestamps the
sinks of the original log's streams have already seen, so they would skip new records or take
old ones twice. So each manifest records the version vector a reader from the beginning holds
before the segment's first record (``before``) and after its last one (``after``), and a restore
gives the new log a clock base that makes its readers derive the very same timestamps.

``before`` comes without reading records, from the nearest exact vector at or before the
segment's start with no record in between, as the metadata tells it:

* the previous segment's copy (``after``, the usual case: backups and offloads go in order);
* a derived clock step (a truncation base: exactly what a reader from the beginning held there);
* the log's beginning (every segment before this one still in the metadata, holding no record);
* the truncation point of a log truncated without a base (it was not replicated then: readers
  from there have always counted from its steps).

With every clock step in between merged, as ``SourceClock`` merges them. When none applies (the
copies start after segments that left without copies and without a base) the clock is unknown
(None) and a restore says so. ``after`` is the copy's own records stamped from ``before``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..log.dlsn import DLSN, INITIAL
from ..log.records import CorruptRecords, decode_records
from ..meta.records import SegmentRecord
from ..names import validate_name
from ..replication.causal import SourceClock, merge
from ..replication.origin import Origin, OriginHeaderError
from .segobject import CorruptObject

Steps = Sequence[tuple[DLSN, Mapping[str, int]]]


@dataclass(frozen=True)
class CopyClock:
    """What a reader of the original log from its beginning held around one segment's records."""

    location: str  # whose local records count (the log's cluster)
    before: dict[str, int]
    after: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"location": self.location, "before": dict(self.before), "after": dict(self.after)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CopyClock:
        def vector(v: Any) -> dict[str, int]:
            if not isinstance(v, dict) or any(int(n) < 0 for n in v.values()):
                raise ValueError(f"malformed version vector {v!r}")
            return {validate_name("location", k): int(n) for k, n in v.items()}

        return cls(validate_name("location", str(raw["location"])), vector(raw["before"]), vector(raw["after"]))


def _no_records_between(segments: Sequence[SegmentRecord], start: DLSN, end: DLSN) -> bool:
    """True when the metadata shows no data record in [``start``, ``end``) (``end`` is a
    segment's first position). A segment missing from ``segments`` there is not known empty."""
    by_seq = {s.seq: s for s in segments}
    for seq in range(start.segment_seq, end.segment_seq):
        seg = by_seq.get(seq)
        if seg is None:
            return False
        after_start = seq > start.segment_seq or (start.entry_id, start.slot) == (0, 0)
        if seg.records > 0 and (after_start or start.entry_id <= seg.last_entry_id):
            return False
    return True


def _merged_steps(vv: Mapping[str, int], steps: Steps, after: DLSN | None, upto: DLSN) -> dict[str, int]:
    out = dict(vv)
    for at, step in steps:
        if (after is None or at > after) and at <= upto:
            out = merge(out, step)
    return out


def vector_before(
    seg: SegmentRecord,
    *,
    segments: Sequence[SegmentRecord],
    steps: Steps,
    derived: Steps,
    previous: CopyClock | None,
    truncation_point: DLSN | None,
) -> dict[str, int] | None:
    """The vector a reader from the log's beginning holds before ``seg``'s first record, or None
    when nothing exact tells it (see the module's docstring). ``previous``: the clock of the
    copy of segment ``seg.seq - 1``; ``segments``: the log's segment records as the metadata
    holds them now; ``steps``/``derived``: the log's clock steps and which of them are derived;
    ``truncation_point``: the log's, None when never truncated."""
    start = DLSN(seg.seq, 0, 0)
    if previous is not None:
        return _merged_steps(previous.after, steps, None, start)
    known: list[tuple[DLSN, Mapping[str, int]]] = [(INITIAL, {}), *((at, vv) for at, vv in derived if at <= start)]
    if truncation_point is not None and truncation_point <= start and not derived:
        known.append((truncation_point, {}))
    for at, vv in sorted(known, key=lambda k: k[0], reverse=True):
        if _no_records_between(segments, at, start):
            return _merged_steps(vv, steps, None, start)  # (steps up to ``at`` are in ``vv`` already)
    return None


def stamp_segment(location: str, seq: int, before: Mapping[str, int], steps: Steps, payloads: Iterable[tuple[int, bytes]]) -> dict[str, int]:
    """The vector after the last record of segment ``seq`` whose entries (id, payload) are
    ``payloads``, stamped from ``before`` as a reader from the beginning stamps them."""
    start = DLSN(seq, 0, 0)
    clock = SourceClock(location, before, base=[s for s in steps if s[0] > start], start=start)
    for entry_id, payload in payloads:
        try:
            records = list(decode_records(payload))
        except CorruptRecords as exc:
            raise CorruptObject(f"segment {seq} entry {entry_id}: malformed records: {exc}") from None
        for slot, record in enumerate(records):
            if record.control:
                continue
            try:
                origin = Origin.from_headers(record.headers)
            except OriginHeaderError as exc:
                raise CorruptObject(f"segment {seq} entry {entry_id}: {exc}") from None
            clock.stamp(origin, DLSN(seq, entry_id, slot))
    return _merged_steps(clock.vv, steps, start, DLSN(seq, 2**62, 0))
