"""Pure planning of re-replication: which entries a lost member held, who can serve each one,
what is lost for good, how the replacement keeps positions, and how a target is chosen."""

from __future__ import annotations

import time

import pytest

from dlctl.log.rereplication import (
    choose_target,
    digest_of,
    entries_on,
    lost_ranges,
    members,
    sources,
    spans,
    with_replacements,
)
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState


def seg(ensembles, w=3, a=2, last=9, state=SegmentState.COMPLETED, min_active=0):
    changes = tuple(EnsembleChange(first, tuple(nodes)) for first, nodes in ensembles)
    return SegmentRecord(1, state, changes, w, a, time.time(), last_entry_id=last, min_active_entry=min_active)


def brute_entries(s: SegmentRecord, node: str) -> list[int]:
    return [e for e in range(s.min_active_entry, s.last_entry_id + 1) if node in s.write_set(e)]


@pytest.mark.parametrize("e,w", [(3, 3), (3, 2), (5, 3), (5, 2), (4, 1), (6, 4)])
def test_entries_on_matches_the_write_sets_for_every_member(e, w):
    nodes = [f"n{i}" for i in range(e)]
    s = seg([(0, nodes), (7, nodes[1:] + ["x"]), (20, ["x"] + nodes[:-1])], w=w, a=1, last=33, min_active=2)
    for node in set(nodes) | {"x", "absent"}:
        assert entries_on(s, node) == brute_entries(s, node)


def test_spans_cover_ensemble_changes_and_skip_truncated_and_empty_ranges():
    s = seg([(0, "abc"), (5, "abd"), (5, "abe"), (8, "abf")], last=9, min_active=3)
    assert [(sp.first, sp.last, sp.nodes) for sp in spans(s)] == [(3, 4, tuple("abc")), (5, 7, tuple("abe")), (8, 9, tuple("abf"))]
    assert spans(seg([(0, "abc")], last=-1)) == []  # an empty segment has nothing to copy


def test_sources_leave_out_every_dead_member():
    s = seg([(0, ["a", "b", "c", "d"])], w=3, last=9)
    assert sources(s, 0, {"b"}) == ("a", "c")
    assert sources(s, 3, {"a", "b", "c"}) == ("d",)


def test_data_loss_is_detected_only_when_a_whole_write_set_is_dead():
    s = seg([(0, "abc")], w=3, last=9)
    assert lost_ranges(s, {"a", "b"}) == []
    (r,) = lost_ranges(s, {"a", "b", "c"})
    assert (r.first, r.last, r.count, r.modulus) == (0, 9, 10, 1)
    assert "entries 0..9" in r.describe()


def test_data_loss_in_a_striped_ensemble_names_exactly_the_lost_ids():
    nodes = ["a", "b", "c", "d", "e"]
    s = seg([(0, nodes)], w=2, a=1, last=23)
    dead = {"b", "c"}
    ranges = lost_ranges(s, dead)
    ids = sorted(i for r in ranges for i in range(r.first, r.last + 1, r.modulus))
    assert ids == [e for e in range(24) if set(s.write_set(e)) <= dead] == [1, 6, 11, 16, 21]
    assert sum(r.count for r in ranges) == 5


def test_data_loss_brute_force_over_ensemble_changes():
    s = seg([(0, "abcde"), (11, "abxde"), (17, "ybxde")], w=3, a=2, last=29)
    for dead in ({"b", "c", "d"}, {"x", "d", "e"}, {"y", "b", "x"}, {"a"}):
        got = sorted(i for r in lost_ranges(s, dead) for i in range(r.first, r.last + 1, r.modulus))
        assert got == [e for e in range(30) if set(s.write_set(e)) <= dead]


def test_replacement_keeps_positions_so_write_sets_keep_their_meaning():
    s = seg([(0, "abc"), (5, "abd")], last=9)
    new = with_replacements(s, {"b": "z"})
    assert [c.nodes for c in new.ensembles] == [tuple("azc"), tuple("azd")]
    for e in range(10):
        assert new.write_set(e) == tuple("z" if n == "b" else n for n in s.write_set(e))
    assert members(new) == {"a", "z", "c", "d"}


REGIONS = {
    "r1a": {"region": "r1", "rack": "k1"}, "r1b": {"region": "r1", "rack": "k2"},
    "r2a": {"region": "r2", "rack": "k1"}, "r2b": {"region": "r2", "rack": "k1"},
    "r3a": {"region": "r3", "rack": "k1"}, "r3b": {"region": "r3", "rack": "k1"},
}


def test_target_prefers_the_lost_agents_region_when_it_has_an_agent_left():
    s = seg([(0, ["r1a", "r2a", "r3a"])])
    avail = {n: i for n, i in REGIONS.items() if n != "r1a"}
    assert choose_target(s, "r1a", avail, lost_region="r1") == "r1b"


def test_target_goes_to_the_region_with_fewest_members_when_the_lost_region_is_gone():
    s = seg([(0, ["r1a", "r2a", "r3a", "r2b"])], w=4)
    avail = {n: i for n, i in REGIONS.items() if not n.startswith("r1")}
    assert choose_target(s, "r1a", avail, lost_region="r1") == "r3b"  # r3 holds 1, r2 holds 2


def test_target_is_never_a_member_or_excluded_and_none_when_nobody_is_left():
    s = seg([(0, ["r1a", "r2a", "r3a"])])
    avail = {n: REGIONS[n] for n in ("r2a", "r3a", "r3b")}
    assert choose_target(s, "r1a", avail, exclude={"r3b"}) is None
    assert choose_target(s, "r1a", avail) == "r3b"


def test_target_choice_is_reproducible_for_the_same_seed():
    s = seg([(0, ["r1a", "r2a", "r3a"])])
    avail = {n: i for n, i in REGIONS.items() if n not in ("r1a", "r1b")}
    picks = {choose_target(s, "r1a", avail, seed=("log", 1, "r1a")) for _ in range(5)}
    assert len(picks) == 1


def test_digest_matches_the_agents_algorithm():
    from agent.storage.store import digest_of as agent_digest

    pairs = [(0, 1), (3, 0xFFFFFFFF), (2**40, 7)]
    assert digest_of(pairs) == agent_digest(pairs)


def test_a_replacement_chosen_under_a_policy_never_breaks_the_region_invariant():
    from dlctl.log.rereplication import choose_target
    from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
    from dlctl.placement import PlacementPolicy

    seg = SegmentRecord(1, SegmentState.COMPLETED, (EnsembleChange(0, ("a", "b", "c")),), 3, 2, 0.0, last_entry_id=9)
    policy = PlacementPolicy(3, 3, 2, min_regions=2)
    only_r2 = {"b": {"region": "r2"}, "c": {"region": "r3"}, "d": {"region": "r2"}}
    # d would put two members in r2, so an ack quorum {b, d} could sit in one region.
    assert choose_target(seg, "a", only_r2, policy=policy) is None
    assert choose_target(seg, "a", only_r2) == "d"  # without a policy nothing forbids it
    with_r1 = {**only_r2, "e": {"region": "r1"}}
    assert choose_target(seg, "a", with_r1, policy=policy) == "e"
