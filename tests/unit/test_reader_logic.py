"""Pure decisions of the log reader (dlctl.log.readpolicy): replica order, the adaptive
speculative timeout, positioning by txid and DLSN over in-memory segment lists, read-ahead bounds."""

from __future__ import annotations

import asyncio
import random

import pytest

from dlctl.log.dlsn import DLSN
from dlctl.log.fetcher import POLL_GRACE
from dlctl.log.reader import LogReader
from dlctl.log.readpolicy import (
    AdaptiveTimeout,
    ReadAhead,
    ReadAheadWindow,
    ReplicaScores,
    SuspectList,
    bisect_first,
    entry_max_txid,
    live_segments,
    order_replicas,
    poll_targets,
    readable_end,
    segment_index_for_txid,
    speculative_order,
    start_for_dlsn,
    start_of_log,
)
from dlctl.log.records import Record, control_record
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState

NODES = {
    "a1": {"region": "east", "rack": "r1"},
    "a2": {"region": "east", "rack": "r2"},
    "b1": {"region": "west", "rack": "r1"},
    "c1": {"region": "south", "rack": "r1"},
}


def seg(seq: int, state: str = "completed", first: int = -1, last: int = -1, last_entry: int = -1, min_active: int = 0,
        nodes: tuple[str, ...] = ("a1", "b1", "c1"), w: int = 3) -> SegmentRecord:
    return SegmentRecord(
        seq=seq, state=SegmentState(state), ensembles=(EnsembleChange(0, nodes),), write_quorum=w, ack_quorum=2,
        created=0.0, last_entry_id=last_entry, first_txid=first, last_txid=last, min_active_entry=min_active,
    )


# -- replica order -------------------------------------------------------------------------------


def test_same_region_replicas_come_first_then_other_regions_in_write_set_order():
    assert order_replicas(("b1", "c1", "a1"), NODES, region="east") == ("a1", "b1", "c1")
    assert order_replicas(("c1", "b1", "a2"), NODES, region="west") == ("b1", "c1", "a2")


def test_same_rack_beats_same_region_which_beats_another_region():
    assert order_replicas(("b1", "a2", "a1"), NODES, region="east", rack="r1") == ("a1", "a2", "b1")


def test_without_a_region_the_write_set_order_is_kept_so_first_choices_rotate_with_entries():
    segment = seg(1, nodes=("a1", "b1", "c1"))
    firsts = [order_replicas(segment.write_set(e), NODES)[0] for e in range(6)]
    assert firsts == ["a1", "b1", "c1", "a1", "b1", "c1"]


def test_suspects_go_last_even_when_close_and_unregistered_agents_after_them():
    assert order_replicas(("a1", "b1", "zz"), NODES, region="east", suspects={"a1"}) == ("b1", "a1", "zz")
    assert order_replicas(("zz", "c1", "a1"), NODES) == ("c1", "a1", "zz")


def test_suspects_expire():
    suspects = SuspectList(duration=5.0)
    suspects.mark("a1", now=100.0)
    assert suspects.active(104.9) == {"a1"}
    assert suspects.active(105.0) == frozenset()
    suspects.mark("b1", now=0.0)
    suspects.clear("b1")
    assert suspects.active(1.0) == frozenset()


# -- speculative order (DistributedLog's) ----------------------------------------------------------

RACKS = {
    "k1a": {"region": "east", "rack": "k1"},
    "k1b": {"region": "east", "rack": "k1"},
    "k2": {"region": "east", "rack": "k2"},
    "w1": {"region": "west", "rack": "k1"},
}


def test_the_first_requests_cross_a_rack_then_a_region_even_with_two_replicas_in_the_readers_rack():
    for seed in range(20):
        order = speculative_order(("w1", "k1b", "k2", "k1a"), RACKS, "east", "k1", rng=random.Random(seed))
        assert order[0] in ("k1a", "k1b")  # the closest
        assert order[1:3] == ("k2", "w1")  # another rack, then another region
        assert set(order) == set(RACKS)


def test_equally_close_replicas_share_the_first_requests_at_random():
    firsts = {speculative_order(("k1a", "k1b", "k2"), RACKS, "east", "k1", rng=random.Random(seed))[0] for seed in range(50)}
    assert firsts == {"k1a", "k1b"}


def test_with_the_entry_as_salt_every_reader_draws_the_same_first_replica_and_entries_spread():
    firsts = [speculative_order(("k1a", "k1b", "k2"), RACKS, salt=(7, 1, e))[0] for e in range(60)]
    assert firsts == [speculative_order(("k2", "k1b", "k1a"), RACKS, salt=(7, 1, e))[0] for e in range(60)]  # not the write-set order
    assert set(firsts) == {"k1a", "k1b", "k2"}


def test_a_replica_seen_slow_is_asked_after_the_others_without_any_failure_and_tried_again_later():
    scores = ReplicaScores(memory=10.0)
    for _ in range(3):
        scores.observe("k1a", 0.050, now=100.0)  # the closest replica, delayed (a slow route)
        scores.observe("k2", 0.002, now=100.0)
    order = speculative_order(("k1a", "k2", "w1"), RACKS, "east", "k1", scores=scores, now=100.5, rng=random.Random(1))
    assert order == ("k2", "w1", "k1a")
    # Slower, but within the margin of noise: the closest stays first.
    close = ReplicaScores()
    close.observe("k1a", 0.003, now=0.0)
    close.observe("k2", 0.002, now=0.0)
    assert speculative_order(("k1a", "k2"), RACKS, "east", "k1", scores=close, now=0.1)[0] == "k1a"
    # The closest seen slow and another never heard from: that one is asked first, to learn it.
    alone = ReplicaScores()
    alone.observe("k1a", 0.050, now=0.0)
    assert speculative_order(("k1a", "k2", "w1"), RACKS, "east", "k1", scores=alone, now=0.1)[0] == "k2"
    quick = ReplicaScores()
    quick.observe("k1a", 0.001, now=0.0)  # fast: no reason to look elsewhere
    assert speculative_order(("k1a", "k2", "w1"), RACKS, "east", "k1", scores=quick, now=0.1)[0] == "k1a"
    # Forgotten after ``memory``: the closest is asked first again, so its recovery is noticed.
    assert speculative_order(("k1a", "k2", "w1"), RACKS, "east", "k1", scores=scores, now=110.5, rng=random.Random(1))[0] == "k1a"


def test_failures_demote_a_replica_while_they_are_recent():
    scores = ReplicaScores(memory=10.0)
    scores.fail("k1a", now=0.0)
    assert speculative_order(("k1a", "k2"), RACKS, "east", "k1", scores=scores, now=1.0)[0] == "k2"
    assert 0.25 < scores.failures("k1a", now=6.0) < 0.5  # halved every memory / 2 seconds
    assert speculative_order(("k1a", "k2"), RACKS, "east", "k1", scores=scores, now=6.0)[0] == "k1a"
    # Unregistered agents and members lacking the entry still come last, in that order.
    assert speculative_order(("zz", "k1a", "k2"), RACKS, "east", "k1", lacking={"k1a"}) == ("k2", "zz", "k1a")


def test_successive_speculative_timeouts_grow_by_the_backoff_up_to_the_cap():
    t = AdaptiveTimeout(floor=0.01, ceiling=0.5, initial=0.1)
    assert [t.after(k) for k in range(5)] == [0.1, 0.2, 0.4, 0.8, 1.0]  # cap: twice the ceiling
    assert t.after(3, backoff=1.5, cap=0.25) == 0.25


def test_long_polls_cover_the_holders_of_the_next_entry_and_of_the_one_carrying_its_lac():
    striped = seg(1, state="inprogress", nodes=("n1", "n2", "n3", "n4"), w=2)
    assert set(poll_targets(striped, lac=4)) == {"n2", "n3", "n4"}  # entry 5 on n2,n3; entry 6 on n3,n4
    full = seg(1, state="inprogress", nodes=("n1", "n2", "n3"), w=3)
    assert set(poll_targets(full, lac=-1)) == {"n1", "n2", "n3"}


# -- adaptive speculative timeout ----------------------------------------------------------------


def test_timeout_starts_at_initial_and_is_clamped_to_floor_and_ceiling():
    t = AdaptiveTimeout(floor=0.01, ceiling=0.5, initial=0.2)
    assert t.current == 0.2
    for _ in range(50):
        t.observe(0.0001)
    assert t.current == 0.01
    for _ in range(50):
        t.observe(5.0)
    assert t.current == 0.5


def test_timeout_follows_observed_latency_with_a_margin_for_jitter():
    t = AdaptiveTimeout(floor=0.001, ceiling=10.0)
    rng = random.Random(7)
    samples = [0.02 + rng.uniform(-0.005, 0.005) for _ in range(500)]
    for s in samples:
        t.observe(s)
    assert max(samples) < t.current < 0.1  # above nearly every answer, far below a hang
    steady = t.current
    for _ in range(200):
        t.observe(0.2)  # the cluster got slower
    assert t.current > 0.2 > steady


def test_timeout_rejects_bad_bounds_and_ignores_negative_samples():
    with pytest.raises(ValueError, match="floor <= ceiling"):
        AdaptiveTimeout(floor=1.0, ceiling=0.5)
    t = AdaptiveTimeout(floor=0.01, ceiling=1.0, initial=0.3)
    t.observe(-1.0)
    assert t.samples == 0 and t.current == 0.3


# -- positioning ---------------------------------------------------------------------------------

# Segments 1..4 closed with txids 1-100, 101-200, (empty), 201-300; 5 in progress from 301.
LOG = [
    seg(1, first=1, last=100, last_entry=9),
    seg(2, first=101, last=200, last_entry=9),
    seg(3, last_entry=-1),
    seg(4, first=201, last=300, last_entry=9),
    seg(5, state="inprogress", first=301),
]


@pytest.mark.parametrize(
    ("txid", "expected_seq"),
    [(-5, 1), (1, 1), (100, 1), (101, 2), (150, 2), (200, 2), (201, 4), (300, 4), (301, 5), (10**9, 5)],
)
def test_txid_search_picks_the_first_segment_that_can_hold_the_txid(txid, expected_seq):
    assert LOG[segment_index_for_txid(LOG, txid)].seq == expected_seq


def test_txid_beyond_every_closed_segment_with_no_inprogress_one_means_the_next_segment():
    closed = LOG[:4]
    assert segment_index_for_txid(closed, 301) == len(closed)
    assert segment_index_for_txid([], 1) == 0


def test_txid_search_over_many_segments_matches_a_linear_scan():
    rng = random.Random(3)
    segments, txid = [], 0
    for seq in range(1, 300):
        n = rng.choice([0, 0, 1, 5, 50])
        if n:
            segments.append(seg(seq, first=txid + 1, last=txid + n, last_entry=n - 1))
            txid += n
        else:
            segments.append(seg(seq))
    for target in range(-1, txid + 3):
        linear = next((i for i, s in enumerate(segments) if s.last_txid >= target), len(segments))
        assert segment_index_for_txid(segments, target) == linear


def test_truncated_segments_are_not_visited():
    segments = [seg(1, state="truncated", last_entry=9), seg(2, state="partially-truncated", last_entry=9, min_active=4), seg(3)]
    assert [s.seq for s in live_segments(reversed(segments))] == [2, 3]


def test_dlsn_start_respects_truncation():
    segments = live_segments([seg(1, state="truncated"), seg(2, state="partially-truncated", min_active=4, last_entry=9), seg(3, last_entry=9)])
    assert start_for_dlsn(segments, DLSN(1, 5, 2)) == DLSN(2, 4, 0)  # segment 1 is gone
    assert start_for_dlsn(segments, DLSN(2, 1, 3)) == DLSN(2, 4, 0)  # before min active
    assert start_for_dlsn(segments, DLSN(2, 6, 3)) == DLSN(2, 6, 3)  # exact
    assert start_for_dlsn(segments, DLSN(3, 0, 1)) == DLSN(3, 0, 1)
    assert start_for_dlsn(segments, DLSN(9, 2, 0)) == DLSN(9, 2, 0)  # in the future: wait for it


def test_start_of_log_is_the_first_active_entry_or_the_next_segment():
    assert start_of_log(live_segments([seg(2, state="partially-truncated", min_active=3)]), 2) == DLSN(2, 3, 0)
    assert start_of_log([], 0) == DLSN(1, 0, 0)
    assert start_of_log([], 7) == DLSN(8, 0, 0)


def test_entry_search_over_an_in_memory_segment_finds_the_first_entry_reaching_the_txid():
    # Entries of 3 records each; entry 4 holds only a control record carrying the last txid.
    entries: list[list[Record]] = []
    txid = 0
    for e in range(10):
        if e == 4:
            entries.append([control_record(txid)])
            continue
        entries.append([Record(txid=txid + i + 1, payload=b"x") for i in range(3)])
        txid += 3
    probes: list[int] = []

    async def reaches_for(target: int):
        async def reaches(entry_id: int) -> bool:
            probes.append(entry_id)
            top = entry_max_txid(entries[entry_id])
            return top is not None and top >= target
        return reaches

    async def find(target: int) -> int:
        return await bisect_first(0, len(entries) - 1, await reaches_for(target))

    for target in range(0, txid + 2):
        first = asyncio.run(find(target))
        linear = next((e for e, recs in enumerate(entries) if any(not r.control and r.txid >= target for r in recs)), len(entries))
        # Never after the first entry holding the txid; at most a control-only entry before it.
        assert first <= linear and all(all(r.control for r in entries[e]) for e in range(first, linear))
    probes.clear()
    asyncio.run(find(20))
    assert len(probes) <= 4  # log2(10) reads, not a scan


def test_readable_end_is_lac_for_inprogress_and_last_entry_for_closed():
    assert readable_end(seg(1, state="inprogress", last_entry=-1), lac=7) == 7
    assert readable_end(seg(1, last_entry=12), lac=3) == 12
    assert readable_end(seg(1, state="partially-truncated", last_entry=12, min_active=5), lac=-1) == 12
    assert readable_end(seg(1, state="truncated", last_entry=12), lac=-1) == -1


# -- read-ahead bounds ---------------------------------------------------------------------------


def test_read_ahead_is_bounded_by_count_and_by_bytes():
    bounds = ReadAhead(max_entries=4, max_bytes=1000)
    assert bounds.allows(0, 0, 0, 0)  # an empty buffer always takes one entry
    assert not bounds.allows(1, 0, 1, 0)  # size unknown: one at a time
    assert bounds.allows(1, 100, 0, 100)
    assert not bounds.allows(4, 0, 4, 10)  # count bound
    assert bounds.allows(2, 600, 0, 300)  # 600 + 300 <= 1000
    assert not bounds.allows(2, 600, 1, 300)  # 600 + 2*300 > 1000
    assert bounds.allows(0, 0, 0, 5000)  # a huge entry still gets read, alone
    assert not bounds.allows(1, 5000, 0, 5000)
    with pytest.raises(ValueError):
        ReadAhead(max_entries=0)


# -- adaptive read-ahead -----------------------------------------------------------------------------


def test_a_consumer_waiting_on_entries_in_flight_doubles_the_window_up_to_the_bound():
    window = ReadAheadWindow(64)
    sizes = []
    for _ in range(6):
        window.taken(waited=True, ready=0)
        sizes.append(window.size)
    assert sizes == [8, 16, 32, 64, 64, 64]


def test_a_slow_consumer_shrinks_the_window_to_its_minimum_and_one_keeping_pace_keeps_it():
    window = ReadAheadWindow(64, initial=32)
    for _ in range(100):
        window.taken(waited=False, ready=window.size)  # everything requested is already there
    assert window.size == 2
    steady = ReadAheadWindow(64, initial=16)
    for _ in range(100):
        steady.taken(waited=False, ready=3)  # the pace matches: a few arrive ahead, not half the window
    assert steady.size == 16
    with pytest.raises(ValueError):
        ReadAheadWindow(1, minimum=2)



# -- polls ahead: when an entry waits for the poll on its way with it (dlctl.log.reader) ---------


class _Clock:
    """The event loop's clock, moved by hand (the fetcher's grace is loop time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.now = loop.time()
        loop.time = lambda: self.now  # type: ignore[method-assign]


def _poll_ahead_reader() -> LogReader:
    reader = LogReader(None, None, "x", poll_depth=8)  # type: ignore[arg-type]  # the fetcher's decisions only
    reader._carrying[5] = 1  # a poll is on its way with entry 5
    return reader


def test_an_entry_a_poll_carries_waits_the_grace_and_a_wake_up_is_armed_at_every_look():
    """A wake-up that comes a hair early (the loop runs timers up to its clock resolution early)
    must arm another: an entry left waiting with no timer waits for some unrelated event — a
    poll timing out, seconds later (seen as a 5 s stall at the end of a replication run)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        clock = _Clock(loop)
        reader = _poll_ahead_reader()
        start = clock.now
        assert reader._awaiting_poll(5)
        first = reader._grace_timer
        assert first is not None and first.when() == pytest.approx(start + POLL_GRACE)
        clock.now = start + POLL_GRACE - 0.0005  # the timer fired early
        assert reader._awaiting_poll(5)
        again = reader._grace_timer
        assert again is not None and again is not first and not again.cancelled()
        assert again.when() >= start + POLL_GRACE - 1e-9
        clock.now = start + POLL_GRACE
        assert not reader._awaiting_poll(5)  # overdue: read it like any entry
        again.cancel()

    asyncio.run(main())


def test_the_last_entries_of_a_closed_segment_are_requested_at_once_not_left_to_polls():
    """A writer's close publishes no LAC, so no poll will bring a closed segment's last entries:
    the fetcher requests them as soon as the metadata shows the close, even with polls out."""

    async def main() -> None:
        _Clock(asyncio.get_running_loop())
        reader = _poll_ahead_reader()
        requested: list[int] = []
        reader._request = lambda segment, entry_id: requested.append(entry_id)  # type: ignore[method-assign]
        reader._fetch_seq, reader._next_entry, reader._lac = 1, 5, 4
        reader._segments = {1: seg(1, "inprogress", nodes=("a1", "b1", "c1"))}
        reader._arm_polls = lambda segment: None  # type: ignore[method-assign]
        reader._pump()
        assert requested == []  # in progress and readable only up to 4: entry 5 is the polls'
        reader._lac = 5
        reader._pump()
        assert requested == []  # readable now, and a poll is on its way with it: the grace
        reader._segments = {1: seg(1, "completed", last_entry=6)}
        reader._pump()
        assert requested == [5, 6]
        if reader._grace_timer is not None:
            reader._grace_timer.cancel()

    asyncio.run(main())
