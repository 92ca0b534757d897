"""The latency paths of the store: small batches synced on the event loop while the sync thread
is idle, and segment files preallocated ahead of the data (trimmed on close, and by startup
recovery after a crash). Real files; fdatasync is only observed, never faked."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from pathlib import Path

from dlagent.storage import SegmentStore, SyncPolicy
from dlagent.storage import sync as sync_mod

LOG_PATH = Path("segments") / f"{1:016x}" / f"{1:016x}.log"


class ThreadRecordingSync:
    """A real fdatasync that remembers which thread called it."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __call__(self, fd: int) -> None:
        self.threads.append(threading.current_thread().name)
        os.fdatasync(fd)


def test_a_lone_small_add_is_synced_on_the_loop_thread(tmp_path, entry):
    sync = ThreadRecordingSync()

    async def body():
        store = SegmentStore(tmp_path, fdatasync=sync)
        await store.open()
        loop_thread = threading.current_thread().name
        for i in range(5):
            await store.add(entry(1, 1, i))
        assert sync.threads == [loop_thread] * 5
        stat = store.stat()
        assert stat["inline_batches"] == stat["batches"] == stat["fdatasyncs"] == 5
        await store.close()

    asyncio.run(body())


def test_a_batch_over_inline_bytes_goes_to_the_sync_thread(tmp_path, entry):
    sync = ThreadRecordingSync()
    small = entry(1, 1, 0)
    big = entry(1, 1, 1, payload=os.urandom(10_000))

    async def body():
        store = SegmentStore(tmp_path, SyncPolicy(inline_bytes=len(small)), fdatasync=sync)
        await store.open()
        await store.add(small)
        await store.add(big)
        assert sync.threads[0] == threading.current_thread().name
        assert sync.threads[1].startswith("dlagent-sync")
        assert store.stat()["inline_batches"] == 1 and store.stat()["batches"] == 2
        assert store.read(1, 1, 1) == big
        await store.close()

    asyncio.run(body())


def test_inline_bytes_zero_always_uses_the_sync_thread(tmp_path, entry):
    sync = ThreadRecordingSync()

    async def body():
        store = SegmentStore(tmp_path, SyncPolicy(inline_bytes=0), fdatasync=sync)
        await store.open()
        for i in range(3):
            await store.add(entry(1, 1, i))
        assert len(sync.threads) == 3 and all(t.startswith("dlagent-sync") for t in sync.threads)
        assert store.stat()["inline_batches"] == 0
        await store.close()

    asyncio.run(body())


def test_an_inline_fdatasync_failure_fails_the_add_and_the_store(tmp_path, entry):
    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error (injected)")

    async def body():
        fatal: list[BaseException] = []
        store = SegmentStore(tmp_path, fdatasync=os.fdatasync)
        await store.open()
        await store.add(entry(1, 1, 0))
        store._committer._fdatasync = failing  # the disk fails from here on
        store._committer._on_fatal = fatal.append
        try:
            await store.add(entry(1, 1, 1))
        except Exception as exc:  # noqa: BLE001
            assert "not durable" in str(exc)
        else:
            raise AssertionError("an add whose fdatasync failed was acknowledged")
        assert fatal and store._committer.failure is not None
        await store.close()

    asyncio.run(body())


def test_files_grow_ahead_of_the_data_and_are_trimmed_on_close(tmp_path, entry):
    entries = [entry(1, 1, i, payload=os.urandom(1000)) for i in range(200)]
    data_end = sum(map(len, entries))
    path = tmp_path / LOG_PATH

    async def body():
        store = SegmentStore(tmp_path, SyncPolicy(prealloc_bytes=1 << 20))
        await store.open()
        await store.add(entries[0])
        # The first growth: at least 64 KiB beyond the data.
        assert path.stat().st_size == len(entries[0]) + sync_mod.PREALLOC_MIN
        for e in entries[1:]:
            await store.add(e)
        size = path.stat().st_size
        assert data_end < size <= data_end + (1 << 20)
        assert store.stat()["preallocated_bytes"] == size - data_end
        assert [store.read(1, 1, i) for i in range(200)] == entries
        await store.close()
        assert path.stat().st_size == data_end

    asyncio.run(body())


def test_a_crash_leaves_preallocated_zeros_that_recovery_trims(tmp_path, entry):
    """No close (as after SIGKILL): the file still holds the zeros; the next start trims them,
    reports no torn tail and appends right after the last entry."""
    entries = [entry(1, 1, i) for i in range(10)]
    data_end = sum(map(len, entries))
    path = tmp_path / LOG_PATH

    async def crashed():
        store = SegmentStore(tmp_path)
        await store.open()
        for e in entries:
            await store.add(e)
        assert path.stat().st_size > data_end
        store._lock.release()  # the process "dies": nothing is flushed, trimmed or closed

    async def restarted():
        store = SegmentStore(tmp_path)
        report = await store.open()
        assert report.tails_cut == [] and report.limbo == [] and report.entries == 10
        assert path.stat().st_size == data_end
        await store.add(entry(1, 1, 10))
        assert [store.read(1, 1, i) for i in range(11)] == entries + [entry(1, 1, 10)]
        await store.close()

    asyncio.run(crashed())
    asyncio.run(restarted())


def test_prealloc_bytes_zero_grows_files_with_each_write(tmp_path, entry):
    path = tmp_path / LOG_PATH

    async def body():
        store = SegmentStore(tmp_path, SyncPolicy(prealloc_bytes=0))
        await store.open()
        total = 0
        for i in range(5):
            e = entry(1, 1, i)
            await store.add(e)
            total += len(e)
            assert path.stat().st_size == total
        await store.close()

    asyncio.run(body())


def test_a_failed_preallocation_is_logged_once_and_writes_go_on(tmp_path, entry, monkeypatch, caplog):
    calls = []

    def refuse(fd: int, offset: int, length: int) -> None:
        calls.append((offset, length))
        raise OSError(errno.EOPNOTSUPP, "Operation not supported (injected)")

    monkeypatch.setattr(sync_mod.os, "posix_fallocate", refuse)
    entries = [entry(1, 1, i, payload=os.urandom(40_000)) for i in range(5)]

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        for e in entries:
            await store.add(e)
        assert [store.read(1, 1, i) for i in range(5)] == entries
        assert not store.failed
        assert (tmp_path / LOG_PATH).stat().st_size == sum(map(len, entries))
        await store.close()

    with caplog.at_level(logging.WARNING, logger="dlagent.storage"):
        asyncio.run(body())
    assert len(calls) == 1, "preallocation goes on being tried after it failed"
    assert sum("preallocating segment files failed" in r.getMessage() for r in caplog.records) == 1


def test_an_evicted_file_is_trimmed(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path, max_open_files=1)
        await store.open()
        await store.add(entry(1, 1, 0))
        first = tmp_path / LOG_PATH
        assert first.stat().st_size > len(entry(1, 1, 0))
        await store.add(entry(1, 2, 0))  # a second file: the first is closed, and trimmed
        assert first.stat().st_size == len(entry(1, 1, 0))
        await store.add(entry(1, 1, 1))  # reopened: grows again after the data
        assert store.read(1, 1, 1) == entry(1, 1, 1)
        await store.close()

    asyncio.run(body())


def test_a_segment_left_idle_gives_back_its_preallocation(tmp_path, entry, monkeypatch):
    """A writer that rolls leaves its last segment open and idle: within two trim periods its
    file is back to the data's size, while a segment still taking data keeps growing ahead."""
    from dlagent.storage import upkeep as store_mod

    monkeypatch.setattr(store_mod, "TRIM_IDLE_SECONDS", 0.05)
    idle, busy = tmp_path / LOG_PATH, tmp_path / "segments" / f"{1:016x}" / f"{2:016x}.log"

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        await store.add(entry(1, 1, 0))
        assert idle.stat().st_size > len(entry(1, 1, 0))
        deadline = asyncio.get_running_loop().time() + 10
        i = 0
        while idle.stat().st_size != len(entry(1, 1, 0)):
            assert asyncio.get_running_loop().time() < deadline, "the idle segment was never trimmed"
            await store.add(entry(1, 2, i))  # the other segment takes data all along
            i += 1
            await asyncio.sleep(0.01)
        assert busy.stat().st_size > sum(len(entry(1, 2, k)) for k in range(i))
        assert store.stat()["preallocated_bytes"] == busy.stat().st_size - sum(len(entry(1, 2, k)) for k in range(i))
        await store.close()

    asyncio.run(body())


class _LateReports:
    """The event loop as the sync thread sees it, except that the thread's report of a finished
    batch (call_soon_threadsafe) waits for ``go``: the window in which the thread is already
    idle but the loop has not yet learnt that its last batch is durable."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.go = threading.Event()

    def __getattr__(self, name: str):
        return getattr(self._loop, name)

    def call_soon_threadsafe(self, fn, *args):
        self.go.wait(10)
        return self._loop.call_soon_threadsafe(fn, *args)


def test_a_small_batch_is_not_synced_inline_before_an_earlier_batch_is_reported(tmp_path, entry):
    big = entry(1, 1, 0, payload=os.urandom(100_000))  # over inline_bytes: the sync thread's
    small = entry(1, 1, 1)

    async def body():
        store = SegmentStore(tmp_path, SyncPolicy(inline_bytes=64 * 1024))
        await store.open()
        committer = store._committer
        late = committer._loop = _LateReports(asyncio.get_running_loop())
        order: list[str] = []
        first = asyncio.ensure_future(store.add(big))
        first.add_done_callback(lambda _: order.append("big"))
        deadline = asyncio.get_running_loop().time() + 10
        while committer._busy or not committer._taken:  # synced, thread idle, not yet reported
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.001)
        second = asyncio.ensure_future(store.add(small))
        second.add_done_callback(lambda _: order.append("small"))
        await asyncio.sleep(0.05)
        assert not second.done(), "acknowledged before the batch ahead of it was reported"
        late.go.set()
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        assert order == ["big", "small"]
        assert [store.read(1, 1, 0), store.read(1, 1, 1)] == [big, small]
        await store.close()

    asyncio.run(body())
