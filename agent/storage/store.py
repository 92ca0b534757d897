"""SegmentStore: the agent's durable segment replicas (the "bookie" role).

Runs inside the agent's event loop. The loop thread validates, indexes and queues entries and
serves reads (one pread each); every write and fsync happens on the store's threads (sync.py:
entry data on the sync thread, files and markers on the metadata thread), so a slow disk never
stalls the loop. Layout on disk: see layout.py.

What is made durable when:
- an add: its bytes, by the group-commit fdatasync of the batch it joined (mode "always");
- a new segment: the empty .log file, then its directory (and segments/ if the log
  directory is new), before the first add to it is queued;
- a fence: every entry accepted before it (their batch), then the .fenced marker file and
  its directory, before fence() returns;
- limbo: the .limbo marker file and its directory, when the corruption is found;
- the acknowledged length: each growing replica's .acked file, about every ACKED_SECONDS
  (upkeep.py) and at a clean close (a file found shorter at start-up goes to limbo: it was
  cut, see recovery.py);
- a cut tail: ftruncate + fsync of the file during open(), before anything is served;
- a delete: unlink of the files, then an fsync of the directory, shared by the deletes that
  arrive within SETTLE_DELAY (a collection deletes many replicas of one log in a row).

This module holds the replicas' state and the order of things (open, close, failure, creating,
fencing and deleting replicas); the work is done in rooms of its own: checks of entries in
entries.py, an add's last step in writes.py, reads in reads.py, LAC waits in lacwait.py, file
work and its fsyncs in files.py, startup recovery in startup.py, background upkeep in upkeep.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dlctl.log.errors import AgentIOError, BadRequestError, LimboError, NoSuchSegmentError
from dlctl.log.format import HEADER_SIZE
from dlctl.logthrottle import LogThrottle

from . import layout
from .entries import DIGEST_ITEM, check_batch_crcs, check_crc, parse_batch, parse_entry, segment_name
from .files import ReplicaFiles, SyncFailed
from .lacwait import LacWaiters
from .layout import FENCED_SUFFIX, DirLock, Key, check_entry_id, check_segment_ids
from .reads import ReplicaReader
from .segment import FdCache, Segment
from .startup import recover_replicas
from .sync import GroupCommitter
from .types import Digest, FenceResult, LimboRecord, RecoveryReport, SegmentInfo, SyncPolicy
from .upkeep import Upkeep
from .writes import EntryQueue

if TYPE_CHECKING:
    from ..metrics import AgentMetrics

log = logging.getLogger("dlagent.storage")

SETTLE_DELAY = 0.02  # seconds deletes wait to share one directory fsync


class SegmentStore(Upkeep):
    """Durable segment replicas under one data directory, for one event loop."""

    def __init__(
        self,
        data_dir: Path,
        sync: SyncPolicy = SyncPolicy(),
        *,
        fdatasync: Callable[[int], None] = os.fdatasync,
        fsync: Callable[[int], None] = os.fsync,
        max_open_files: int = 512,
        metrics: AgentMetrics | None = None,
    ) -> None:
        """``fdatasync`` syncs entry data (group commit); ``fsync`` syncs new files,
        directories and markers. Both are injectable so tests can count calls and fail them.
        ``metrics``: where group commit records its batches and fdatasyncs."""
        self.data_dir = Path(data_dir)
        self.sync = sync
        self.on_failure: Callable[[BaseException], None] | None = None
        self._files = ReplicaFiles(self.data_dir, fsync)
        self._fds = FdCache(max_open_files)
        self._committer = GroupCommitter(sync, self._fatal, fdatasync, metrics)
        self._lock = DirLock(self.data_dir)
        self._segments: dict[Key, Segment] = {}
        self._creating: dict[Key, asyncio.Task] = {}
        self._deleting: dict[Key, asyncio.Task] = {}
        self._lac_waiters = LacWaiters()
        self._queue = EntryQueue(self._committer, self._fds, self._lac_waiters)
        self._background: set[asyncio.Task] = set()
        self._state = "new"  # new -> open -> closing -> closed
        self._serving = False
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._settling: asyncio.Task | None = None  # the next settle of deletes, which deletes join
        self._trim_timer: asyncio.TimerHandle | None = None
        self._acked_timer: asyncio.TimerHandle | None = None
        self._checkpointing: asyncio.Task | None = None  # index checkpoints being written (one batch at a time)
        self._throttle = LogThrottle(log)  # read failures can come in floods (descriptors exhausted)
        self._reader = ReplicaReader(self._fds, self._to_limbo, self._throttle)

    # ------------------------------------------------------------------ lifecycle

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def _check(self) -> None:
        if self._serving:
            return
        if self._failure is not None:
            raise AgentIOError(
                f"storage in {self.data_dir} failed ({self._failure}); this agent no longer serves",
                hint="check the disk and the agent log, then restart the agent (startup recovery checks every replica)",
            )
        raise AgentIOError(f"segment store {self.data_dir} is {self._state}, not open")

    async def open(self) -> RecoveryReport:
        if self._state != "new":
            raise AgentIOError(f"segment store {self.data_dir} was already opened")
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._files.make_data_dir)
        self._lock.acquire_exclusive()
        try:
            segments, report = await asyncio.to_thread(recover_replicas, self._files)
            self._files.load_reclaimed()
        except BaseException:
            self._lock.release()
            raise
        self._segments = segments
        self._committer.start()
        self._state = "open"
        self._serving = True
        self._start_upkeep()
        log.info(
            "opened %s: %d segments, %d entries, %d tails cut, %d in limbo",
            self.data_dir, report.segments, report.entries, len(report.tails_cut), len(report.limbo),
        )
        return report

    async def close(self) -> None:
        """Flush what is pending, stop the sync thread, release the lock. Idempotent."""
        if self._state in ("new", "closed"):
            self._state = "closed"
            return
        if self._state == "closing":
            return
        self._state = "closing"
        self._serving = False
        self._stop_upkeep()
        try:
            if self._failure is None:
                try:
                    await self._committer.flush()
                except AgentIOError:
                    pass  # already fatal; the waiters got the error
                else:
                    await self._last_upkeep()
            for task in list(self._creating.values()) + list(self._deleting.values()) + list(self._background):
                try:
                    await asyncio.shield(task)
                except BaseException:  # noqa: BLE001 - their callers saw the error
                    pass
            await self._committer.stop()
        finally:
            self._fds.close_all()
            self._lac_waiters.fail_all(AgentIOError(f"segment store {self.data_dir} closed"))
            self._lock.release()
            self._state = "closed"

    def _fatal(self, exc: BaseException) -> None:
        if self._failure is not None:
            return
        self._failure = exc
        self._serving = False
        log.critical("storage in %s failed, refusing all further requests: %s", self.data_dir, exc)
        if self._committer.failure is None:
            self._committer.fail(exc)
        self._lac_waiters.fail_all(AgentIOError(f"storage failed: {exc}"))
        callback = self.on_failure
        if callback is not None:
            try:
                callback(exc)
            except Exception:  # noqa: BLE001 - the failure must stay recorded whatever the callback does
                log.exception("on_failure callback raised")

    async def _blocking(self, what: str, fn: Callable, *args):
        """Run a metadata job on the sync thread; a failed fsync there is fatal."""
        try:
            return await self._committer.run_blocking(fn, *args)
        except SyncFailed as exc:
            self._fatal(exc)
            raise AgentIOError(f"{what}: {exc}") from exc
        except AgentIOError:
            raise
        except OSError as exc:
            raise AgentIOError(f"{what}: {exc}") from exc

    # ------------------------------------------------------------------ segments

    async def _segment_for_write(self, key: Key, *, fenced: bool) -> Segment:
        """The segment, created durably if new (one creation however many adds race for it)."""
        while True:
            seg = self._segments.get(key)
            if seg is not None:
                return seg
            deleting = self._deleting.get(key)
            if deleting is not None:
                try:
                    await asyncio.shield(deleting)
                except Exception:  # noqa: BLE001 - the deleter reports it; we re-check
                    pass
                self._check()
                continue
            creating = self._creating.get(key)
            if creating is None:
                creating = self._loop.create_task(self._create(key, fenced))  # type: ignore[union-attr]
                self._creating[key] = creating
            await asyncio.shield(creating)
            self._check()

    async def _create(self, key: Key, fenced: bool) -> Segment:
        try:
            path = await self._blocking(f"cannot create {segment_name(key)}", self._files.create, key, fenced)
            seg = Segment(key, path)
            seg.fenced = seg.fence_durable = fenced
            self._segments[key] = seg
            return seg
        finally:
            self._creating.pop(key, None)

    def _segment(self, log_id: object, segment_seq: object) -> Segment:
        self._check()
        key = check_segment_ids(log_id, segment_seq)
        seg = self._segments.get(key)
        if seg is None:
            raise NoSuchSegmentError(f"this agent has no replica of {segment_name(key)}")
        if seg.limbo is not None:
            raise LimboError(
                f"replica of {segment_name(key)} is in limbo ({seg.limbo.reason} at offset {seg.limbo.offset} of {seg.path})",
                hint="re-replicate it from its peers (dlctl recover), which deletes and rewrites this replica",
            )
        return seg

    # ------------------------------------------------------------------ adds (entries.py, writes.py)

    async def add(self, encoded: bytes, *, recovery: bool = False, uncached: bool = False) -> None:
        """Store one encoded entry durably. Pass ``bytes`` (others are copied once). ``uncached``:
        drop it from the page cache once durable (a bulk copy's write, see GroupCommitter)."""
        self._check()
        encoded, n, log_id, seq, entry_id, lac, length, crc = parse_entry(encoded)
        check_crc(encoded, log_id, seq, entry_id, crc)
        key = (log_id, seq)
        seg = self._segments.get(key)
        if seg is None:
            seg = await self._segment_for_write(key, fenced=False)
        end = self._queue.accept(seg, encoded, n, entry_id, lac, length, crc, recovery, None, uncached)
        fut = self._committer.wait(seg, end)
        if fut is not None:
            await fut

    def add_nowait(
        self, encoded: bytes, callback: Callable[[BaseException | None], None], *, recovery: bool = False, uncached: bool = False
    ) -> bool:
        """``add`` without a coroutine, for the server's hot path: validates and queues the entry
        at once and calls ``callback(None)`` on the loop thread once it is durable, or
        ``callback(error)`` if it never will be (maybe before returning, for an entry stored
        already). A bad entry raises, as ``add`` does. Returns False, having done nothing, when
        the entry's segment does not exist here yet: creating it takes a wait, so use ``add``.
        """
        self._check()
        encoded, n, log_id, seq, entry_id, lac, length, crc = parse_entry(encoded)
        seg = self._segments.get((log_id, seq))
        if seg is None:
            return False  # before the CRC check: add() does it
        check_crc(encoded, log_id, seq, entry_id, crc)
        self._queue.accept(seg, encoded, n, entry_id, lac, length, crc, recovery, callback, uncached)
        return True

    async def add_batch(self, entries: Sequence[bytes | memoryview], *, recovery: bool = False, uncached: bool = False, sealed_here: bool = False) -> int:
        """Store several encoded entries of one segment (ids strictly increasing) durably, each
        exactly as ``add`` stores it, all or nothing: every entry is checked (header, ids,
        CRC, the fenced and limbo rules, an id stored with other bytes) before any is queued, so
        a refused batch stored nothing; the error names the entry. Returns how many entries the
        batch held, once all are durable. Read-only memoryviews (slices of a request's body)
        are kept as they are, not copied: their owner must not change them. ``sealed_here``:
        this process encoded the entries and computed their CRCs (a pull's re-encoded copy),
        nothing received them, so the CRCs are not computed a second time; every other check
        stays."""
        self._check()
        parsed = parse_batch(entries)
        if not sealed_here:
            check_batch_crcs(parsed)
        key = parsed[0][2], parsed[0][3]
        seg = self._segments.get(key)
        if seg is None:
            seg = await self._segment_for_write(key, fenced=False)
        end = self._queue.accept_batch(seg, parsed, recovery, None, uncached)
        fut = self._committer.wait(seg, end)
        if fut is not None:
            await fut
        return len(parsed)

    def add_batch_nowait(
        self, entries: Sequence[bytes | memoryview], callback: Callable[[BaseException | None], None], *, recovery: bool = False, uncached: bool = False
    ) -> bool:
        """``add_batch`` without a coroutine, as ``add_nowait`` is to ``add``: ``callback`` is
        told once every entry is durable; a refused batch raises (nothing stored); False,
        having done nothing, when the segment does not exist here yet (use ``add_batch``)."""
        self._check()
        parsed = parse_batch(entries)
        seg = self._segments.get((parsed[0][2], parsed[0][3]))
        if seg is None:
            return False  # before the CRC checks: add_batch() does them
        check_batch_crcs(parsed)
        self._queue.accept_batch(seg, parsed, recovery, callback, uncached)
        return True

    # ------------------------------------------------------------------ reads (reads.py)

    def read(self, log_id: int, segment_seq: int, entry_id: int) -> bytes:
        """The encoded entry, CRC re-verified (a mismatch puts the replica in limbo, as a media
        error does; a read failing for want of descriptors or memory raises the retryable
        AgentResourceError and leaves the replica alone: see reads.py). An entry accepted but
        not yet durable is served from memory."""
        return self._reader.read(self._segment(log_id, segment_seq), entry_id)

    def read_range(self, log_id: int, segment_seq: int, first: int, last: int, max_bytes: int) -> bytes:
        """Encoded entries ``first``..``last`` back to back, as ``ReplicaReader.read_range``
        reads them: no more than ``max_bytes`` (but always ``first``), up to the first one
        missing here."""
        return self._reader.read_range(self._segment(log_id, segment_seq), first, last, max_bytes)

    def _to_limbo(self, seg: Segment, offset: int, reason: str) -> None:
        if seg.limbo is not None:
            return
        record = LimboRecord(seg.log_id, seg.seq, str(seg.path), offset, reason)
        seg.limbo = record
        log.error("%s in limbo: %s at offset %d", seg.path, reason, offset)
        task = self._loop.create_task(self._persist_limbo(record))  # type: ignore[union-attr]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _persist_limbo(self, record: LimboRecord) -> None:
        try:
            await self._blocking(f"cannot persist limbo of {record.path}", self._files.write_limbo_marker, record)
        except AgentIOError as exc:
            # Still in limbo for this run. Without the marker a restart re-checks the file:
            # rot is found again by the scan, a transient read error may clear.
            log.error("%s", exc)

    # ------------------------------------------------------------------ LAC (lacwait.py)

    def lac(self, log_id: int, segment_seq: int) -> int:
        return self._segment(log_id, segment_seq).lac

    def last_entry_id(self, log_id: int, segment_seq: int) -> int:
        return self._segment(log_id, segment_seq).index.last_id

    def learn_lac(self, log_id: int, segment_seq: int, lac: int) -> int:
        """Raise the replica's LAC to ``lac`` if higher (not persisted: entries carry it). Returns it."""
        seg = self._segment(log_id, segment_seq)
        if not isinstance(lac, int) or isinstance(lac, bool) or not -1 <= lac < 2**63:
            raise BadRequestError(f"LAC {lac!r} out of range (-1..2^63-1)")
        if lac > seg.lac:
            self._lac_waiters.raise_lac(seg, lac)
        return seg.lac

    async def wait_lac(self, log_id: int, segment_seq: int, above: int, timeout: float) -> int:
        """The replica's LAC as soon as it exceeds ``above``; at ``timeout`` the current LAC (-1 if
        the segment still does not exist). Woken by add(), never polls."""
        self._check()
        key = check_segment_ids(log_id, segment_seq)
        if not isinstance(above, int) or isinstance(above, bool) or not -1 <= above < 2**63:
            raise BadRequestError(f"LAC to wait above {above!r} out of range (-1..2^63-1)")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not math.isfinite(timeout) or timeout < 0:
            raise BadRequestError(f"timeout {timeout!r} must be a finite number of seconds >= 0")
        seg = self._segments.get(key)
        if seg is not None:
            if seg.limbo is not None:
                self._segment(log_id, segment_seq)  # raises LimboError
            if seg.lac > above:
                return seg.lac
        if timeout > 0:
            result = await self._lac_waiters.wait(self._loop, key, above, timeout)  # type: ignore[arg-type]
            if result is not None:
                return result
        self._check()
        seg = self._segments.get(key)
        if seg is None:
            return -1
        return self._segment(log_id, segment_seq).lac


    # ------------------------------------------------------------------ fencing

    async def fence(self, log_id: int, segment_seq: int) -> FenceResult:
        """Fence durably (creating an empty fenced replica if unknown); idempotent."""
        self._check()
        key = check_segment_ids(log_id, segment_seq)
        seg = self._segments.get(key)
        if seg is None:
            seg = await self._segment_for_write(key, fenced=True)
        seg = self._segment(log_id, segment_seq)  # limbo check, also after the await
        if not seg.fence_durable:
            seg.fenced = True  # from here on normal adds are refused
            if seg.fencing is None:
                seg.fencing = self._loop.create_task(self._persist_fence(seg))  # type: ignore[union-attr]
                self._background.add(seg.fencing)
                seg.fencing.add_done_callback(self._background.discard)
            await asyncio.shield(seg.fencing)
        self._check()
        return FenceResult(seg.index.last_id, seg.lac)

    async def _persist_fence(self, seg: Segment) -> None:
        try:
            # Entries accepted before the fence become durable first, so the result is stable.
            fut = self._committer.wait(seg, seg.size)
            if fut is not None:
                await fut
            path = layout.segment_path(self.data_dir, seg.key, FENCED_SUFFIX)
            await self._blocking(f"cannot persist fence of {segment_name(seg.key)}", self._files.write_marker, path, b"fenced\n")
            seg.fence_durable = True
        finally:
            seg.fencing = None

    def is_fenced(self, log_id: int, segment_seq: int) -> bool:
        self._check()
        seg = self._segments.get(check_segment_ids(log_id, segment_seq))
        return seg is not None and seg.fenced

    # ------------------------------------------------------------------ digest, listing, stats

    def digest(self, log_id: int, segment_seq: int, first: int = 0, last: int | None = None) -> Digest:
        """Digest (see ``digest_of``) of the entries with ids in [first, last] (last: the last stored)."""
        seg = self._segment(log_id, segment_seq)
        check_entry_id(first, "first entry id")
        if last is not None:
            check_entry_id(last, "last entry id")
        h = hashlib.sha256()
        pack = DIGEST_ITEM.pack
        count = nbytes = 0
        first_id = last_id = -1
        for entry_id, _off, length, crc in seg.index.items(first, last):
            h.update(pack(entry_id, crc))
            if first_id < 0:
                first_id = entry_id
            last_id = entry_id
            count += 1
            nbytes += HEADER_SIZE + length
        return Digest(log_id, segment_seq, count, first_id, last_id, seg.lac, nbytes, h.hexdigest())

    def list_segments(self) -> list[SegmentInfo]:
        self._check()
        return [self._segments[k].info() for k in sorted(self._segments)]

    def stat(self) -> dict:
        """Disk and store counters; works after a failure too (it reports it)."""
        try:
            usage = shutil.disk_usage(self.data_dir)
            total, free = usage.total, usage.free
        except OSError:
            total = free = -1
        segs = self._segments.values()
        c = self._committer
        return {
            "data_dir": str(self.data_dir),
            "disk_total_bytes": total,
            "disk_free_bytes": free,
            "segments": len(self._segments),
            "entries": sum(s.index.count for s in segs),
            "bytes": sum(s.size for s in segs),
            "preallocated_bytes": sum(s.alloc_end - s.size for s in segs if s.alloc_end > s.size),
            "limbo": sum(1 for s in segs if s.limbo is not None),
            "read_resource_errors": self._reader.resource_errors,  # failed for want of descriptors/memory: retryable, not limbo
            "read_entries": self._reader.entries,  # served to clients since the agent started
            "read_bytes": self._reader.bytes,
            "reclaimed_bytes": self._files.reclaimed_bytes,  # freed by deleting replicas, since the data dir exists
            "reclaimed_replicas": self._files.reclaimed_replicas,
            "fenced": sum(1 for s in segs if s.fenced),
            "sync_mode": self.sync.mode,
            "failed": self._failure is not None,
            "failure": None if self._failure is None else str(self._failure),
            "adds": c.adds,
            "batches": c.batches,
            "inline_batches": c.inline_batches,  # synced on the event loop (small, sync thread idle)
            "fdatasyncs": c.fdatasyncs,
            "bytes_written": c.bytes_written,
            "pending_bytes": c.pending_bytes,
            **self._scrub_stat(),
        }

    # ------------------------------------------------------------------ scrubbing (scrub.py)

    # The counters of the Scrubber running over this store (it sets them; None: not scrubbing).
    scrub_stats = None

    def _scrub_stat(self) -> dict:
        stats = self.scrub_stats
        return {"scrub_enabled": False} if stats is None else stats.to_stat()

    def scrub_keys(self) -> list[Key]:
        """The replicas a scrub pass checks: those not in limbo now, in key order."""
        self._check()
        return sorted(k for k, s in self._segments.items() if s.limbo is None)

    def scrub_chunk(
        self, key: Key, seg: Segment | None, next_id: int, max_bytes: int, max_entries: int
    ) -> tuple[Segment, list[tuple[int, int, int, int]], int] | None:
        """Loop thread: the scrubber's next entries of replica ``key``, from entry id ``next_id``
        on, as (the segment, [(entry id, offset, bytes, crc)] in id order, the id to go on from).
        Only entries durable now (the tail being written is left to a later pass); at most
        ``max_entries`` looked at and ``max_bytes`` taken, but at least one entry. None when
        there is nothing more to check: the replica has no entries from ``next_id`` on, or it is
        gone, in limbo, or no longer ``seg`` (the replica the scrubber began with; None to begin)."""
        self._check()
        current = self._segments.get(key)
        if current is None or current.limbo is not None or (seg is not None and current is not seg):
            return None
        chunk = current.durable_entries(next_id, max_bytes, max_entries)
        return None if chunk is None else (current, *chunk)

    def scrub_found(self, seg: Segment, offset: int, reason: str) -> bool:
        """Loop thread: the scrubber read ``seg`` and found it damaged at ``offset``. Puts it in
        limbo (durably, logged at ERROR with file, offset and reason) unless it is no longer the
        replica that was read (deleted, maybe created anew, meanwhile) or is in limbo already.
        True if this put it in limbo."""
        if not self._serving or self._segments.get(seg.key) is not seg or seg.limbo is not None:
            return False
        self._to_limbo(seg, offset, f"found by scrubbing: {reason}")
        return True

    # ------------------------------------------------------------------ delete

    async def delete(self, log_id: int, segment_seq: int) -> bool:
        """Remove the replica's files durably; True if it existed. Idempotent."""
        self._check()
        key = check_segment_ids(log_id, segment_seq)
        while key in self._deleting:
            try:
                await asyncio.shield(self._deleting[key])
            except Exception:  # noqa: BLE001 - retried below
                pass
        creating = self._creating.get(key)
        if creating is not None:
            try:
                await asyncio.shield(creating)
            except Exception:  # noqa: BLE001 - a failed create leaves at most an empty file
                pass
        self._check()
        task = self._loop.create_task(self._delete(key))  # type: ignore[union-attr]
        self._deleting[key] = task
        return await asyncio.shield(task)

    async def _delete(self, key: Key) -> bool:
        try:
            seg = self._segments.pop(key, None)
            if seg is not None:
                # Let queued writes land before the fd goes (the sync thread may be using it).
                fut = self._committer.wait(seg, seg.size)
                if fut is not None:
                    await fut
                if seg.fencing is not None:
                    try:
                        await asyncio.shield(seg.fencing)
                    except Exception:  # noqa: BLE001
                        pass
                self._fds.close(seg)
            removed = await self._blocking(f"cannot delete {segment_name(key)}", self._files.remove, key)
            await self._settle_soon(key)
            return seg is not None or removed
        finally:
            self._deleting.pop(key, None)

    async def _settle_soon(self, key: Key) -> None:
        """Wait until this delete's unlink is durable: deletes that arrive within
        ``SETTLE_DELAY`` share one settle (one directory fsync) — group commit for deletes, so a
        paced collection does not force a journal commit per replica while writers fsync."""
        task = self._settling
        if task is None:
            task = self._settling = self._loop.create_task(self._settle_after(SETTLE_DELAY))  # type: ignore[union-attr]
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        try:
            await asyncio.shield(task)
        except AgentIOError as exc:
            raise AgentIOError(f"cannot delete {segment_name(key)}: {exc}") from exc

    async def _settle_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        # Unlinks that finish from here on wait for the next settle; every one finished before
        # is in the set this one takes.
        self._settling = None
        await self._blocking("cannot make deletes durable", self._files.settle_deletes)
