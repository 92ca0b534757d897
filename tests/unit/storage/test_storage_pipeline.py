"""The group-commit pipeline: which fdatasync acknowledges which add, the callback fast path
(``add_nowait``), and metadata jobs running beside data syncs (fdatasync injected)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest
from dlagent.storage import SegmentStore
from dlagent.storage import sync as sync_mod

from dlctl.log.errors import AgentIOError, BadRequestError, FencedError


class SteppedSync:
    """An fdatasync whose calls are released one by one by the test; records, for each call,
    the file size when it was *called* (what that call can cover)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sizes: list[int] = []
        self.started: list[threading.Event] = [threading.Event() for _ in range(64)]
        self.release: list[threading.Event] = [threading.Event() for _ in range(64)]
        self.returned: list[threading.Event] = [threading.Event() for _ in range(64)]
        self.fail_at: int | None = None

    def __call__(self, fd: int) -> None:
        with self.lock:
            k = len(self.sizes)
            self.sizes.append(os.fstat(fd).st_size)
        self.started[k].set()
        self.release[k].wait(10)
        try:
            if self.fail_at is not None and k >= self.fail_at:
                raise OSError(5, "Input/output error (injected)")
            os.fdatasync(fd)
        finally:
            self.returned[k].set()

    def release_all(self) -> None:
        for event in self.release:
            event.set()


async def until(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 10), "timed out"


def test_an_add_written_after_an_fdatasync_started_waits_for_the_next_one(threaded, tmp_path, entry):
    sync = SteppedSync()
    a, b = entry(1, 1, 0), entry(1, 1, 1, payload=os.urandom(300_000))

    async def body():
        store = SegmentStore(tmp_path, threaded, fdatasync=sync)
        await store.open()
        add_a = asyncio.ensure_future(store.add(a))
        await until(sync.started[0])  # A's fdatasync is in flight, not returned
        add_b = asyncio.ensure_future(store.add(b))
        await asyncio.sleep(0.05)
        assert not add_a.done() and not add_b.done()
        sync.release[0].set()
        await add_a
        # B was accepted while sync 0 ran: its bytes were not in the file when sync 0 was
        # called, so sync 0 does not acknowledge it; sync 1, called after they were written, does.
        assert sync.sizes[0] == len(a)
        await until(sync.started[1])
        assert sync.sizes[1] == len(a) + len(b)
        await asyncio.sleep(0.05)
        assert not add_b.done(), "acknowledged before the fdatasync covering it returned"
        sync.release[1].set()
        await add_b
        assert sync.returned[1].is_set()
        sync.release_all()
        await store.close()

    asyncio.run(body())


def test_adds_arriving_during_a_sync_share_the_next_one(threaded, tmp_path, entry):
    sync = SteppedSync()

    async def body():
        store = SegmentStore(tmp_path, threaded, fdatasync=sync)
        await store.open()
        first = asyncio.ensure_future(store.add(entry(1, 1, 0)))
        await until(sync.started[0])
        rest = [asyncio.ensure_future(store.add(entry(1, 1, i))) for i in range(1, 50)]
        await asyncio.sleep(0.02)
        assert store.stat()["pending_bytes"] == sum(len(entry(1, 1, i)) for i in range(50))
        sync.release_all()
        await asyncio.gather(first, *rest)
        # The sync thread took the whole pile in one batch right after sync 0.
        assert len(sync.sizes) == 2
        assert store.stat()["fdatasyncs"] == 2 and store.stat()["pending_bytes"] == 0
        await store.close()

    asyncio.run(body())


def test_add_nowait_calls_back_once_durable(threaded, tmp_path, entry):
    sync = SteppedSync()
    results: list[tuple[int, BaseException | None, bool]] = []

    async def body():
        store = SegmentStore(tmp_path, threaded, fdatasync=sync)
        await store.open()
        sync.release[0].set()
        await store.add(entry(1, 1, 0))  # creates the segment (the slow path)
        assert not store.add_nowait(entry(1, 2, 0), lambda exc: None), "unknown segment: use add()"
        assert store.list_segments()[0].segment_seq == 1  # nothing was done for segment 2

        def cb(i):
            return lambda exc: results.append((i, exc, sync.returned[1].is_set()))

        assert store.add_nowait(entry(1, 1, 1), cb(1)) is True
        assert store.add_nowait(entry(1, 1, 2), cb(2)) is True
        await until(sync.started[1])
        await asyncio.sleep(0.02)
        assert results == []
        sync.release[1].set()
        for _ in range(200):
            if len(results) == 2:
                break
            await asyncio.sleep(0.005)
        assert results == [(1, None, True), (2, None, True)]
        # An idempotent re-add of a durable entry is answered at once.
        now: list[BaseException | None] = []
        assert store.add_nowait(entry(1, 1, 2), now.append) is True
        assert now == [None]
        # Bad entries raise, as add() does; nothing is queued for them.
        bad = bytearray(entry(1, 1, 3))
        bad[-1] ^= 1
        with pytest.raises(BadRequestError):
            store.add_nowait(bytes(bad), now.append)
        await store.fence(1, 1)
        with pytest.raises(FencedError):
            store.add_nowait(entry(1, 1, 3), now.append)
        assert now == [None]
        sync.release_all()
        await store.close()

    asyncio.run(body())


def test_a_failed_fdatasync_fails_nowait_callbacks_and_never_acknowledges(threaded, tmp_path, entry):
    sync = SteppedSync()
    results: list[BaseException | None] = []

    async def body():
        store = SegmentStore(tmp_path, threaded, fdatasync=sync)
        await store.open()
        sync.release[0].set()
        await store.add(entry(1, 1, 0))
        sync.fail_at = 1
        store.add_nowait(entry(1, 1, 1), results.append)
        await until(sync.started[1])
        store.add_nowait(entry(1, 1, 2), results.append)  # queued behind the failing sync
        sync.release_all()
        for _ in range(200):
            if len(results) == 2:
                break
            await asyncio.sleep(0.005)
        assert len(results) == 2 and all(isinstance(r, AgentIOError) for r in results)
        assert store.failed
        with pytest.raises(AgentIOError):
            store.add_nowait(entry(1, 1, 3), results.append)
        await store.close()

    asyncio.run(body())


def test_metadata_jobs_do_not_wait_behind_a_data_sync(threaded, tmp_path, entry):
    sync = SteppedSync()

    async def body():
        store = SegmentStore(tmp_path, threaded, fdatasync=sync)
        await store.open()
        held = asyncio.ensure_future(store.add(entry(1, 1, 0)))
        await until(sync.started[0])
        # Fencing an unknown segment creates it, fenced: files and markers fsynced on the
        # metadata thread while the data sync is still in flight.
        result = await asyncio.wait_for(store.fence(1, 2), 5)
        assert result.last_entry_id == -1 and store.is_fenced(1, 2)
        assert not held.done()
        sync.release_all()
        await held
        await store.close()

    asyncio.run(body())


def test_the_store_shortens_the_gil_switch_interval(tmp_path):
    previous = sys.getswitchinterval()

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        assert sys.getswitchinterval() <= sync_mod.SWITCH_INTERVAL
        await store.close()

    try:
        sys.setswitchinterval(0.005)
        asyncio.run(body())
    finally:
        sys.setswitchinterval(previous)
