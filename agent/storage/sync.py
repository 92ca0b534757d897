"""Group commit: accepted entries are written and fdatasync'ed in batches off the event loop.

The loop thread only queues buffers (no syscall per add) into the *open* batch. The **sync
thread** takes a batch, writes it (one ``pwritev`` per file), ``fdatasync``s each file it
wrote, and reports the batch durable to the loop; the waiters are plain callbacks (no task or
future per add on the server's hot path).

When the sync thread finishes a batch it takes the open batch at once, in the same thread,
before reporting the finished one: a batch that waited out a sync has gathered everything that
was coming meanwhile, and a round trip through the event loop between two syncs left the disk
idle for a quarter of each cycle (measured with 64 KiB entries). When the sync thread is idle
the loop hands the open batch over once an event-loop turn brought no new add (nobody else is
about to join: a lone writer pays no extra latency), or its oldest add has waited
``window_ms``, or it holds ``window_bytes``. While a sync is in flight the open batch grows
without a cap: a slower disk gets bigger batches, so the number of fdatasyncs follows the
disk's speed, not the add rate. (Capping batches at ``window_bytes`` to pipeline smaller syncs
measured markedly slower for 64 KiB entries: the fixed cost of each fdatasync dominates.
Writing the open batch ahead on another thread while a sync is in flight measured slower too:
the thread hand-offs and GIL contention cost more than the overlapped copy saves.)

Durability: a batch is acknowledged only after an fdatasync of each of its files that was
*called* after every byte of the batch had been written (by the same thread, just before).
fdatasync covers whatever was written before it was called; nothing written later counts on
it. Batches are synced strictly one after another and reported in order, so "batch k is
durable" implies every batch before it is too; per segment, a batch covers one contiguous
byte range.

A failed write or fdatasync is fatal: after it, the page cache may hold data the disk does not
(and Linux may drop the dirty pages and report success on a later fsync), so nothing written
since the last good sync can ever be acknowledged. Every waiting add fails with
AgentIOError and the owner is told (``on_fatal``) so it stops serving.

A batch handed over while the sync thread is idle and holding at most ``inline_bytes`` is
made durable on the loop thread instead (see SyncPolicy): a lone synchronous writer's add then
costs no wake-up of the sync thread and none of the loop on the way back. The rules above are
unchanged: it is the only batch in flight, and it is reported before anything else runs.

Segment files are preallocated ahead of the data (``prealloc_bytes``): the loop decides, when
an add crosses the allocated end, how far the file should grow, and the thread that writes the
batch calls ``posix_fallocate`` first. A failed preallocation is not fatal (the write decides):
it is logged once and preallocation stops.

Adds marked *uncached* (a bulk copy's writes: the bootstrap's sink segments and re-replicated
replicas, which nobody reads back before their copy is verified and committed) leave the page
cache once durable: after the fdatasync, the thread that wrote the batch drops those pages
(``POSIX_FADV_DONTNEED``; they are clean by then, so nothing is lost and nothing is written
twice). A copy of gigabytes then cycles through a few warm pages instead of pushing the
agent's hot data out of memory and making the kernel find (and on a VM, the host fault in)
fresh pages for every byte: measured on this sandbox, the sink agents' CPU per GiB copied fell
from about 3.0 to 1.5 s (tests/benchmarks/profile_bootstrap.py). Only in "always" mode: unsynced
dirty pages would not be dropped.

Metadata jobs (new files, markers, deletes: ``run_blocking``) run on a thread of their own,
so a stream of data batches never delays a fence behind it. Their order with the data is
explicit in the store: a fence or a delete first awaits the data it depends on.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter
from typing import TYPE_CHECKING

from dlctl.log.errors import AgentIOError

from .segment import Segment
from .types import SyncPolicy

if TYPE_CHECKING:
    from ..metrics import AgentMetrics

log = logging.getLogger("dlagent.storage")

try:
    IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
except (ValueError, OSError):  # pragma: no cover - every Linux has it
    IOV_MAX = 1024

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

# The sync thread needs the GIL back after every pwritev and fdatasync. While the loop thread
# is busy, CPython lets a waiting thread have it only after the switch interval (5 ms by
# default), which stalls the disk pipeline for that long; the store lowers it to this.
SWITCH_INTERVAL = 0.0002


def pwritev_all(fd: int, bufs: list, offset: int) -> None:
    """Write ``bufs`` contiguously at ``offset``, retrying short writes; raise on no progress."""
    pending = list(bufs)
    pos = 0
    while pos < len(pending):
        chunk = pending[pos : pos + IOV_MAX]
        want = sum(len(b) for b in chunk)
        done = os.pwritev(fd, chunk, offset)
        if done <= 0:
            raise OSError(errno.EIO, f"pwritev wrote {done} of {want} bytes at offset {offset}")
        offset += done
        if done == want:
            pos += len(chunk)
            continue
        while done >= len(pending[pos]):
            done -= len(pending[pos])
            pos += 1
        pending[pos] = memoryview(pending[pos])[done:]


def _drop_cached(slot: Slot) -> None:
    """Advise the kernel to drop ``slot``'s pages, now clean (synced). From the page holding its
    first byte, which the previous batch of the segment left partly written and so cached; the
    kernel keeps a partial last page, for the next batch to drop."""
    start = slot.start - slot.start % PAGE_SIZE
    try:
        os.posix_fadvise(slot.fd, start, slot.end - start, os.POSIX_FADV_DONTNEED)
    except OSError as exc:  # only advice: the data is durable either way
        log.debug("dropping synced pages of fd %d from the page cache failed: %s", slot.fd, exc)


def _future_waiter(fut: asyncio.Future) -> Callable[[BaseException | None], None]:
    def done(exc: BaseException | None) -> None:
        if not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

    return done


# Preallocation grows a file by as much as it holds, at least this much and at most the
# policy's prealloc_bytes: a small segment wastes little, a big one rarely grows (a lone
# writer's 3,000 appends of 150 bytes grow the file 5 times).
PREALLOC_MIN = 16 * 1024


class Slot:
    """One segment's contiguous byte range in a batch. ``fd`` is the segment's file, which stays
    open while it has unwritten data (the FdCache never evicts a pinned segment). ``grow_from``
    and ``grow_to``, when set, is a range to preallocate before writing. ``uncached``: drop the
    range from the page cache once it is durable."""

    __slots__ = ("fd", "start", "bufs", "end", "grow_from", "grow_to", "uncached")

    def __init__(self, fd: int, start: int, buf: bytes, uncached: bool) -> None:
        self.fd = fd
        self.start = start
        self.bufs = [buf]
        self.end = start + len(buf)
        self.grow_from = -1
        self.grow_to = -1
        self.uncached = uncached

    def grow(self, start: int, end: int) -> None:
        self.grow_from = start if self.grow_from < 0 else min(self.grow_from, start)
        self.grow_to = max(self.grow_to, end)


class Batch:
    __slots__ = ("segs", "waiters", "adds", "bytes", "started")

    def __init__(self) -> None:
        self.segs: dict[Segment, Slot] = {}
        # Called with None once the batch is durable, or with an error; loop thread only.
        self.waiters: list[Callable[[BaseException | None], None]] = []
        self.adds = 0
        self.bytes = 0
        self.started = 0.0


class GroupCommitter:
    """Shared state between the loop and the sync thread is guarded by ``_lock``: which batch is
    open (and its contents), the batches the sync thread took (``_taken``) and whether it is
    running (``_busy``). Waiter futures, ``Segment`` fields and the counters belong to the loop."""

    def __init__(
        self,
        policy: SyncPolicy,
        on_fatal: Callable[[BaseException], None],
        fdatasync: Callable[[int], None] = os.fdatasync,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.policy = policy
        self._metrics = metrics  # per batch: its size once durable, the time of each fdatasync
        self._on_fatal = on_fatal
        self._fdatasync = fdatasync
        self._sync_data = policy.mode == "always"
        self._lock = threading.Lock()
        self._open = Batch()
        self._taken: deque[Batch] = deque()  # handed to the sync thread, not yet reported durable
        self._busy = False  # the sync thread is working through batches
        self._window = policy.window_ms / 1000.0
        self._window_bytes = policy.window_bytes
        self._inline_bytes = policy.inline_bytes
        self._prealloc = policy.prealloc_bytes  # 0 once a preallocation failed
        self._stopped = False
        self._sync: ThreadPoolExecutor | None = None
        self._meta: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.failure: BaseException | None = None
        # Counters for stat() and the benchmarks.
        self.adds = 0
        self.batches = 0
        self.inline_batches = 0
        self.fdatasyncs = 0
        self.bytes_written = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if sys.getswitchinterval() > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)
        self._sync = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlagent-sync")
        self._meta = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlagent-meta")

    def _batches(self) -> list[Batch]:
        """Unfinished batches, oldest first (caller holds the lock)."""
        out = list(self._taken)
        if self._open.adds:
            out.append(self._open)
        return out

    @property
    def pending_bytes(self) -> int:
        with self._lock:
            return sum(b.bytes for b in self._batches())

    def append(
        self, seg: Segment, buf: bytes, callback: Callable[[BaseException | None], None] | None = None, *, uncached: bool = False
    ) -> int:
        """Queue an entry at the end of ``seg``; returns its offset. ``callback``, if given, is
        called once it is durable (see ``on_durable``). ``seg.fd`` must be open (a segment with
        queued data is pinned in the FdCache, so it stays open until written). ``uncached``: a
        bulk copy's write, dropped from the page cache once durable (with the rest of its slot)."""
        off = seg.size
        end = off + len(buf)
        seg.size = end
        seg.mem[off] = buf
        self.adds += 1
        grow_to = 0
        if end > seg.alloc_end and self._prealloc:
            grow_to = end + min(max(end, PREALLOC_MIN), self._prealloc)
        with self._lock:
            b = self._open
            slot = b.segs.get(seg)
            if slot is None:
                slot = b.segs[seg] = Slot(seg.fd, off, buf, uncached)  # type: ignore[arg-type]
            else:
                slot.bufs.append(buf)
                slot.end = end
                slot.uncached |= uncached
            if grow_to:
                slot.grow(seg.alloc_end, grow_to)
            if callback is not None:
                b.waiters.append(callback)
            first = not b.adds
            b.adds += 1
            b.bytes += len(buf)
            wake = first and not self._busy  # a busy sync thread takes the batch by itself
        if grow_to:
            seg.alloc_end = grow_to
        if wake:
            b.started = self._loop.time()  # type: ignore[union-attr]
            self._loop.call_soon(self._linger, b, -1)  # type: ignore[union-attr]
        return off

    def wait(self, seg: Segment, end: int) -> asyncio.Future | None:
        """A future resolved once ``seg`` is durable up to ``end``; None if it already is."""
        if end <= seg.durable:
            return None
        fut = self._loop.create_future()  # type: ignore[union-attr]
        self._batch_holding(seg, end).waiters.append(_future_waiter(fut))
        return fut

    def on_durable(self, seg: Segment, end: int, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback(None)`` once ``seg`` is durable up to ``end`` (now, if it is already),
        ``callback(error)`` if it never will be. Raises if the store failed."""
        if end <= seg.durable:
            callback(None)
        else:
            self._batch_holding(seg, end).waiters.append(callback)

    def _batch_holding(self, seg: Segment, end: int) -> Batch:
        if self.failure is not None:
            raise AgentIOError(f"store failed: {self.failure}")
        # Per segment, batches hold increasing byte ranges: the batch whose range ends at or
        # after ``end`` and starts before it holds it.
        with self._lock:
            batches = self._batches()
        for batch in reversed(batches):
            slot = batch.segs.get(seg)
            if slot is not None and slot.start < end <= slot.end:
                return batch
        raise AssertionError(f"{seg.path}: offset {end} is neither durable nor queued")

    async def flush(self) -> None:
        """Wait until everything queued so far is durable."""
        while True:
            if self.failure is not None:
                raise AgentIOError(f"store failed: {self.failure}")
            with self._lock:
                batches = self._batches()
            if not batches:
                return
            fut = self._loop.create_future()  # type: ignore[union-attr]
            batches[-1].waiters.append(_future_waiter(fut))
            await fut

    def _linger(self, batch: Batch, seen: int) -> None:
        """Loop callback for the open batch while the sync thread is idle: hands it over once a
        whole loop turn passed without a new add (``seen`` is the count at the previous check;
        -1 on the first call, which is in the turn after the first add, maybe before adds
        already scheduled for that turn), or the window is over."""
        if self.failure is not None or self._stopped or batch is not self._open:
            return
        if batch.adds != seen and batch.bytes < self._window_bytes and self._loop.time() < batch.started + self._window:  # type: ignore[union-attr]
            self._loop.call_soon(self._linger, batch, batch.adds)  # type: ignore[union-attr]
            return
        with self._lock:
            # Only the loop starts the sync thread, and only when it is idle, so the open
            # batch is still the one we lingered on.
            self._open = Batch()
            self._taken.append(batch)
            self._busy = True
            # Inline only when no earlier batch still waits for its report (the sync thread
            # went idle but its _completed call has not run yet): reports go out in order.
            inline = len(self._taken) == 1 and batch.bytes <= self._inline_bytes
        if inline:
            self._inline(batch)
        else:
            self._sync.submit(self._cycle, batch)  # type: ignore[union-attr]

    def _inline(self, batch: Batch) -> None:
        """Loop thread, sync thread idle: make a small ``batch`` durable here and report it.
        Nothing can join the batch meanwhile (adds come from this thread)."""
        try:
            self._write(batch)
        except BaseException as exc:  # noqa: BLE001 - any failure here is fatal
            self._fail(exc)
            return
        with self._lock:
            self._busy = False
        self.inline_batches += 1
        self._completed(batch)

    def _write(self, batch: Batch) -> None:
        """Preallocate, write and (in "always" mode) fdatasync every file of ``batch``. Nobody
        else touches a batch once taken: the loop appends to the next one. Every byte of the
        batch is written before its fdatasync is called."""
        for slot in batch.segs.values():
            if slot.grow_to > 0 and self._prealloc:
                self._preallocate(slot)
            pwritev_all(slot.fd, slot.bufs, slot.start)
        if self._sync_data:
            metrics = self._metrics
            for slot in batch.segs.values():
                started = perf_counter()
                self._fdatasync(slot.fd)
                if metrics is not None:
                    metrics.fsync(perf_counter() - started)
                if slot.uncached:
                    _drop_cached(slot)

    def _preallocate(self, slot: Slot) -> None:
        try:
            os.posix_fallocate(slot.fd, slot.grow_from, slot.grow_to - slot.grow_from)
        except OSError as exc:
            # Only an optimisation: the write itself decides whether the disk has room.
            self._prealloc = 0
            log.warning("preallocating segment files failed (%s); files now grow with each write", exc)

    def _cycle(self, batch: Batch) -> None:
        """Sync thread: make ``batch`` durable, then each batch that opened meanwhile, until none."""
        loop = self._loop
        assert loop is not None
        while True:
            try:
                self._write(batch)
            except BaseException as exc:  # noqa: BLE001 - any failure here is fatal
                loop.call_soon_threadsafe(self._fail, exc)
                return
            # Take the next batch (or go idle) before reporting this one: once an add is
            # acknowledged, the next one must find the sync thread's state up to date (idle:
            # the loop's window rules apply to it).
            done = batch
            with self._lock:
                if self.failure is not None:
                    return  # _busy stays set: nothing is handed over again
                batch = self._open
                more = batch.adds > 0
                if more:
                    self._open = Batch()
                    self._taken.append(batch)
                else:
                    self._busy = False
            loop.call_soon_threadsafe(self._completed, done)
            if not more:
                return

    def _completed(self, batch: Batch) -> None:
        """Loop thread: ``batch`` is durable (reports arrive in order)."""
        if self.failure is not None:
            return  # failed meanwhile (a metadata fsync); the waiters have their error
        with self._lock:
            done = self._taken.popleft()
        assert done is batch
        self.batches += 1
        self.bytes_written += batch.bytes
        if self._metrics is not None:
            self._metrics.committed(batch.adds, batch.bytes)
        if self._sync_data:
            self.fdatasyncs += len(batch.segs)
        for seg, slot in batch.segs.items():
            seg.durable = slot.end
            mem = seg.mem
            off = slot.start
            for buf in slot.bufs:
                del mem[off]
                off += len(buf)
        for callback in batch.waiters:
            try:
                callback(None)
            except Exception:  # noqa: BLE001 - one broken waiter must not keep others waiting
                log.exception("durability callback failed")

    def run_blocking(self, fn: Callable, *args) -> asyncio.Future:
        """Run a metadata fsync job on the metadata thread."""
        return self._loop.run_in_executor(self._meta, fn, *args)  # type: ignore[union-attr]

    def _fail(self, exc: BaseException) -> None:
        if self.failure is not None:
            return
        with self._lock:
            self.failure = exc
            batches = self._batches()
        for batch in batches:
            for callback in batch.waiters:
                try:
                    callback(AgentIOError(f"write/fdatasync failed, entry not durable: {exc}"))
                except Exception:  # noqa: BLE001
                    log.exception("durability callback failed")
        self._on_fatal(exc)

    def fail(self, exc: BaseException) -> None:
        """Fatal failure detected elsewhere (a metadata fsync): fail every waiter, stop flushing."""
        self._fail(exc)

    async def stop(self) -> None:
        # The caller flushed first (or the store failed): nothing is handed over any more.
        self._stopped = True
        # A sync cycle in flight finishes in its thread; shutdown waits for it.
        for name in ("_sync", "_meta"):
            executor = getattr(self, name)
            if executor is not None:
                setattr(self, name, None)
                await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)
