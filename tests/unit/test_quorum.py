"""The quorum arithmetic every part of the log takes its striping from (dlctl.log.quorum),
checked against formulations of its own: membership by position, and the intersection
properties the numbers exist for, by brute force over small ensembles."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given
from hypothesis import strategies as st

from dlctl.log.quorum import fence_quorum, lac_quorum, stores, write_set_of, write_sets
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState


@st.composite
def shapes(draw: st.DrawFn) -> tuple[int, int, int]:
    e = draw(st.integers(1, 6))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    return e, w, a


@given(shapes(), st.integers(0, 1000))
def test_a_member_stores_an_entry_when_its_position_follows_the_entrys_start_by_less_than_w(shape, entry_id):
    e, w, _ = shape
    ensemble = [f"n{i}" for i in range(e)]
    for position, node in enumerate(ensemble):
        assert stores(ensemble, w, node, entry_id) == ((position - entry_id) % e < w)
    assert len(set(write_set_of(ensemble, w, entry_id))) == w
    # The segment record stripes the same way (it takes it from here; this pins both).
    seg = SegmentRecord(1, SegmentState.INPROGRESS, (EnsembleChange(0, tuple(ensemble)),), w, 1, 0.0)
    assert seg.write_set(entry_id) == write_set_of(ensemble, w, entry_id)


@given(shapes())
def test_lac_answers_from_e_minus_a_plus_1_members_meet_every_ack_quorum_and_one_fewer_may_not(shape):
    e, w, a = shape
    ensemble = [f"n{i}" for i in range(e)]
    quorums = [set(q) for ws in write_sets(ensemble, w) for q in combinations(ws, a)]
    need = lac_quorum(e, a)
    assert all(set(s) & q for s in combinations(ensemble, need) for q in quorums)
    if need > 1:  # one answer fewer can miss some ack quorum entirely
        assert any(not (set(s) & q) for s in combinations(ensemble, need - 1) for q in quorums)


@given(shapes())
def test_fencing_w_minus_a_plus_1_of_a_write_set_leaves_no_ack_quorum_and_one_fewer_does(shape):
    e, w, a = shape
    ensemble = [f"n{i}" for i in range(e)]
    for ws in write_sets(ensemble, w):
        for fenced in combinations(ws, fence_quorum(w, a)):
            assert len(set(ws) - set(fenced)) < a
        if fence_quorum(w, a) > 1:
            assert len(set(ws) - set(ws[: fence_quorum(w, a) - 1])) >= a
