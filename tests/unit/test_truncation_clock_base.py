"""The clock base a truncation records (dlctl.replication.truncation_base, clock): pure logic."""

from __future__ import annotations

import json

import pytest

from dlctl.log.dlsn import DLSN, INITIAL
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.replication.causal import SourceClock
from dlctl.replication.clock import (
    SegmentBase,
    _dump,
    parse_base,
    parse_derived,
    parse_entry_vv,
    parse_segment,
    parse_truncation,
)
from dlctl.replication.origin import Origin
from dlctl.replication.truncation_base import (
    EntryRange,
    Evidence,
    base_without_reading,
    may_hold_records,
    ranges,
    segment_base,
)


def seg(seq: int, last: int, records: int, state: SegmentState = SegmentState.COMPLETED, min_active: int = 0) -> SegmentRecord:
    return SegmentRecord(seq, state, (EnsembleChange(0, ("n1", "n2", "n3")),), 3, 2, 0.0, last_entry_id=last, records=records, min_active_entry=min_active)


def test_ranges_cover_exactly_the_records_between_the_previous_base_and_the_point():
    segments = [seg(1, 9, 50, SegmentState.TRUNCATED), seg(2, 9, 50, SegmentState.PARTIALLY_TRUNCATED, min_active=4), seg(3, 9, 50), seg(4, 9, 50), seg(5, -1, 0, SegmentState.INPROGRESS)]
    # From a base inside entry 4 of segment 2 (slot 3) to a point inside entry 6 of segment 4 (slot 2).
    got = ranges(segments, DLSN(2, 4, 3), DLSN(4, 6, 2))
    assert got == [EntryRange(2, 4, 9, 3, None), EntryRange(3, 0, 9), EntryRange(4, 0, 6, 0, 2)]
    # A point at an entry's start stops before that entry; at a segment's start, before the segment.
    assert ranges(segments, DLSN(3, 0, 0), DLSN(4, 6, 0)) == [EntryRange(3, 0, 9), EntryRange(4, 0, 5)]
    assert ranges(segments, DLSN(3, 0, 0), DLSN(4, 0, 0)) == [EntryRange(3, 0, 9)]
    # Up to the start of the in-progress segment: everything written before it.
    assert ranges(segments, INITIAL, DLSN(5, 0, 0))[-1] == EntryRange(4, 0, 9)
    # Truncated segments hold nothing readable; a partially truncated one from its first active entry.
    assert ranges(segments, INITIAL, DLSN(3, 0, 0)) == [EntryRange(2, 4, 9)]
    # A point past a closed segment's last entry means all of it.
    assert ranges(segments, DLSN(4, 0, 0), DLSN(4, 20, 1)) == [EntryRange(4, 0, 9)]


def test_ranges_refuse_a_point_inside_an_in_progress_segment():
    with pytest.raises(ValueError, match="in progress"):
        ranges([seg(1, 3, 4), seg(2, -1, 0, SegmentState.INPROGRESS)], INITIAL, DLSN(2, 1, 0))


def test_metadata_without_records_needs_no_read():
    segments = [seg(1, 0, 0), seg(2, -1, 0), seg(3, 5, 6)]
    assert not may_hold_records(segments, INITIAL, DLSN(3, 0, 0))
    assert may_hold_records(segments, INITIAL, DLSN(3, 1, 0))
    assert not may_hold_records(segments, DLSN(3, 0, 0), DLSN(3, 0, 0))


def test_base_without_reading_merges_the_steps_a_reader_applies_before_the_point():
    steps = [(DLSN(2, 0, 0), {"a": 5}), (DLSN(4, 0, 0), {"a": 9, "b": 2}), (DLSN(6, 0, 0), {"a": 50})]
    assert base_without_reading({"a": 3, "c": 1}, DLSN(1, 0, 0), steps, DLSN(4, 0, 0)) == {"a": 9, "b": 2, "c": 1}
    # A step at or before the previous base is in its vector already; after the point, not yet.
    assert base_without_reading({"a": 3}, DLSN(2, 0, 0), steps, DLSN(3, 0, 0)) == {"a": 3}


def test_a_step_at_the_truncation_point_makes_a_reader_from_the_point_stamp_as_a_reader_from_the_beginning():
    """The property, on a modelled log: a = local records, replicated records with their vts."""
    log = []
    for i in range(30):
        origin = Origin("b", DLSN(1, i, 0), {"b": i + 1, "a": max(0, i - 3)}) if i % 4 == 0 else None
        log.append((DLSN(1 + i // 10, i % 10, 0), origin))
    dr_step = (DLSN(2, 0, 0), {"a": 100})
    full = SourceClock("a", base=[dr_step])
    stamps = {d: full.stamp(o, d) for d, o in log}
    point = DLSN(2, 5, 0)
    # What truncation_base computes: the clock just before the point, reading from the beginning.
    before = SourceClock("a", base=[dr_step])
    for d, o in log:
        if d >= point:
            break
        before.stamp(o, d)
    vv_at_point = base_without_reading(before.vv, INITIAL, [dr_step], point)
    steps = [dr_step, (point, vv_at_point)]
    from_point = SourceClock("a", base=steps, start=point)
    assert {d: from_point.stamp(o, d) for d, o in log if d >= point} == {d: v for d, v in stamps.items() if d >= point}
    # Without the step a reader from the point counts from the steps alone: different stamps.
    bare = SourceClock("a", base=[dr_step], start=point)
    assert any(bare.stamp(o, d) != stamps[d] for d, o in log if d >= point)
    # The step changes nothing for a reader that still starts at the beginning (a truncation cut
    # short after recording it).
    again = SourceClock("a", base=steps)
    assert {d: again.stamp(o, d) for d, o in log} == stamps


def test_clock_znode_keeps_the_truncation_base_next_to_the_steps():
    body = _dump(((DLSN(3, 0, 0), {"a": 7}),), "truncation base", {"at": "3/0/0", "vv": {"a": 7}})
    assert parse_base(body, "z") == ((DLSN(3, 0, 0), {"a": 7}),)
    assert parse_truncation(body, "z") == (DLSN(3, 0, 0), {"a": 7})
    assert parse_entry_vv(body, "z") is None
    inside = _dump((), "t", {"at": "3/4/2", "vv": {"a": 9}, "entry_vv": {"a": 7}})
    assert parse_entry_vv(inside, "z") == (DLSN(3, 4, 0), {"a": 7})
    assert parse_truncation(_dump((), "dr"), "z") is None  # written before truncation bases existed
    bad = json.dumps({"steps": [], "truncation": {"at": "3/0/0", "vv": {"../x": 1}}}).encode()
    with pytest.raises(ValueError, match="malformed truncation base"):
        parse_truncation(bad, "z")


def test_evidence_of_replication():
    assert not Evidence().replicated
    assert Evidence(pins=["a-to-b"]).replicated and "a-to-b" in Evidence(pins=["a-to-b"]).describe()
    assert Evidence(streams_in=["c-to-a"]).replicated
    assert Evidence(steps=1).replicated
    assert Evidence(truncation_base=True).replicated


# -- the start of the point's segment (what a bootstrap copying it from its first active entry needs) ---

def test_one_scan_from_before_the_segment_records_its_start_vector_and_its_records_before_the_entry_and_the_point():
    start, entry = DLSN(3, 0, 0), DLSN(3, 4, 0)
    # The scan from 2/0/0 read 10 records before 3/0/0 and 7 more before 3/4/0, 9 before the point 3/4/2.
    found = {start: ({"a": 10}, 10), entry: ({"a": 17}, 17)}
    assert segment_base(start, entry, DLSN(2, 0, 0), 19, found, None) == SegmentBase(start, {"a": 10}, 7, 9)
    # A point at the entry's start: the entry is the point.
    assert segment_base(start, DLSN(3, 4, 0), DLSN(2, 0, 0), 17, {start: ({"a": 10}, 10)}, None) == SegmentBase(start, {"a": 10}, 7, 7)


def test_a_scan_from_a_previous_base_inside_the_segment_continues_what_that_base_recorded():
    start = DLSN(3, 0, 0)
    known = SegmentBase(start, {"a": 10}, 5, 6)  # the previous point 3/2/1: 5 records before entry 2, 6 before it
    # New point 3/6/3: the scan from 3/2/1 read 8 records before entry 6, 11 before the point.
    got = segment_base(start, DLSN(3, 6, 0), DLSN(3, 2, 1), 11, {DLSN(3, 6, 0): ({"a": 24}, 8)}, known)
    assert got == SegmentBase(start, {"a": 10}, 6 + 8, 6 + 11)
    # The new point in the previous point's entry: the entry's count stays.
    assert segment_base(start, DLSN(3, 2, 0), DLSN(3, 2, 1), 2, {}, known) == SegmentBase(start, {"a": 10}, 5, 8)
    # The previous base in another segment, or none recorded: nothing tells the segment's start.
    assert segment_base(start, DLSN(3, 2, 0), DLSN(3, 2, 1), 2, {}, SegmentBase(DLSN(2, 0, 0), {}, 0, 0)) is None
    assert segment_base(start, DLSN(3, 2, 0), DLSN(3, 2, 1), 2, {}, None) is None


def test_truncation_steps_are_flagged_derived_and_raising_steps_are_not():
    steps = ((DLSN(3, 0, 0), {"a": 10}), (DLSN(3, 4, 0), {"a": 17}), (DLSN(3, 4, 2), {"a": 19}), (DLSN(5, 0, 0), {"a": 90}))
    record = {"at": "3/4/2", "vv": {"a": 19}, "entry_vv": {"a": 17}, "segment": {"vv": {"a": 10}, "before_entry": 7, "before_point": 9}}
    body = _dump(steps, "truncation base", record, steps[:3])
    assert parse_base(body, "z") == steps
    assert parse_derived(body, "z") == steps[:3]
    assert parse_segment(body, "z") == SegmentBase(DLSN(3, 0, 0), {"a": 10}, 7, 9)
    # A base recorded before steps were flagged: its steps are recognised by the recorded vectors.
    old = _dump(steps, "truncation base", {"at": "3/4/2", "vv": {"a": 19}, "entry_vv": {"a": 17}})
    assert parse_derived(old, "z") == steps[1:3]
    assert parse_segment(old, "z") is None
    # A raising step at a derived step's position but with another vector is not derived.
    assert parse_derived(_dump(((DLSN(3, 4, 2), {"a": 50}),), "dr", record), "z") == ()
    bad = _dump((), "t", dict(record, segment={"vv": {"a": 1}, "before_entry": -1, "before_point": 0}))
    with pytest.raises(ValueError, match="malformed truncation base"):
        parse_segment(bad, "z")
