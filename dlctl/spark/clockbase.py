"""The source log's clock base in a bootstrap copy (issue 11; DESIGN.md §7, §8) — pure logic.

A location that ``dr recover`` brought back has *clock steps* (``dlctl.replication.clock``): from
a position on, its local counter starts at least at a floor, so it never hands out a vector
timestamp twice. Streams honour them through ``dlctl.replication.causal.SourceClock``: a step is
merged into the version vector before the first record at or after its position is stamped
(steps at or before the point where reading starts: at once).

The bootstrap derives each copied segment's starting version vector with a prefix fold over
per-segment clock effects (``dlctl.spark.plan``) and the copy stamps records from there
(``transform.Clock``). A step that lies *at a segment's start* — after every position of the
previous copied segment, at or before this one's first position — is merged into the fold right
before that segment: the vector a stream's ``SourceClock`` holds when it stamps the segment's
first record. Records are then stamped exactly as a stream stamps them.

``dr recover`` starts every step at the first position of a segment not created yet (or at the
log's start, ``dlctl.ops.dr.rebuild``), so every *raising* step it makes is such a boundary step. A raising
step strictly *inside* a copied segment would need the copy to know record positions while
stamping; ``blockers`` makes the plan refuse such a log instead of letting it stamp records
differently from a stream. A *derived* step (a truncation base, ``dlctl.replication.clock``) is
exactly the vector a reader from the beginning holds there: a copy that stamps from the right
vector at the segment's start holds that same vector when it passes the step, so a derived step
inside a copied segment changes nothing and is passed over (``Placement.passed``).

**A partially truncated first segment** (truncated to a point D inside it) is copied from its
first active entry (``min_active_entry``, the entry D lies in; the sink segment gets the same
``min_active_entry``), as the copy always did — not from the segment's start: what lies before
that entry is truncated at the source and stays so at the sink. Its records are stamped from
the vector before that entry (the truncation's derived step there, merged by ``place``), and its
clock effect — from which the next segments' vectors are folded — is the effect of the copied
entries only: for a log of local records, the segment's record count less the records before
the first active entry that the truncation recorded (``skipped``); the clock pre-pass reads the
copied entries only anyway. When the truncation did not record that count (a base written before
it did), the bootstrap reads the log's clocks in the pre-pass instead (``jobplan.plan_job``).

``start_vv`` (``start_vectors(..., vv0)``): the source's version vector before the first copied
record when it is not the empty vector — a source that truncated its log's beginning still
counted those records (``dr recover`` derives it from a checkpoint of a stream from that source).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..log.dlsn import DLSN
from ..meta.records import SegmentRecord
from ..replication.causal import merge

_LAST_SLOT = 2**31  # above any slot: DLSN(seq, entry, _LAST_SLOT) is after every record of the entry


def _first(seg: SegmentRecord) -> DLSN:
    return DLSN(seg.seq, max(seg.min_active_entry, 0), 0)


def _end(seg: SegmentRecord) -> DLSN:
    return DLSN(seg.seq, seg.last_entry_id, _LAST_SLOT)


@dataclass(frozen=True)
class Placement:
    """Where each step of a clock base falls relative to the copied segments."""

    at_start: list[dict[str, int]]  # per copied segment: the merged vectors of the steps at its start
    inside: list[tuple[DLSN, int]] = field(default_factory=list)  # (raising step position, segment seq) strictly inside one
    after: int = 0  # steps after the last copied segment (the stream that continues applies them)
    passed: list[tuple[DLSN, int]] = field(default_factory=list)  # derived steps inside a copied segment: no effect


def _is(step: tuple[Any, Mapping[str, int]], among: Sequence[tuple[Any, Mapping[str, int]]]) -> bool:
    def nz(vv: Mapping[str, int]) -> dict[str, int]:
        return {k: v for k, v in vv.items() if v > 0}

    return any(step[0] == d[0] and nz(step[1]) == nz(d[1]) for d in among)


def place(copy: Sequence[SegmentRecord], steps: Sequence[tuple[Any, Mapping[str, int]]], derived: Sequence[tuple[Any, Mapping[str, int]]] = ()) -> Placement:
    """Assign every step to the copied segment it precedes, or find it inside one (``derived``:
    the steps that are exact truncation bases, passed over inside a segment)."""
    at_start: list[dict[str, int]] = [{} for _ in copy]
    inside: list[tuple[DLSN, int]] = []
    passed: list[tuple[DLSN, int]] = []
    after = 0
    for start, vv in sorted(steps, key=lambda s: s[0]):
        index = next((i for i, seg in enumerate(copy) if start <= _first(seg)), None)
        within = None
        if index is None:
            if copy and start <= _end(copy[-1]):
                within = copy[-1].seq
            else:
                after += 1
                continue
        elif index > 0 and start <= _end(copy[index - 1]):
            within = copy[index - 1].seq
        if within is not None:
            (passed if _is((start, vv), derived) else inside).append((start, within))
            continue
        at_start[index] = merge(at_start[index], vv)
    return Placement(at_start, inside, after, passed)


def blockers(copy: Sequence[SegmentRecord], steps: Sequence[tuple[Any, Mapping[str, int]]], derived: Sequence[tuple[Any, Mapping[str, int]]] = ()) -> list[str]:
    """Why the copy cannot stamp records exactly as a stream would (empty: it can)."""
    return [
        f"the source log's clock base has a raising step (not a truncation base) at {start} inside segment {seq}: the bootstrap copies whole "
        "segments and applies raising clock steps only at segment starts (where `dr recover` makes them), so it would stamp that "
        "segment's records differently from a stream; stream this log from a position the source still holds instead"
        for start, seq in place(copy, steps, derived).inside
    ]


def skipped(first: SegmentRecord, recorded: Mapping[tuple[int, int], int]) -> int | None:
    """The data records of the first copied segment before its first copied entry (the copy
    leaves them out): 0 for a segment copied from its start, else what the truncation that made
    that entry the first active one recorded (``recorded``: (segment, entry) -> records), None
    when nothing recorded it."""
    entry = max(first.min_active_entry, 0)
    if entry == 0:
        return 0
    return recorded.get((first.seq, entry))


def start_vectors(location: str, effects: Sequence[Any], at_start: Sequence[Mapping[str, int]] | None = None, vv0: Mapping[str, int] | None = None) -> list[dict[str, int]]:
    """Each segment's starting version vector: the prefix fold of the segments' clock effects
    (``ClockEffect.apply``) from ``vv0``, with the clock steps at each segment's start merged in
    before it (``at_start`` from ``place``)."""
    out = []
    vv = dict(vv0 or {})
    steps = list(at_start) if at_start is not None else [{} for _ in effects]
    for effect, step in zip(effects, steps):
        if step:
            vv = merge(vv, step)
        out.append(dict(vv))
        vv = effect.apply(location, vv)
    return out


__all__ = ["Placement", "blockers", "place", "skipped", "start_vectors"]
