"""Where a replica lives on disk, derived only from validated integers.

    <data_dir>/LOCK                                   flock'ed by the one store using the dir
    <data_dir>/segments/<log_id:016x>/<seq:016x>.log     the entries, append-only
    <data_dir>/segments/<log_id:016x>/<seq:016x>.fenced  exists => fenced (durable marker)
    <data_dir>/segments/<log_id:016x>/<seq:016x>.limbo   exists => limbo (JSON: where, why)
    <data_dir>/segments/<log_id:016x>/<seq:016x>.acked   bytes of the .log known durable (u64 + CRC-32C)
    <data_dir>/segments/<log_id:016x>/<seq:016x>.idx     a checkpoint of its index (checkpoint.py)
    <data_dir>/segments/<log_id:016x>/<seq:016x>.idx.tmp the next one, being written

Paths are built with fixed-width hex of integers checked to be in range, so nothing that
comes from the network can name a file outside ``segments/``; directory listings are parsed
back with a strict pattern and anything else is ignored.

Least privilege (DESIGN.md §10): directories are made 0700 and files 0600, by explicit modes
here and in the store as well as by the umask ``dlagent serve`` sets: replicas are the
cluster's data, and no other local user has any business reading them.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import stat
from pathlib import Path

from dlctl.log.errors import AgentIOError, BadRequestError
from dlctl.log.format import U64_MAX

log = logging.getLogger("dlagent.storage")

FILE_MODE = 0o600  # every file the agent creates
DIR_MODE = 0o700  # every directory it creates, and the data dir whatever made it

SEGMENTS_DIR = "segments"
LOCK_FILE = "LOCK"
LOG_SUFFIX = ".log"
FENCED_SUFFIX = ".fenced"
LIMBO_SUFFIX = ".limbo"
ACKED_SUFFIX = ".acked"
IDX_SUFFIX = ".idx"
IDX_TMP_SUFFIX = ".idx.tmp"
CHECKPOINT_SUFFIXES = frozenset((IDX_SUFFIX, IDX_TMP_SUFFIX))  # shortcuts for a start, not replica state
SUFFIXES = (LOG_SUFFIX, FENCED_SUFFIX, LIMBO_SUFFIX, ACKED_SUFFIX, IDX_SUFFIX, IDX_TMP_SUFFIX)

ENTRY_ID_MAX = 2**63 - 1
_HEX16 = re.compile(r"[0-9a-f]{16}")
_FILE = re.compile(r"([0-9a-f]{16})(\.log|\.fenced|\.limbo|\.acked|\.idx|\.idx\.tmp)")

Key = tuple[int, int]  # (log id, segment seq)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_segment_ids(log_id: object, segment_seq: object) -> Key:
    """The (log id, segment seq) key, or BadRequestError naming the bad field."""
    if not _is_int(log_id) or not 0 < log_id <= U64_MAX:  # type: ignore[operator]
        raise BadRequestError(f"log id {log_id!r} out of range (1..2^64-1)")
    if not _is_int(segment_seq) or not 0 < segment_seq <= U64_MAX:  # type: ignore[operator]
        raise BadRequestError(f"segment seq {segment_seq!r} out of range (1..2^64-1)")
    return (log_id, segment_seq)  # type: ignore[return-value]


def check_entry_id(entry_id: object, what: str = "entry id") -> int:
    if not _is_int(entry_id) or not 0 <= entry_id <= ENTRY_ID_MAX:  # type: ignore[operator]
        raise BadRequestError(f"{what} {entry_id!r} out of range (0..2^63-1)")
    return entry_id  # type: ignore[return-value]


def segments_root(data_dir: Path) -> Path:
    return data_dir / SEGMENTS_DIR


def log_dir(data_dir: Path, log_id: int) -> Path:
    check_segment_ids(log_id, 1)
    return data_dir / SEGMENTS_DIR / f"{log_id:016x}"


def segment_path(data_dir: Path, key: Key, suffix: str = LOG_SUFFIX) -> Path:
    log_id, seq = check_segment_ids(*key)
    if suffix not in SUFFIXES:
        raise ValueError(f"unknown segment file suffix {suffix!r}")
    return data_dir / SEGMENTS_DIR / f"{log_id:016x}" / f"{seq:016x}{suffix}"


def parse_log_dir_name(name: str) -> int | None:
    if not _HEX16.fullmatch(name):
        return None
    log_id = int(name, 16)
    return log_id if log_id > 0 else None


def parse_segment_file_name(name: str) -> tuple[int, str] | None:
    """(segment seq, suffix) of a file we own, or None for anything else."""
    m = _FILE.fullmatch(name)
    if not m:
        return None
    seq = int(m.group(1), 16)
    return (seq, m.group(2)) if seq > 0 else None


def secure_data_dir(path: Path) -> int | None:
    """Make ``path`` (and missing parents) if needed, and leave it 0700: a directory that group
    or others can reach (made by hand, by ``mkdir -p``, by an older agent) is narrowed, and
    the log says so. Returns the mode it was narrowed from, else None. A directory this user
    cannot chmod (not its owner) is served from anyway, with an error in the log naming the fix."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if not mode & 0o077:
        return None
    try:
        os.chmod(path, DIR_MODE)
    except OSError as exc:
        log.error("data directory %s is mode %04o, open to other users, and cannot be narrowed (%s): run `chmod 700 %s` as its owner", path, mode, exc.strerror, path)
        return None
    log.warning("data directory %s was mode %04o, open to other users: narrowed to %04o", path, mode, DIR_MODE)
    return mode


def fsync_path(path: Path, fsync=os.fsync) -> None:
    """fsync a file or directory by path (directories: makes creates/unlinks/renames durable)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fsync(fd)
    finally:
        os.close(fd)


class DirLock:
    """An flock on <data_dir>/LOCK: exclusive for the store, shared for fsck (read-only)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    def _holder(self) -> str:
        try:
            text = self.path.read_text(errors="replace").strip()
        except OSError:
            return "another process"
        return f"pid {text}" if text.isdigit() else "another process"

    def acquire_exclusive(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError as exc:
            raise AgentIOError(f"cannot open lock file {self.path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise AgentIOError(
                    f"data directory {self.path.parent} is in use by {self._holder()} (lock {self.path})",
                    hint="stop the other agent (or fsck) using this data directory first",
                ) from None
            raise AgentIOError(f"cannot lock {self.path}: {exc.strerror}") from exc
        # The pid is informational (for the message above); the flock is what excludes.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def acquire_shared_readonly(self) -> bool:
        """Shared lock without creating or writing anything; False if a store holds the dir."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return True  # no store ever ran here
        except PermissionError:
            return True  # can not tell; reading on is still harmless
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def holder(self) -> str:
        return self._holder()

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock


def discover(data_dir: Path) -> tuple[list[tuple[Key, set[str]]], list[str]]:
    """Every segment under ``segments/`` (key, suffixes present), in key order, and the paths
    of anything there that is not ours (reported, never touched)."""
    root = segments_root(data_dir)
    found: list[tuple[Key, set[str]]] = []
    stray: list[str] = []
    try:
        log_dirs = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return found, stray
    for d in log_dirs:
        log_id = parse_log_dir_name(d.name)
        if log_id is None or not d.is_dir(follow_symlinks=False):
            stray.append(d.path)
            continue
        by_seq: dict[int, set[str]] = {}
        for f in sorted(os.scandir(d.path), key=lambda e: e.name):
            parsed = parse_segment_file_name(f.name)
            if parsed is None or not f.is_file(follow_symlinks=False):
                stray.append(f.path)
                continue
            by_seq.setdefault(parsed[0], set()).add(parsed[1])
        found.extend(((log_id, seq), by_seq[seq]) for seq in sorted(by_seq))
    return found, stray
