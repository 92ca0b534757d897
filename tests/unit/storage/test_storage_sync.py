"""Group commit and what a failed fsync does (fsync injected: pure-logic fakes over real files)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from dlagent.storage import SegmentStore, SyncPolicy
from dlctl.log.errors import AgentIOError


def slow_sync(counter, delay: float):
    def sync(fd: int) -> None:
        time.sleep(delay)  # a disk whose flush takes a while: adds pile up meanwhile
        counter(fd)

    return sync


def test_concurrent_adds_share_fdatasyncs(tmp_path, entry, counting_sync):
    sync = counting_sync()
    n = 400

    async def body():
        store = SegmentStore(tmp_path, fdatasync=slow_sync(sync, 0.002))
        await store.open()
        await asyncio.gather(*(store.add(entry(1, 1, i)) for i in range(n)))
        assert sync.calls <= n / 20, f"{sync.calls} fdatasyncs for {n} concurrent adds"
        assert store.stat()["fdatasyncs"] == sync.calls
        # A steady stream of 64 in flight: still far fewer syncs than adds.
        before = sync.calls
        sem = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with sem:
                await store.add(entry(1, 1, i))

        await asyncio.gather(*(one(i) for i in range(n, 3 * n)))
        assert sync.calls - before <= 2 * n / 10
        await store.close()

        store = SegmentStore(tmp_path)
        report = await store.open()
        assert report.entries == 3 * n and report.tails_cut == []
        await store.close()

    asyncio.run(body())


def test_a_lone_add_is_not_delayed_by_the_window(tmp_path, entry, counting_sync):
    sync = counting_sync()

    async def body():
        store = SegmentStore(tmp_path, SyncPolicy(window_ms=500), fdatasync=sync)
        await store.open()
        started = time.monotonic()
        for i in range(20):
            await store.add(entry(1, 1, i))
        # Nobody else was coming, so no add waited for the (huge) window.
        assert time.monotonic() - started < 2.0
        assert sync.calls == 20
        await store.close()

    asyncio.run(body())


@pytest.mark.parametrize("window_bytes, expected_syncs", [(4096, 2), (1 << 20, 1)])
def test_window_bytes_ends_the_linger(tmp_path, entry, counting_sync, window_bytes, expected_syncs):
    sync = counting_sync()

    async def body():
        # The held sync must be the thread's (inline, it would block the loop).
        store = SegmentStore(tmp_path, SyncPolicy(window_ms=1000, window_bytes=window_bytes, inline_bytes=0), fdatasync=sync)
        await store.open()
        await store.add(entry(1, 1, 0))
        before = sync.calls
        sync.gate.clear()  # the first sync of the trickle stays in flight until the end
        big = [entry(1, 1, i, payload=os.urandom(3000)) for i in range(1, 41)]
        tasks = []
        for e in big:
            # One add per loop turn: the loop is never idle, so without the byte cap the batch
            # would linger (window_ms is long) until the trickle ends.
            tasks.append(asyncio.ensure_future(store.add(e)))
            await asyncio.sleep(0)
        assert store.stat()["pending_bytes"] == 40 * 3048
        sync.gate.set()
        await asyncio.gather(*tasks)
        # Capped: a first small batch went out mid-trickle, the rest piled up behind it.
        assert sync.calls - before == expected_syncs
        assert store.stat()["pending_bytes"] == 0
        await store.close()

    asyncio.run(body())


def test_failed_fdatasync_fails_pending_and_later_adds_and_calls_on_failure(tmp_path, entry, counting_sync):
    sync = counting_sync()
    failures: list[BaseException] = []

    async def body():
        store = SegmentStore(tmp_path, fdatasync=sync)
        store.on_failure = failures.append
        await store.open()
        await store.add(entry(1, 1, 0))
        await store.add(entry(1, 1, 1))
        acked = sync.calls
        sync.fail_from = acked + 1
        results = await asyncio.gather(*(store.add(entry(1, 1, i)) for i in range(2, 12)), return_exceptions=True)
        assert all(isinstance(r, AgentIOError) for r in results), results
        assert store.failed
        assert len(failures) == 1 and failures[0] is sync.error
        # From now on, everything refuses — nothing is ever acknowledged again.
        with pytest.raises(AgentIOError):
            await store.add(entry(1, 1, 20))
        with pytest.raises(AgentIOError):
            store.read(1, 1, 0)
        with pytest.raises(AgentIOError):
            store.lac(1, 1)
        with pytest.raises(AgentIOError):
            await store.fence(1, 1)
        with pytest.raises(AgentIOError):
            await store.wait_lac(1, 1, 5, 1)
        st = store.stat()
        assert st["failed"] is True and "injected" in st["failure"]
        await store.close()  # still releases the lock
        assert len(failures) == 1

        store = SegmentStore(tmp_path)
        await store.open()
        assert store.read(1, 1, 0) == entry(1, 1, 0)  # what was acknowledged is there
        assert store.read(1, 1, 1) == entry(1, 1, 1)
        await store.close()

    asyncio.run(body())


def test_failure_wakes_long_polls(tmp_path, entry, counting_sync):
    sync = counting_sync()

    async def body():
        store = SegmentStore(tmp_path, fdatasync=sync)
        await store.open()
        await store.add(entry(1, 1, 0))
        poll = asyncio.ensure_future(store.wait_lac(1, 1, 10, timeout=10))
        sync.fail_from = sync.calls + 1
        with pytest.raises(AgentIOError):
            await store.add(entry(1, 1, 1))
        with pytest.raises(AgentIOError):
            await asyncio.wait_for(poll, 1)
        await store.close()

    asyncio.run(body())


def test_failed_metadata_fsync_is_fatal_too(tmp_path, entry, counting_sync):
    meta = counting_sync(real=os.fsync)
    failures: list[BaseException] = []

    async def body():
        store = SegmentStore(tmp_path, fsync=meta)
        store.on_failure = failures.append
        await store.open()
        await store.add(entry(1, 1, 0))
        meta.fail_from = meta.calls + 1
        with pytest.raises(AgentIOError):
            await store.fence(1, 1)
        assert store.failed and len(failures) == 1
        with pytest.raises(AgentIOError):
            await store.add(entry(1, 1, 1), recovery=True)
        await store.close()

    asyncio.run(body())


def test_callback_errors_do_not_hide_the_failure(tmp_path, entry, counting_sync):
    sync = counting_sync()

    def bad_callback(exc: BaseException) -> None:
        raise RuntimeError("callback bug")

    async def body():
        store = SegmentStore(tmp_path, fdatasync=sync)
        store.on_failure = bad_callback
        await store.open()
        sync.fail_from = 1
        with pytest.raises(AgentIOError):
            await store.add(entry(1, 1, 0))
        assert store.failed
        await store.close()

    asyncio.run(body())


def test_sync_never_writes_without_fdatasync(tmp_path, entry, counting_sync):
    sync = counting_sync()

    async def body():
        store = SegmentStore(tmp_path, SyncPolicy(mode="never"), fdatasync=sync)
        await store.open()
        await asyncio.gather(*(store.add(entry(1, 1, i)) for i in range(50)))
        assert sync.calls == 0
        assert store.stat()["sync_mode"] == "never"
        await store.close()
        store = SegmentStore(tmp_path)
        report = await store.open()
        assert report.entries == 50
        await store.close()

    asyncio.run(body())


def test_never_mode_documents_its_risk():
    doc = SyncPolicy.__doc__ or ""
    assert "never" in doc and "power loss" in doc and "Never the default" in doc


def test_close_flushes_pending_adds(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        await store.add(entry(1, 1, 0))
        adds = [asyncio.ensure_future(store.add(entry(1, 1, i))) for i in range(1, 30)]
        await asyncio.sleep(0)  # accepted (queued), not yet durable
        await store.close()
        await asyncio.gather(*adds)
        # After close nothing more is accepted.
        late = [asyncio.ensure_future(store.add(entry(1, 2, 0)))]
        with pytest.raises(AgentIOError):
            await late[0]
        store = SegmentStore(tmp_path)
        assert (await store.open()).entries == 30
        await store.close()

    asyncio.run(body())
