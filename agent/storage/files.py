"""The store's blocking file work, and every fsync of it except group commit's fdatasync.

Runs on the store's threads (its metadata thread, or a thread of startup recovery), never on
the event loop: creating a replica's files, writing its markers (fenced, limbo) and its
acknowledged length, cutting a torn tail, removing a replica and making removals durable.
What is made durable when is listed in store.py; this module is how.

A failed fsync raises ``SyncFailed``, which the store treats as fatal, as it does a failed
data fdatasync: after it, the kernel may have dropped the dirty pages, and a retry that
succeeds would vouch for data that is gone.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dlctl.log.errors import AgentIOError

from . import checkpoint, layout
from .index import EntryIndex
from .layout import ACKED_SUFFIX, CHECKPOINT_SUFFIXES, FENCED_SUFFIX, IDX_SUFFIX, IDX_TMP_SUFFIX, LIMBO_SUFFIX, LOG_SUFFIX, Key
from .recovery import encode_acked
from .types import LimboRecord

log = logging.getLogger("dlagent.storage")

RECLAIMED_FILE = "reclaimed.json"  # in the data dir: bytes and replicas freed by deletes, ever


class SyncFailed(Exception):
    """An fsync of metadata failed on the sync thread: fatal, like a failed data fdatasync."""


class ReplicaFiles:
    """The files of the replicas under one data directory. ``fsync`` syncs new files,
    directories and markers (injectable so tests can count calls and fail them)."""

    def __init__(self, data_dir: Path, fsync: Callable[[int], None]) -> None:
        self.data_dir = data_dir
        self._fsync = fsync
        self._synced_log_dirs: set[Path] = set()  # log dirs whose entry in segments/ this process fsynced
        # Deletes: directories whose unlinks still need an fsync, and what deleting freed
        # (kept across restarts in RECLAIMED_FILE, shown by `cluster status`).
        self._settle_lock = threading.Lock()
        self._unsettled_dirs: set[Path] = set()
        self.reclaimed_bytes = 0
        self.reclaimed_replicas = 0

    def make_data_dir(self) -> None:
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

    def sync_fd(self, fd: int, what: object) -> None:
        try:
            self._fsync(fd)
        except OSError as exc:
            raise SyncFailed(f"fsync of {what} failed: {exc}") from exc

    def sync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self.sync_fd(fd, path)
        finally:
            os.close(fd)

    def create(self, key: Key, fenced: bool, exist_ok: bool = False) -> Path:
        """A new replica's empty .log file (and its .fenced marker), durable with its directory."""
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
            self.sync_fd(fd, path)
        finally:
            os.close(fd)
        if fenced:
            self.write_marker(layout.segment_path(self.data_dir, key, FENCED_SUFFIX), b"fenced\n", sync_dir=False)
        self.sync_dir(ldir)
        if new_dir:
            self.sync_dir(ldir.parent)
            self._synced_log_dirs.add(ldir)
        return path

    def write_marker(self, path: Path, content: bytes, sync_dir: bool = True) -> None:
        # Existence is what counts; the content is for people. A crash mid-write leaves an
        # existing (maybe empty) marker, which still means fenced/limbo: the safe side.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, layout.FILE_MODE)
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            self.sync_fd(fd, path)
        finally:
            os.close(fd)
        if sync_dir:
            self.sync_dir(path.parent)

    def write_limbo_marker(self, record: LimboRecord) -> None:
        doc = record.to_dict() | {"detected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        path = layout.segment_path(self.data_dir, (record.log_id, record.segment_seq), LIMBO_SUFFIX)
        try:
            self.write_marker(path, (json.dumps(doc, sort_keys=True) + "\n").encode())
        except OSError as exc:  # a failed fsync (SyncFailed) is fatal instead
            raise AgentIOError(f"cannot persist limbo state of {path}: {exc}") from exc

    def write_acked(self, due: list[tuple[Key, int]]) -> None:
        """Write and fsync each replica's .acked file (its directory too when the file is new).
        A replica whose .log is gone was deleted after the snapshot (deletes run on the same
        thread, in order): its length is not recorded."""
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
                self.sync_fd(fd, path)
            finally:
                os.close(fd)
        for directory in sorted(new_dirs):
            self.sync_dir(directory)

    def write_checkpoints(self, due: list[tuple[Key, int, int, EntryIndex]]) -> list[tuple[Key, int]]:
        """Each (key, covered length, LAC, index) as the replica's index checkpoint (checkpoint.py);
        the (key, covered length) of those written."""
        written = []
        for key, covered, lac, index in due:
            if not layout.segment_path(self.data_dir, key, LOG_SUFFIX).exists():
                continue  # deleted meanwhile
            checkpoint.write(layout.segment_path(self.data_dir, key, IDX_SUFFIX), checkpoint.encode(covered, lac, index), fsync=self._fsync)
            written.append((key, covered))
        return written

    def cut(self, path: Path, length: int, sync: bool = True) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, length)
            if sync:
                self._fsync(fd)
        except OSError as exc:
            raise AgentIOError(f"cannot cut the torn tail of {path} at offset {length}: {exc}") from exc
        finally:
            os.close(fd)

    def remove(self, key: Key) -> bool:
        """Unlink the replica's files; ``settle_deletes`` makes the unlinks durable."""
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
                self.reclaimed_bytes += freed
                self.reclaimed_replicas += 1
        return existed

    def settle_deletes(self) -> None:
        """Make every unlink done so far durable: one fsync per directory touched, however many
        deletes touched it (a collection deletes many segments of one log in a row, and this
        thread also creates the files writers wait for), then remove log directories left empty.

        Each delete runs this after its unlink, on the same (FIFO) thread: either an earlier run
        already took its directory after the unlink and synced it, or this run does."""
        with self._settle_lock:
            dirs, self._unsettled_dirs = self._unsettled_dirs, set()
            counters = (self.reclaimed_bytes, self.reclaimed_replicas)
        if not dirs:
            return
        for ldir in sorted(dirs):
            if ldir.is_dir():
                self.sync_dir(ldir)
            try:
                ldir.rmdir()
            except OSError:
                pass  # not empty (other segments of the log) or already gone
            else:
                self._synced_log_dirs.discard(ldir)  # made again, it needs its own parent fsync
                self.sync_dir(ldir.parent)
        self._save_reclaimed(*counters)

    def load_reclaimed(self) -> None:
        try:
            raw = json.loads((self.data_dir / RECLAIMED_FILE).read_text())
            self.reclaimed_bytes, self.reclaimed_replicas = int(raw["bytes"]), int(raw["replicas"])
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
