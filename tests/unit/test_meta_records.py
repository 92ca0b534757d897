"""Metadata records: JSON round trips, quorum validation, write sets under striping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlctl.meta.records import (
    EnsembleChange,
    LogConfig,
    LogRecord,
    SegmentRecord,
    SegmentState,
    log_from_json,
    segment_from_json,
    to_json,
)


def segment(nodes=("a", "b", "c"), w=3, a=2, changes=()):
    return SegmentRecord(1, SegmentState.INPROGRESS, (EnsembleChange(0, tuple(nodes)), *changes), w, a, 0.0)


def test_log_record_round_trip():
    record = LogRecord("orders", 7, 1.5, LogConfig(5, 3, 2, 1024, 60.0), max_segment_seq=4)
    assert log_from_json(to_json(record), "x") == record


def test_segment_record_round_trip():
    record = segment(changes=(EnsembleChange(10, ("a", "d", "c")),)).completed_with(20, 99, 100, 4096, 2.0)
    assert segment_from_json(to_json(record), "x") == record


@pytest.mark.parametrize("e,w,a", [(2, 3, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0)])
def test_quorums_must_nest(e, w, a):
    with pytest.raises(ValueError, match="E >= W >= A >= 1"):
        LogConfig(e, w, a)


@pytest.mark.parametrize("data", [b"", b"[]", b"{", b'{"seq": 1}', b'{"name": "x"}', b"\xff"])
def test_malformed_records_name_the_znode(data):
    with pytest.raises(ValueError, match="/dlctl/c/logs/x"):
        segment_from_json(data, "/dlctl/c/logs/x")
    with pytest.raises(ValueError, match="/dlctl/c/logs/x"):
        log_from_json(data, "/dlctl/c/logs/x")


@given(e=st.integers(1, 9), data=st.data())
def test_write_sets_stripe_round_robin(e, data):
    w = data.draw(st.integers(1, e))
    nodes = tuple(f"n{i}" for i in range(e))
    seg = segment(nodes, w=w, a=1)
    entry = data.draw(st.integers(0, 10_000))
    ws = seg.write_set(entry)
    assert len(ws) == len(set(ws)) == w
    assert ws[0] == nodes[entry % e]
    # Every node stores exactly W of every E consecutive entries: load is even.
    counts = {n: 0 for n in nodes}
    for k in range(entry, entry + e):
        for n in seg.write_set(k):
            counts[n] += 1
    assert set(counts.values()) == {w}


def test_ensemble_changes_apply_from_their_first_entry():
    seg = segment(changes=(EnsembleChange(5, ("a", "x", "c")),))
    assert "b" in seg.write_set(4) and "x" not in seg.write_set(4)
    assert "x" in seg.write_set(5) and "b" not in seg.write_set(5)
