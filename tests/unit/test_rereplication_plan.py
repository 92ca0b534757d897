"""Pure planning of re-replication: which entries a lost member held, who can serve each one,
what is lost for good, how the replacement keeps positions, and how a target is chosen."""

from __future__ import annotations

import asyncio
import time

import pytest

from dlctl.log.format import Entry, encode
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
from dlctl.log.rereplication_copy import _batches, _Budget, _Piece, _runs, _stages
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
    from agent.storage.entries import digest_of as agent_digest

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


# -- how a copy cuts its work: runs read as ranges, batches added at once --------------------------


def test_runs_are_consecutive_ids_with_the_same_sources_in_the_same_order():
    nodes = ["a", "b", "c", "lost"]
    whole = seg([(0, nodes), (6, ["a", "b", "d", "lost"])], w=4, a=2, last=11)  # E = W: one run per ensemble's sources
    order = lambda s: (lambda e: tuple(n for n in s.write_set(e) if n != "lost"))  # noqa: E731
    able = lambda s: (lambda e: frozenset(order(s)(e)))  # noqa: E731
    # Write sets rotate with the id: the order differs entry by entry, the holders do not.
    assert len(_runs(entries_on(whole, "lost"), order(whole))) > 6
    assert _runs(entries_on(whole, "lost"), order(whole), able(whole)) == [(0, 5, ("a", "b", "c")), (6, 11, ("d", "a", "b"))]
    assert _runs([2, 3, 4], order(whole), able(whole)) == [(2, 4, ("c", "a", "b"))]  # the first id's order
    striped = seg([(0, ["a", "b", "lost"])], w=2, a=2, last=8)  # E > W: sources alternate, runs of one
    runs = _runs(entries_on(striped, "lost"), order(striped), able(striped))
    assert [(f, l) for f, l, _ in runs] == [(1, 1), (2, 2), (4, 4), (5, 5), (7, 7), (8, 8)]
    assert all(src == striped.write_set(f)[:1] or src == tuple(n for n in striped.write_set(f) if n != "lost") for f, _, src in runs)
    assert _runs([3, 4, 6, 7], lambda e: ("a",)) == [(3, 4, ("a",)), (6, 7, ("a",))]  # a gap ends a run


def encoded(first: int, count: int, size: int = 100) -> tuple[bytes, list[int]]:
    es = [encode(Entry(1, 1, first + i, first + i - 1, bytes([i]) * size)) for i in range(count)]
    return b"".join(es), [len(e) for e in es]


def ids_of(batch: list[_Piece]) -> list[int]:
    return [p.first + i for p in batch for i in range(len(p.sizes))]


def test_batches_keep_order_respect_the_cap_and_merge_what_lies_back_to_back():
    buf, sizes = encoded(0, 10)
    n = sizes[0]
    pieces = [_Piece(0, buf, 0, 4 * n, sizes[:4]), _Piece(4, buf, 4 * n, 10 * n, sizes[4:])]
    (batch,) = _batches(pieces, 10 * n)
    assert len(batch) == 1 and (batch[0].start, batch[0].end, ids_of(batch)) == (0, 10 * n, list(range(10)))  # one buffer again
    batches = _batches(pieces, 3 * n)
    assert [ids_of(b) for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert all(sum(p.end - p.start for p in b) <= 3 * n for b in batches)
    assert b"".join(bytes(p.view()) for b in batches for p in b) == buf
    singles = [_Piece(i, bytes(buf[i * n : (i + 1) * n]), 0, n, [n]) for i in (1, 3, 4)]  # a striped replica's: separate buffers
    (batch,) = _batches(singles, 10 * n)
    assert ids_of(batch) == [1, 3, 4] and len(batch) == 3
    assert [ids_of(b) for b in _batches(pieces, n // 2)] == [[i] for i in range(10)]  # an entry over the cap goes alone


def test_the_window_is_shared_by_reads_and_adds_and_each_stage_holds_two_chunks():
    for window in (1, 2, 3, 16, 128, 4096, 100_000):
        per, reading, adding = _stages(window)
        assert reading + adding == max(2, window) and per >= 1
        assert window < 8 or (reading >= 2 * per and adding >= 2 * per)


def test_a_budget_is_taken_whole_so_two_chunks_never_wait_on_each_other():
    async def body():
        budget = _Budget(10)
        await budget.take(6)
        second = asyncio.ensure_future(budget.take(6))  # does not fit: waits, holding nothing
        await asyncio.sleep(0.01)
        assert not second.done() and budget.used == 6
        await budget.give(6)
        await asyncio.wait_for(second, 1)
        assert budget.used == 6
        await budget.give(6)
        await asyncio.wait_for(budget.take(25), 1)  # larger than the limit: goes when alone
        assert budget.used == 25

    asyncio.run(body())
