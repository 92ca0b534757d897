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
- the acknowledged length: each growing replica's .acked file, about every ACKED_SECONDS and at
  a clean close (a file found shorter at start-up goes to limbo: it was cut, see recovery.py);
- a cut tail: ftruncate + fsync of the file during open(), before anything is served;
- a delete: unlink of the files, then an fsync of the directory, shared by the deletes that
  arrive within SETTLE_DELAY (a collection deletes many replicas of one log in a row).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import math
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dlctl.log.errors import (
    AgentError,
    AgentIOError,
    AgentResourceError,
    BadRequestError,
    FencedError,
    LimboError,
    NoSuchEntryError,
    NoSuchSegmentError,
)
from dlctl.log.format import FORMAT_VERSION, HEADER_SIZE, KNOWN_FLAGS, MAGIC, MAX_PAYLOAD, CorruptEntry, crc32c, decode_header
from dlctl.logthrottle import LogThrottle

from . import checkpoint, layout, oserrors
from .layout import ACKED_SUFFIX, CHECKPOINT_SUFFIXES, FENCED_SUFFIX, IDX_SUFFIX, IDX_TMP_SUFFIX, LIMBO_SUFFIX, LOG_SUFFIX, DirLock, Key, check_entry_id, check_segment_ids
from .recovery import HEADER_STRUCT as _HDR
from .recovery import SegmentCheck, encode_acked, inspect_segment
from .index import EntryIndex
from .segment import FdCache, Segment
from .sync import GroupCommitter
from .types import Digest, FenceResult, LimboRecord, RecoveryReport, SegmentInfo, SyncPolicy, TailCut

if TYPE_CHECKING:
    from ..metrics import AgentMetrics

log = logging.getLogger("dlagent.storage")

_CRC_COVERED = HEADER_SIZE - 4
_DIGEST_ITEM = struct.Struct(">qI")
RECLAIMED_FILE = "reclaimed.json"  # in the data dir: bytes and replicas freed by deletes, ever
SETTLE_DELAY = 0.02  # seconds deletes wait to share one directory fsync
# How often segments left idle give back their preallocated space: one that took no data over
# a whole period is trimmed (so within two periods of its last add).
TRIM_IDLE_SECONDS = 2.0
# How often the durable length of replicas that grew is recorded in their .acked files: a file
# cut while the agent is down is caught unless the cut reaches into the last second of data
# made durable before a crash (a clean stop records everything).
ACKED_SECONDS = 1.0
# Index checkpoints written per trim tick at most (the rest: at the next ticks).
CHECKPOINTS_PER_TICK = 32


def digest_of(pairs: Iterable[tuple[int, int]]) -> str:
    """The digest of ordered (entry id, CRC-32C) pairs: SHA-256 over each pair packed as
    big-endian i64 + u32 (12 bytes), hex. Anyone holding the entries can recompute it."""
    h = hashlib.sha256()
    pack = _DIGEST_ITEM.pack
    for entry_id, crc in pairs:
        h.update(pack(entry_id, crc))
    return h.hexdigest()


class _SyncFailed(Exception):
    """An fsync of metadata failed on the sync thread: fatal, like a failed data fdatasync."""


def _seg_name(key: Key) -> str:
    return f"segment {key[1]} of log {key[0]}"


class SegmentStore:
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
        self._fsync = fsync
        self._fds = FdCache(max_open_files)
        self._committer = GroupCommitter(sync, self._fatal, fdatasync, metrics)
        self._lock = DirLock(self.data_dir)
        self._segments: dict[Key, Segment] = {}
        self._creating: dict[Key, asyncio.Task] = {}
        self._deleting: dict[Key, asyncio.Task] = {}
        self._lac_waiters: dict[Key, list[tuple[int, asyncio.Future]]] = {}
        self._background: set[asyncio.Task] = set()
        self._state = "new"  # new -> open -> closing -> closed
        self._serving = False
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Deletes: directories whose unlinks still need an fsync, and what deleting freed
        # (kept across restarts in RECLAIMED_FILE, shown by `cluster status`).
        self._settle_lock = threading.Lock()
        self._unsettled_dirs: set[Path] = set()
        self._reclaimed_bytes = 0
        self._reclaimed_replicas = 0
        self._settling: asyncio.Task | None = None  # the next settle, which deletes join
        self._trim_timer: asyncio.TimerHandle | None = None
        self._acked_timer: asyncio.TimerHandle | None = None
        self._checkpointing: asyncio.Task | None = None  # index checkpoints being written (one batch at a time)
        self._synced_log_dirs: set[Path] = set()  # log dirs whose entry in segments/ this process fsynced
        self._throttle = LogThrottle(log)  # read failures can come in floods (descriptors exhausted)
        self.read_resource_errors = 0  # reads failed for want of a resource (never limbo)
        self.read_entries = 0  # entries served by read and read_range (plain ints: the read path stays cheap)
        self.read_bytes = 0

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
        await asyncio.to_thread(self._make_data_dir)
        self._lock.acquire_exclusive()
        try:
            segments, report = await asyncio.to_thread(self._recover)
            self._load_reclaimed()
        except BaseException:
            self._lock.release()
            raise
        self._segments = segments
        self._committer.start()
        self._state = "open"
        self._serving = True
        self._trim_timer = self._loop.call_later(TRIM_IDLE_SECONDS, self._trim_idle)
        self._acked_timer = self._loop.call_later(ACKED_SECONDS, self._record_acked_soon)
        log.info(
            "opened %s: %d segments, %d entries, %d tails cut, %d in limbo",
            self.data_dir, report.segments, report.entries, len(report.tails_cut), len(report.limbo),
        )
        return report

    def _trim_idle(self) -> None:
        """Every TRIM_IDLE_SECONDS: give back the preallocated space of segments left idle."""
        self._trim_timer = None
        if not self._serving:
            return
        self._fds.trim_idle()
        self._throttle.flush()
        if self._checkpointing is None or self._checkpointing.done():
            due = self._checkpoints_due(everything=False)
            if due:
                self._checkpointing = self._loop.create_task(self._write_checkpoints(due))  # type: ignore[union-attr]
        self._trim_timer = self._loop.call_later(TRIM_IDLE_SECONDS, self._trim_idle)  # type: ignore[union-attr]

    # -- index checkpoints (checkpoint.py) -----------------------------------------------------------

    def _checkpoints_due(self, *, everything: bool) -> list[tuple[Key, int, int, EntryIndex]]:
        """(key, covered length, LAC, index snapshot) of each replica whose durable data grew past
        its checkpoint and has rested since the last look (``everything``: at a clean stop, every
        one that grew). Loop thread: snapshots copy the index arrays whole, cheaply.

        Only where durable means fdatasync'ed (``mode="always"``): with ``"never"`` a power loss
        may tear what a checkpoint covers, which the full scan cuts as a torn tail."""
        if self.sync.mode != "always":
            return []
        due = []
        for key, seg in self._segments.items():
            rested = everything or seg.rest_mark == seg.durable
            seg.rest_mark = seg.durable
            if seg.limbo is not None or key in self._deleting or seg.pinned or seg.durable <= seg.indexed or not rested:
                continue
            # Stopping, nothing changes an index any more: no copy. Running, a bounded batch per
            # tick, so the first ticks after a start that read everything (all replicas due at
            # once) do not copy every index at the same time.
            due.append((key, seg.durable, seg.lac, seg.index if everything else seg.index.snapshot()))
            if not everything and len(due) >= CHECKPOINTS_PER_TICK:
                break
        return due

    async def _write_checkpoints(self, due: list[tuple[Key, int, int, EntryIndex]]) -> None:
        """Write them on a thread of their own (not the sync thread: group commits do not wait
        for them). A checkpoint is only a shortcut for the next start: one that cannot be written
        is logged and the replica is read in full then."""
        try:
            written = await asyncio.to_thread(self._write_checkpoint_files, due)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("cannot write index checkpoints in %s: %s", self.data_dir, exc)
            return
        for key, covered in written:
            seg = self._segments.get(key)
            if seg is not None and covered > seg.indexed:
                seg.indexed = covered

    def _write_checkpoint_files(self, due: list[tuple[Key, int, int, EntryIndex]]) -> list[tuple[Key, int]]:
        written = []
        for key, covered, lac, index in due:
            if not layout.segment_path(self.data_dir, key, LOG_SUFFIX).exists():
                continue  # deleted meanwhile
            checkpoint.write(layout.segment_path(self.data_dir, key, IDX_SUFFIX), checkpoint.encode(covered, lac, index), fsync=self._fsync)
            written.append((key, covered))
        return written

    # -- acknowledged lengths (.acked files; see recovery.py) ------------------------------------

    def _acked_due(self) -> list[tuple[Key, int]]:
        return [(k, s.durable) for k, s in self._segments.items() if s.limbo is None and s.durable > s.acked and k not in self._deleting]

    def _record_acked_soon(self) -> None:
        """Every ACKED_SECONDS: record the durable length of each replica that grew since."""
        self._acked_timer = None
        if not self._serving:
            return
        due = self._acked_due()
        if not due:
            self._acked_timer = self._loop.call_later(ACKED_SECONDS, self._record_acked_soon)  # type: ignore[union-attr]
            return
        task = self._loop.create_task(self._record_acked(due))  # type: ignore[union-attr]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _record_acked(self, due: list[tuple[Key, int]], reschedule: bool = True) -> None:
        try:
            await self._blocking("cannot record acknowledged lengths", self._write_acked, due)
            for key, length in due:
                seg = self._segments.get(key)
                if seg is not None and length > seg.acked:
                    seg.acked = length
        except AgentIOError as exc:
            log.error("%s", exc)  # a failed fsync is fatal (see _blocking); anything else: next time
        finally:
            if reschedule and self._serving:
                self._acked_timer = self._loop.call_later(ACKED_SECONDS, self._record_acked_soon)  # type: ignore[union-attr]

    def _write_acked(self, due: list[tuple[Key, int]]) -> None:
        """Metadata thread: write and fsync each replica's .acked file (its directory too when
        the file is new). A replica whose .log is gone was deleted after the snapshot (deletes
        run on this thread too, in order): its length is not recorded."""
        new_dirs: set[Path] = set()
        for key, length in due:
            if not layout.segment_path(self.data_dir, key, LOG_SUFFIX).exists():
                continue
            path = layout.segment_path(self.data_dir, key, ACKED_SUFFIX)
            if not path.exists():
                new_dirs.add(path.parent)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, layout.FILE_MODE)
            try:
                os.pwrite(fd, encode_acked(length), 0)
                self._sync_fd(fd, path)
            finally:
                os.close(fd)
        for directory in sorted(new_dirs):
            self._sync_dir(directory)

    def _make_data_dir(self) -> None:
        root = layout.segments_root(self.data_dir)
        try:
            layout.secure_data_dir(self.data_dir)
            root.mkdir(mode=layout.DIR_MODE, exist_ok=True)
            # At every start, not only when just created: a run that crashed between a mkdir
            # and its parent's fsync left an entry a later power loss could still drop.
            layout.fsync_path(self.data_dir, self._fsync)
            layout.fsync_path(self.data_dir.parent, self._fsync)
        except OSError as exc:
            raise AgentIOError(f"cannot create data directory {root}: {exc}") from exc

    async def close(self) -> None:
        """Flush what is pending, stop the sync thread, release the lock. Idempotent."""
        if self._state in ("new", "closed"):
            self._state = "closed"
            return
        if self._state == "closing":
            return
        self._state = "closing"
        self._serving = False
        if self._trim_timer is not None:
            self._trim_timer.cancel()
            self._trim_timer = None
        if self._acked_timer is not None:
            self._acked_timer.cancel()
            self._acked_timer = None
        try:
            if self._failure is None:
                try:
                    await self._committer.flush()
                    # A clean stop records every replica's final length: a cut made while the
                    # agent is down is then always seen.
                    await self._record_acked(self._acked_due(), reschedule=False)
                except AgentIOError:
                    pass  # already fatal; the waiters got the error
                else:
                    # And every replica's index: the next start reads only what comes after.
                    if self._checkpointing is not None:
                        await asyncio.shield(self._checkpointing)
                    await self._write_checkpoints(self._checkpoints_due(everything=True))
            for task in list(self._creating.values()) + list(self._deleting.values()) + list(self._background):
                try:
                    await asyncio.shield(task)
                except BaseException:  # noqa: BLE001 - their callers saw the error
                    pass
            await self._committer.stop()
        finally:
            self._fds.close_all()
            self._wake_all_lac_waiters(AgentIOError(f"segment store {self.data_dir} closed"))
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
        self._wake_all_lac_waiters(AgentIOError(f"storage failed: {exc}"))
        callback = self.on_failure
        if callback is not None:
            try:
                callback(exc)
            except Exception:  # noqa: BLE001 - the failure must stay recorded whatever the callback does
                log.exception("on_failure callback raised")

    # ------------------------------------------------------------------ recovery (sync thread)

    def _recover(self) -> tuple[dict[Key, Segment], RecoveryReport]:
        root = layout.segments_root(self.data_dir)
        segments: dict[Key, Segment] = {}
        tails: list[TailCut] = []
        limbo: list[LimboRecord] = []
        entries = scanned = from_checkpoints = 0
        found, ignored = layout.discover(self.data_dir)
        for key, files in found:
            files = self._drop_stale_checkpoints(key, files)
            if not files:
                continue
            try:
                seg, check = self._recover_segment(key, files, tails, limbo)
            except _SyncFailed as exc:
                raise AgentIOError(f"startup recovery of {_seg_name(key)}: {exc}") from exc
            segments[key] = seg
            entries += seg.index.count
            if check.scan is not None:
                scanned += check.scan.file_size - check.scan.scanned_from
                from_checkpoints += check.scan.scanned_from > 0
        if ignored:
            log.warning("ignoring %d files in %s that are not segment replicas: %s", len(ignored), root, ignored[:5])
        return segments, RecoveryReport(len(segments), entries, tails, limbo, ignored, scanned, from_checkpoints)

    def _drop_stale_checkpoints(self, key: Key, files: set[str]) -> set[str]:
        """A checkpoint being written when the agent stopped goes; so does a checkpoint whose
        replica is gone (a delete cut short: it means nothing without the log)."""
        stale = {IDX_TMP_SUFFIX} | (set(CHECKPOINT_SUFFIXES) if files <= CHECKPOINT_SUFFIXES else set())
        for suffix in stale & files:
            try:
                os.unlink(layout.segment_path(self.data_dir, key, suffix))
            except OSError as exc:
                log.warning("cannot remove %s: %s", layout.segment_path(self.data_dir, key, suffix), exc)
        return files - stale

    def _recover_segment(
        self, key: Key, files: set[str], tails: list[TailCut], limbo: list[LimboRecord]
    ) -> tuple[Segment, SegmentCheck]:
        check = inspect_segment(self.data_dir, key, files, use_checkpoint=True)
        if check.checkpoint_error is not None:
            log.warning("%s: index checkpoint not used (%s): read in full", check.path, check.checkpoint_error)
        if not check.has_log and check.marker is None and check.corruption is None:
            # A fenced marker alone: fenced before any entry arrived (or a delete cut short
            # after the log went). Either way an empty, fenced replica; give it its file.
            self._create_files(key, fenced=False, exist_ok=True)
        scan = check.scan
        seg = Segment(key, check.path, scan.index if scan else None, size=scan.file_size if scan else 0, lac=scan.lac if scan else -1)
        seg.fenced = seg.fence_durable = check.fenced
        seg.acked = check.acked or 0
        seg.indexed = scan.scanned_from if scan is not None else 0
        record = check.marker
        if record is None and check.corruption is not None:
            record = check.corruption
            self._write_limbo_marker(record)
            log.error("%s in limbo: %s at offset %d (valid entry at %d)", check.path, record.reason, record.offset, record.next_valid_offset)
        if record is not None:
            seg.limbo = record
            limbo.append(record)
            return seg, check
        if scan is not None and scan.zero_tail:
            # Preallocated space left by a crash: not data, not a tear (see recovery).
            self._cut(check.path, scan.valid_end, sync=False)
            seg.size = seg.durable = seg.alloc_end = scan.valid_end
        torn = check.torn_tail
        if torn is not None:
            offset, nbytes, reason = torn
            self._cut(check.path, offset)
            seg.size = seg.durable = seg.alloc_end = offset
            tails.append(TailCut(key[0], key[1], str(check.path), offset, nbytes, reason))
            log.warning("%s: cut %d-byte torn tail at offset %d (%s)", check.path, nbytes, offset, reason)
        return seg, check

    def _cut(self, path: Path, length: int, sync: bool = True) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, length)
            if sync:
                self._fsync(fd)
        except OSError as exc:
            raise AgentIOError(f"cannot cut the torn tail of {path} at offset {length}: {exc}") from exc
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ blocking helpers (sync thread)

    def _sync_fd(self, fd: int, what: object) -> None:
        try:
            self._fsync(fd)
        except OSError as exc:
            raise _SyncFailed(f"fsync of {what} failed: {exc}") from exc

    def _sync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._sync_fd(fd, path)
        finally:
            os.close(fd)

    def _create_files(self, key: Key, fenced: bool, exist_ok: bool = False) -> Path:
        ldir = layout.log_dir(self.data_dir, key[0])
        if not ldir.is_dir():
            try:
                ldir.mkdir(mode=layout.DIR_MODE)
            except FileExistsError:
                pass
        # A log directory's entry in segments/ is synced the first time this process creates
        # a file in it, new or not: an earlier run may have crashed between its mkdir and that
        # fsync (one fsync per log directory and process).
        new_dir = ldir not in self._synced_log_dirs
        path = layout.segment_path(self.data_dir, key, LOG_SUFFIX)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, layout.FILE_MODE)
        except FileExistsError:
            # Left by a creation that failed after open (say ENOSPC on fsync of the dir):
            # reusable only if it holds nothing.
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            if os.fstat(fd).st_size and not exist_ok:
                os.close(fd)
                raise OSError(errno.EEXIST, f"{path} exists with data but is not a known segment") from None
        try:
            self._sync_fd(fd, path)
        finally:
            os.close(fd)
        if fenced:
            self._write_marker(layout.segment_path(self.data_dir, key, FENCED_SUFFIX), b"fenced\n", sync_dir=False)
        self._sync_dir(ldir)
        if new_dir:
            self._sync_dir(ldir.parent)
            self._synced_log_dirs.add(ldir)
        return path

    def _write_marker(self, path: Path, content: bytes, sync_dir: bool = True) -> None:
        # Existence is what counts; the content is for people. A crash mid-write leaves an
        # existing (maybe empty) marker, which still means fenced/limbo: the safe side.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, layout.FILE_MODE)
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            self._sync_fd(fd, path)
        finally:
            os.close(fd)
        if sync_dir:
            self._sync_dir(path.parent)

    def _write_limbo_marker(self, record: LimboRecord) -> None:
        doc = record.to_dict() | {"detected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        path = layout.segment_path(self.data_dir, (record.log_id, record.segment_seq), LIMBO_SUFFIX)
        try:
            self._write_marker(path, (json.dumps(doc, sort_keys=True) + "\n").encode())
        except OSError as exc:  # a failed fsync (_SyncFailed) is fatal instead
            raise AgentIOError(f"cannot persist limbo state of {path}: {exc}") from exc

    def _remove_files(self, key: Key) -> bool:
        """Unlink the replica's files; ``_settle_deletes`` makes the unlinks durable."""
        existed = False
        freed = 0
        # The log first: a delete cut short leaves markers alone, which read back as an
        # empty fenced replica or a limbo one — both refuse writes, neither serves stale data.
        # The acknowledged length before the log: left alone, it would read back as a replica
        # file gone missing.
        # The index checkpoint first of all: it means nothing without the log.
        for suffix in (IDX_TMP_SUFFIX, IDX_SUFFIX, ACKED_SUFFIX, LOG_SUFFIX, FENCED_SUFFIX, LIMBO_SUFFIX):
            path = layout.segment_path(self.data_dir, key, suffix)
            try:
                size = os.stat(path).st_size
                os.unlink(path)
                existed = existed or suffix not in CHECKPOINT_SUFFIXES
                freed += size if suffix != ACKED_SUFFIX and suffix not in CHECKPOINT_SUFFIXES else 0  # records about the replica, not its data
            except FileNotFoundError:
                pass
        ldir = layout.log_dir(self.data_dir, key[0])
        with self._settle_lock:
            self._unsettled_dirs.add(ldir)
            if existed:
                self._reclaimed_bytes += freed
                self._reclaimed_replicas += 1
        return existed

    def _settle_deletes(self) -> None:
        """Make every unlink done so far durable: one fsync per directory touched, however many
        deletes touched it (a collection deletes many segments of one log in a row, and this
        thread also creates the files writers wait for), then remove log directories left empty.

        Each delete runs this after its unlink, on the same (FIFO) thread: either an earlier run
        already took its directory after the unlink and synced it, or this run does."""
        with self._settle_lock:
            dirs, self._unsettled_dirs = self._unsettled_dirs, set()
            counters = (self._reclaimed_bytes, self._reclaimed_replicas)
        if not dirs:
            return
        for ldir in sorted(dirs):
            if ldir.is_dir():
                self._sync_dir(ldir)
            try:
                ldir.rmdir()
            except OSError:
                pass  # not empty (other segments of the log) or already gone
            else:
                self._synced_log_dirs.discard(ldir)  # made again, it needs its own parent fsync
                self._sync_dir(ldir.parent)
        self._save_reclaimed(*counters)

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
            raise AgentIOError(f"cannot delete {_seg_name(key)}: {exc}") from exc

    async def _settle_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        # Unlinks that finish from here on wait for the next settle; every one finished before
        # is in the set this one takes.
        self._settling = None
        await self._blocking("cannot make deletes durable", self._settle_deletes)

    def _load_reclaimed(self) -> None:
        try:
            raw = json.loads((self.data_dir / RECLAIMED_FILE).read_text())
            self._reclaimed_bytes, self._reclaimed_replicas = int(raw["bytes"]), int(raw["replicas"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # never written, or torn by a crash: statistics start again from zero

    def _save_reclaimed(self, nbytes: int, replicas: int) -> None:
        # Statistics for `cluster status`, not data: replaced atomically but not fsynced (a
        # crash may lose the last increments, never a replica).
        tmp = self.data_dir / (RECLAIMED_FILE + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, layout.FILE_MODE)
            with open(fd, "w") as f:
                f.write(json.dumps({"bytes": nbytes, "replicas": replicas}) + "\n")
            os.replace(tmp, self.data_dir / RECLAIMED_FILE)
        except OSError as exc:
            log.warning("cannot record reclaimed space in %s: %s", self.data_dir, exc)

    async def _blocking(self, what: str, fn: Callable, *args):
        """Run a metadata job on the sync thread; a failed fsync there is fatal."""
        try:
            return await self._committer.run_blocking(fn, *args)
        except _SyncFailed as exc:
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
            path = await self._blocking(f"cannot create {_seg_name(key)}", self._create_files, key, fenced)
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
            raise NoSuchSegmentError(f"this agent has no replica of {_seg_name(key)}")
        if seg.limbo is not None:
            raise LimboError(
                f"replica of {_seg_name(key)} is in limbo ({seg.limbo.reason} at offset {seg.limbo.offset} of {seg.path})",
                hint="re-replicate it from its peers (dlctl recover), which deletes and rewrites this replica",
            )
        return seg

    # ------------------------------------------------------------------ adds

    async def add(self, encoded: bytes, *, recovery: bool = False, uncached: bool = False) -> None:
        """Store one encoded entry durably. Pass ``bytes`` (others are copied once). ``uncached``:
        drop it from the page cache once durable (a bulk copy's write, see GroupCommitter)."""
        encoded, n, log_id, seq, entry_id, lac, length, crc = self._parse_entry(encoded)
        _check_crc(encoded, log_id, seq, entry_id, crc)
        key = (log_id, seq)
        seg = self._segments.get(key)
        if seg is None:
            seg = await self._segment_for_write(key, fenced=False)
        end = self._accept(seg, encoded, n, entry_id, lac, length, crc, recovery, None, uncached)
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
        encoded, n, log_id, seq, entry_id, lac, length, crc = self._parse_entry(encoded)
        seg = self._segments.get((log_id, seq))
        if seg is None:
            return False  # before the CRC check: add() does it
        _check_crc(encoded, log_id, seq, entry_id, crc)
        self._accept(seg, encoded, n, entry_id, lac, length, crc, recovery, callback, uncached)
        return True

    async def add_batch(self, entries: Sequence[bytes | memoryview], *, recovery: bool = False, uncached: bool = False) -> int:
        """Store several encoded entries of one segment (ids strictly increasing) durably, each
        exactly as ``add`` stores it, all or nothing: every entry is checked (header, ids,
        CRC, the fenced and limbo rules, an id stored with other bytes) before any is queued, so
        a refused batch stored nothing; the error names the entry. Returns how many entries the
        batch held, once all are durable. Read-only memoryviews (slices of a request's body)
        are kept as they are, not copied: their owner must not change them."""
        parsed = self._parse_batch(entries)
        _check_batch_crcs(parsed)
        key = parsed[0][2], parsed[0][3]
        seg = self._segments.get(key)
        if seg is None:
            seg = await self._segment_for_write(key, fenced=False)
        end = self._accept_batch(seg, parsed, recovery, None, uncached)
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
        parsed = self._parse_batch(entries)
        seg = self._segments.get((parsed[0][2], parsed[0][3]))
        if seg is None:
            return False  # before the CRC checks: add_batch() does them
        _check_batch_crcs(parsed)
        self._accept_batch(seg, parsed, recovery, callback, uncached)
        return True

    def _parse_batch(self, entries: Sequence[bytes | memoryview]) -> list[tuple]:
        """``_parse_entry`` of each entry of a batch, and the batch's own rules: one segment, ids
        strictly increasing. An error names the entry by its place in the batch (and its id)."""
        self._check()
        count = len(entries)
        if not count:
            raise BadRequestError("an empty batch of entries")
        out = []
        for k, encoded in enumerate(entries):
            try:
                item = self._parse_entry(encoded, keep_views=True)
            except BadRequestError as exc:
                raise BadRequestError(f"{_in_batch(k, count)}: {exc.message}; {_NOTHING_STORED}") from None
            if out:
                first, prev = out[0], out[-1]
                if (item[2], item[3]) != (first[2], first[3]):
                    raise BadRequestError(
                        f"{_in_batch(k, count, item[4])} is of {_seg_name((item[2], item[3]))}, the batch's first of "
                        f"{_seg_name((first[2], first[3]))}: a batch holds one segment's entries; {_NOTHING_STORED}"
                    )
                if item[4] <= prev[4]:
                    raise BadRequestError(
                        f"{_in_batch(k, count, item[4])} follows entry {prev[4]}: a batch's entry ids must increase; {_NOTHING_STORED}"
                    )
            out.append(item)
        return out

    def _accept_batch(
        self, seg: Segment, parsed: list[tuple], recovery: bool, callback: Callable[[BaseException | None], None] | None, uncached: bool
    ) -> int:
        """Queue a verified batch (``_accept`` for each entry, every check made before the first
        is queued); returns the offset in ``seg`` up to which the batch is durable."""
        key, count = seg.key, len(parsed)
        if seg.limbo is not None:
            raise LimboError(f"replica of {_seg_name(key)} is in limbo; adds refused until it is re-replicated; {_NOTHING_STORED}")
        if seg.fenced and not recovery:
            raise FencedError(
                f"{_seg_name(key)} is fenced: a newer writer owns the log; batch of entries {parsed[0][4]}..{parsed[-1][4]} refused, nothing stored"
            )
        index = seg.index
        end = 0
        new = []
        for k, item in enumerate(parsed):
            encoded, n, _log, _seq, entry_id, _lac, length, crc = item
            known = index.get(entry_id)
            if known is None:
                new.append(item)
                continue
            off = known[0]
            if known[1] != length or known[2] != crc or self._stored(seg, off, n) != encoded:
                raise BadRequestError(
                    f"{_in_batch(k, count, entry_id)}: entry {entry_id} of {_seg_name(key)} is already stored (offset {off} of "
                    f"{seg.path}) with different contents; refusing to overwrite; {_NOTHING_STORED}"
                )
            end = max(end, off + n)
        if new:
            if seg.fd is None:
                try:
                    self._fds.get(seg)
                except OSError as exc:
                    cls = AgentResourceError if oserrors.is_resource(exc) else AgentIOError
                    raise cls(f"cannot open {seg.path}: {exc}; {_NOTHING_STORED}") from exc
            append, add_to_index = self._committer.append, index.add
            top = seg.lac
            for encoded, n, _log, _seq, entry_id, lac, length, crc in new:
                off = append(seg, encoded, None, uncached=uncached)
                add_to_index(entry_id, off, length, crc)
                if lac > top:
                    top = lac
            end = max(end, off + n)
            if top > seg.lac:
                self._raise_lac(seg, top)
        if callback is not None:
            self._committer.on_durable(seg, end, callback)
        return end

    def _parse_entry(self, encoded: bytes, keep_views: bool = False) -> tuple:
        """The header fields of an entry to add, checked (all but the CRC). ``keep_views``: a
        read-only memoryview is kept, not copied (a batch's entries, views of its body)."""
        self._check()
        if type(encoded) is not bytes and not (keep_views and type(encoded) is memoryview and encoded.readonly):
            if not isinstance(encoded, (bytearray, memoryview)):
                raise BadRequestError(f"entry must be bytes, not {type(encoded).__name__}")
            encoded = bytes(encoded)
        n = len(encoded)
        if n < HEADER_SIZE:
            raise BadRequestError(f"entry of {n} bytes is shorter than the {HEADER_SIZE}-byte header")
        magic, version, flags, reserved, log_id, seq, entry_id, lac, length, crc = _HDR.unpack_from(encoded)
        if (
            magic != MAGIC or version != FORMAT_VERSION or flags & ~KNOWN_FLAGS or reserved
            or length != n - HEADER_SIZE or length > MAX_PAYLOAD
            or not log_id or not seq or entry_id < 0 or not -1 <= lac < entry_id
        ):
            raise BadRequestError(_header_problem(encoded, n))
        return encoded, n, log_id, seq, entry_id, lac, length, crc

    def _accept(
        self, seg: Segment, encoded: bytes, n: int, entry_id: int, lac: int, length: int, crc: int,
        recovery: bool, callback: Callable[[BaseException | None], None] | None, uncached: bool,
    ) -> int:
        """Queue a verified entry (or find it stored already); returns the offset in ``seg`` it is
        durable at. ``callback``, if given, is told when it is."""
        key = seg.key
        if seg.limbo is not None:
            raise LimboError(f"replica of {_seg_name(key)} is in limbo; adds refused until it is re-replicated")
        if seg.fenced and not recovery:
            raise FencedError(f"{_seg_name(key)} is fenced: a newer writer owns the log; add of entry {entry_id} refused")
        known = seg.index.get(entry_id)
        if known is not None:
            off = known[0]
            if known[1] != length or known[2] != crc or self._stored(seg, off, n) != encoded:
                raise BadRequestError(
                    f"entry {entry_id} of {_seg_name(key)} is already stored (offset {off} of {seg.path}) "
                    "with different contents; refusing to overwrite"
                )
            if callback is not None:
                self._committer.on_durable(seg, off + n, callback)
            return off + n
        if seg.fd is None:
            try:
                self._fds.get(seg)
            except OSError as exc:
                cls = AgentResourceError if oserrors.is_resource(exc) else AgentIOError
                raise cls(f"cannot open {seg.path}: {exc}") from exc
        off = self._committer.append(seg, encoded, callback, uncached=uncached)
        seg.index.add(entry_id, off, length, crc)
        if lac > seg.lac:
            self._raise_lac(seg, lac)
        return off + n

    def _stored(self, seg: Segment, off: int, n: int) -> bytes:
        buf = seg.mem.get(off)
        if buf is not None:
            return buf
        try:
            return os.pread(self._fds.get(seg), n, off)
        except OSError as exc:
            cls = AgentResourceError if oserrors.is_resource(exc) else AgentIOError
            raise cls(f"cannot read {seg.path} at offset {off}: {exc}") from exc

    # ------------------------------------------------------------------ reads

    def read(self, log_id: int, segment_seq: int, entry_id: int) -> bytes:
        """The encoded entry, CRC re-verified (a mismatch puts the replica in limbo, as a media
        error does; a read failing for want of descriptors or memory raises the retryable
        AgentResourceError and leaves the replica alone: see oserrors.py).

        An entry accepted but not yet durable is served from memory, as BookKeeper does:
        readers stop at LAC anyway, and recovery re-writes whatever it reads to a quorum.
        """
        seg = self._segment(log_id, segment_seq)
        check_entry_id(entry_id)
        loc = seg.index.get(entry_id)
        if loc is None:
            raise NoSuchEntryError(f"entry {entry_id} of {_seg_name(seg.key)} is not on this agent")
        off, length, crc = loc
        n = HEADER_SIZE + length
        buf = seg.mem.get(off)
        if buf is not None:
            self.read_entries += 1
            self.read_bytes += n
            return buf if type(buf) is bytes else bytes(buf)  # a batch's entry: a view of its request
        fd = self._fd_to_read(seg, off, f"entry {entry_id}")
        try:
            buf = os.pread(fd, n, off)
        except OSError as exc:
            raise self._read_failed(seg, off, f"read of entry {entry_id}", exc) from exc
        problem = verify_entry(buf, n, seg.key, entry_id, crc)
        if problem is not None:
            self._to_limbo(seg, off, problem)
            raise LimboError(f"replica of {_seg_name(seg.key)} is corrupt at offset {off} of {seg.path}: {problem}")
        self.read_entries += 1
        self.read_bytes += n
        return buf

    def read_range(self, log_id: int, segment_seq: int, first: int, last: int, max_bytes: int) -> bytes:
        """Encoded entries ``first``, ``first + 1``, ... back to back, each CRC re-verified as
        ``read`` does: up to ``last``, up to the first entry this replica lacks, and no more
        than ``max_bytes`` (but always ``first``, or NoSuchEntryError). Entries that lie back to
        back in the file (the usual case) are read with one ``pread`` per run."""
        seg = self._segment(log_id, segment_seq)
        check_entry_id(first)
        index, mem = seg.index, seg.mem
        locs: list[tuple[int, int, int, int]] = []  # (entry id, offset, size, crc)
        total = 0
        entry_id = first
        while entry_id <= last:
            loc = index.get(entry_id)
            if loc is None:
                if entry_id == first:
                    raise NoSuchEntryError(f"entry {entry_id} of {_seg_name(seg.key)} is not on this agent")
                break
            off, length, crc = loc
            n = HEADER_SIZE + length
            if locs and total + n > max_bytes:
                break
            locs.append((entry_id, off, n, crc))
            total += n
            entry_id += 1
        parts: list[bytes | memoryview] = []
        i = 0
        while i < len(locs):
            entry_id, off, n, crc = locs[i]
            buf = mem.get(off)
            if buf is not None:  # accepted, not yet durable: served from memory, as read() does
                parts.append(buf)
                i += 1
                continue
            j, end = i + 1, off + n  # the run of entries lying back to back on disk
            while j < len(locs) and locs[j][1] == end and mem.get(end) is None:
                end += locs[j][2]
                j += 1
            fd = self._fd_to_read(seg, off, f"entries {entry_id}..{locs[j - 1][0]}")
            try:
                run = os.pread(fd, end - off, off)
            except OSError as exc:
                raise self._read_failed(seg, off, f"read of entries {entry_id}..{locs[j - 1][0]}", exc) from exc
            view = memoryview(run)
            pos = 0
            for k in range(i, j):
                e_id, e_off, e_n, e_crc = locs[k]
                problem = verify_entry(view[pos : pos + e_n], e_n, seg.key, e_id, e_crc)
                if problem is not None:
                    self._to_limbo(seg, e_off, problem)
                    raise LimboError(f"replica of {_seg_name(seg.key)} is corrupt at offset {e_off} of {seg.path}: {problem}")
                pos += e_n
            parts.append(run)
            i = j
        self.read_entries += len(locs)
        self.read_bytes += total
        if len(parts) == 1 and type(parts[0]) is bytes:
            return parts[0]
        return b"".join(parts)

    def _fd_to_read(self, seg: Segment, offset: int, what: str) -> int:
        try:
            return self._fds.get(seg)
        except OSError as exc:
            raise self._read_failed(seg, offset, f"opening the file to read {what}", exc, opening=True) from exc

    def _read_failed(self, seg: Segment, offset: int, what: str, exc: OSError, *, opening: bool = False) -> AgentError:
        """The error to fail a read with (see oserrors.py): want of a resource is retryable and
        never limbo; damage (a media error, the file gone) puts the replica in limbo; anything
        else fails this read only."""
        where = f"{what} of {_seg_name(seg.key)} ({seg.path}, offset {offset})"
        if oserrors.is_resource(exc):
            self.read_resource_errors += 1
            self._throttle.warning(
                "reads failed for want of a resource", "%s failed for want of a resource (%s): not damage, the read can be retried", where, exc.strerror or exc
            )
            return AgentResourceError(f"{where} failed: the agent is short of a resource ({exc.strerror or exc}); try again or another replica")
        if oserrors.is_damage(exc, opening=opening):
            self._to_limbo(seg, offset, f"{what} failed: {exc}")
            return LimboError(f"replica of {_seg_name(seg.key)} is unreadable at offset {offset} of {seg.path}: {exc}")
        self._throttle.warning("reads failed", "%s failed (%s): not taken as damage", where, exc)
        return AgentIOError(f"{where} failed: {exc}")

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
            await self._blocking(f"cannot persist limbo of {record.path}", self._write_limbo_marker, record)
        except AgentIOError as exc:
            # Still in limbo for this run. Without the marker a restart re-checks the file:
            # rot is found again by the scan, a transient read error may clear.
            log.error("%s", exc)

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
            self._raise_lac(seg, lac)
        return seg.lac

    def _raise_lac(self, seg: Segment, lac: int) -> None:
        seg.lac = lac
        waiters = self._lac_waiters.get(seg.key)
        if not waiters:
            return
        keep = []
        for item in waiters:
            above, fut = item
            if lac > above:
                if not fut.done():
                    fut.set_result(lac)
            else:
                keep.append(item)
        waiters[:] = keep

    def _wake_all_lac_waiters(self, exc: BaseException) -> None:
        for waiters in self._lac_waiters.values():
            for _above, fut in waiters:
                if not fut.done():
                    fut.set_exception(exc)
        self._lac_waiters.clear()

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
            loop = self._loop
            fut = loop.create_future()  # type: ignore[union-attr]
            item = (above, fut)
            self._lac_waiters.setdefault(key, []).append(item)
            handle = loop.call_later(timeout, _resolve_none, fut)  # type: ignore[union-attr]
            try:
                result = await fut
            finally:
                handle.cancel()
                waiters = self._lac_waiters.get(key)
                if waiters is not None:
                    try:
                        waiters.remove(item)
                    except ValueError:
                        pass
                    if not waiters:
                        del self._lac_waiters[key]
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
            await self._blocking(f"cannot persist fence of {_seg_name(seg.key)}", self._write_marker, path, b"fenced\n")
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
        pack = _DIGEST_ITEM.pack
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
            "read_resource_errors": self.read_resource_errors,  # failed for want of descriptors/memory: retryable, not limbo
            "read_entries": self.read_entries,  # served to clients since the agent started
            "read_bytes": self.read_bytes,
            "reclaimed_bytes": self._reclaimed_bytes,  # freed by deleting replicas, since the data dir exists
            "reclaimed_replicas": self._reclaimed_replicas,
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
        index, durable = current.index, current.durable
        if next_id > index.last_id:
            return None
        locs: list[tuple[int, int, int, int]] = []
        total = looked = 0
        last = next_id - 1
        for entry_id, off, length, crc in index.items(next_id):
            n = HEADER_SIZE + length
            if off + n <= durable:
                if locs and total + n > max_bytes:
                    break
                locs.append((entry_id, off, n, crc))
                total += n
            last = entry_id
            looked += 1
            if looked >= max_entries:
                break
        return current, locs, last + 1

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
            removed = await self._blocking(f"cannot delete {_seg_name(key)}", self._remove_files, key)
            await self._settle_soon(key)
            return seg is not None or removed
        finally:
            self._deleting.pop(key, None)


def _resolve_none(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def _check_crc(encoded: bytes, log_id: int, seq: int, entry_id: int, crc: int) -> None:
    view = memoryview(encoded)
    if crc32c(view[HEADER_SIZE:], crc32c(view[:_CRC_COVERED])) != crc:
        raise BadRequestError(f"CRC-32C mismatch in entry {entry_id} of {_seg_name((log_id, seq))}: refused, nothing stored")


_NOTHING_STORED = "nothing of the batch stored"


def _in_batch(k: int, count: int, entry_id: int | None = None) -> str:
    """Where an entry is in a batch, for errors: its place (1-based) and, once known, its id."""
    return f"batch entry {k + 1} of {count}" + (f" (entry {entry_id})" if entry_id is not None else "")


def _check_batch_crcs(parsed: list[tuple]) -> None:
    count = len(parsed)
    for k, (encoded, _n, log_id, seq, entry_id, _lac, _length, crc) in enumerate(parsed):
        view = memoryview(encoded)
        if crc32c(view[HEADER_SIZE:], crc32c(view[:_CRC_COVERED])) != crc:
            raise BadRequestError(f"{_in_batch(k, count, entry_id)}: CRC-32C mismatch in entry {entry_id} of {_seg_name((log_id, seq))}; {_NOTHING_STORED}")


def _header_problem(encoded: bytes, n: int) -> str:
    try:
        header = decode_header(encoded)
    except CorruptEntry as exc:
        return f"bad entry header: {exc.reason}"
    if header.total_size != n:
        return f"entry is {n} bytes but its header says {header.total_size} ({HEADER_SIZE} + payload {header.length})"
    return "bad entry header"


def verify_entry(buf: bytes, n: int, key: Key, entry_id: int, crc: int) -> str | None:
    if len(buf) != n:
        return f"entry {entry_id}: short read ({len(buf)} of {n} bytes)"
    magic, _v, _f, _r, h_log, h_seq, h_entry, _lac, length, h_crc = _HDR.unpack_from(buf)
    if magic != MAGIC or (h_log, h_seq, h_entry) != (key[0], key[1], entry_id) or h_crc != crc or length != n - HEADER_SIZE:
        return f"entry {entry_id}: stored header does not match the index"
    view = memoryview(buf)
    if crc32c(view[HEADER_SIZE:], crc32c(view[:_CRC_COVERED])) != crc:
        return f"entry {entry_id}: CRC-32C mismatch on read"
    return None
