"""The pure rules of dlctl.log.repair: which members of a completed segment are under-replicated."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dlctl.log.protocol import SegmentInfo
from dlctl.log.repair import Cause, expected_ids, replica_cause, segment_problems
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState


def completed(nodes=("a", "b", "c"), w=3, a=2, last=9, state=SegmentState.COMPLETED, min_active=0, changes=None) -> SegmentRecord:
    ensembles = changes or (EnsembleChange(0, nodes),)
    return SegmentRecord(7, state, ensembles, w, a, 0.0, last_entry_id=last, min_active_entry=min_active)


def info(entries: int, last: int, limbo: bool = False) -> SegmentInfo:
    return SegmentInfo(1, 7, entries, last, last, True, limbo, 100)


def listing(**by_node: SegmentInfo | None) -> dict:
    return {node: ({} if i is None else {(1, 7): i}) for node, i in by_node.items()}


def test_every_member_holding_every_entry_is_healthy():
    seg = completed()
    assert segment_problems("l", 1, seg, listing(a=info(10, 9), b=info(10, 9), c=info(10, 9)), {}) == []


def test_a_member_short_of_the_last_entry_is_under_replicated_with_the_counts():
    (p,) = segment_problems("l", 1, completed(), listing(a=info(10, 9), b=info(4, 3), c=info(10, 9)), {})
    assert (p.node, p.cause, p.expected_entries, p.held_entries) == ("b", Cause.SHORT, 10, 4)


def test_a_member_with_a_gap_is_short_even_when_its_last_entry_is_there():
    (p,) = segment_problems("l", 1, completed(), listing(a=info(10, 9), b=info(10, 9), c=info(9, 9)), {})
    assert (p.node, p.cause) == ("c", Cause.SHORT)


def test_missing_limbo_down_and_unreachable_members_are_told_apart():
    problems = segment_problems("l", 1, completed(nodes=("a", "b", "c", "d"), w=4), listing(a=None, b=info(10, 9, limbo=True)), {"c": "timed out"})
    assert {(p.node, p.cause) for p in problems} == {("a", Cause.MISSING), ("b", Cause.LIMBO), ("c", Cause.UNREACHABLE), ("d", Cause.AGENT_DOWN)}


def test_in_progress_and_truncated_segments_are_not_audited():
    short = listing(a=None, b=None, c=None)
    for state in (SegmentState.INPROGRESS, SegmentState.TRUNCATED):
        assert segment_problems("l", 1, completed(state=state), short, {}) == []


def test_an_empty_completed_segment_needs_nothing_from_anyone():
    assert segment_problems("l", 1, completed(last=-1), listing(a=None, b=None, c=None), {}) == []


def test_truncated_entries_of_a_partially_truncated_segment_are_not_expected():
    seg = completed(state=SegmentState.PARTIALLY_TRUNCATED, min_active=5)
    assert expected_ids(seg, "a") == list(range(5, 10))
    assert replica_cause(expected_ids(seg, "a"), info(5, 9)) == (None, 5)


def test_striped_members_are_expected_to_hold_only_their_write_sets_entries():
    seg = completed(nodes=("a", "b", "c"), w=2, last=5)  # entry e on members e%3 and (e+1)%3
    assert expected_ids(seg, "a") == [0, 2, 3, 5]
    assert segment_problems("l", 1, seg, listing(a=info(4, 5), b=info(4, 4), c=info(4, 5)), {}) == []


def test_an_ensemble_change_moves_later_entries_to_the_new_member():
    seg = completed(changes=(EnsembleChange(0, ("a", "b", "c")), EnsembleChange(5, ("a", "b", "d"))))
    assert expected_ids(seg, "c") == list(range(5))
    assert expected_ids(seg, "d") == list(range(5, 10))
    (p,) = segment_problems("l", 1, seg, listing(a=info(10, 9), b=info(10, 9), c=info(5, 4), d=info(3, 7)), {})
    assert (p.node, p.cause) == ("d", Cause.SHORT)


@given(st.integers(-1, 40), st.integers(0, 40), st.integers(-1, 45))
def test_a_replica_is_healthy_exactly_when_it_is_not_limbo_and_holds_at_least_every_expected_entry(last, held, held_last):
    expected = list(range(last + 1))
    cause, _ = replica_cause(expected, info(held, held_last))
    healthy = not expected or (held_last >= last and held >= len(expected))
    assert (cause is None) == healthy
    assert replica_cause(expected, info(held, held_last, limbo=True))[0] is Cause.LIMBO


def test_fewest_copies_counts_the_worst_write_set():
    from dlctl.log.repair import fewest_copies

    assert fewest_copies(completed(), set()) == 3
    assert fewest_copies(completed(), {"b"}) == 2
    assert fewest_copies(completed(), {"a", "b", "c"}) == 0
    striped = completed(nodes=("a", "b", "c", "d"), w=2, last=7)  # write sets ab, bc, cd, da
    assert fewest_copies(striped, {"a"}) == 1
    assert fewest_copies(striped, {"a", "c"}) == 1
    assert fewest_copies(striped, {"a", "b"}) == 0
    assert fewest_copies(completed(nodes=("a", "b", "c", "d"), w=2, last=0), {"c", "d"}) == 2  # one entry: set ab only


def test_a_member_the_record_calls_short_is_a_problem_even_when_its_listing_looks_whole():
    from dataclasses import replace

    seg = replace(completed(), short={"b": 3})
    (p,) = segment_problems("l", 1, seg, listing(a=info(10, 9), b=info(10, 9), c=info(10, 9)), {})
    assert (p.node, p.cause) == ("b", Cause.RECORDED) and "up to 3" in p.detail
    (down,) = segment_problems("l", 1, seg, listing(a=info(10, 9), c=info(10, 9)), {})
    assert (down.node, down.cause) == ("b", Cause.AGENT_DOWN) and "up to 3" in down.detail
    # A short listing wins over the record: the refill is needed either way, the listing is news.
    (short,) = segment_problems("l", 1, seg, listing(a=info(10, 9), b=info(4, 3), c=info(10, 9)), {})
    assert short.cause is Cause.SHORT


def test_closing_keeps_only_members_short_of_the_end_and_caps_them_at_it():
    seg = completed(state=SegmentState.INPROGRESS, last=-1)
    closed = seg.completed_with(9, 9, 10, 100, 0.0, short={"a": 4, "b": 9, "c": 12})
    assert closed.short == {"a": 4}
    assert closed.lacking(4) == frozenset() and closed.lacking(5) == {"a"}


def test_the_record_of_short_members_round_trips_and_is_left_out_when_empty():
    import json

    import pytest as _pytest

    from dlctl.meta.records import segment_from_json, to_json

    plain = completed()
    assert "short" not in json.loads(to_json(plain))
    marked = plain.completed_with(9, 9, 10, 100, 0.0, short={"b": -1})
    assert segment_from_json(to_json(marked), "x").short == {"b": -1}
    raw = json.loads(to_json(marked))
    raw["short"] = {"b": "three"}
    with _pytest.raises(ValueError, match="'short' must map node ids to entry ids"):
        segment_from_json(json.dumps(raw).encode(), "x")


def test_readers_try_members_the_record_calls_short_last():
    from dlctl.log.readpolicy import order_replicas

    nodes = {n: {"region": "r1", "rack": "k1"} for n in "abc"}
    assert order_replicas(("a", "b", "c"), nodes, "r1", "k1", lacking={"a"}) == ("b", "c", "a")
    assert order_replicas(("a", "b", "c"), nodes, "r1", "k1", suspects={"b"}, lacking={"a"}) == ("c", "b", "a")


def test_digest_verdicts_name_the_minority_and_refuse_to_pick_without_a_majority():
    from dlctl.log.repair import digest_verdicts

    assert digest_verdicts({"a": (10, "x"), "b": (10, "x"), "c": (10, "x")}) == ({}, True)
    odd, majority = digest_verdicts({"a": (10, "x"), "b": (10, "y"), "c": (10, "x")})
    assert set(odd) == {"b"} and majority
    odd, majority = digest_verdicts({"a": (10, "x"), "b": (10, "y")})
    assert set(odd) == {"a", "b"} and not majority
    odd, majority = digest_verdicts({"a": (10, "x"), "b": (10, "y"), "c": (10, "z"), "d": (10, "x")})
    assert set(odd) == {"a", "b", "c", "d"} and not majority  # 2 of 4 is no strict majority
