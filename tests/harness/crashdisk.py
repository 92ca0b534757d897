"""A disk that forgets, at a power loss, everything that was not made durable (pure logic).

This is the model behind the power-loss filesystem (``harness.powerfs``, which serves it over
FUSE so that real agents run on it). It holds a whole small filesystem in memory — a tree of
directories and regular files — and keeps, next to what every process currently sees, enough to
reconstruct what a disk would hold after the machine lost power at this instant. ``power_loss()``
turns the current state into that, and is the only place the two can differ in effect.

What survives a power loss, by operation (the strict POSIX reading: only fsync promises):

- **File data and size** (``write``, ``ftruncate``/``truncate``, ``fallocate``): durable once
  ``fsync`` *or* ``fdatasync`` of that file returns (both are treated alike: fdatasync also
  commits a size change, which Linux does because the size is needed to read the data back).
  An fsync covers everything written to the file before it was called, through any descriptor;
  nothing written after it. At a power loss every file goes back to its content and size as of
  its last fsync: writes since then are discarded, a size grown since (by a write or
  ``fallocate``) shrinks back, a file truncated since gets its cut bytes back. Kept as pre-images:
  before the first change after an fsync to a page (4 KiB) that lies inside the durable size,
  that page's durable bytes are saved; bytes beyond the durable size need none (they are cut).
  A new file's durable state is empty (size 0). An fsync is durable when it *returns*
  (``begin_fsync`` when called, ``finish_fsync`` when it returns): one in flight at a power loss
  makes nothing durable and fails with EIO.
- **Directory entries** (``create``, ``mkdir``, ``unlink``, ``rmdir``, ``rename``): durable
  once the *directory holding the entry* is fsynced — not by an fsync of the file itself (Linux's
  fsync(2): "an explicit fsync() on a file descriptor for the directory is also needed"). At a
  power loss every directory's entries go back to its listing as of its last fsync, so a file or
  directory created since vanishes (with everything under it), one unlinked or removed since comes
  back (with its durable content), and a rename since is undone in each directory that was not
  fsynced (a rename between two directories of which only one was fsynced can leave the file
  under both names, or neither: POSIX allows no better). A new directory's own listing is
  durable-empty. The root is the mount point and always exists.
- **Not modelled** (durable at once): permission bits, owners and timestamps (nothing the agent
  relies on); ``fallocate`` with ``FALLOC_FL_KEEP_SIZE`` (only reserves space: no visible
  content or size). Refused, so nothing can silently depend on them: hard links, symlinks,
  device nodes and FIFOs (EPERM), renaming a directory (EPERM), ``RENAME_EXCHANGE`` (EINVAL),
  ``fallocate`` modes that punch, zero, collapse or insert ranges (EOPNOTSUPP).

This is stricter than a journaling filesystem in practice (ext4 and XFS would keep a created
directory entry whose file was fsynced, for example), which is the point: what the agent keeps
through this model it keeps on any POSIX filesystem that honours fsync, and what it loses here is
a missing fsync, not bad luck.

By default (``power_loss()``) everything unsynced is discarded, never kept in part: one of the
outcomes real hardware can produce, and the one that shows a missing fsync most reliably (every
page that depended on it is gone). Real devices may also persist any subset of the unsynced
pages, in any order: ``power_loss(keep=p)`` produces those outcomes — a *torn* loss, where each
page written or changed since its file's last fsync independently keeps its new bytes with
probability p (else its durable ones; zeros past the durable size), and the size is either the
durable or the current one. What remains becomes durable. Directory entries are never torn.

Errors are raised as ``OSError`` with the errno the kernel would give.
"""

from __future__ import annotations

import errno
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from stat import S_IFDIR, S_IFREG

PAGE = 4096
# fallocate(2) mode bits (linux/falloc.h).
FALLOC_FL_KEEP_SIZE = 0x01
RENAME_NOREPLACE = 1 << 0
RENAME_EXCHANGE = 1 << 1


def _error(code: int, what: str) -> OSError:
    return OSError(code, f"{os.strerror(code)}: {what}")


class FileData:
    """One regular file's bytes: the current content, and the durable one as pre-images.

    ``data`` holds the current content up to its last non-zero-filled byte; bytes from
    ``len(data)`` up to ``size`` read as zeros (``fallocate`` or a truncate that grows the
    file), so preallocated space costs no memory. ``saved`` maps a page index to that page's
    durable bytes (``[p * PAGE, min((p + 1) * PAGE, durable_size))``), taken before the first
    change to the page since the last fsync; every other byte below ``durable_size`` is unchanged
    since then, so current and durable content agree there.
    """

    __slots__ = ("data", "size", "durable_size", "saved", "written", "version")

    def __init__(self) -> None:
        self.version = 0  # bumped by every change (a sync in flight checks it)
        self.data = bytearray()
        self.size = 0
        self.durable_size = 0
        self.saved: dict[int, bytes] = {}
        # Pages written since the last fsync (for reports only: ``saved`` and the durable size
        # are what a power loss goes back to).
        self.written: set[int] = set()

    # -- reading ---------------------------------------------------------------------------------

    def read(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if offset >= end:
            return b""
        chunk = bytes(self.data[offset:end])
        return chunk + bytes(end - offset - len(chunk))

    def durable_content(self) -> bytes:
        """What a power loss would leave (without changing anything)."""
        out = bytearray(self.read(0, self.durable_size))
        out.extend(bytes(self.durable_size - len(out)))
        for page, image in self.saved.items():
            out[page * PAGE : page * PAGE + len(image)] = image
        return bytes(out)

    @property
    def unsynced_pages(self) -> int:
        """Pages written since the last fsync (truncates and preallocations count none)."""
        return len(self.written)

    @property
    def dirty(self) -> bool:
        return bool(self.saved or self.written) or self.size != self.durable_size

    # -- changing ----------------------------------------------------------------------------------

    def _preserve(self, start: int, end: int) -> None:
        """Save the durable bytes of every page in [start, end) ∩ [0, durable_size) not saved yet:
        called before those bytes change."""
        end = min(end, self.durable_size)
        if start >= end:
            return
        for page in range(start // PAGE, (end - 1) // PAGE + 1):
            if page not in self.saved:
                lo = page * PAGE
                self.saved[page] = self.read(lo, min(lo + PAGE, self.durable_size) - lo).ljust(
                    min(lo + PAGE, self.durable_size) - lo, b"\0"
                )

    def write(self, offset: int, buf: bytes) -> int:
        if offset < 0:
            raise _error(errno.EINVAL, f"write at offset {offset}")
        if not buf:
            return 0
        end = offset + len(buf)
        self.version += 1
        self._preserve(offset, end)
        self.written.update(range(offset // PAGE, (end - 1) // PAGE + 1))
        if offset > len(self.data):
            self.data.extend(bytes(offset - len(self.data)))
        self.data[offset:end] = buf
        if end > self.size:
            self.size = end
        return len(buf)

    def truncate(self, length: int) -> None:
        if length < 0:
            raise _error(errno.EINVAL, f"truncate to {length}")
        self.version += 1
        if length < self.size:
            # The cut bytes inside the durable size must come back if the truncate is lost.
            self._preserve(length, self.durable_size)
            del self.data[length:]
        self.size = length

    def allocate(self, offset: int, length: int, keep_size: bool) -> None:
        """posix_fallocate/fallocate: the range reads as it did (zeros past the end); mode 0 grows
        the size to cover it. Space reservation itself is not modelled."""
        if offset < 0 or length <= 0:
            raise _error(errno.EINVAL, f"fallocate offset {offset} length {length}")
        end = offset + length
        if not keep_size and end > self.size:
            self.version += 1
            self.size = end

    def sync(self) -> None:
        """fsync/fdatasync: the current content and size become the durable ones."""
        self.durable_size = self.size
        self.saved.clear()
        self.written.clear()

    def snapshot(self) -> tuple[int, int, bytes]:
        """The state an fsync called now promises to make durable: (version, size, content)."""
        return self.version, self.size, bytes(self.data[: self.size])

    def sync_to(self, snap: tuple[int, int, bytes]) -> None:
        """An fsync called at ``snap`` returns: what the file held then becomes durable, not what
        was written since (through another descriptor, while the fsync was in flight)."""
        version, size, content = snap
        if version == self.version:
            self.sync()
            return
        durable = content.ljust(size, b"\0")
        self.durable_size = size
        self.saved = {}
        for page in range(0, (size + PAGE - 1) // PAGE):
            lo, hi = page * PAGE, min(page * PAGE + PAGE, size)
            if self.read(lo, hi - lo).ljust(hi - lo, b"\0") != durable[lo:hi]:
                self.saved[page] = durable[lo:hi]
        self.written = {p for p in self.written if p in self.saved or p * PAGE + PAGE > size}

    def power_loss(self, keep: float = 0.0, rng: random.Random | None = None) -> int:
        """Go back to the durable state; returns how many written pages were discarded.

        ``keep`` > 0 (with ``rng``): a *torn* power loss instead — the size is the current one
        with probability ``keep`` (else the durable one), and each page changed since the last
        fsync independently keeps its current bytes with probability ``keep`` (else goes back to
        its durable bytes; zeros past the durable size). What remains becomes the durable state."""
        if not self.dirty:
            return 0
        if keep > 0.0:
            assert rng is not None
            return self._torn(keep, rng)
        lost = self.unsynced_pages
        durable = self.durable_size
        if len(self.data) > durable:
            del self.data[durable:]
        for page, image in self.saved.items():
            lo = page * PAGE
            if lo > len(self.data):
                self.data.extend(bytes(lo - len(self.data)))
            self.data[lo : lo + len(image)] = image
        self.size = durable
        self.saved.clear()
        self.written.clear()
        return lost

    def _torn(self, keep: float, rng: random.Random) -> int:
        durable, current = self.durable_size, self.size
        size = current if current != durable and rng.random() < keep else durable
        reverted = 0
        for page in sorted(self.written | self.saved.keys()):
            lo = page * PAGE
            # A cut the size did not keep comes back whole (ftruncate is one journaled change).
            undo_cut = size > current and lo + PAGE > current and page in self.saved
            if not undo_cut and rng.random() < keep:
                continue
            reverted += page in self.written
            image = self.saved.get(page, self.read(lo, max(0, min(lo + PAGE, durable) - lo)))
            image = image.ljust(PAGE, b"\0")  # zeros past the durable size
            if lo > len(self.data):
                self.data.extend(bytes(lo - len(self.data)))
            self.data[lo : lo + PAGE] = image
        del self.data[size:]
        self.size = size
        self.sync()
        return reverted


class Node:
    __slots__ = ("ino", "mode", "uid", "gid", "atime_ns", "mtime_ns", "ctime_ns")

    def __init__(self, ino: int, mode: int) -> None:
        now = time.time_ns()
        self.ino = ino
        self.mode = mode
        self.uid = os.getuid()
        self.gid = os.getgid()
        self.atime_ns = self.mtime_ns = self.ctime_ns = now

    @property
    def is_dir(self) -> bool:
        return isinstance(self, Directory)

    def touch(self) -> None:
        self.mtime_ns = self.ctime_ns = time.time_ns()


class File(Node):
    __slots__ = ("content",)

    def __init__(self, ino: int, mode: int) -> None:
        super().__init__(ino, S_IFREG | (mode & 0o7777))
        self.content = FileData()


class Directory(Node):
    """``entries``: what lookups see now; ``durable``: the listing as of the last fsync."""

    __slots__ = ("entries", "durable")

    def __init__(self, ino: int, mode: int) -> None:
        super().__init__(ino, S_IFDIR | (mode & 0o7777))
        self.entries: dict[str, Node] = {}
        self.durable: dict[str, Node] = {}


@dataclass(frozen=True)
class LossReport:
    """What one power loss discarded."""

    files_reverted: int  # files whose content or size went back to their last fsync
    pages_discarded: int  # pages written since their file's last fsync (4 KiB; partly written ones count)
    entries_reverted: int  # directory entries that vanished, came back or changed target
    epoch: int  # the volume's epoch after the loss (handles of older epochs are dead)

    def to_dict(self) -> dict[str, int]:
        return {
            "files_reverted": self.files_reverted,
            "pages_discarded": self.pages_discarded,
            "entries_reverted": self.entries_reverted,
            "epoch": self.epoch,
        }


class Volume:
    """The filesystem: a tree under ``root``, operations by path or node, and ``power_loss()``.

    Not thread-safe: the FUSE layer serialises calls. ``epoch`` counts power losses, so that a
    layer handing out file handles can tell a handle opened before the last one (its process is
    gone: a power loss takes every process with it).
    """

    def __init__(self) -> None:
        self._next_ino = 2
        self.root = Directory(1, 0o755)
        self.epoch = 0
        self.counters: Counter[str] = Counter()

    # -- lookup ----------------------------------------------------------------------------------

    @staticmethod
    def _parts(path: str) -> list[str]:
        if not path.startswith("/"):
            raise _error(errno.EINVAL, f"path {path!r} is not absolute")
        return [p for p in path.split("/") if p]

    def lookup(self, path: str) -> Node:
        node: Node = self.root
        for name in self._parts(path):
            if not isinstance(node, Directory):
                raise _error(errno.ENOTDIR, path)
            child = node.entries.get(name)
            if child is None:
                raise _error(errno.ENOENT, path)
            node = child
        return node

    def _parent(self, path: str) -> tuple[Directory, str]:
        parts = self._parts(path)
        if not parts:
            raise _error(errno.EBUSY, "the root")
        if parts[-1] in (".", ".."):
            raise _error(errno.EINVAL, path)
        parent = self.lookup("/" + "/".join(parts[:-1]))
        if not isinstance(parent, Directory):
            raise _error(errno.ENOTDIR, path)
        return parent, parts[-1]

    def _new_ino(self) -> int:
        ino = self._next_ino
        self._next_ino += 1
        return ino

    # -- namespace -------------------------------------------------------------------------------

    def mkdir(self, path: str, mode: int = 0o755) -> Directory:
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _error(errno.EEXIST, path)
        node = parent.entries[name] = Directory(self._new_ino(), mode)
        parent.touch()
        self.counters["mkdir"] += 1
        return node

    def create(self, path: str, mode: int = 0o644, *, exclusive: bool = False, truncate: bool = False) -> File:
        """open(O_CREAT): a new empty file, or the existing one (EEXIST with ``exclusive``)."""
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is not None:
            if exclusive:
                raise _error(errno.EEXIST, path)
            if isinstance(node, Directory):
                raise _error(errno.EISDIR, path)
            assert isinstance(node, File)
            if truncate:
                self.truncate(node, 0)
            return node
        node = parent.entries[name] = File(self._new_ino(), mode)
        parent.touch()
        self.counters["create"] += 1
        return node

    def unlink(self, path: str) -> None:
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is None:
            raise _error(errno.ENOENT, path)
        if isinstance(node, Directory):
            raise _error(errno.EISDIR, path)
        del parent.entries[name]
        parent.touch()
        self.counters["unlink"] += 1

    def rmdir(self, path: str) -> None:
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is None:
            raise _error(errno.ENOENT, path)
        if not isinstance(node, Directory):
            raise _error(errno.ENOTDIR, path)
        if node.entries:
            raise _error(errno.ENOTEMPTY, path)
        del parent.entries[name]
        parent.touch()
        self.counters["rmdir"] += 1

    def rename(self, old: str, new: str, flags: int = 0) -> None:
        if flags & RENAME_EXCHANGE or flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE):
            raise _error(errno.EINVAL, f"rename flags {flags:#x} are not modelled")
        src_dir, src_name = self._parent(old)
        dst_dir, dst_name = self._parent(new)
        node = src_dir.entries.get(src_name)
        if node is None:
            raise _error(errno.ENOENT, old)
        if isinstance(node, Directory):
            raise _error(errno.EPERM, f"renaming a directory is not modelled: {old}")
        target = dst_dir.entries.get(dst_name)
        if target is node:
            return
        if target is not None:
            if flags & RENAME_NOREPLACE:
                raise _error(errno.EEXIST, new)
            if isinstance(target, Directory):
                raise _error(errno.EISDIR, new)
        del src_dir.entries[src_name]
        dst_dir.entries[dst_name] = node
        src_dir.touch()
        dst_dir.touch()
        self.counters["rename"] += 1

    def listdir(self, node: Node) -> list[str]:
        if not isinstance(node, Directory):
            raise _error(errno.ENOTDIR, f"inode {node.ino}")
        return list(node.entries)

    # -- file content ----------------------------------------------------------------------------

    @staticmethod
    def _file(node: Node) -> File:
        if isinstance(node, Directory):
            raise _error(errno.EISDIR, f"inode {node.ino}")
        assert isinstance(node, File)
        return node

    def read(self, node: Node, offset: int, length: int) -> bytes:
        return self._file(node).content.read(offset, length)

    def write(self, node: Node, offset: int, buf: bytes) -> int:
        f = self._file(node)
        n = f.content.write(offset, buf)
        f.touch()
        self.counters["write"] += 1
        self.counters["bytes_written"] += n
        return n

    def truncate(self, node: Node, length: int) -> None:
        f = self._file(node)
        f.content.truncate(length)
        f.touch()
        self.counters["truncate"] += 1

    def fallocate(self, node: Node, mode: int, offset: int, length: int) -> None:
        f = self._file(node)
        if mode & ~FALLOC_FL_KEEP_SIZE:
            raise _error(errno.EOPNOTSUPP, f"fallocate mode {mode:#x} is not modelled")
        f.content.allocate(offset, length, keep_size=bool(mode & FALLOC_FL_KEEP_SIZE))
        self.counters["fallocate"] += 1

    # -- durability ------------------------------------------------------------------------------

    def fsync(self, node: Node, datasync: bool = False) -> None:
        """fsync/fdatasync of a file (its data and size) or of a directory (its entries)."""
        self.finish_fsync(node, self.begin_fsync(node), datasync)

    def begin_fsync(self, node: Node) -> object:
        """An fsync is called: what it covers (``finish_fsync`` makes that durable). Between the
        two, the fsync is in flight: a power loss then discards what it covers (it never returned)."""
        if isinstance(node, Directory):
            return (self.epoch, dict(node.entries))
        return (self.epoch, self._file(node).content.snapshot())

    def finish_fsync(self, node: Node, token: object, datasync: bool = False) -> None:
        """The fsync returns: raises EIO if a power loss came first (nothing became durable)."""
        epoch, state = token  # type: ignore[misc]
        if epoch != self.epoch:
            raise _error(errno.EIO, "the power was lost during this fsync")
        if isinstance(node, Directory):
            node.durable = state
            self.counters["fsync_dir"] += 1
        else:
            self._file(node).content.sync_to(state)
            self.counters["fdatasync" if datasync else "fsync"] += 1

    def _durable_tree(self) -> Iterator[Node]:
        """Every node a power loss would leave, reached from the root over durable listings."""
        seen: set[int] = set()
        stack: list[Node] = [self.root]
        while stack:
            node = stack.pop()
            if node.ino in seen:
                continue
            seen.add(node.ino)
            yield node
            if isinstance(node, Directory):
                stack.extend(node.durable.values())

    def unsynced(self) -> dict[str, int]:
        """How much a power loss now would discard (nothing is changed)."""
        files = pages = entries = 0
        for node in self._durable_tree():
            if isinstance(node, Directory):
                entries += _entry_changes(node)
            elif node.content.dirty:  # type: ignore[attr-defined]
                files += 1
                pages += node.content.unsynced_pages  # type: ignore[attr-defined]
        return {"files": files, "pages": pages, "entries": entries}

    def power_loss(self, keep: float = 0.0, seed: int | None = None) -> LossReport:
        """The machine loses power: every directory and file goes back to its durable state, and
        whatever only unsynced entries reached is gone. ``keep`` > 0: file contents are torn
        instead (FileData.power_loss), from a generator seeded with ``seed``."""
        rng = random.Random(seed) if keep > 0.0 else None
        files = pages = entries = 0
        for node in list(self._durable_tree()):
            if isinstance(node, Directory):
                entries += _entry_changes(node)
                node.entries = dict(node.durable)
            else:
                assert isinstance(node, File)
                if node.content.dirty:
                    files += 1
                    pages += node.content.power_loss(keep, rng)
        self.epoch += 1
        self.counters["power_loss"] += 1
        return LossReport(files, pages, entries, self.epoch)


def _entry_changes(d: Directory) -> int:
    names = d.entries.keys() | d.durable.keys()
    return sum(1 for n in names if d.entries.get(n) is not d.durable.get(n))
