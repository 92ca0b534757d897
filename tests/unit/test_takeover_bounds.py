"""The writer's bounds (dlctl.meta.bounds, dlctl.log.takeover): pure logic, with an in-memory
stand-in for the znode (compare-and-set by version). The real record, a real takeover and a
deposed writer's refused reservation are tested in tests/integration/test_fast_takeover.py."""

from __future__ import annotations

import asyncio

import pytest

from dlctl.errors import ConflictError
from dlctl.log.takeover import HORIZON, MAX_BLOCK, MIN_BLOCK, BoundsKeeper, BoundsLost, takeover_floor
from dlctl.meta.bounds import WriterBounds
from dlctl.meta.records import Versioned


class MemoryStore:
    def __init__(self) -> None:
        self.record = Versioned(WriterBounds(), -1)
        self.writes = 0

    def get(self, name: str) -> Versioned[WriterBounds]:
        return self.record

    def put(self, name: str, new: WriterBounds, current: Versioned[WriterBounds]) -> Versioned[WriterBounds]:
        if current.version != self.record.version:
            raise ConflictError("changed")
        self.writes += 1
        self.record = Versioned(new, self.record.version + 1)
        return self.record


async def call(fn, *args):
    return fn(*args)


def keeper(store: MemoryStore, owner: str = "w1", session: int = 7, now: float = 1000.0) -> BoundsKeeper:
    return BoundsKeeper(store, "log", owner, session, call, lambda: now)


def test_a_new_owner_starts_above_bounds_only_when_the_writer_it_takes_over_from_reserved_them():
    held = WriterBounds(txid=5000, time_ms=99, writer="old", session=3)
    assert takeover_floor(held, "old") == held
    assert takeover_floor(held, "someone-else") is None  # reserved by another (or an older) writer
    assert takeover_floor(held, None) is None  # nothing in progress: nothing to start above
    assert takeover_floor(WriterBounds(), "old") is None  # a writer that predates bounds


def test_bounds_records_round_trip_and_malformed_ones_are_named():
    bounds = WriterBounds(12, 34, "w", 5)
    assert WriterBounds.from_json(bounds.to_json(), "here") == bounds
    for bad in (b"{", b'{"txid": 1}', b'{"txid": -5, "time_ms": 0, "writer": ""}', b'{"txid": "x", "time_ms": 0, "writer": ""}'):
        with pytest.raises(ValueError, match="here: malformed writer bounds"):
            WriterBounds.from_json(bad, "here")


def test_claiming_reserves_a_block_and_a_horizon_above_what_it_takes_over():
    store = MemoryStore()
    store.record = Versioned(WriterBounds(txid=500, time_ms=2_000_000, writer="old", session=1), 4)
    k = keeper(store, now=1000.0)
    previous = asyncio.run(k.claim(10, 0))
    assert previous.writer == "old" and previous.txid == 500
    held = store.record.value
    assert (held.writer, held.session) == ("w1", 7)
    assert held.txid == 500 + MIN_BLOCK
    assert held.time_ms == 2_000_000 + int(HORIZON * 1000)  # never below what it took over
    assert k.covers(500 + MIN_BLOCK, 2_000_000) and not k.covers(501 + MIN_BLOCK, 0)


def test_reserving_often_grows_the_block_up_to_its_cap():
    store = MemoryStore()
    k = keeper(store)
    asyncio.run(k.claim(0, 0))
    blocks = []
    for _ in range(40):  # back to back: the writer is fast
        asyncio.run(k.extend(k.confirmed.txid, 0))
        blocks.append(k._block)  # noqa: SLF001 - the sizing is the point
    assert blocks == sorted(blocks) and blocks[-1] == MAX_BLOCK


def test_a_deposed_writer_is_told_so_and_its_own_lost_answer_is_adopted():
    store = MemoryStore()
    mine = keeper(store, owner="w1", session=7)
    asyncio.run(mine.claim(0, 0))
    # Our own write whose answer was lost: the record changed, but it is ours; adopt it.
    store.record = Versioned(WriterBounds(txid=10**6, time_ms=10**13, writer="w1", session=7), store.record.version + 1)
    asyncio.run(mine.extend(5, 5))
    assert mine.confirmed.txid == 10**6
    # Another writer (even one reusing our owner id, through another session) claimed it.
    store.record = Versioned(WriterBounds(txid=10**6, time_ms=10**13, writer="w1", session=8), store.record.version + 1)
    with pytest.raises(BoundsLost):
        asyncio.run(mine.extend(10**6 + 1, 0))


def test_running_low_asks_for_more_before_an_entry_has_to_wait():
    store = MemoryStore()
    k = keeper(store, now=1000.0)
    asyncio.run(k.claim(0, 0))
    bounds = k.confirmed
    assert not k.running_low(0, 1_000_000)
    assert k.running_low(bounds.txid - MIN_BLOCK // 2 + 1, 1_000_000)  # txids
    assert k.running_low(0, bounds.time_ms - 100)  # time
