"""The pure decision rules of fencing and recovery, checked exhaustively and against a model.

The model: a writer acknowledged a prefix of entries, each on at least A replicas of its write
set; entries after that prefix are on arbitrary replicas (never acknowledged). Some replicas
are unreachable. Whatever the layout, recovery driven by these rules must either stay undecided
or end at or after the last acknowledged entry, and only ever recover entries that exist.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlctl.log import format as fmt
from dlctl.log.records import Record, encode_records
from dlctl.log.quorum import can_still_ack, fence_covered, fence_possible, fence_quorum, write_set_of, write_sets
from dlctl.log.recovery import TOTALS_RECORD_SIZE, Verdict, entry_summary, entry_verdict, recovery_end, totals_record
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState


def quorums(max_e: int = 6):
    return [(e, w, a) for e in range(1, max_e + 1) for w in range(1, e + 1) for a in range(1, w + 1)]


def ensemble_of(e: int) -> tuple[str, ...]:
    return tuple(f"n{i}" for i in range(e))


def subsets(items):
    return (set(c) for r in range(len(items) + 1) for c in itertools.combinations(items, r))


# -- write sets ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("e", "w", "a"), quorums())
def test_write_sets_stripe_round_robin_and_match_the_segment_metadata(e, w, a):
    ensemble = ensemble_of(e)
    seg = SegmentRecord(1, SegmentState.INPROGRESS, (EnsembleChange(0, ensemble),), w, a, 0.0)
    for entry_id in range(3 * e):
        ws = write_set_of(ensemble, w, entry_id)
        assert ws == seg.write_set(entry_id)
        assert len(set(ws)) == w and ws[0] == ensemble[entry_id % e]
    sets = write_sets(ensemble, w)
    assert len(sets) == e
    for member in ensemble:  # striping spreads the load evenly: each member is in W of E write sets
        assert sum(member in ws for ws in sets) == w


def test_fence_quorum_is_w_minus_a_plus_1():
    assert [fence_quorum(w, a) for w, a in ((3, 2), (3, 3), (3, 1), (5, 3), (2, 2))] == [2, 1, 3, 3, 1]


# -- fencing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("e", "w", "a"), quorums(5))
def test_fence_coverage_means_the_old_writer_can_never_reach_ack_quorum(e, w, a):
    """Exhaustive over every fenced set: covered exactly when no write set keeps A unfenced members."""
    ensemble = ensemble_of(e)
    for fenced in subsets(ensemble):
        old_writer_can_ack = any(sum(m not in fenced for m in ws) >= a for ws in write_sets(ensemble, w))
        assert fence_covered(ensemble, w, a, fenced) == (not old_writer_can_ack), fenced


@pytest.mark.parametrize(("e", "w", "a"), quorums(5))
def test_fencing_is_possible_exactly_when_the_reachable_replicas_can_cover_it(e, w, a):
    ensemble = ensemble_of(e)
    for unreachable in subsets(ensemble):
        assert fence_possible(ensemble, w, a, unreachable) == fence_covered(ensemble, w, a, set(ensemble) - unreachable)


def test_fencing_with_e_greater_than_w_needs_every_write_set_covered():
    ensemble = ensemble_of(5)  # E=5, W=3, A=2: 2 of every 3 consecutive members
    assert not fence_covered(ensemble, 3, 2, {"n0", "n2", "n4"})  # (n1, n2, n3) has one fenced
    assert fence_covered(ensemble, 3, 2, {"n0", "n1", "n2", "n3"})  # (n4, n0, n1) has 2, (n3, n4, n0) has 2
    assert not fence_possible(ensemble, 3, 2, {"n1", "n2"})  # (n1, n2, n3) keeps only n3
    assert not fence_possible(ensemble, 3, 2, {"n1", "n3"})  # on a ring of 5, any two share a write set
    assert fence_possible(ensemble, 3, 2, {"n1"})


def test_for_e_equal_w_any_w_minus_a_plus_1_replicas_fence_the_segment():
    ensemble = ensemble_of(3)
    assert fence_covered(ensemble, 3, 2, {"n0", "n2"})
    assert not fence_covered(ensemble, 3, 2, {"n1"})


# -- entry verdicts --------------------------------------------------------------------------------


def test_entry_verdict_rules():
    assert entry_verdict(3, 2, found=True, absent=2, pending=0) is Verdict.FOUND
    assert entry_verdict(3, 2, found=False, absent=2, pending=1) is Verdict.ABSENT
    assert entry_verdict(3, 2, found=False, absent=1, pending=1) is Verdict.PENDING
    assert entry_verdict(3, 2, found=False, absent=1, pending=0) is Verdict.UNKNOWN  # the third is unreachable
    assert entry_verdict(3, 3, found=False, absent=1, pending=2) is Verdict.ABSENT  # A = W: one absence proves it
    assert entry_verdict(3, 1, found=False, absent=2, pending=0) is Verdict.UNKNOWN  # A = 1: all W must lack it


def progressive_verdict(w: int, a: int, holders: set[int], reachable: set[int], order: list[int]) -> list[Verdict]:
    """Replies of the reachable replicas arriving in ``order``; the verdict after each one."""
    verdicts = []
    found, absent = False, 0
    answering = [r for r in order if r in reachable]
    for i, replica in enumerate(answering):
        if replica in holders:
            found = True
        else:
            absent += 1
        verdicts.append(entry_verdict(w, a, found=found, absent=absent, pending=len(answering) - i - 1))
    if not answering:
        verdicts.append(entry_verdict(w, a, found=False, absent=0, pending=0))
    return verdicts


@settings(max_examples=300)
@given(data=st.data())
def test_an_entry_on_an_ack_quorum_is_never_judged_absent(data):
    w = data.draw(st.integers(1, 7))
    a = data.draw(st.integers(1, w))
    holders = data.draw(st.sets(st.integers(0, w - 1), min_size=a))
    reachable = data.draw(st.sets(st.integers(0, w - 1)))
    order = data.draw(st.permutations(list(range(w))))
    verdicts = progressive_verdict(w, a, holders, reachable, order)
    assert Verdict.ABSENT not in verdicts
    assert verdicts[-1] is (Verdict.FOUND if holders & reachable else Verdict.UNKNOWN)


@settings(max_examples=300)
@given(data=st.data())
def test_an_entry_on_no_replica_is_judged_absent_once_enough_replicas_answer(data):
    w = data.draw(st.integers(1, 7))
    a = data.draw(st.integers(1, w))
    reachable = data.draw(st.sets(st.integers(0, w - 1)))
    order = data.draw(st.permutations(list(range(w))))
    final = progressive_verdict(w, a, set(), reachable, order)[-1]
    assert final is (Verdict.ABSENT if len(reachable) >= fence_quorum(w, a) else Verdict.UNKNOWN)


def test_can_still_ack():
    assert can_still_ack(1, 1, 2) and can_still_ack(2, 0, 2)
    assert not can_still_ack(1, 0, 2) and not can_still_ack(0, 1, 2)


# -- where recovery ends ---------------------------------------------------------------------------


def test_recovery_ends_before_the_first_absent_entry_and_not_while_something_is_undecided():
    F, A, P, U = Verdict.FOUND, Verdict.ABSENT, Verdict.PENDING, Verdict.UNKNOWN
    assert recovery_end(5, [A]) == 4  # nothing past the LAC
    assert recovery_end(5, [F, F, A, F]) == 6  # entries after the first absent one are never recovered
    assert recovery_end(0, [A]) == -1  # an empty segment
    assert recovery_end(5, [F, P, A]) is None
    assert recovery_end(5, [F, U, A]) is None
    assert recovery_end(5, [F, F]) is None  # not yet seen its end


@settings(max_examples=400)
@given(data=st.data())
def test_model_recovery_keeps_every_acknowledged_entry_and_invents_none(data):
    """E >= W >= A, acknowledged prefix on >= A replicas of each write set, garbage after it,
    some replicas unreachable: the verdict-driven recovery never ends before the acknowledged
    prefix, and every entry it keeps exists on some reachable replica."""
    e = data.draw(st.integers(1, 6))
    w = data.draw(st.integers(1, e))
    a = data.draw(st.integers(1, w))
    ensemble = ensemble_of(e)
    acked = data.draw(st.integers(-1, 6))  # last acknowledged entry id
    total = data.draw(st.integers(acked + 1, acked + 5))  # entries that reached any replica: 0..total-1
    holdings: dict[int, set[str]] = {}
    for entry_id in range(total):
        ws = list(write_set_of(ensemble, w, entry_id))
        min_size = a if entry_id <= acked else 0
        holdings[entry_id] = set(data.draw(st.lists(st.sampled_from(ws), min_size=min_size, unique=True)))
        if entry_id <= acked:
            assert len(holdings[entry_id]) >= a
    reachable = data.draw(st.sets(st.sampled_from(ensemble)))
    start = data.draw(st.integers(0, acked + 1))  # the LAC seen + 1, never past what was acknowledged

    verdicts = []
    for entry_id in range(start, total + 2):
        ws = write_set_of(ensemble, w, entry_id)
        have = holdings.get(entry_id, set())
        found = bool(have & reachable)
        absent = sum(1 for m in ws if m in reachable and m not in have)
        verdicts.append(entry_verdict(w, a, found=found, absent=absent, pending=0))
        if verdicts[-1] is not Verdict.FOUND:
            break
    end = recovery_end(start, verdicts)
    if end is not None:
        assert end >= acked, "an acknowledged entry was lost"
        assert all(holdings.get(x, set()) & reachable for x in range(start, end + 1))
    else:
        assert Verdict.UNKNOWN in verdicts


# -- the totals record that ends every entry -------------------------------------------------------


def entry_with(records: list[Record]) -> bytes:
    return fmt.encode(fmt.Entry(1, 1, 0, -1, encode_records(records)))


def test_entry_summary_reads_the_totals_record_and_ignores_entries_without_one():
    data = [Record(txid=7, payload=b"a"), Record(txid=8, payload=b"b")]
    summary = entry_summary(entry_with([*data, totals_record(8, 42, 4096)]))
    assert (summary.records, summary.bytes, summary.last_txid) == (42, 4096, 8)
    assert entry_summary(entry_with(data)) is None
    assert entry_summary(entry_with([Record(txid=9, payload=b"", control=True)])) is None  # a control record, but not totals
    assert TOTALS_RECORD_SIZE == len(encode_records([totals_record(2**62, 2**40, 2**50)]))


def test_unclean_recovery_is_refused_unless_the_log_is_named_to_confirm_it():
    from dlctl.errors import ExitCode, RefusedError
    from dlctl.ops.recover import recover_plan

    for confirm in (None, "other-log"):
        with pytest.raises(RefusedError) as refused:
            recover_plan(None, "orders", force=False, timeout=1.0, accept_data_loss=True, confirm=confirm)  # type: ignore[arg-type]
        assert refused.value.exit_code is ExitCode.REFUSED and "--confirm orders" in refused.value.hint
