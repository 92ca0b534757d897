"""SegmentStore: adds, reads, fencing, deletes, long-poll LAC, id validation, the dir lock."""

from __future__ import annotations

import asyncio
import os
import stat as stat_mod
import time
from pathlib import Path

import pytest

from dlagent.storage import FenceResult, SegmentStore, SyncPolicy, digest_of
from dlctl.log.errors import (
    AgentIOError,
    BadRequestError,
    FencedError,
    NoSuchEntryError,
    NoSuchSegmentError,
)
from dlctl.log.format import HEADER_SIZE, decode

LOG_PATH = Path("segments") / f"{1:016x}" / f"{1:016x}.log"


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_add_read_round_trip_and_reopen(tmp_path, entry):
    entries = [entry(1, 1, i, payload=os.urandom(i * 37)) for i in range(20)]

    async def body():
        store = SegmentStore(tmp_path)
        report = await store.open()
        assert report.segments == 0 and report.tails_cut == [] and report.limbo == []
        for e in entries:
            await store.add(e)
        for i, e in enumerate(entries):
            assert store.read(1, 1, i) == e
        assert store.lac(1, 1) == 18
        assert store.last_entry_id(1, 1) == 19
        [info] = store.list_segments()
        assert (info.log_id, info.segment_seq, info.entries, info.last_entry_id, info.lac) == (1, 1, 20, 19, 18)
        assert info.size_bytes == sum(map(len, entries)) and not info.fenced and not info.limbo
        st = store.stat()
        assert st["segments"] == 1 and st["entries"] == 20 and st["sync_mode"] == "always" and not st["failed"]
        assert st["disk_total_bytes"] > 0 and st["disk_free_bytes"] > 0
        await store.close()

        assert (tmp_path / LOG_PATH).stat().st_size == sum(map(len, entries))
        store = SegmentStore(tmp_path)
        report = await store.open()
        assert (report.segments, report.entries) == (1, 20)
        for i, e in enumerate(entries):
            got = store.read(1, 1, i)
            assert got == e and decode(got).entry_id == i
        assert store.lac(1, 1) == 18
        await store.close()

    asyncio.run(body())


def test_non_contiguous_and_out_of_order_ids(tmp_path, entry):
    # Striping (E > W) leaves holes; pipelining delivers out of order.
    ids = [7, 2, 12, 0, 5, 30, 1_000_000_000_000, 3]
    encoded = {i: entry(1, 4, i, lac=max(i - 3, -1)) for i in ids}

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        await asyncio.gather(*(store.add(encoded[i]) for i in ids))
        for i in ids:
            assert store.read(1, 4, i) == encoded[i]
        for missing in (1, 4, 6, 13, 31, 999):
            with pytest.raises(NoSuchEntryError):
                store.read(1, 4, missing)
        assert store.last_entry_id(1, 4) == 1_000_000_000_000
        assert store.lac(1, 4) == 1_000_000_000_000 - 3
        d = store.digest(1, 4)
        assert d.entries == len(ids) and d.first_entry_id == 0 and d.last_entry_id == 1_000_000_000_000
        part = store.digest(1, 4, 2, 12)
        assert (part.entries, part.first_entry_id, part.last_entry_id) == (5, 2, 12)
        crcs = {i: int.from_bytes(encoded[i][44:48], "big") for i in ids}
        assert part.digest == digest_of((i, crcs[i]) for i in sorted(ids) if 2 <= i <= 12)
        assert part.bytes == sum(len(encoded[i]) for i in ids if 2 <= i <= 12)
        await store.close()

        store = SegmentStore(tmp_path)
        await store.open()
        assert store.digest(1, 4) == d
        await store.close()

    asyncio.run(body())


def test_idempotent_re_add_and_conflicting_re_add(tmp_path, entry, threaded):
    async def body():
        store = SegmentStore(tmp_path, threaded)  # file sizes are compared
        await store.open()
        first = entry(1, 1, 0, payload=b"original")
        await asyncio.gather(store.add(first), store.add(first))  # the second while the first is pending
        await store.add(first)  # and again once durable
        size = (tmp_path / LOG_PATH).stat().st_size
        assert size == len(first)
        with pytest.raises(BadRequestError, match="different contents"):
            await store.add(entry(1, 1, 0, payload=b"imposter"))
        with pytest.raises(BadRequestError, match="different contents"):
            await store.add(entry(1, 1, 0, lac=-1, payload=b"originaL"))
        assert store.read(1, 1, 0) == first
        assert (tmp_path / LOG_PATH).stat().st_size == size
        await store.close()

    asyncio.run(body())


def test_bad_entries_are_refused_and_nothing_is_stored(tmp_path, entry):
    good = entry(1, 1, 0, payload=b"payload bytes")

    def flipped(buf: bytes, pos: int) -> bytes:
        b = bytearray(buf)
        b[pos] ^= 0x01
        return bytes(b)

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        with pytest.raises(BadRequestError, match="CRC-32C"):
            await store.add(flipped(good, HEADER_SIZE + 3))
        with pytest.raises(BadRequestError, match="CRC-32C"):
            await store.add(flipped(entry(1, 1, 5, lac=2), 39))  # LAC 2 -> 3: the header is covered too
        with pytest.raises(BadRequestError, match="magic"):
            await store.add(flipped(good, 0))
        with pytest.raises(BadRequestError, match="header says"):
            await store.add(good + b"x")
        with pytest.raises(BadRequestError, match="header says"):
            await store.add(good[:-1])
        with pytest.raises(BadRequestError, match="shorter than"):
            await store.add(good[:20])
        with pytest.raises(BadRequestError):
            await store.add("not bytes")  # type: ignore[arg-type]
        with pytest.raises(NoSuchSegmentError):
            store.read(1, 1, 0)
        assert store.list_segments() == []
        assert not (tmp_path / "segments" / f"{1:016x}").exists()
        await store.add(bytearray(good))  # buffers other than bytes are accepted (copied)
        assert store.read(1, 1, 0) == good
        await store.close()

    asyncio.run(body())


def test_fence_is_durable_and_refuses_normal_adds(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        for i in range(3):
            await store.add(entry(1, 1, i))
        assert not store.is_fenced(1, 1)
        assert await store.fence(1, 1) == FenceResult(last_entry_id=2, lac=1)
        assert await store.fence(1, 1) == FenceResult(last_entry_id=2, lac=1)  # idempotent
        assert store.is_fenced(1, 1)
        assert (tmp_path / LOG_PATH.with_suffix(".fenced")).exists()
        with pytest.raises(FencedError):
            await store.add(entry(1, 1, 3))
        with pytest.raises(FencedError):
            await store.add(entry(1, 1, 0))  # even an identical re-add from the deposed writer
        await store.add(entry(1, 1, 3), recovery=True)
        await store.add(entry(1, 1, 2), recovery=True)  # recovery re-writes what is there
        await store.close()

        store = SegmentStore(tmp_path)
        await store.open()
        assert store.is_fenced(1, 1)
        assert store.list_segments()[0].fenced
        with pytest.raises(FencedError):
            await store.add(entry(1, 1, 4))
        assert store.read(1, 1, 3) == entry(1, 1, 3)
        assert await store.fence(1, 1) == FenceResult(last_entry_id=3, lac=2)
        await store.close()

    asyncio.run(body())


def test_fence_waits_for_adds_accepted_before_it(tmp_path, entry, counting_sync, threaded):
    sync = counting_sync()

    async def body():
        store = SegmentStore(tmp_path, threaded, fdatasync=sync)
        await store.open()
        await store.add(entry(1, 1, 0))
        sync.gate.clear()  # hold the next fdatasync
        sync.entered.clear()
        add = asyncio.ensure_future(store.add(entry(1, 1, 1)))
        await asyncio.to_thread(sync.entered.wait, 5)
        fence = asyncio.ensure_future(store.fence(1, 1))
        await asyncio.sleep(0.05)
        assert not add.done() and not fence.done()
        assert store.is_fenced(1, 1)  # refusing new adds already
        with pytest.raises(FencedError):
            await store.add(entry(1, 1, 2))
        sync.gate.set()
        await add
        assert await fence == FenceResult(1, 0)
        await store.close()

    asyncio.run(body())


def test_fencing_an_unknown_segment_creates_it_empty_and_fenced(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        assert await store.fence(3, 9) == FenceResult(last_entry_id=-1, lac=-1)
        [info] = store.list_segments()
        assert (info.log_id, info.segment_seq, info.entries, info.fenced, info.size_bytes) == (3, 9, 0, True, 0)
        with pytest.raises(FencedError):
            await store.add(entry(3, 9, 0))
        with pytest.raises(NoSuchEntryError):
            store.read(3, 9, 0)
        assert store.lac(3, 9) == -1 and store.last_entry_id(3, 9) == -1
        await store.close()

        store = SegmentStore(tmp_path)
        await store.open()
        assert store.is_fenced(3, 9)
        with pytest.raises(FencedError):
            await store.add(entry(3, 9, 0))
        await store.add(entry(3, 9, 0), recovery=True)
        await store.close()

    asyncio.run(body())


def test_fence_marker_without_log_reads_back_as_empty_fenced(tmp_path, entry):
    # What a delete cut short after unlinking the log leaves behind.
    seg_dir = tmp_path / "segments" / f"{5:016x}"
    seg_dir.mkdir(parents=True)
    (seg_dir / f"{2:016x}.fenced").write_bytes(b"")

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        assert store.is_fenced(5, 2) and store.last_entry_id(5, 2) == -1
        with pytest.raises(FencedError):
            await store.add(entry(5, 2, 0))
        await store.add(entry(5, 2, 0), recovery=True)
        await store.close()

    asyncio.run(body())


def test_delete_is_durable_and_idempotent(tmp_path, entry, counting_sync):
    synced_dirs: list[str] = []

    def fsync(fd: int) -> None:
        if stat_mod.S_ISDIR(os.fstat(fd).st_mode):
            synced_dirs.append(os.readlink(f"/proc/self/fd/{fd}"))
        os.fsync(fd)

    async def body():
        store = SegmentStore(tmp_path, fsync=fsync)
        await store.open()
        for seq in (1, 2):
            for i in range(3):
                await store.add(entry(1, seq, i))
        await store.fence(1, 2)
        synced_dirs.clear()
        assert await store.delete(1, 2) is True
        assert str(tmp_path / "segments" / f"{1:016x}") in synced_dirs
        assert not (tmp_path / "segments" / f"{1:016x}" / f"{2:016x}.log").exists()
        assert not (tmp_path / "segments" / f"{1:016x}" / f"{2:016x}.fenced").exists()
        with pytest.raises(NoSuchSegmentError):
            store.read(1, 2, 0)
        assert await store.delete(1, 2) is False
        assert await store.delete(7, 7) is False
        assert [i.segment_seq for i in store.list_segments()] == [1]

        # The last segment of a log takes its directory with it.
        synced_dirs.clear()
        assert await store.delete(1, 1) is True
        assert not (tmp_path / "segments" / f"{1:016x}").exists()
        assert str(tmp_path / "segments") in synced_dirs
        # A new add after a delete starts a fresh replica.
        await store.add(entry(1, 2, 5))
        assert store.list_segments()[0].entries == 1 and not store.is_fenced(1, 2)
        await store.close()

        store = SegmentStore(tmp_path)
        await store.open()
        assert [(i.segment_seq, i.entries) for i in store.list_segments()] == [(2, 1)]
        await store.close()

    asyncio.run(body())


def test_delete_while_adds_are_pending(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        adds = [asyncio.ensure_future(store.add(entry(1, 1, i))) for i in range(50)]
        await asyncio.sleep(0)
        deleted = await store.delete(1, 1)
        await asyncio.gather(*adds)
        assert deleted
        assert store.list_segments() == []
        assert files_under(tmp_path / "segments") == set()
        await store.close()

    asyncio.run(body())


BAD_IDS = [0, -1, 2**64, 2**64 + 1, -(2**63), True, "1", 1.0, None]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_out_of_range_ids_are_rejected_and_touch_nothing(tmp_path, bad):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        before = files_under(tmp_path)
        for call in (
            lambda: store.read(bad, 1, 0),
            lambda: store.read(1, bad, 0),
            lambda: store.lac(bad, 1),
            lambda: store.last_entry_id(1, bad),
            lambda: store.is_fenced(bad, 1),
            lambda: store.digest(1, bad),
        ):
            with pytest.raises(BadRequestError):
                call()
        for coro in (store.fence(bad, 1), store.fence(1, bad), store.delete(bad, 1), store.wait_lac(1, bad, -1, 0.01)):
            with pytest.raises(BadRequestError):
                await coro
        assert files_under(tmp_path) == before
        await store.close()

    asyncio.run(body())


def test_out_of_range_entry_ids_are_rejected(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        await store.add(entry(1, 1, 0))
        for bad in (-1, 2**63, True, "0"):
            with pytest.raises(BadRequestError):
                store.read(1, 1, bad)
            with pytest.raises(BadRequestError):
                store.digest(1, 1, first=bad)
        with pytest.raises(BadRequestError):
            await store.wait_lac(1, 1, -2, 0.01)
        with pytest.raises(BadRequestError):
            await store.wait_lac(1, 1, 0, float("inf"))
        with pytest.raises(BadRequestError):
            await store.wait_lac(1, 1, 0, -1)
        await store.close()

    asyncio.run(body())


def test_largest_ids_map_to_fixed_width_names_inside_the_data_dir(tmp_path, entry):
    big = 2**64 - 1

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        await store.add(entry(big, big, 2**63 - 1, lac=5))
        assert files_under(tmp_path / "segments") == {"ffffffffffffffff", "ffffffffffffffff/ffffffffffffffff.log"}
        assert store.read(big, big, 2**63 - 1) == entry(big, big, 2**63 - 1, lac=5)
        await store.close()

    asyncio.run(body())


def test_stray_files_are_ignored_and_reported(tmp_path, entry):
    root = tmp_path / "segments"
    (root / "not-a-log").mkdir(parents=True)
    (root / f"{0:016x}").mkdir()  # log id 0 is invalid
    (root / f"{1:016x}").mkdir()
    (root / f"{1:016x}" / "notes.txt").write_text("hello")
    (root / f"{1:016x}" / f"{0:016x}.log").write_bytes(b"x")  # seq 0 is invalid
    (root / f"{1:016x}" / f"{2:016x}.log").symlink_to("/etc/passwd")

    async def body():
        store = SegmentStore(tmp_path)
        report = await store.open()
        assert report.segments == 0
        assert len(report.ignored) == 5
        assert store.list_segments() == []
        await store.close()

    asyncio.run(body())


def test_wait_lac_returns_promptly_when_an_add_raises_it(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        # The segment does not exist yet when the long poll starts.
        waiter = asyncio.ensure_future(store.wait_lac(2, 1, 0, timeout=10))
        other = asyncio.ensure_future(store.wait_lac(2, 1, 5, timeout=10))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await store.add(entry(2, 1, 0, lac=-1))
        await store.add(entry(2, 1, 1, lac=0))  # LAC 0: not above 0 yet
        await asyncio.sleep(0.01)
        assert not waiter.done()
        started = time.monotonic()
        await store.add(entry(2, 1, 2, lac=1))
        assert await asyncio.wait_for(waiter, 1) == 1
        # Woken by the add, not by the 10 s timeout (the margin is for the add's own fsync on a
        # loaded machine: CI once took 0.42 s).
        assert time.monotonic() - started < 5
        assert not other.done()
        other.cancel()
        # Already above: immediate.
        started = time.monotonic()
        assert await store.wait_lac(2, 1, -1, timeout=10) == 1
        assert time.monotonic() - started < 5  # not the 10 s timeout
        # learn_lac wakes too.
        waiter = asyncio.ensure_future(store.wait_lac(2, 1, 1, timeout=10))
        await asyncio.sleep(0)
        store.learn_lac(2, 1, 7)
        assert await asyncio.wait_for(waiter, 1) == 7
        await store.close()

    asyncio.run(body())


def test_wait_lac_returns_current_lac_at_timeout(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        started = time.monotonic()
        assert await store.wait_lac(4, 4, -1, timeout=0.2) == -1  # no such segment (yet)
        elapsed = time.monotonic() - started
        assert 0.18 <= elapsed < 1.0
        await store.add(entry(4, 4, 3, lac=2))
        started = time.monotonic()
        assert await store.wait_lac(4, 4, 2, timeout=0.2) == 2
        assert 0.18 <= time.monotonic() - started < 1.0
        assert await store.wait_lac(4, 4, 2, timeout=0) == 2
        assert store._lac_waiters == {}  # timed-out waiters leave nothing behind
        await store.close()

    asyncio.run(body())


def test_wait_lac_is_woken_with_an_error_on_close(tmp_path):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        waiter = asyncio.ensure_future(store.wait_lac(1, 1, 0, timeout=10))
        await asyncio.sleep(0.01)
        await store.close()
        with pytest.raises(AgentIOError):
            await asyncio.wait_for(waiter, 1)

    asyncio.run(body())


def test_data_dir_lock_excludes_a_second_store(tmp_path):
    async def body():
        first = SegmentStore(tmp_path)
        await first.open()
        second = SegmentStore(tmp_path)
        with pytest.raises(AgentIOError, match=f"in use by pid {os.getpid()}"):
            await second.open()
        await first.close()
        third = SegmentStore(tmp_path)
        await third.open()
        await third.close()

    asyncio.run(body())


def test_closed_store_refuses_everything(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path)
        with pytest.raises(AgentIOError):
            store.read(1, 1, 0)  # not opened yet
        await store.open()
        await store.add(entry())
        await store.close()
        await store.close()  # idempotent
        with pytest.raises(AgentIOError):
            await store.add(entry(1, 1, 1))
        with pytest.raises(AgentIOError):
            store.read(1, 1, 0)
        with pytest.raises(AgentIOError):
            store.list_segments()

    asyncio.run(body())


def test_pending_entries_are_readable_before_their_sync_completes(tmp_path, entry, counting_sync, threaded):
    sync = counting_sync()

    async def body():
        store = SegmentStore(tmp_path, threaded, fdatasync=sync)
        await store.open()
        sync.gate.clear()
        add = asyncio.ensure_future(store.add(entry(1, 1, 0)))
        await asyncio.to_thread(sync.entered.wait, 5)
        assert store.read(1, 1, 0) == entry(1, 1, 0)
        later = asyncio.ensure_future(store.add(entry(1, 1, 1)))  # queued behind the held sync
        await asyncio.sleep(0.01)
        assert store.read(1, 1, 1) == entry(1, 1, 1) and store.lac(1, 1) == 0
        assert not add.done() and not later.done()
        sync.gate.set()
        await asyncio.gather(add, later)
        await store.close()

    asyncio.run(body())


def test_many_segments_with_few_open_files(tmp_path, entry):
    async def body():
        # Relative to what the test process already holds (other tests' sockets, threads' pipes):
        # 20 segments through a cache of 4 files may add those 4, the event loop's and the
        # store's own descriptors (lock, directories, sync threads), never one per segment.
        before = len(os.listdir("/proc/self/fd"))
        store = SegmentStore(tmp_path, max_open_files=4)
        await store.open()
        for seq in range(1, 21):
            await asyncio.gather(*(store.add(entry(9, seq, i)) for i in range(3)))
        for seq in range(1, 21):
            assert store.read(9, seq, 2) == entry(9, seq, 2)
        assert len(os.listdir("/proc/self/fd")) - before <= 4 + 8, "grew by more than the file cache allows"
        await store.close()

    asyncio.run(body())


def test_sync_policy_validation():
    with pytest.raises(ValueError):
        SyncPolicy(mode="sometimes")
    with pytest.raises(ValueError):
        SyncPolicy(window_bytes=0)
    assert SyncPolicy().mode == "always"
