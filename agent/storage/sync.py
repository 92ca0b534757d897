"""Group commit: accepted entries are written and fdatasync'ed in batches by one sync thread.

The loop thread only queues buffers (no syscall per add). A flusher task hands a batch to the
sync thread, which writes each dirty file with one ``pwritev`` and then ``fdatasync``s it;
while that is in flight, new adds pile up in the next batch, so the number of fdatasyncs
follows the disk's speed, not the add rate. When the sync thread is free, the open batch is
handed over once an event-loop turn brought no new add (nobody else is about to join: a lone
writer pays no extra latency), or its oldest add has waited ``window_ms``, or it holds
``window_bytes``. While a sync is in flight the next batch grows without a cap: a slower disk
gets bigger batches. (Capping batches at ``window_bytes`` to pipeline smaller syncs measured
markedly slower for 64 KiB entries: the fixed cost of each fdatasync dominates.)

Batches are written strictly one after another, so "batch k is durable" implies every batch
before it is too; per segment, a batch covers one contiguous byte range.

A failed write or fdatasync is fatal: after it, the page cache may hold data the disk does not
(and Linux may drop the dirty pages and report success on a later fsync), so nothing written
since the last good sync can ever be acknowledged. Every waiting add fails with
AgentIOError and the owner is told (``on_fatal``) so it stops serving.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from dlctl.log.errors import AgentIOError

from .segment import Segment
from .types import SyncPolicy

try:
    IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
except (ValueError, OSError):  # pragma: no cover - every Linux has it
    IOV_MAX = 1024


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


class Batch:
    __slots__ = ("segs", "waiters", "adds", "bytes", "started")

    def __init__(self) -> None:
        # segment -> [start offset, buffers, end offset]
        self.segs: dict[Segment, list] = {}
        self.waiters: list[asyncio.Future] = []
        self.adds = 0
        self.bytes = 0
        self.started = 0.0


class GroupCommitter:
    def __init__(
        self,
        policy: SyncPolicy,
        on_fatal: Callable[[BaseException], None],
        fdatasync: Callable[[int], None] = os.fdatasync,
    ) -> None:
        self.policy = policy
        self._on_fatal = on_fatal
        self._fdatasync = fdatasync
        self._sync_data = policy.mode == "always"
        self._open = Batch()
        self._inflight: Batch | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.failure: BaseException | None = None
        # Counters for stat() and the benchmarks.
        self.adds = 0
        self.batches = 0
        self.fdatasyncs = 0
        self.bytes_written = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlagent-sync")
        self._task = self._loop.create_task(self._run(), name="dlagent-group-commit")

    def _batches(self) -> list[Batch]:
        """Unfinished batches, oldest first."""
        out = [self._inflight] if self._inflight is not None else []
        if self._open.adds:
            out.append(self._open)
        return out

    @property
    def pending_bytes(self) -> int:
        return sum(b.bytes for b in self._batches())

    def append(self, seg: Segment, buf: bytes) -> int:
        """Queue an entry at the end of ``seg``; returns its offset. ``seg.fd`` must be open (a
        segment with queued data is pinned in the FdCache, so it stays open until written)."""
        off = seg.size
        end = off + len(buf)
        seg.size = end
        seg.mem[off] = buf
        b = self._open
        slot = b.segs.get(seg)
        if slot is None:
            b.segs[seg] = [off, [buf], end]
        else:
            slot[1].append(buf)
            slot[2] = end
        if not b.adds:
            b.started = self._loop.time()  # type: ignore[union-attr]
            self._wake.set()  # type: ignore[union-attr]
        b.adds += 1
        b.bytes += len(buf)
        self.adds += 1
        return off

    def wait(self, seg: Segment, end: int) -> asyncio.Future | None:
        """A future resolved once ``seg`` is durable up to ``end``; None if it already is."""
        if end <= seg.durable:
            return None
        if self.failure is not None:
            raise AgentIOError(f"store failed: {self.failure}")
        # Per segment, batches hold increasing byte ranges: the first batch reaching ``end``
        # holds it.
        for batch in self._batches():
            slot = batch.segs.get(seg)
            if slot is not None and end <= slot[2]:
                fut = self._loop.create_future()  # type: ignore[union-attr]
                batch.waiters.append(fut)
                return fut
        raise AssertionError(f"{seg.path}: offset {end} is neither durable nor queued")

    async def flush(self) -> None:
        """Wait until everything queued so far is durable."""
        while True:
            if self.failure is not None:
                raise AgentIOError(f"store failed: {self.failure}")
            batches = self._batches()
            if not batches:
                return
            batch = batches[-1]
            fut = self._loop.create_future()  # type: ignore[union-attr]
            batch.waiters.append(fut)
            await fut

    async def _run(self) -> None:
        loop = self._loop
        assert loop is not None and self._wake is not None
        window = self.policy.window_ms / 1000.0
        window_bytes = self.policy.window_bytes
        while self.failure is None:
            batch = self._open
            if not batch.adds:
                self._wake.clear()
                await self._wake.wait()
                continue
            # Linger while others are still joining (an add arrived during the last loop turn),
            # bounded by the window; a batch that already waited out a sync goes at once.
            deadline = batch.started + window
            while batch.bytes < window_bytes and loop.time() < deadline:
                seen = batch.adds
                await asyncio.sleep(0)
                if batch.adds == seen:
                    break
            self._open = Batch()
            self._inflight = batch
            jobs = [(seg.fd, bufs, start) for seg, (start, bufs, _end) in batch.segs.items()]
            try:
                await loop.run_in_executor(self._executor, self._write_and_sync, jobs)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - any failure here is fatal
                self._fail(exc)
                return
            self._inflight = None
            if self.failure is not None:
                return  # failed meanwhile (a metadata fsync); the waiters have their error
            self.batches += 1
            self.bytes_written += batch.bytes
            if self._sync_data:
                self.fdatasyncs += len(jobs)
            for seg, (start, bufs, end) in batch.segs.items():
                seg.durable = end
                mem = seg.mem
                off = start
                for buf in bufs:
                    del mem[off]
                    off += len(buf)
            for fut in batch.waiters:
                if not fut.done():
                    fut.set_result(None)

    def _write_and_sync(self, jobs: list[tuple[int, list, int]]) -> None:
        # Runs in the sync thread: all writes first, so the disk sees them before any sync.
        for fd, bufs, offset in jobs:
            pwritev_all(fd, bufs, offset)
        if self._sync_data:
            for fd, _bufs, _offset in jobs:
                self._fdatasync(fd)

    def run_blocking(self, fn: Callable, *args) -> asyncio.Future:
        """Run a metadata fsync job on the sync thread, ordered with the data batches."""
        return self._loop.run_in_executor(self._executor, fn, *args)  # type: ignore[union-attr]

    def _fail(self, exc: BaseException) -> None:
        if self.failure is not None:
            return
        self.failure = exc
        for batch in (self._inflight, self._open):
            if batch is None:
                continue
            for fut in batch.waiters:
                if not fut.done():
                    fut.set_exception(AgentIOError(f"write/fdatasync failed, entry not durable: {exc}"))
        self._on_fatal(exc)

    def fail(self, exc: BaseException) -> None:
        """Fatal failure detected elsewhere (a metadata fsync): fail every waiter, stop flushing."""
        self._fail(exc)
        task = self._task
        if task is not None and not task.done() and self._inflight is None and task is not asyncio.current_task():
            task.cancel()

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            # The caller flushed first (or the store failed); an in-flight job, if any, finishes
            # in the thread and executor.shutdown waits for it.
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)
