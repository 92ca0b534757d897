"""Scrubbing: the agent re-reads its segment replicas in the background, at a bounded rate, and
puts a damaged one in limbo (DESIGN.md §4, §5: "background scrubbing verifies CRCs of cold data").

Why: readers verify every entry's CRC end to end, so damage never reaches a reader, but most of a
log is cold: nobody reads it until a reader catches up from far behind, a recovery or a copy
needs it. Bit rot or a latent sector error there goes unnoticed until it is needed, and by then
the peers holding the other copies may have failed too. A scrubbed replica that turns out
damaged goes to limbo while its peers still hold good copies; a limbo replica refuses reads,
fences and votes, so nothing is served from it, and it is re-replicated from its peers.

What a pass checks: every entry of every replica that is not in limbo, exactly as a read does
(``entries.verify_entry``: the stored header matches the index — magic, ids, length, CRC — and the
CRC-32C over header and payload holds). Only entries that are durable when their chunk is
planned: the tail still being written (held in memory) is left to a later pass. Replicas created
during a pass are checked by the next one; a replica deleted during a pass is dropped from it,
and a finding about a replica that was deleted (and maybe created again) while its bytes were
being read is dropped too: only the replica that was read can be put in limbo.

How fast: a token bucket over bytes at ``bytes_per_second`` (no credit builds up while idle, so
a burst never exceeds one chunk); chunks of at most CHUNK_BYTES and CHUNK_ENTRIES, read one run
of adjacent entries per ``pread``. A pass starts every ``interval``; one that takes longer (more
data than ``bytes_per_second x interval``) is followed at once by the next, and says so in the
log. The first pass starts one interval after the agent started when startup recovery read and
checked every replica file in full (``recovery.scan_file``), and at once (``first_delay=0``,
``dlagent.daemon``) when it started replicas from index checkpoints, which it did not read
(``dlagent.storage.checkpoint``).

Defaults (``[scrub]`` in agent.toml): 4 MiB/s and a pass a week. 4 MiB/s covers 2.3 TiB a week
and is a small fraction of an SSD's bandwidth; measured on 1 KiB entries (the most CPU per byte),
it costs a few percent of the agent's CPU per add and no append throughput beyond the noise of a
shared machine (tests/benchmarks/bench_scrub.py: on/off 0.99 for 1 KiB adds, 0.98 for 64 KiB).
A week is Ceph's deep-scrub interval: rot is found within a week, long before the peers' copies
of the same entries are likely to rot too. On a spinning disk each 1 MiB chunk costs about two
seeks (to it and back to the appends), some 6 % of the disk's time at 4 MiB/s: use 1-2 MiB/s
there (HDFS's block scanner reads 1 MiB/s).

Threads: the event-loop thread plans each chunk (a snapshot of index entries, which only the
loop may touch) and decides limbo (``SegmentStore.scrub_found``); a thread of the scrubber's own
reads and verifies. The scrubber reads through a file descriptor of its own, opened on the loop
while the replica is current and closed on that thread after its last read, so a delete, an
eviction from the store's FdCache or a new file under the same name never makes it read the
wrong file.

The page cache: each range is dropped (``POSIX_FADV_DONTNEED``) before it is read, so a pass
checks the bytes on the disk rather than a cached copy of them, and again once verified, so
scrubbing a terabyte of cold data does not push the agent's working set out of memory (readahead
is off on the scrubber's descriptor, so it brings in nothing it does not check and drop). The
kernel drops only clean folios wholly inside the range: dirty ones (``sync = never``) stay, the
partial page at the end of a range stays (the writer may be appending to it; the next range
drops it), and so do large folios that recent writes left across a range boundary — data that
was cached anyway, whose cached copy that pass checked; a pass after its eviction checks the disk.

Read errors: a resource error (EMFILE, ENFILE, ENOMEM, EAGAIN, EINTR, ENOBUFS) says nothing about
the data: logged, retried after a backoff, never limbo. A media error (EIO; EBADMSG and EUCLEAN,
which ext4 and XFS return for their own checksum failures) or a replica file gone while its
replica is current is damage, as it is for a read. Any other error (EACCES, ...) is logged and
retried, never limbo: the scrubber puts a replica in limbo only on evidence about its bytes.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from dlctl.log.errors import AgentIOError

from . import oserrors  # which failed reads are damage, which want of a resource (shared with reads.py)
from .segment import Segment
from .entries import verify_entry
from .store import SegmentStore
from .sync import PAGE_SIZE

log = logging.getLogger("dlagent.scrub")

DEFAULT_BYTES_PER_SECOND = 4 << 20
DEFAULT_INTERVAL = 7 * 86400.0
# A chunk is read, verified and paced as one. 1 MiB keeps a spinning disk's seeks away from the
# append stream to a few per second; 1,024 entries bound the loop's planning of one chunk to
# about 0.4 ms however small the entries are.
CHUNK_BYTES = 1 << 20
CHUNK_ENTRIES = 1024
RETRY_FIRST = 1.0  # seconds before a read that hit a resource error is tried again
RETRY_MAX = 60.0  # the backoff doubles up to this

Loc = tuple[int, int, int, int]  # (entry id, offset, bytes incl. header, crc)


@dataclass
class ScrubStats:
    """Counters since the agent started, shown by the store's ``stat()`` as ``scrub_*``."""

    enabled: bool = True
    bytes: int = 0  # bytes of entries verified
    entries: int = 0  # entries verified
    passes: int = 0  # full passes completed
    last_pass_at: float | None = None  # UNIX time the last full pass ended
    last_pass_seconds: float | None = None  # how long it took
    next_pass_at: float | None = None  # UNIX time the next pass starts (None: one is running)
    damaged: int = 0  # replicas the scrubber found damaged and put in limbo
    retries: int = 0  # reads (or opens) that failed without telling anything about the data, tried again later

    def to_stat(self) -> dict[str, Any]:
        return {f"scrub_{k}": v for k, v in asdict(self).items()}


class Pace:
    """A token bucket over bytes: ``take(n)`` returns when ``n`` more bytes keep the rate at or
    under ``rate`` bytes per second. Credit does not accumulate while nothing is taken."""

    def __init__(self, rate: float, clock: Callable[[], float], sleep: Callable[[float], Awaitable[Any]]) -> None:
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._free_at = float("-inf")

    async def take(self, nbytes: int) -> None:
        now = self._clock()
        start = max(self._free_at, now)
        self._free_at = start + nbytes / self.rate
        if start > now:
            await self._sleep(start - now)


@dataclass
class _Outcome:
    """What the scrub thread found in one chunk."""

    nbytes: int = 0
    entries: int = 0
    problem: tuple[int, int, str] | None = None  # (entry id, offset, reason): damage
    error: tuple[int, int, OSError] | None = None  # (entry id, offset, error): the read failed


def _drop(fd: int, start: int, end: int) -> None:
    """Advise the kernel to drop [start, end) from the page cache: whole pages from the one
    holding ``start``, the partial page holding ``end`` kept (see the module docstring)."""
    start -= start % PAGE_SIZE
    end -= end % PAGE_SIZE
    if end > start:
        try:
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except OSError as exc:  # only advice
            log.debug("dropping scrubbed pages of fd %d failed: %s", fd, exc)


class Scrubber:
    """Scrubs ``store`` from the event loop it runs in: ``start()``, later ``await stop()``.

    ``clock``/``sleep`` (monotonic seconds, and an async sleep on that clock), ``wall`` (UNIX time,
    for the stats) and ``pread`` (called on the scrub thread) are injectable for tests."""

    def __init__(
        self,
        store: SegmentStore,
        bytes_per_second: float = DEFAULT_BYTES_PER_SECOND,
        interval: float = DEFAULT_INTERVAL,
        *,
        first_delay: float | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        chunk_entries: int = CHUNK_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        wall: Callable[[], float] = time.time,
        pread: Callable[[int, int, int], bytes] = os.pread,
    ) -> None:
        if not bytes_per_second > 0 or not interval > 0:
            raise ValueError(f"scrub rate {bytes_per_second!r} and interval {interval!r} must be > 0")
        self.store = store
        self.bytes_per_second = bytes_per_second
        self.interval = interval
        self.first_delay = interval if first_delay is None else first_delay
        self.chunk_bytes = chunk_bytes
        self.chunk_entries = chunk_entries
        self._clock, self._sleep, self._wall, self._pread = clock, sleep, wall, pread
        self._pace = Pace(bytes_per_second, clock, sleep)
        self._retry_delay = RETRY_FIRST
        self.stats = ScrubStats()
        store.scrub_stats = self.stats
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def _thread(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlagent-scrub")
        return self._executor

    def start(self) -> Scrubber:
        """Start the passes (from inside the store's event loop)."""
        self._task = asyncio.ensure_future(self._run())
        log.info(
            "scrubbing started: every replica checked every %gs at %.1f MiB/s at most, the first pass in %gs",
            self.interval, self.bytes_per_second / (1 << 20), self.first_delay,
        )
        return self

    async def stop(self) -> None:
        """Stop scrubbing; returns once the scrub thread is idle and its files are closed."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)
        self.stats.next_pass_at = None

    async def _run(self) -> None:
        next_at = self._clock() + self.first_delay
        while True:
            delay = next_at - self._clock()
            self.stats.next_pass_at = self._wall() + max(delay, 0.0)
            if delay > 0:
                await self._sleep(delay)
            started = self._clock()
            try:
                await self.run_pass()
            except AgentIOError as exc:
                log.info("scrubbing stops: %s", exc)
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bug must not end scrubbing for good
                log.exception("scrub pass failed; the next one starts in %gs", self.interval)
            next_at = started + self.interval
            took = self._clock() - started
            if took > self.interval:
                log.warning(
                    "scrub pass took %.0fs, longer than [scrub] interval (%gs): the next one starts at once; "
                    "raise [scrub] bytes_per_second (now %d) or the interval to check every replica once per interval",
                    took, self.interval, self.bytes_per_second,
                )

    # -- a pass ----------------------------------------------------------------------------

    async def run_pass(self) -> None:
        """Check every replica once (those not in limbo when the pass starts)."""
        started = self._clock()
        self.stats.next_pass_at = None
        before = (self.stats.bytes, self.stats.entries, self.stats.damaged)
        keys = self.store.scrub_keys()  # raises AgentIOError once the store no longer serves
        log.debug("scrub pass %d: %d replicas", self.stats.passes + 1, len(keys))
        for key in keys:
            await self._scrub_segment(key)
        self.stats.passes += 1
        self.stats.last_pass_at = self._wall()
        self.stats.last_pass_seconds = self._clock() - started
        nbytes, entries, damaged = (a - b for a, b in zip((self.stats.bytes, self.stats.entries, self.stats.damaged), before))
        log.info(
            "scrub pass %d done in %.1fs: %d replicas, %d entries, %d bytes checked, %d found damaged",
            self.stats.passes, self.stats.last_pass_seconds, len(keys), entries, nbytes, damaged,
        )

    async def _scrub_segment(self, key: tuple[int, int]) -> None:
        seg: Segment | None = None
        fd: int | None = None
        next_id = 0
        try:
            while True:
                planned = self.store.scrub_chunk(key, seg, next_id, self.chunk_bytes, self.chunk_entries)
                if planned is None:
                    return  # checked to its end, or gone, replaced or in limbo meanwhile
                seg, locs, after = planned
                if not locs:  # only entries not durable yet: a later pass checks them
                    next_id = after
                    continue
                if fd is None:
                    # On the loop, right after planning: the file is the replica's own.
                    try:
                        fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
                    except OSError as exc:
                        if not await self._read_failed(seg, locs[0][0], -1, exc, opening=True):
                            return
                        continue
                    try:  # no readahead: it would cache pages beyond what is checked and dropped
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                    except OSError:
                        pass
                await self._pace.take(sum(loc[2] for loc in locs))
                outcome = await asyncio.get_running_loop().run_in_executor(self._thread(), self._check, fd, seg.key, locs)
                self.stats.bytes += outcome.nbytes
                self.stats.entries += outcome.entries
                if outcome.problem is not None:
                    entry_id, offset, reason = outcome.problem
                    self._found(seg, entry_id, offset, reason)
                    return
                if outcome.error is not None:
                    entry_id, offset, exc = outcome.error
                    if not await self._read_failed(seg, entry_id, offset, exc):
                        return
                    continue  # the same chunk again
                self._retry_delay = RETRY_FIRST
                next_id = after
        finally:
            if fd is not None:
                # On the scrub thread, after any read still using it (even if this task was
                # cancelled mid-read): the number must not be reused under a read.
                self._thread().submit(os.close, fd)

    def _check(self, fd: int, key: tuple[int, int], locs: list[Loc]) -> _Outcome:
        """Scrub thread: read and verify ``locs`` (one pread per run of adjacent entries)."""
        out = _Outcome()
        locs = sorted(locs, key=lambda loc: loc[1])
        i = 0
        while i < len(locs):
            j, start = i + 1, locs[i][1]
            end = start + locs[i][2]
            while j < len(locs) and locs[j][1] == end:
                end += locs[j][2]
                j += 1
            _drop(fd, start, end)  # read the disk, not a cached copy
            try:
                run = self._pread(fd, end - start, start)
            except OSError as exc:
                out.error = (locs[i][0], start, exc)
                return out
            view = memoryview(run)
            for entry_id, off, n, crc in locs[i:j]:
                pos = off - start
                problem = verify_entry(view[pos : pos + n], n, key, entry_id, crc)
                if problem is not None:
                    out.problem = (entry_id, off, problem)
                    break
                out.nbytes += n
                out.entries += 1
            _drop(fd, start, end)
            if out.problem is not None:
                return out
            i = j
        return out

    def _found(self, seg: Segment, entry_id: int, offset: int, reason: str) -> None:
        """Loop thread: damage. The store logs it (file, offset, reason) as it puts the replica
        in limbo, unless the replica was deleted or replaced meanwhile."""
        if self.store.scrub_found(seg, offset, reason):
            self.stats.damaged += 1
        else:
            log.info(
                "scrub: finding in %s dropped (%s at offset %d): the replica was deleted, replaced or put in limbo "
                "while it was read, or the store closed", seg.path, reason, offset,
            )

    async def _read_failed(self, seg: Segment, entry_id: int, offset: int, exc: OSError, *, opening: bool = False) -> bool:
        """Loop thread: a read (or the open) of ``seg`` failed. Damage goes to limbo (False: done
        with this replica); anything else is retried after a backoff (True: try again)."""
        if oserrors.is_damage(exc, opening=opening):
            what = "the replica file is missing" if exc.errno == errno.ENOENT else f"read of entry {entry_id} failed"
            self._found(seg, entry_id, offset, f"{what}: {exc}")
            return False
        delay = self._retry_delay
        self._retry_delay = min(delay * 2, RETRY_MAX)
        self.stats.retries += 1
        where = f"opening {seg.path}" if opening else f"reading {seg.path} at offset {offset} (entry {entry_id})"
        if oserrors.is_resource(exc):
            log.warning("scrub: %s failed for want of a resource (%s): not damage; trying again in %gs", where, exc, delay)
        else:
            log.error("scrub: %s failed (%s): not taken as damage; trying again in %gs", where, exc, delay)
        await self._sleep(delay)
        return True


__all__ = ["DEFAULT_BYTES_PER_SECOND", "DEFAULT_INTERVAL", "Pace", "ScrubStats", "Scrubber"]
