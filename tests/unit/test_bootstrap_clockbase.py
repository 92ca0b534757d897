"""The bootstrap honours a source log's clock base (issue 11): every copied record gets the
vector timestamp a stream reading the same log with ``SourceClock`` gives it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dlctl.log.dlsn import DLSN
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.replication.causal import SourceClock
from dlctl.replication.origin import Origin, decode_vt
from dlctl.replication.truncation_base import base_without_reading
from dlctl.spark import clockbase
from dlctl.spark.plan import local_effect
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


# -- a source truncated inside a segment (derived steps, the records left out) -----------------------

def entry_log(segments: list[list[list[dict | None]]]) -> list[tuple[SegmentRecord, list[tuple[DLSN, dict | None]]]]:
    """Segments of entries of records (``None``: local; a dict: replicated with that timestamp)."""
    out = []
    for i, entries in enumerate(segments):
        records = [(DLSN(i + 1, e, s), vt) for e, recs in enumerate(entries) for s, vt in enumerate(recs)]
        out.append((seg(i + 1, len(entries), len(records)), records))
    return out


def vv_before(log, raising, position: DLSN) -> dict[str, int]:
    """What a reader from the beginning holds just before ``position`` (what a truncation records)."""
    clock = SourceClock(HERE, base=raising, start=DLSN(0, 0, 0))
    for _, records in log:
        for dlsn, vt in records:
            if dlsn >= position:
                return base_without_reading(clock.vv, DLSN(0, 0, 0), raising, position)
            clock.stamp(Origin("west", DLSN(9, 9, 9), vt) if vt is not None else None, dlsn)
    return base_without_reading(clock.vv, DLSN(0, 0, 0), raising, position)


def truncated_at(log, raising, point: DLSN, *, marked: bool = True):
    """The copy a bootstrap makes after a truncation to ``point``, the derived steps and the
    records of the point's segment before its entry, as ``truncation_base.prepare`` records them."""
    entry, start = DLSN(point.segment_seq, point.entry_id, 0), DLSN(point.segment_seq, 0, 0)
    derived = [(point, vv_before(log, raising, point))]
    if point.slot > 0:
        derived.append((entry, vv_before(log, raising, entry)))
    if point > start:
        derived.append((start, vv_before(log, raising, start)))
    kept = []
    for s, records in log:
        if s.seq < point.segment_seq:
            continue
        if s.seq == point.segment_seq and marked and point.entry_id > 0:
            s = SegmentRecord(s.seq, SegmentState.PARTIALLY_TRUNCATED, s.ensembles, 3, 2, 0.0, last_entry_id=s.last_entry_id, records=s.records, bytes=100, min_active_entry=point.entry_id)
        kept.append((s, [(d, vt) for d, vt in records if d >= DLSN(s.seq, s.min_active_entry, 0)]))
    skipped = sum(1 for d, _ in next(r for s, r in log if s.seq == point.segment_seq) if d < entry)
    return kept, sorted(derived, key=lambda d: d[0]), {(point.segment_seq, point.entry_id): skipped}


def copied_stamps(kept, steps, derived, recorded, *, local: bool) -> dict[DLSN, dict]:
    """What the bootstrap stamps the copied records with (``job._tasks``'s arithmetic)."""
    copy = [s for s, _ in kept]
    placement = clockbase.place(copy, steps, derived)
    assert placement.inside == [], clockbase.blockers(copy, steps, derived)
    if local:
        skipped = clockbase.skipped(copy[0], recorded)
        assert skipped is not None
        effects = [local_effect(s, skipped if i == 0 else 0) for i, s in enumerate(copy)]
    else:  # the clock pre-pass: the effect of the entries the copy reads
        effects = []
        for _, records in kept:
            effect = ClockEffect()
            for _, vt in records:
                effect = effect.then(ClockEffect(add=1) if vt is None else ClockEffect(0, vt.get(HERE, 0), {k: v for k, v in vt.items() if k != HERE}))
            effects.append(effect)
    out = {}
    for (_, records), start in zip(kept, clockbase.start_vectors(HERE, effects, placement.at_start)):
        clock = Clock(HERE, start)
        for dlsn, vt in records:
            if vt is None:
                out[dlsn] = decode_vt(clock.stamp_local())
            else:
                clock.stamp_replicated(vt)
                out[dlsn] = vt
    return out


def streamed_stamps(log, raising) -> dict[DLSN, dict]:
    clock = SourceClock(HERE, base=raising, start=DLSN(0, 0, 0))
    return {d: clock.stamp(Origin("west", DLSN(9, 9, 9), vt) if vt is not None else None, d) for _, records in log for d, vt in records}


def test_truncation_steps_inside_the_first_copied_segment_are_passed_over_and_its_left_out_records_are_not_counted():
    log = entry_log([[[None] * 3] * 4, [[None] * 3] * 4, [[None] * 2] * 3])  # 12, 12, 6 local records
    point = DLSN(2, 2, 1)  # inside entry 2 of segment 2: 6 records of it lie before the entry
    kept, derived, recorded = truncated_at(log, (), point)
    assert recorded == {(2, 2): 6}
    assert clockbase.blockers([s for s, _ in kept], derived, derived) == []
    placement = clockbase.place([s for s, _ in kept], derived, derived)
    assert placement.passed == [(point, 2)] and placement.at_start[0] == {HERE: 18}
    got = copied_stamps(kept, derived, derived, recorded, local=True)
    want = streamed_stamps(log, ())
    assert got == {d: want[d] for d in got} and min(got) == DLSN(2, 2, 0)
    assert got[DLSN(3, 0, 0)] == {HERE: 25}
    # Counting the whole segment (what the fold did before) hands the next segment other stamps.
    copy = [s for s, _ in kept]
    wrong = clockbase.start_vectors(HERE, [local_effect(s) for s in copy], placement.at_start)
    assert wrong[1] == {HERE: 30} != {HERE: 24}


def test_a_point_at_an_entry_start_inside_a_segment_needs_no_passing_but_the_left_out_count():
    log = entry_log([[[None] * 2] * 5, [[None] * 2] * 2])
    kept, derived, recorded = truncated_at(log, (), DLSN(1, 3, 0))
    assert clockbase.place([s for s, _ in kept], derived, derived).passed == []
    got = copied_stamps(kept, derived, derived, recorded, local=True)
    want = streamed_stamps(log, ())
    assert got == {d: want[d] for d in got} and got[DLSN(2, 0, 0)] == {HERE: 11}


def test_a_raising_step_inside_a_copied_segment_still_refuses_with_a_hint_that_can_be_followed():
    log = entry_log([[[None] * 3] * 4, [[None] * 3] * 4])
    kept, derived, _ = truncated_at(log, (), DLSN(1, 1, 1))
    raising = (DLSN(1, 2, 0), {HERE: 100})
    (problem,) = clockbase.blockers([s for s, _ in kept], [*derived, raising], derived)
    assert "raising step" in problem and "1/2/0" in problem and "segment 1" in problem
    assert "from the start" not in problem  # the start is gone at a truncated source
    # The same vector at the same place as a derived step is no raising step only if it is one.
    assert clockbase.blockers([s for s, _ in kept], [raising], [(DLSN(1, 2, 0), {HERE: 99})]) != []


def test_the_left_out_count_is_unknown_without_a_recorded_one():
    first = seg(4, 10, 30, min_active=5)
    assert clockbase.skipped(first, {}) is None
    assert clockbase.skipped(first, {(4, 3): 9}) is None  # another entry: another truncation
    assert clockbase.skipped(first, {(4, 5): 12}) == 12
    assert clockbase.skipped(seg(4, 10, 30), {}) == 0  # copied from its start: nothing left out


record_or_local = st.one_of(st.none(), st.none(), st.dictionaries(st.sampled_from([HERE, "west", "north"]), st.integers(1, 40), min_size=1))


@settings(max_examples=300, deadline=None)
@given(
    shape=st.lists(st.lists(st.lists(record_or_local, min_size=1, max_size=4), min_size=1, max_size=5), min_size=1, max_size=4),
    where=st.tuples(st.integers(0, 10), st.integers(0, 10), st.integers(0, 10)),
    raising=st.lists(st.tuples(st.integers(0, 5), st.dictionaries(st.sampled_from([HERE, "west"]), st.integers(0, 80))), max_size=3),
    marked=st.booleans(),
)
def test_every_record_copied_after_a_truncation_anywhere_gets_the_streamed_timestamp(shape, where, raising, marked):
    log = entry_log(shape)
    s_i = where[0] % len(shape)
    e_i = where[1] % len(shape[s_i])
    point = DLSN(s_i + 1, e_i, where[2] % len(shape[s_i][e_i]))
    # ``dr recover`` raises only at segment starts (or at the log's start).
    steps_raising = tuple(sorted(((DLSN(seq, 0, 0), vv) for seq, vv in raising), key=lambda s: s[0]))
    kept, derived, recorded = truncated_at(log, steps_raising, point, marked=marked)
    steps = tuple(sorted((*steps_raising, *derived), key=lambda s: s[0]))
    local = all(vt is None for _, records in log for _, vt in records)
    got = copied_stamps(kept, steps, derived, recorded, local=local)
    want = streamed_stamps(log, steps_raising)
    assert [nonzero(v) for v in got.values()] == [nonzero(want[d]) for d in got]
    assert min(got) == DLSN(point.segment_seq, point.entry_id if marked else 0, 0)
