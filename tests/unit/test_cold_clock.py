"""The clock a segment copy carries (dlctl.cold.clock): where the vector before a segment comes
from, and the stamping of a copy's records. The oracle is counting by hand: a local record takes
the vector so far with its own location's counter plus one; a replicated one brings its own
vector time; a clock step raises the vector from its position on."""

from __future__ import annotations

import dataclasses

import pytest

from dlctl.cold.clock import CopyClock, stamp_segment, vector_before
from dlctl.cold.manifest import SegmentManifest
from dlctl.cold.segobject import CorruptObject
from dlctl.log.dlsn import DLSN
from dlctl.log.records import Record, encode_records
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.replication.origin import Origin


def segment(seq: int, records: int, state: SegmentState = SegmentState.COMPLETED) -> SegmentRecord:
    return SegmentRecord(seq, state, (EnsembleChange(0, ("n1", "n2", "n3")),), 3, 2, 1.0, last_entry_id=max(records - 1, 0), records=records)


def local(txid: int) -> Record:
    return Record(txid, b"x")


def replicated(txid: int, vt: dict[str, int]) -> Record:
    return Record(txid, b"r", headers=Origin("west", DLSN(1, 0, txid), vt).headers())


def test_the_first_segment_counts_from_the_beginning_and_its_steps():
    segs = [segment(1, 3), segment(2, 3)]
    raised = [(DLSN(1, 0, 0), {"east": 5})]
    assert vector_before(segs[0], segments=segs, steps=raised, derived=(), previous=None, truncation_point=None) == {"east": 5}
    # The second has records before it and no copy of the first: nothing exact tells its vector.
    assert vector_before(segs[1], segments=segs, steps=(), derived=(), previous=None, truncation_point=None) is None
    # With the copy of the first, its ``after`` and the steps at the second's start.
    prev = CopyClock("east", {}, {"east": 3, "west": 2})
    got = vector_before(segs[1], segments=segs, steps=[(DLSN(2, 0, 0), {"east": 10})], derived=(), previous=prev, truncation_point=None)
    assert got == {"east": 10, "west": 2}


def test_a_truncation_base_or_an_empty_gap_is_an_exact_start():
    segs = [segment(3, 0), segment(4, 2)]  # 1 and 2 left the cluster without copies
    base = [(DLSN(3, 0, 0), {"east": 40, "west": 7})]
    assert vector_before(segs[1], segments=segs, steps=base, derived=base, previous=None, truncation_point=DLSN(3, 0, 0)) == {"east": 40, "west": 7}
    # Segment 3 holds a record before 4: the base at 3 does not reach 4.
    busy = [segment(3, 1), segment(4, 2)]
    assert vector_before(busy[1], segments=busy, steps=base, derived=base, previous=None, truncation_point=DLSN(3, 0, 0)) is None
    # A base inside segment 3 past its last entry: nothing in between.
    late = [(DLSN(3, 5, 0), {"east": 41})]
    assert vector_before(busy[1], segments=busy, steps=late, derived=late, previous=None, truncation_point=DLSN(3, 5, 0)) == {"east": 41}
    # Truncated without a base (not replicated then): readers from the point count from its steps.
    assert vector_before(segs[1], segments=segs, steps=[], derived=(), previous=None, truncation_point=DLSN(3, 0, 0)) == {}
    # Deleted segments between the beginning and the segment: unknown, never guessed.
    assert vector_before(segs[1], segments=segs, steps=[], derived=(), previous=None, truncation_point=None) is None


def test_stamping_a_copy_counts_local_records_and_merges_replicated_ones():
    entries = [(0, encode_records([local(1), replicated(2, {"west": 4, "east": 1})])), (1, encode_records([local(3)]))]
    steps = [(DLSN(7, 1, 0), {"east": 20})]  # raised before entry 1
    after = stamp_segment("east", 7, {"east": 1}, steps, entries)
    # east 2 (local), then west's (4, east 1) merged, then the step (east 20), then east 21.
    assert after == {"east": 21, "west": 4}
    # A step after the last record still belongs to what follows the segment.
    assert stamp_segment("east", 7, {}, [(DLSN(7, 9, 0), {"east": 50})], [(0, encode_records([local(1)]))]) == {"east": 50}
    with pytest.raises(CorruptObject, match="entry 0"):
        stamp_segment("east", 7, {}, [], [(0, b"\x07garbage")])


def test_a_manifest_keeps_its_clock_and_refuses_a_malformed_one():
    record = segment(2, 1)
    clock = CopyClock("east", {"east": 3}, {"east": 4, "west": 1})
    manifest = SegmentManifest.of("east", "orders", 9, record, b"data", clock)
    again = SegmentManifest.from_json(manifest.to_json(), "m")
    assert again.clock == clock
    assert SegmentManifest.from_json(dataclasses.replace(manifest, clock=None).to_json(), "m").clock is None
    bad = manifest.to_json().replace(b'"west": 1', b'"west": -1')
    with pytest.raises(CorruptObject, match="malformed manifest"):
        SegmentManifest.from_json(bad, "m")
    escaping = manifest.to_json().replace(b'"location": "east"', b'"location": "../x"')
    with pytest.raises(CorruptObject, match="malformed manifest"):
        SegmentManifest.from_json(escaping, "m")
