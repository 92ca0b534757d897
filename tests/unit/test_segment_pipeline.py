"""The writer's per-segment pipeline (dlctl.log.segment_pipeline), without agents: a pending
entry's ack set against a count of its own, the in-order acknowledgement (LAC, DLSNs, totals)
under every order in which quorums form, striping and failed members, fencing, silence and
sealing. The members are scripted fakes; the answers are delivered by hand."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dlctl.log import format as fmt
from dlctl.log.dlsn import DLSN
from dlctl.log.errors import AgentUnavailableError, FencedError
from dlctl.log.quorum import write_set_of
from dlctl.log.readpolicy import AdaptiveTimeout
from dlctl.log.recovery import TOTALS_RECORD_SIZE
from dlctl.log.segment_pipeline import Batch, PendingEntry, SegmentPipeline
from dlctl.meta.records import NO_ENTRY, EnsembleChange, SegmentRecord, SegmentState, Versioned

LOG_ID = 7


class Member:
    """A scripted replica: keeps each add's answer callback, by entry id, until a test answers."""

    def __init__(self) -> None:
        self.answer: dict[int, Callable[[BaseException | None], None]] = {}

    def add_nowait(self, encoded: bytes, on_done: Callable[[BaseException | None], None], *, flush: bool = False) -> bool:
        self.answer[fmt.stored_entry_id(encoded)] = on_done
        return True

    async def add(self, encoded: bytes) -> Any:  # never used: add_nowait always takes it
        raise AssertionError("add_nowait refused nothing")


class Rig:
    """A pipeline on an ensemble of fake members, with what it told the writer."""

    def __init__(self, e: int, w: int, a: int, failed: dict[str, str] | None = None) -> None:
        self.nodes = tuple(f"n{i}" for i in range(e))
        self.members = {n: Member() for n in self.nodes if n not in (failed or {})}
        record = SegmentRecord(3, SegmentState.INPROGRESS, (EnsembleChange(0, self.nodes),), w, a, 0.0)
        self.acknowledged: list[tuple[int, int, DLSN | None]] = []
        self.fenced: list[str] = []
        self.rolls: list[tuple[str, bool, bool]] = []
        self.seg = SegmentPipeline(
            Versioned(record, 0), self.members, dict(failed or {}), log_name="log", log_id=LOG_ID, add_latency=AdaptiveTimeout(floor=0.0005, ceiling=10.0),
            on_acknowledged=lambda seg, records, freed, last: self.acknowledged.append((records, freed, last)),
            on_fenced=lambda seg, node, exc: self.fenced.append(node),
            request_roll=self._roll,
        )

    def _roll(self, reason: str, *, failure: bool = False, urgent: bool = False) -> bool:
        self.rolls.append((reason, failure, urgent))
        return False

    def send(self, *payloads: bytes, txid: int = 1) -> tuple[Batch, list[asyncio.Future[DLSN]]]:
        """One entry of ``payloads`` (one record each, the last with a future)."""
        batch = Batch(txid)
        futures: list[asyncio.Future[DLSN]] = []
        for i, payload in enumerate(payloads):
            batch.parts.append(payload)
            fut = asyncio.get_running_loop().create_future()
            futures.append(fut)
            batch.futures.append(fut)
            batch.size += len(payload)
            batch.last_txid = txid + i
        self.seg.dispatch(batch, append_ms=1000 + self.seg.next_entry_id)
        return batch, futures

    def answer(self, entry_id: int, node: str, exc: BaseException | None = None) -> None:
        self.members[node].answer.pop(entry_id)(exc)

    def sent_to(self, entry_id: int) -> set[str]:
        return {n for n, m in self.members.items() if entry_id in m.answer}


def in_loop(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` inside a running event loop (the pipeline and its futures need one)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        async def main() -> None:
            test(*args, **kwargs)

        asyncio.run(main())

    return run


# -- a pending entry's ack set -------------------------------------------------------------------


@st.composite
def answer_orders(draw: st.DrawFn) -> tuple[list[str], int, list[tuple[str, bool]]]:
    """A write set, A, and answers (stored or failed) of some of its members, in a drawn order."""
    w = draw(st.integers(1, 5))
    a = draw(st.integers(1, w))
    nodes = [f"n{i}" for i in range(w)]
    answered = draw(st.permutations(nodes))[: draw(st.integers(0, w))]
    return nodes, a, [(n, draw(st.booleans())) for n in answered]


@given(answer_orders())
def test_an_entry_reaches_quorum_at_its_a_th_store_exactly_once_and_stays_ackable_while_stores_plus_unanswered_reach_a(case):
    nodes, a, answers = case
    entry = PendingEntry(Batch(0), 0, b"", 0, nodes, a, 0.0, 0)
    stores = 0
    for node, ok in answers:
        if ok:
            stores += 1
            assert entry.stored(node) == (stores == a)
        else:
            assert entry.failed(node)
            assert not entry.failed(node)  # a second failure of the same member counts once
        assert entry.acked == (stores >= a)
        assert entry.ackable() == (stores >= a or stores + len(entry.waiting) >= a)
    answered = {n for n, _ in answers}
    assert entry.waiting == set(nodes) - answered


def test_a_member_given_up_on_that_stores_the_entry_after_all_counts():
    entry = PendingEntry(Batch(0), 0, b"", 0, ["n0", "n1", "n2"], 2, 0.0, 0)
    assert entry.stored("n0") is False
    assert entry.failed("n1") and entry.ackable()
    assert entry.stored("n1") is True and entry.acked  # its copy is real


def test_only_members_of_an_entry_another_stored_that_waited_the_silence_are_overdue():
    entry = PendingEntry(Batch(0), 0, b"", 0, ["n0", "n1", "n2"], 3, 10.0, 0)
    assert entry.overdue(now=100.0, silence=1.0) == []  # nobody answered: a stall, not a silent member
    entry.stored("n1")
    assert entry.overdue(now=10.5, silence=1.0) == []  # not long enough
    assert entry.overdue(now=11.0, silence=1.0) == ["n0", "n2"]
    entry.stored("n0")
    entry.stored("n2")
    assert entry.acked and entry.overdue(now=100.0, silence=1.0) == []


# -- in order ------------------------------------------------------------------------------------


@st.composite
def quorum_races(draw: st.DrawFn) -> tuple[int, int, int, int, list[tuple[int, str]]]:
    """E, W, A, a number of entries, and every answer to them, stores all, in a drawn order."""
    e = draw(st.integers(1, 5))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    n = draw(st.integers(1, 6))
    nodes = [f"n{i}" for i in range(e)]
    answers = [(i, node) for i in range(n) for node in write_set_of(nodes, w, i)]
    return e, w, a, n, draw(st.permutations(answers))


@settings(max_examples=200, deadline=None)
@given(quorum_races())
@in_loop
def test_entries_are_acknowledged_in_entry_order_whatever_order_their_quorums_form_in(case):
    e, w, a, n, answers = case
    rig = Rig(e, w, a)
    futures = [rig.send(b"record %d" % i, txid=10 + i)[1][0] for i in range(n)]
    stores = [0] * n
    for entry_id, node in answers:
        rig.answer(entry_id, node)
        stores[entry_id] += 1
        prefix = 0
        while prefix < n and stores[prefix] >= a:
            prefix += 1
        assert rig.seg.lac == prefix - 1
        assert [f.done() for f in futures] == [i < prefix for i in range(n)]
        assert len(rig.seg.inflight) == n - prefix
    assert [f.result() for f in futures] == [DLSN(3, i, 0) for i in range(n)]
    assert sum(r for r, _, _ in rig.acknowledged) == n == rig.seg.records
    assert rig.acknowledged[-1][2] == DLSN(3, n - 1, 0)
    assert rig.seg.last_txid == 10 + n - 1 and rig.seg.last_data_entry == n - 1
    assert rig.seg.first_time == 1000 and rig.seg.last_time == 1000 + n - 1
    assert rig.rolls == [] and rig.fenced == []


@in_loop
def test_each_entry_carries_the_lac_and_running_totals_at_its_dispatch_and_goes_to_its_write_set():
    rig = Rig(4, 2, 2)
    rig.send(b"a")
    rig.send(b"bb", b"cc", txid=2)
    assert [rig.sent_to(i) for i in (0, 1)] == [{"n0", "n1"}, {"n1", "n2"}]
    for node in ("n0", "n1"):
        rig.answer(0, node)
    rig.send(b"d", txid=4)
    assert rig.sent_to(2) == {"n2", "n3"}
    entries = [fmt.decode(rig.seg.inflight[i].encoded) for i in range(2)]
    assert [(x.entry_id, x.lac) for x in entries] == [(1, NO_ENTRY), (2, 0)]
    assert rig.seg.published_lac == 0
    size = lambda body: fmt.HEADER_SIZE + body + TOTALS_RECORD_SIZE  # noqa: E731
    assert (rig.seg.sent_records, rig.seg.sent_bytes, rig.seg.sent_txid) == (4, size(1) + size(4) + size(1), 4)
    assert (rig.seg.records, rig.seg.bytes) == (1, size(1))



# -- failures ------------------------------------------------------------------------------------


@in_loop
def test_a_failed_member_leaves_later_write_sets_is_recorded_short_and_asks_for_a_roll():
    rig = Rig(3, 3, 2)
    _, [first] = rig.send(b"a")
    rig.answer(0, "n2", AgentUnavailableError("gone"))
    assert rig.seg.failed == {"n2": "gone"} and rig.seg.short == {"n2": -1}
    assert rig.rolls == [("agent n2 failed", True, False)]
    rig.send(b"b", txid=2)
    assert rig.sent_to(1) == {"n0", "n1"}  # not to the failed member
    rig.answer(0, "n0")
    rig.answer(0, "n1")
    assert first.result() == DLSN(3, 0, 0)  # the rest still make the quorum
    rig.answer(1, "n0", AgentUnavailableError("also gone"))
    assert rig.rolls[-1] == ("entry 1 of segment 3 cannot reach ack quorum", True, True)
    assert not rig.seg.all_ackable()



@in_loop
def test_a_member_unreachable_at_open_gets_nothing_asks_for_an_urgent_roll_when_needed_and_is_closed_short():
    rig = Rig(3, 3, 3, failed={"n1": "unreachable at open"})
    rig.send(b"a")
    assert rig.sent_to(0) == {"n0", "n2"}
    assert rig.rolls == [("entry 0 of segment 3 cannot reach ack quorum", True, True)]
    rig = Rig(3, 3, 2, failed={"n1": "unreachable at open"})
    rig.send(b"a")
    assert rig.rolls == []  # the others make A = 2
    rig.answer(0, "n0")
    rig.answer(0, "n2")
    assert rig.seg.completed(5.0).short == {"n1": NO_ENTRY}  # never sent anything



@in_loop
def test_a_fencing_answer_is_reported_once_and_never_after_the_segment_is_sealed():
    rig = Rig(3, 3, 2)
    rig.send(b"a")
    rig.send(b"b", txid=2)
    rig.answer(0, "n0", FencedError("fenced"))
    assert rig.fenced == ["n0"] and rig.seg.failed == {}  # deposed, not a failed member
    rig.seg.seal()
    rig.answer(1, "n0", FencedError("fenced"))
    assert rig.fenced == ["n0"]



@in_loop
def test_a_silent_member_is_failed_short_of_its_first_unanswered_entry_and_revives_if_it_answers():
    rig = Rig(3, 3, 3)
    for i in range(3):
        rig.send(b"r%d" % i, txid=1 + i)
    for node in ("n0", "n1", "n2"):
        rig.answer(0, node)
    for node in ("n0", "n1"):
        rig.answer(1, node)
    rig.seg.inflight[0].sent_at -= 60.0  # entry 1 waited a minute for n2
    rig.seg.check_silent(None)
    assert rig.seg.failed == {}  # detection off
    rig.seg.check_silent(0.0)
    assert set(rig.seg.failed) == {"n2"} and rig.seg.silent == {"n2"}
    assert rig.seg.short == {"n2": 0}  # it answered entry 0, not 1 or 2
    assert rig.rolls[-1][2]  # entry 1 can no longer reach A = 3 without it: urgent
    rig.answer(1, "n2")  # it was only slow
    assert rig.seg.silent == set() and rig.seg.lac == 1



# -- the end -------------------------------------------------------------------------------------


@in_loop
def test_sealing_hands_back_unacknowledged_records_in_order_and_later_answers_count_for_nothing():
    rig = Rig(3, 3, 2)
    rig.send(b"one")
    rig.send(b"two", b"three", txid=2)
    rig.send(b"four", txid=4)
    for node in ("n0", "n1"):
        rig.answer(0, node)
    leftovers = rig.seg.seal()
    assert [b.first_txid for b in leftovers] == [2, 4]
    assert [b"".join(b.parts) for b in leftovers] == [b"twothree", b"four"]
    rig.answer(1, "n0")
    rig.answer(1, "n1")
    assert rig.seg.lac == 0 and not any(f.done() for b in leftovers for f in b.futures)
    done = rig.seg.completed(5.0)
    assert (done.state, done.last_entry_id, done.records, done.last_txid) == (SegmentState.COMPLETED, 0, 1, 1)
    assert (done.first_time, done.last_time) == (1000, 1000)

