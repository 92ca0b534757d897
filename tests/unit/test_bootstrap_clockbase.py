"""The bootstrap honours a source log's clock base (issue 11): every copied record gets the
vector timestamp a stream reading the same log with ``SourceClock`` gives it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dlctl.log.dlsn import DLSN
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.replication.causal import SourceClock
from dlctl.replication.origin import Origin, decode_vt
from dlctl.spark import clockbase
from dlctl.spark.transform import Clock, ClockEffect

HERE = "east"


def seg(seq: int, entries: int, records: int, min_active: int = 0) -> SegmentRecord:
    return SegmentRecord(seq, SegmentState.COMPLETED, (EnsembleChange(0, ("a", "b", "c")),), 3, 2, 0.0, last_entry_id=entries - 1, records=records, bytes=100, min_active_entry=min_active)


def layout(segments: list[list[dict | None]]) -> list[tuple[SegmentRecord, list[tuple[DLSN, dict | None]]]]:
    """Segments of one record per entry (``None``: written at the source; a dict: replicated
    with that timestamp), numbered from 1."""
    out = []
    for i, recs in enumerate(segments):
        s = seg(i + 1, max(1, len(recs)), len(recs))
        out.append((s, [(DLSN(s.seq, e, 0), vt) for e, vt in enumerate(recs)]))
    return out


def streamed(segs, steps, vv0=None) -> list[dict]:
    """What a stream from the beginning stamps (``SourceClock`` with the clock base)."""
    clock = SourceClock(HERE, vv0 or {}, base=steps, start=DLSN(0, 0, 0))
    out = []
    for _, records in segs:
        for dlsn, vt in records:
            origin = Origin("west", DLSN(9, 9, 9), vt) if vt is not None else None
            out.append(clock.stamp(origin, dlsn))
    return out


def bootstrapped(segs, steps, vv0=None) -> list[dict]:
    """What the bootstrap stamps: per-segment effects folded into start vectors with the steps
    placed by ``clockbase``, then each segment's records stamped by ``transform.Clock``."""
    effects = []
    for _, records in segs:
        effect = ClockEffect()
        for _, vt in records:
            effect = effect.then(ClockEffect(add=1) if vt is None else ClockEffect(0, vt.get(HERE, 0), {k: v for k, v in vt.items() if k != HERE}))
        effects.append(effect)
    copy = [s for s, _ in segs]
    placement = clockbase.place(copy, steps)
    assert placement.inside == []
    starts = clockbase.start_vectors(HERE, effects, placement.at_start, vv0)
    out = []
    for (_, records), start in zip(segs, starts):
        clock = Clock(HERE, start)
        for _, vt in records:
            if vt is None:
                out.append(decode_vt(clock.stamp_local()))
            else:
                clock.stamp_replicated(vt)
                out.append(vt)
    return out


def test_a_raised_clock_at_a_segment_start_counts_from_the_floor_as_a_stream_does():
    segs = layout([[None, None], [None, {"west": 4}], [None, None]])
    steps = ((DLSN(3, 0, 0), {HERE: 100}),)
    got = bootstrapped(segs, steps)
    assert got == streamed(segs, steps)
    assert [vt.get(HERE) for vt in got] == [1, 2, 3, None, 101, 102]


def test_steps_before_the_first_copied_segment_and_in_skipped_segments_apply_before_the_next_copied_one():
    copy = [seg(4, 3, 3), seg(7, 2, 2)]
    steps = ((DLSN(1, 0, 0), {HERE: 10}), (DLSN(5, 0, 0), {HERE: 50, "west": 2}), (DLSN(7, 0, 0), {HERE: 60}), (DLSN(9, 0, 0), {HERE: 99}))
    placement = clockbase.place(copy, steps)
    assert placement.at_start == [{HERE: 10}, {HERE: 60, "west": 2}]
    assert placement.inside == [] and placement.after == 1
    effects = [ClockEffect(add=3), ClockEffect(add=2)]
    assert clockbase.start_vectors(HERE, effects, placement.at_start) == [{HERE: 10}, {HERE: 60, "west": 2}]


def test_a_step_inside_a_copied_segment_is_a_blocker_naming_it():
    copy = [seg(2, 10, 10, min_active=3), seg(3, 10, 10)]
    assert clockbase.blockers(copy, ((DLSN(2, 3, 0), {HERE: 5}),)) == []  # at the first active entry: a boundary
    (problem,) = clockbase.blockers(copy, ((DLSN(2, 5, 1), {HERE: 5}),))
    assert "2/5/1" in problem and "segment 2" in problem
    (problem,) = clockbase.blockers(copy, ((DLSN(3, 9, 0), {HERE: 5}),))
    assert "segment 3" in problem


def test_a_start_vector_for_a_truncated_source_continues_its_count():
    segs = layout([[None, {"west": 1}], [None]])
    vv0 = {HERE: 300, "west": 7}
    assert bootstrapped(segs, (), vv0) == streamed(segs, (), vv0)
    assert bootstrapped(segs, (), vv0)[0] == {HERE: 301, "west": 7}


record = st.one_of(st.none(), st.dictionaries(st.sampled_from([HERE, "west", "north"]), st.integers(1, 40), min_size=1))


@settings(max_examples=300, deadline=None)
@given(
    segments=st.lists(st.lists(record, min_size=1, max_size=6), min_size=1, max_size=6),
    steps=st.lists(st.tuples(st.integers(0, 8), st.dictionaries(st.sampled_from([HERE, "west"]), st.integers(0, 80))), max_size=4),
    vv0=st.dictionaries(st.sampled_from([HERE, "west"]), st.integers(0, 30)),
)
def test_every_bootstrapped_timestamp_equals_the_streamed_one(segments, steps, vv0):
    segs = layout(segments)
    base = tuple(sorted(((DLSN(seq, 0, 0), vv) for seq, vv in steps), key=lambda s: s[0]))
    # (A zero component is no component: the encoded timestamp leaves it out.)
    assert [nonzero(v) for v in bootstrapped(segs, base, vv0)] == [nonzero(v) for v in streamed(segs, base, vv0)]


def nonzero(vt: dict) -> dict:
    return {k: v for k, v in vt.items() if v > 0}
