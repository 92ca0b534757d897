"""Scrubbing (dlagent.storage.scrub) over a real SegmentStore in a tmp dir: what a pass checks,
what it puts in limbo and what it does not, how fast it reads, and the page cache it leaves.

Time is a fake clock whose ``sleep`` advances it (the scrubber's pacing and backoff sleep on it),
so rates are measured exactly, never against the wall clock. Damage is real: bits flipped in
the real files under a running store. Read errors are injected through ``pread``.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import threading
from pathlib import Path

import pytest
from harness.pagecache import pages, resident_pages

from dlagent.storage import SegmentStore, SyncPolicy
from dlagent.storage.scrub import RETRY_FIRST, Scrubber
from dlctl.log.errors import LimboError
from dlctl.log.format import HEADER_SIZE


def log_path(root: Path, seq: int = 1, log_id: int = 1) -> Path:
    return root / "segments" / f"{log_id:016x}" / f"{seq:016x}.log"


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def flip(path: Path, offset: int, xor: int = 0x10) -> None:
    """Bit rot under a running store: the file changes, the store is not told."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ xor]))


class FakeTime:
    """A monotonic clock that only moves when the scrubber sleeps on it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class Reads:
    """A ``pread`` that records (fake time, file, offset, length) of every read, and can fail or
    hold chosen ones (it runs on the scrub thread)."""

    def __init__(self, time: FakeTime | None = None) -> None:
        self.time = time
        self.log: list[tuple[float, str, int, int]] = []
        self.fail: list[OSError] = []  # raised by the next reads, one each
        self.hold_path: str | None = None  # a read of this file waits for ``resume``
        self.holding = threading.Event()
        self.resume = threading.Event()

    def __call__(self, fd: int, n: int, off: int) -> bytes:
        if self.hold_path is not None and fd_path(fd) == self.hold_path:
            self.hold_path = None
            self.holding.set()
            assert self.resume.wait(10), "test never resumed the held read"
        self.log.append((self.time.now if self.time else 0.0, fd_path(fd), off, n))
        if self.fail:
            raise self.fail.pop(0)
        return os.pread(fd, n, off)


def entries_of(entry, seq: int, count: int, size: int = 1000) -> list[bytes]:
    return [entry(1, seq, i, payload=bytes([i % 251]) * size) for i in range(count)]


async def open_with(tmp_path: Path, segments: dict[int, list[bytes]], policy: SyncPolicy | None = None, **kw) -> SegmentStore:
    store = SegmentStore(tmp_path, policy or SyncPolicy(), **kw)
    await store.open()
    for encoded in segments.values():
        await asyncio.gather(*(store.add(e) for e in encoded))
    return store


def scrubber(store: SegmentStore, time: FakeTime, reads: Reads | None = None, **kw) -> Scrubber:
    return Scrubber(store, kw.pop("bytes_per_second", 1 << 20), kw.pop("interval", 3600.0), clock=time.clock, sleep=time.sleep,
                    wall=time.clock, pread=reads or os.pread, **kw)


def scrub_counters(store: SegmentStore) -> dict:
    return {k: v for k, v in store.stat().items() if k.startswith("scrub_")}


# -- what a pass checks ---------------------------------------------------------------------------


def test_a_clean_pass_finds_nothing_and_counts_every_entry_and_byte(tmp_path, entry):
    segs = {1: entries_of(entry, 1, 20), 2: entries_of(entry, 2, 30, size=3000)}
    total_bytes = sum(len(e) for es in segs.values() for e in es)

    async def body():
        store = await open_with(tmp_path, segs)
        assert scrub_counters(store) == {"scrub_enabled": False}
        time = FakeTime()
        s = scrubber(store, time, chunk_entries=7)  # several chunks per replica
        await s.run_pass()
        c = scrub_counters(store)
        assert (c["scrub_passes"], c["scrub_entries"], c["scrub_bytes"], c["scrub_damaged"], c["scrub_retries"]) == (1, 50, total_bytes, 0, 0)
        assert c["scrub_enabled"] and c["scrub_last_pass_at"] == time.now
        await s.run_pass()
        c = scrub_counters(store)
        assert (c["scrub_passes"], c["scrub_entries"], c["scrub_bytes"]) == (2, 100, 2 * total_bytes)
        assert store.stat()["limbo"] == 0
        assert [store.read(1, 2, i) for i in range(30)] == segs[2]
        await s.stop()
        await store.close()

    asyncio.run(body())


def test_a_flipped_bit_in_a_durable_entry_puts_the_replica_in_limbo_durably_and_is_logged(tmp_path, entry, caplog):
    caplog.set_level(logging.INFO)
    segs = {1: entries_of(entry, 1, 20), 2: entries_of(entry, 2, 20)}
    path = log_path(tmp_path, 1)
    bad = sum(len(e) for e in segs[1][:7])  # entry 7 starts here

    async def body():
        store = await open_with(tmp_path, segs)
        flip(path, bad + HEADER_SIZE + 100)
        s = scrubber(store, FakeTime())
        await s.run_pass()
        c = scrub_counters(store)
        assert c["scrub_damaged"] == 1 and store.stat()["limbo"] == 1
        assert c["scrub_entries"] == 7 + 20  # segment 1 up to the bad entry, all of segment 2
        for i in (0, 7, 19):  # not even the intact entries are served any more
            with pytest.raises(LimboError):
                store.read(1, 1, i)
        with pytest.raises(LimboError):
            store.read_range(1, 1, 0, 5, 1 << 20)
        assert store.read(1, 2, 7) == segs[2][7]  # the other replica is untouched
        [finding] = [r for r in caplog.records if r.levelno == logging.ERROR]
        message = finding.getMessage()
        assert str(path) in message and f"at offset {bad}" in message and "entry 7: CRC-32C mismatch" in message
        # A replica in limbo is not scrubbed again: the next pass reads segment 2 only.
        await s.run_pass()
        assert scrub_counters(store)["scrub_entries"] == 27 + 20
        await s.stop()
        await store.close()
        marker = json.loads(path.with_suffix(".limbo").read_text())
        assert marker["offset"] == bad and marker["reason"].startswith("found by scrubbing: entry 7: CRC-32C")

        store = SegmentStore(tmp_path)  # durable: a restart finds it in limbo too
        report = await store.open()
        assert [(r.segment_seq, r.offset) for r in report.limbo] == [(1, bad)]
        await store.close()

    asyncio.run(body())


def test_a_valid_entry_where_the_index_expects_another_is_damage(tmp_path, entry):
    """The header and the index must agree, as for a read: a CRC-valid entry with the wrong
    contents (here another version of entry 3, same length) is not what was acknowledged."""
    segs = {1: entries_of(entry, 1, 10)}
    path = log_path(tmp_path, 1)
    at = sum(len(e) for e in segs[1][:3])

    async def body():
        store = await open_with(tmp_path, segs)
        impostor = entry(1, 1, 3, payload=b"x" * 1000)
        assert len(impostor) == len(segs[1][3])
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(impostor)
        await scrubber(store, FakeTime()).run_pass()
        assert scrub_counters(store)["scrub_damaged"] == 1
        with pytest.raises(LimboError, match="found by scrubbing: entry 3: stored header does not match the index"):
            store.read(1, 1, 0)
        await store.close()

    asyncio.run(body())


def test_a_replica_file_gone_under_a_current_replica_is_damage(tmp_path, entry):
    async def body():
        store = await open_with(tmp_path, {1: entries_of(entry, 1, 5)})
        os.unlink(log_path(tmp_path, 1))  # not a delete through the store: the file just went
        await scrubber(store, FakeTime()).run_pass()
        assert scrub_counters(store)["scrub_damaged"] == 1
        with pytest.raises(LimboError, match="the replica file is missing"):
            store.read(1, 1, 0)
        await store.close()

    asyncio.run(body())


def test_entries_not_yet_durable_are_left_for_a_later_pass(tmp_path, entry, counting_sync, threaded):
    """The tail being written (accepted, written, its fdatasync not returned) is not read."""
    sync = counting_sync()
    es = entries_of(entry, 1, 15)
    durable_end = sum(len(e) for e in es[:10])

    async def body():
        store = await open_with(tmp_path, {1: es[:10]}, threaded, fdatasync=sync)
        sync.gate.clear()
        sync.entered.clear()
        pending = [asyncio.ensure_future(store.add(e)) for e in es[10:]]
        await asyncio.to_thread(sync.entered.wait, 5)  # written, its fdatasync held
        assert log_path(tmp_path, 1).stat().st_size == sum(map(len, es))
        reads = Reads()
        s = scrubber(store, FakeTime(), reads)
        await s.run_pass()
        assert scrub_counters(store)["scrub_entries"] == 10
        assert max(off + n for _t, _p, off, n in reads.log) == durable_end
        sync.gate.set()
        await asyncio.gather(*pending)
        await s.run_pass()
        assert scrub_counters(store)["scrub_entries"] == 10 + 15
        await s.stop()
        await store.close()

    asyncio.run(body())


# -- read errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["EMFILE", "ENFILE", "ENOMEM", "EAGAIN", "EINTR"])
def test_a_resource_error_on_read_is_retried_later_and_never_limbo(tmp_path, entry, caplog, code):
    caplog.set_level(logging.INFO)
    es = entries_of(entry, 1, 20)

    async def body():
        store = await open_with(tmp_path, {1: es})
        time, reads = FakeTime(), Reads()
        reads.fail.append(OSError(getattr(errno, code), os.strerror(getattr(errno, code))))
        s = scrubber(store, time, reads)
        await s.run_pass()
        c = scrub_counters(store)
        assert (c["scrub_damaged"], c["scrub_retries"], c["scrub_entries"], c["scrub_passes"]) == (0, 1, 20, 1)
        assert store.stat()["limbo"] == 0 and store.read(1, 1, 5) == es[5]
        assert [off for _t, _p, off, _n in reads.log] == [0, 0]  # the same range, read again
        assert RETRY_FIRST in time.slept  # after a backoff
        [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert "not damage" in warning.getMessage() and str(log_path(tmp_path, 1)) in warning.getMessage()
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        await s.stop()
        await store.close()
        assert not log_path(tmp_path, 1).with_suffix(".limbo").exists()

    asyncio.run(body())


def test_a_media_error_on_read_is_damage_as_it_is_for_a_read(tmp_path, entry):
    async def body():
        store = await open_with(tmp_path, {1: entries_of(entry, 1, 20)})
        reads = Reads()
        reads.fail.append(OSError(errno.EIO, "Input/output error (injected)"))
        await scrubber(store, FakeTime(), reads).run_pass()
        assert scrub_counters(store)["scrub_damaged"] == 1 and scrub_counters(store)["scrub_retries"] == 0
        with pytest.raises(LimboError, match="read of entry 0 failed"):
            store.read(1, 1, 3)
        await store.close()

    asyncio.run(body())


# -- concurrency with deletes -------------------------------------------------------------------------


def test_a_replica_deleted_mid_pass_is_dropped_from_it_without_error(tmp_path, entry, caplog):
    caplog.set_level(logging.INFO)
    segs = {seq: entries_of(entry, seq, 20) for seq in (1, 2, 3)}

    async def body():
        store = await open_with(tmp_path, segs)
        reads = Reads()
        reads.hold_path = str(log_path(tmp_path, 2))
        s = scrubber(store, FakeTime(), reads, chunk_entries=5)
        task = asyncio.ensure_future(s.run_pass())
        await asyncio.to_thread(reads.holding.wait, 5)  # segment 2's first chunk is being read
        assert await store.delete(1, 2)
        reads.resume.set()
        await task
        c = scrub_counters(store)
        # Segment 2's chunk in flight was read (from the deleted file) and fine; the rest of it
        # was dropped; segment 3 was checked in full.
        assert (c["scrub_passes"], c["scrub_entries"], c["scrub_damaged"]) == (1, 20 + 5 + 20, 0)
        assert {p for _t, p, _o, _n in reads.log} >= {str(log_path(tmp_path, 3))}
        assert store.stat()["limbo"] == 0
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        await s.stop()
        await store.close()

    asyncio.run(body())


def test_damage_found_in_a_replica_deleted_and_created_anew_while_it_was_read_is_dropped(tmp_path, entry):
    """The old file was damaged; the replica that replaced it under the same name is not, and
    must not go to limbo for what its predecessor held."""
    old = entries_of(entry, 1, 10)
    new = [entry(1, 1, i, payload=b"new" * 300) for i in range(10)]

    async def body():
        store = await open_with(tmp_path, {1: old})
        flip(log_path(tmp_path, 1), HEADER_SIZE + 50)  # entry 0 of the old file
        reads = Reads()
        reads.hold_path = str(log_path(tmp_path, 1))
        s = scrubber(store, FakeTime(), reads)
        task = asyncio.ensure_future(s.run_pass())
        await asyncio.to_thread(reads.holding.wait, 5)
        assert await store.delete(1, 1)
        for e in new:  # re-replicated: the same segment, another file
            await store.add(e)
        reads.resume.set()
        await task
        assert reads.log[0][1].endswith("(deleted)")  # the scrubber read the old file
        c = scrub_counters(store)
        assert c["scrub_damaged"] == 0 and store.stat()["limbo"] == 0
        assert [store.read(1, 1, i) for i in range(10)] == new
        await s.run_pass()  # and the new replica is checked by the next pass, clean
        assert scrub_counters(store)["scrub_damaged"] == 0 and scrub_counters(store)["scrub_entries"] == 10
        await s.stop()
        await store.close()

    asyncio.run(body())


# -- rate, schedule, page cache ---------------------------------------------------------------------


def test_reads_keep_to_the_rate_exactly_and_no_credit_builds_up_while_idle(tmp_path, entry):
    rate = 1 << 20
    segs = {seq: entries_of(entry, seq, 64, size=16 * 1024) for seq in (1, 2, 3)}  # about 3 MiB

    async def body():
        store = await open_with(tmp_path, segs)
        time = FakeTime()
        reads = Reads(time)
        s = scrubber(store, time, reads, bytes_per_second=rate, chunk_bytes=128 * 1024)
        for _ in range(2):
            reads.log.clear()
            start = time.now
            await s.run_pass()
            assert len(reads.log) > 20
            done = 0
            for at, _path, _off, n in reads.log:
                # Each read starts exactly when the bytes read before it fit the rate: never
                # sooner (the cap), never later (the scrubber does not dawdle).
                assert at - start == pytest.approx(done / rate)
                done += n
            assert done == sum(len(e) for es in segs.values() for e in es)
            time.now += 3600  # idle: the next pass must not read faster to catch up
        await s.stop()
        await store.close()

    asyncio.run(body())


def test_passes_start_one_interval_apart_and_the_first_one_interval_after_start(tmp_path, entry):
    async def body():
        store = await open_with(tmp_path, {1: entries_of(entry, 1, 5)})
        time = FakeTime()
        reads = Reads(time)
        three = asyncio.Event()

        async def sleep(seconds: float) -> None:
            await time.sleep(seconds)
            if store.stat()["scrub_passes"] >= 3:
                three.set()
                await asyncio.Event().wait()  # park here until stopped

        t0 = time.now
        s = Scrubber(store, 1 << 20, 100.0, clock=time.clock, sleep=sleep, wall=time.clock, pread=reads).start()
        await asyncio.wait_for(three.wait(), 10)
        assert [at - t0 for at, *_ in reads.log] == [100.0, 200.0, 300.0]
        assert store.stat()["scrub_next_pass_at"] == t0 + 400.0
        await s.stop()
        await store.close()

    asyncio.run(body())


def test_a_pass_longer_than_the_interval_is_followed_at_once_and_says_so(tmp_path, entry, caplog):
    caplog.set_level(logging.INFO)

    async def body():
        es = entries_of(entry, 1, 64, size=16 * 1024)
        length = sum(map(len, es))  # 1 MiB and a bit
        store = await open_with(tmp_path, {1: es})
        time = FakeTime()
        reads = Reads(time)
        two = asyncio.Event()

        async def sleep(seconds: float) -> None:
            await time.sleep(seconds)
            if store.stat()["scrub_passes"] >= 2:
                two.set()
                await asyncio.Event().wait()

        # 1 MiB at 256 KiB/s: a pass takes about 4 s, the interval is 1 s.
        s = Scrubber(store, 256 * 1024, 1.0, first_delay=0, chunk_bytes=64 * 1024, clock=time.clock, sleep=sleep, wall=time.clock, pread=reads).start()
        await asyncio.wait_for(two.wait(), 10)
        firsts = [at for at, _p, off, _n in reads.log if off == 0]
        assert firsts[1] - firsts[0] == pytest.approx(length / (256 * 1024))  # the second at once, as the rate allows
        assert any("longer than [scrub] interval" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        await s.stop()
        await store.close()

    asyncio.run(body())


def test_a_pass_leaves_no_pages_it_read_in_the_page_cache(tmp_path, entry):
    """Cold data stays out of the page cache: a pass over a terabyte must not push the agent's
    working set out of memory."""
    es = entries_of(entry, 1, 640, size=16 * 1024)  # 10 MiB, 10 chunks
    length = sum(map(len, es))
    path = log_path(tmp_path, 1)

    async def body():
        store = await open_with(tmp_path, {1: es})
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold: on disk only (synced, clean)
        finally:
            os.close(fd)
        assert resident_pages(path, length) == 0
        await scrubber(store, FakeTime()).run_pass()
        assert scrub_counters(store)["scrub_entries"] == 640
        # The partial page at the end is kept (an append may land in it).
        assert resident_pages(path, length) <= 1, f"of {pages(length)} pages"
        await store.close()

    asyncio.run(body())


def test_scrubbing_stops_when_the_store_closes(tmp_path, entry, caplog):
    caplog.set_level(logging.INFO)

    async def body():
        store = await open_with(tmp_path, {1: entries_of(entry, 1, 5)})
        time = FakeTime()
        gate = asyncio.Event()

        async def sleep(seconds: float) -> None:
            await time.sleep(seconds)
            await gate.wait()

        s = Scrubber(store, 1 << 20, 10.0, clock=time.clock, sleep=sleep, wall=time.clock).start()
        await store.close()
        gate.set()
        await asyncio.wait_for(asyncio.shield(s._task), 5)  # ends by itself
        assert any("scrubbing stops" in r.getMessage() for r in caplog.records)
        assert store.stat()["scrub_passes"] == 0
        await s.stop()

    asyncio.run(body())
