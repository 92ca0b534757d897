"""A FUSE filesystem that loses, on command, everything not fsynced: power loss for real processes.

Real agents run with their data directories on a ``PowerFs`` mount; a test cuts the power by
freezing the agent (``node.proc.pause()``), calling ``fs.power_loss(dead_pids=[pid])``, SIGKILLing
the agent (``node.proc.kill()``) and starting it again on the same directory. What the agent
finds then is what a disk would hold.

**The model** (all of it in ``harness.crashdisk``, whose docstring is the reference; FileData
and Volume there are unit-tested without FUSE):

- File data and size survive once an fsync or fdatasync of that file returned; at a power loss
  every file goes back to its content and size as of its last one. Writes since, growth since
  (``write`` past the end, ``posix_fallocate``) and cuts since (``ftruncate``) are undone.
- Directory entries (create, mkdir, unlink, rmdir, rename) survive once the directory holding
  them was fsynced; at a power loss every directory goes back to its listing as of then. An
  fsync of a file does not make its name durable.
- An fsync or fdatasync is durable when it returns; one in flight at the power loss fails
  (EIO) and makes nothing durable. Each takes ``--sync-latency-ms`` (0 by default), like a
  device's flush, so that a cut can fall inside one.
- Not modelled (durable at once): modes, owners, timestamps, ``FALLOC_FL_KEEP_SIZE``
  reservations. Refused: links, symlinks, device nodes, renaming directories, other
  ``fallocate`` modes (so nothing can depend on them unseen).
- Everything unsynced is discarded at once, never kept in part — unless the power loss asks for
  a torn one (``keep``: each unsynced page survives with that probability, in no order).

**Why the kernel cannot keep anything behind our back.** The mount uses ``direct_io`` (no
page cache for file data: every read and write is a request to this process) and zero entry,
attribute and negative timeouts (every lookup and stat asks again), so after a power loss no
process sees data, sizes or names the model discarded. FUSE's write-back cache is off. flock is
left to the kernel (local locks, released when the holder dies), as the agent's LOCK file needs
no more.

**The instant of the cut.** The harness freezes the agent (SIGSTOP: from the test, or from
inside this process's write or fsync handler when a cut is armed), then calls ``power_loss``
naming its pid, then SIGKILLs and reaps it. Whatever reached this process before the power loss
is judged by the model; nothing of the agent's gets in after it: requests it still had queued are
refused (by thread id: FUSE tells who asks), handles open at the cut are dead (EIO), and an fsync
in flight fails without making anything durable. (Killing first and cutting after would be
exact too — a process cannot die while a request of its that this process already read is
unanswered, and unread ones are withdrawn — but an fsync in flight would then always complete.)

**The process and its control channel.** ``python -m harness.powerfs MOUNTPOINT @NAME`` mounts
in the foreground (libfuse 3 through ``mfusepy``, single-threaded: one big lock
serialises requests anyway) and answers one JSON request per line on the abstract Unix socket
NAME (no file, so no path-length limit under deep test directories):
``{"op": "power_loss", "dead_pids": [...]}`` (discard, reply with what was discarded),
``{"op": "arm", "trigger": "write"|"fsync", "pids": [...]}`` (freeze those processes inside the
next write, or the next fsync of a file, so that a cut falls exactly there; ``{"op": "fired"}``
says whether it did), ``{"op": "stats"}`` (operation counters, fsyncs included, and what a power
loss would discard now), ``{"op": "ping"}``. A power loss holds the same lock as the FUSE
requests, so it happens between two of them, or while an fsync is in flight: each fsync takes
``--sync-latency-ms`` (like a device's flush) with the lock free, covers what the file held when
it was called, and becomes durable only when it returns — a power loss first makes it fail (EIO)
and discards what it covered.

``PowerFs`` below is the test side: start, power_loss, stats, close (unmounting even a mount
whose process died). Missing FUSE pieces are reported by ``missing_prerequisites`` so that a
test fails naming them; there is no skip.
"""

from __future__ import annotations

import argparse
import errno
import functools
import json
import logging
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .crashdisk import Directory, File, Node, Volume

log = logging.getLogger("powerfs")

FUSE_CAP_WRITEBACK_CACHE = 1 << 16  # libfuse 3's fuse_common.h
CUT_WAIT = 30.0  # longest an fsync a cut fell in waits for the power loss (then it completes)
DEBIAN_PACKAGE = "fuse3"  # libfuse3-3 (the library) and fusermount3
PYPI_PACKAGE = "mfusepy"
O_ACCMODE = os.O_RDONLY | os.O_WRONLY | os.O_RDWR


# -- the filesystem process --------------------------------------------------------------------------


class _Handle:
    __slots__ = ("node", "epoch")

    def __init__(self, node: Node, epoch: int) -> None:
        self.node = node
        self.epoch = epoch


def _locked(method: Callable) -> Callable:
    """One request at a time (with the control channel), and none from a process the power took."""

    @functools.wraps(method)
    def wrapper(self: PowerFsOperations, *args: Any) -> Any:
        with self._mutex:
            self._check_requester()
            return method(self, *args)

    return wrapper


class PowerFsOperations:
    """FUSE requests mapped onto a crashdisk ``Volume``, for mfusepy (which registers with libfuse
    exactly the methods defined here). File handles name nodes, so requests on an open file never
    need its path (``nullpath_ok``; ``hard_remove`` unlinks at once)."""

    use_ns = True

    def __init__(self, volume: Volume, lock: threading.Lock, *, sync_latency: float = 0.0,
                 requester: Callable[[], int] = lambda: 0) -> None:
        self.volume = volume
        self._mutex = lock
        self.handles: dict[int, _Handle] = {}
        self._next_fh = 1
        self.sync_latency = sync_latency  # seconds each fsync takes (a disk's flush)
        self._requester = requester  # the thread id behind the current request
        self.dead_tids: set[int] = set()  # threads of processes that died with the power
        self.fsyncs_in_flight = 0
        # A cut armed to fall on the next write or fsync: (trigger, pids to freeze); see _control.
        self.armed: tuple[str, list[int]] | None = None
        self.fired: str | None = None
        self._cut = threading.Event()  # set by power_loss: an fsync the cut fell in may end
        self._cut.set()

    # -- setup --------------------------------------------------------------------------------

    def init_with_config(self, conn, config) -> None:
        if config is None:
            raise RuntimeError("powerfs needs libfuse 3 (its fuse_config); set FUSE_LIBRARY_NAME=fuse3")
        config.direct_io = 1  # no page cache: every read and write comes here
        config.entry_timeout = 0.0  # every lookup asks again: names a power loss removed vanish at once
        config.attr_timeout = 0.0  # sizes too
        config.negative_timeout = 0.0
        config.hard_remove = 1  # unlink really unlinks (no .fuse_hidden files)
        config.nullpath_ok = 1  # requests on open files come by handle
        config.use_ino = 1
        config.kernel_cache = 0
        config.auto_cache = 0
        if conn is not None:
            conn.want &= ~FUSE_CAP_WRITEBACK_CACHE  # writes reach this process before write() returns
            log.info("fuse connection: capable %#x, want %#x", conn.capable, conn.want)

    # -- helpers ------------------------------------------------------------------------------

    def _maybe_fire(self, trigger: str) -> bool:
        """If a cut is armed on ``trigger``: freeze its processes now, inside this request (the
        requesting thread waits for the answer; every other thread stops at once). True if so."""
        if self.armed is None or self.armed[0] != trigger:
            return False
        _, pids = self.armed
        self.armed = None
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        self.fired = trigger
        if trigger == "fsync":
            self._cut.clear()  # that fsync waits for the power loss (see _fsync)
        return True

    def _check_requester(self) -> None:
        # A request a frozen victim queued before the power loss, read only after it: the
        # process is dead on a real machine, so its request never reaches the disk.
        if self.dead_tids and self._requester() in self.dead_tids:
            raise OSError(errno.EIO, "request from a process that died with the power")

    def _node(self, path: str | None, fh: Any = None) -> Node:
        if fh:
            handle = self.handles.get(int(fh))
            if handle is None:
                raise OSError(errno.EBADF, f"unknown file handle {fh}")
            if handle.epoch != self.volume.epoch:
                raise OSError(errno.EIO, "file handle opened before a power loss")
            return handle.node
        if path is None:
            raise OSError(errno.EBADF, "no path and no file handle")
        return self.volume.lookup(path)

    def _open_handle(self, node: Node) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = _Handle(node, self.volume.epoch)
        return fh

    @staticmethod
    def _attrs(node: Node) -> dict[str, int]:
        if isinstance(node, File):
            size = node.content.size
            nlink = 1
        else:
            assert isinstance(node, Directory)
            size = 4096
            nlink = 2 + sum(1 for child in node.entries.values() if isinstance(child, Directory))
        return {
            "st_ino": node.ino,
            "st_mode": node.mode,
            "st_nlink": nlink,
            "st_uid": node.uid,
            "st_gid": node.gid,
            "st_size": size,
            "st_blocks": (size + 511) // 512,
            "st_blksize": 4096,
            "st_atime": node.atime_ns,
            "st_mtime": node.mtime_ns,
            "st_ctime": node.ctime_ns,
        }

    # -- metadata -----------------------------------------------------------------------------

    @_locked
    def getattr(self, path: str | None, fh: Any = None) -> dict[str, int]:
        return self._attrs(self._node(path, fh))

    @_locked
    def access(self, path: str, amode: int) -> int:
        self.volume.lookup(path)
        return 0

    @_locked
    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 24, "f_bfree": 1 << 23, "f_bavail": 1 << 23,
                "f_files": 1 << 20, "f_ffree": 1 << 19, "f_favail": 1 << 19, "f_namemax": 255}

    @_locked
    def chmod(self, path: str | None, mode: int, fh: Any = None) -> int:
        node = self._node(path, fh)
        node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
        return 0

    @_locked
    def chown(self, path: str | None, uid: int, gid: int, fh: Any = None) -> int:
        node = self._node(path, fh)
        if uid != -1:
            node.uid = uid
        if gid != -1:
            node.gid = gid
        return 0

    @_locked
    def utimens(self, path: str | None, times: tuple[int, int] | None = None, fh: Any = None) -> int:
        node = self._node(path, fh)
        if times is None:
            node.touch()
            node.atime_ns = node.mtime_ns
        else:
            node.atime_ns, node.mtime_ns = int(times[0]), int(times[1])
        return 0

    # -- namespace ----------------------------------------------------------------------------

    @_locked
    def mkdir(self, path: str, mode: int) -> int:
        self.volume.mkdir(path, mode)
        return 0

    @_locked
    def rmdir(self, path: str) -> int:
        self.volume.rmdir(path)
        return 0

    @_locked
    def unlink(self, path: str) -> int:
        self.volume.unlink(path)
        return 0

    @_locked
    def rename(self, old: str, new: str, flags: int = 0) -> int:
        self.volume.rename(old, new, flags)
        return 0

    def link(self, target: str, source: str) -> int:
        raise OSError(errno.EPERM, "hard links are not modelled")

    def symlink(self, target: str, source: str) -> int:
        raise OSError(errno.EPERM, "symlinks are not modelled")

    def mknod(self, path: str, mode: int, dev: int) -> int:
        raise OSError(errno.EPERM, "device nodes and FIFOs are not modelled")

    @_locked
    def opendir(self, path: str) -> int:
        node = self.volume.lookup(path)
        if not isinstance(node, Directory):
            raise OSError(errno.ENOTDIR, path)
        return self._open_handle(node)

    @_locked
    def readdir(self, path: str | None, fh: Any) -> list[tuple[str, dict[str, int], int]]:
        # With an inode number each: entries with d_ino 0 are skipped by readdir(3).
        node = self._node(path, fh)
        self.volume.listdir(node)  # ENOTDIR for a file
        assert isinstance(node, Directory)
        out = [(".", {"st_ino": node.ino, "st_mode": node.mode}, 0), ("..", {"st_ino": 1, "st_mode": self.volume.root.mode}, 0)]
        out += [(name, {"st_ino": child.ino, "st_mode": child.mode}, 0) for name, child in node.entries.items()]
        return out

    def releasedir(self, path: str | None, fh: Any) -> int:
        with self._mutex:
            self.handles.pop(int(fh), None)
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: Any) -> int:
        return self._fsync(path, datasync, fh)

    # -- files --------------------------------------------------------------------------------

    @_locked
    def create(self, path: str, mode: int, flags: int = 0) -> int:
        node = self.volume.create(path, mode, exclusive=bool(flags & os.O_EXCL), truncate=bool(flags & os.O_TRUNC))
        return self._open_handle(node)

    @_locked
    def open(self, path: str, flags: int) -> int:
        node = self.volume.lookup(path)
        if isinstance(node, Directory) and flags & O_ACCMODE != os.O_RDONLY:
            raise OSError(errno.EISDIR, path)
        if flags & os.O_TRUNC and flags & O_ACCMODE != os.O_RDONLY:
            self.volume.truncate(node, 0)
        return self._open_handle(node)

    @_locked
    def read(self, path: str | None, size: int, offset: int, fh: Any) -> bytes:
        return self.volume.read(self._node(path, fh), offset, size)

    @_locked
    def write(self, path: str | None, data: bytes, offset: int, fh: Any) -> int:
        written = self.volume.write(self._node(path, fh), offset, data)
        self._maybe_fire("write")  # written, not durable
        return written

    @_locked
    def truncate(self, path: str | None, length: int, fh: Any = None) -> int:
        self.volume.truncate(self._node(path, fh), length)
        return 0

    @_locked
    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: Any) -> int:
        self.volume.fallocate(self._node(path, fh), mode, offset, size)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: Any) -> int:
        return self._fsync(path, datasync, fh)

    def _fsync(self, path: str | None, datasync: int, fh: Any) -> int:
        """Covers what the file (or directory) holds now; durable only when it returns, after
        ``sync_latency`` (a power loss meanwhile discards it and fails the fsync with EIO)."""
        with self._mutex:
            self._check_requester()
            node = self._node(path, fh)
            token = self.volume.begin_fsync(node)
            self.fsyncs_in_flight += 1
            held = isinstance(node, File) and self._maybe_fire("fsync")  # called, not returned
        try:
            if self.sync_latency:
                time.sleep(self.sync_latency)  # the lock is free: a power loss may come now
            if held:
                self._cut.wait(CUT_WAIT)  # the cut falls inside this fsync: it ends after the loss
        finally:
            with self._mutex:
                self.fsyncs_in_flight -= 1
                try:
                    self.volume.finish_fsync(node, token, bool(datasync))
                except OSError:
                    self.volume.counters["fsync_cut_short"] += 1
                    raise
        return 0

    def flush(self, path: str | None, fh: Any) -> int:
        return 0

    def release(self, path: str | None, fh: Any) -> int:
        with self._mutex:  # also for a process the power took: its handles go
            self.handles.pop(int(fh), None)
        return 0

    # -- control (not FUSE requests) ------------------------------------------------------------

    def control(self, request: dict[str, Any]) -> dict[str, Any]:
        """A request from the control socket (its own thread: not a FUSE request)."""
        with self._mutex:
            return self._control(request)

    def _control(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        if op == "arm":
            trigger = request.get("trigger")
            if trigger not in ("write", "fsync"):
                return {"ok": False, "error": f"unknown trigger {trigger!r}"}
            self.armed, self.fired = (trigger, [int(p) for p in request["pids"]]), None
            return {"ok": True}
        if op == "fired":
            fired, self.armed = self.fired, (self.armed if request.get("keep_armed") else None)
            if fired is None and self.armed is None:
                self._cut.set()
            return {"ok": True, "fired": fired}
        if op == "stats":
            return {"ok": True, "counters": dict(self.volume.counters), "unsynced": self.volume.unsynced(),
                    "open_handles": len(self.handles), "epoch": self.volume.epoch}
        if op == "power_loss":
            # The processes on this disk die with the power: the harness froze them before this
            # call and kills them after it. Requests they still have queued are refused, and
            # handles still open are dead (their epoch is over: EIO from now on).
            for pid in request.get("dead_pids", ()):
                self.dead_tids.add(int(pid))
                try:
                    self.dead_tids.update(int(t) for t in os.listdir(f"/proc/{int(pid)}/task"))
                except FileNotFoundError:
                    pass  # already gone: nothing of it can be queued any more
            stale = sum(1 for h in self.handles.values() if h.epoch == self.volume.epoch)
            in_flight = self.fsyncs_in_flight
            report = self.volume.power_loss(float(request.get("keep", 0.0)), request.get("seed"))
            self._cut.set()
            return {"ok": True, **report.to_dict(), "handles_dropped": stale, "fsyncs_in_flight": in_flight}
        return {"ok": False, "error": f"unknown op {op!r}"}


def _make_fuse_class():
    """mfusepy's FUSE, passing what its libfuse 3 wrappers drop: the file handle of truncate,
    chmod, chown and utimens on an open file (needed with ``nullpath_ok``) and rename's flags."""
    import mfusepy

    def path_of(self, path):
        return None if path is None else path.decode(self.encoding, self.errors)

    def fh_of(fip):
        return fip.contents.fh if fip else None

    class Fuse(mfusepy.FUSE):
        def truncate_fuse_3(self, path, length, fip):
            return self.operations.truncate(path_of(self, path), length, fh_of(fip))

        def chmod_fuse_3(self, path, mode, fip):
            return self.operations.chmod(path_of(self, path), mode, fh_of(fip))

        def chown_fuse_3(self, path, uid, gid, fip):
            uid = -1 if mfusepy.c_uid_t(uid + 1).value == 0 else uid
            gid = -1 if mfusepy.c_gid_t(gid + 1).value == 0 else gid
            return self.operations.chown(path_of(self, path), uid, gid, fh_of(fip))

        def utimens_fuse_3(self, path, buf, fip):
            times = None
            if buf:
                times = (mfusepy.time_of_timespec(buf.contents.actime, use_ns=True), mfusepy.time_of_timespec(buf.contents.modtime, use_ns=True))
            return self.operations.utimens(path_of(self, path), times, fh_of(fip))

        def rename_fuse_3(self, old, new, flags):
            return self.operations.rename(path_of(self, old), path_of(self, new), flags)

    return Fuse


class _ControlHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            try:
                reply = self.server.operations.control(json.loads(line))  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - the caller sees what went wrong
                log.exception("control request failed")
                reply = {"ok": False, "error": repr(exc)}
            self.wfile.write(json.dumps(reply).encode() + b"\n")
            self.wfile.flush()


class _ControlServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve(mountpoint: str, control_socket: str, debug: bool = False, sync_latency: float = 0.0) -> int:
    """Mount ``mountpoint`` and serve it until it is unmounted (or SIGTERM/SIGINT)."""
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, format="%(asctime)s powerfs %(levelname)s %(message)s")
    import mfusepy

    if mfusepy.fuse_version_major != 3:
        raise SystemExit(f"powerfs needs libfuse 3 (found {mfusepy.fuse_version_major}.{mfusepy.fuse_version_minor}); install {DEBIAN_PACKAGE}")
    volume = Volume()
    operations = PowerFsOperations(volume, threading.Lock(), sync_latency=sync_latency, requester=lambda: mfusepy.fuse_get_context()[2])
    server = _ControlServer(_socket_address(control_socket), _ControlHandler)
    server.operations = operations  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, name="powerfs-control", daemon=True).start()
    log.info("mounting %s (control socket %s, libfuse %d.%d)", mountpoint, control_socket, mfusepy.fuse_version_major, mfusepy.fuse_version_minor)
    _make_fuse_class()(operations, mountpoint, foreground=True, nothreads=True, fsname="powerfs", subtype="powerfs", debug=debug)
    server.shutdown()
    log.info("unmounted %s; counters %s", mountpoint, dict(volume.counters))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.powerfs", description=__doc__.split("\n")[0])
    parser.add_argument("mountpoint")
    parser.add_argument("control_socket", help="@NAME: an abstract Unix socket; otherwise a path")
    parser.add_argument("--debug", action="store_true", help="libfuse's request trace on stderr")
    parser.add_argument("--sync-latency-ms", type=float, default=0.0, help="how long each fsync/fdatasync takes")
    args = parser.parse_args(argv)
    return serve(args.mountpoint, args.control_socket, args.debug, args.sync_latency_ms / 1000.0)


def _socket_address(name: str) -> str:
    return "\0" + name[1:] if name.startswith("@") else name


# -- the test side -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def missing_prerequisites() -> tuple[str, ...]:
    """What this machine lacks to mount a PowerFs (empty when nothing). Asked once per process."""
    missing = []
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse (the fuse kernel module)")
    elif not os.access("/dev/fuse", os.R_OK | os.W_OK):
        missing.append("read/write access to /dev/fuse (run as root)")
    env = {**os.environ, "FUSE_LIBRARY_NAME": "fuse3"}
    probe = subprocess.run(
        [sys.executable, "-c", "import mfusepy; print(mfusepy.fuse_version_major)"], capture_output=True, text=True, env=env
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        missing.append(f"the Python binding {PYPI_PACKAGE} with libfuse 3 ({last}); `pip install {PYPI_PACKAGE}` (the test extra) and `apt-get install {DEBIAN_PACKAGE}`")
    elif probe.stdout.strip() != "3":
        missing.append(f"libfuse 3 (mfusepy found libfuse {probe.stdout.strip()}); `apt-get install {DEBIAN_PACKAGE}`")
    if shutil.which("fusermount3") is None and shutil.which("umount") is None:
        missing.append(f"fusermount3 or umount, to unmount; `apt-get install {DEBIAN_PACKAGE}`")
    return tuple(missing)


def is_mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point now (also when its FUSE process died: then any access
    fails with ENOTCONN, and os.path.ismount says False)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4 and fields[4].encode().decode("unicode_escape") == target:
                return True
    return False


def detach_dead_mounts() -> list[str]:
    """Detach PowerFs mounts whose process is gone (a test run killed hard leaves them: every
    access fails with ENOTCONN). Live ones, of test runs still going, are left alone."""
    detached = []
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for fields in mounts:
        # mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE ...
        if "-" not in fields or fields[fields.index("-") + 1 : fields.index("-") + 2] != ["fuse.powerfs"]:
            continue
        path = fields[4].encode().decode("unicode_escape")
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ENOTCONN:
                unmount(Path(path))
                detached.append(path)
    return detached


def unmount(path: Path) -> None:
    """Detach ``path`` (lazily, so a busy or dead mount goes too); quiet if it is not mounted."""
    if not is_mounted(path):
        return
    tool = shutil.which("fusermount3")
    argv = [tool, "-u", "-z", str(path)] if tool else ["umount", "-l", str(path)]
    subprocess.run(argv, check=False, capture_output=True)


class PowerFs:
    """One PowerFs mount served by its own process (in ``procs``), with its control client.

    A power loss of the agent on it: ``node.proc.pause()`` (or ``arm`` and ``fired``), then
    ``power_loss(dead_pids=[node.proc.pid])``, then ``node.proc.kill()``, then start it again."""

    def __init__(self, procs, mountpoint: Path, *, name: str = "powerfs", sync_latency_ms: float = 0.0) -> None:
        self.procs = procs
        self.sync_latency_ms = sync_latency_ms
        self.mountpoint = Path(mountpoint)
        self.control_socket = f"@powerfs-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.name = name
        self.proc = None
        self.losses: list[dict[str, Any]] = []

    def start(self, timeout: float = 20.0) -> PowerFs:
        from .procs import wait_until

        missing = missing_prerequisites()
        if missing:
            raise AssertionError("cannot mount a power-loss filesystem; this machine lacks:\n  - " + "\n  - ".join(missing))
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        tests_dir = str(Path(__file__).resolve().parent.parent)
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [tests_dir, os.environ.get("PYTHONPATH")])), "FUSE_LIBRARY_NAME": "fuse3"}
        argv = [sys.executable, "-m", "harness.powerfs", str(self.mountpoint), self.control_socket, "--sync-latency-ms", str(self.sync_latency_ms)]
        self.proc = self.procs.start(argv, name=self.name, env=env)
        wait_until(lambda: is_mounted(self.mountpoint) and self._ping(), timeout, message=f"{self.name} mounted on {self.mountpoint}",
                   watch=self.proc, ignore=(OSError,))
        return self

    def _ping(self) -> bool:
        return bool(self.request({"op": "ping"}).get("ok"))

    def request(self, message: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(_socket_address(self.control_socket))
            sock.sendall(json.dumps(message).encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise OSError(errno.ECONNRESET, f"{self.name} closed the control connection")
                reply += chunk
        answer = json.loads(reply)
        if not answer.get("ok"):
            raise AssertionError(f"{self.name}: {message} failed: {answer.get('error')}")
        return answer

    def power_loss(self, dead_pids: Iterable[int] = (), *, keep: float = 0.0, seed: int | None = None) -> dict[str, Any]:
        """Discard everything not fsynced. Every process using the mount must be either dead
        (killed and reaped) or frozen (SIGSTOP) and named in ``dead_pids``, to be killed after:
        requests it still has queued are then refused. ``keep`` > 0: a torn loss instead (each
        unsynced page kept with that probability; see crashdisk.FileData.power_loss)."""
        report = self.request({"op": "power_loss", "dead_pids": list(dead_pids), "keep": keep, "seed": seed})
        self.losses.append(report)
        return report

    def stats(self) -> dict[str, Any]:
        return self.request({"op": "stats"})

    def arm(self, trigger: str, pids: Iterable[int]) -> None:
        """Make this disk freeze ``pids`` (SIGSTOP) at its next ``trigger``: "write" (right after
        a write is applied, before any fsync covers it) or "fsync" (an fsync of a file called and
        not returned). The power cut then falls exactly there: see ``wait_fired``."""
        self.request({"op": "arm", "trigger": trigger, "pids": list(pids)})

    def fired(self, *, disarm: bool = False) -> str | None:
        """The trigger that froze the armed processes, or None (then ``disarm`` cancels it)."""
        return self.request({"op": "fired", "keep_armed": not disarm})["fired"]

    def close(self) -> None:
        """Unmount (lazily: also a mount whose process died) and end the process."""
        unmount(self.mountpoint)
        if self.proc is not None:
            self.proc.terminate(5.0)


if __name__ == "__main__":
    sys.exit(main())
