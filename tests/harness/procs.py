"""Real processes for tests: started in their own process group, logged to a file, killed for sure.

Every process belongs to a ``ProcessRegistry``; closing the registry (fixture teardown) or
interpreter exit ends everything it started, including children that escaped the process group
(sshd's per-connection children call ``setsid``). ``wait_until`` is the one way tests await a
condition: it polls against a deadline and fails naming what was awaited, with log tails.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar, Union

T = TypeVar("T")

LOG_TAIL_LINES = 40
HEADER_PREFIX = "=== "  # the harness's own lines in a process log, around the argv it ran
HEADER_END = "=== output follows"


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (reads only its end; never raises)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def _scan_proc() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, pgid) for every visible process."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses; the fixed fields follow the last ')'.
        fields = stat[stat.rindex(b")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


# Every process the harness starts carries this variable (inherited by its children, and set
# by sshd nodes in their sessions), so daemons that double-fork away from their parent are
# still found. The value starts with the pid of the test process that owns it.
TAG_VAR = "DLCTL_HARNESS_TAG"


def new_tag() -> str:
    return f"{os.getpid()}:{uuid.uuid4().hex}"


def _tag_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return None
    prefix = TAG_VAR.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("ascii", "replace")
    return None


def process_tree(root: int, tag: str | None = None) -> set[int]:
    """``root``, its process group, every descendant and every process carrying ``tag``."""
    table = _scan_proc()
    members = {pid for pid, (_, pgid) in table.items() if pgid == root}
    if root in table:
        members.add(root)
    if tag is not None:
        members |= {pid for pid in table if pid != os.getpid() and _tag_of(pid) == tag}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    frontier = list(members)
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in members:
                members.add(child)
                frontier.append(child)
    return members


def kill_orphans() -> list[int]:
    """SIGKILL tagged processes whose owning test process is gone (a run killed hard).

    Processes of test runs still alive (other sessions on this machine) are left alone.
    """
    killed = []
    for pid in _scan_proc():
        tag = _tag_of(pid)
        if tag is None or pid == os.getpid():
            continue
        owner = tag.split(":", 1)[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            _signal_pids([pid], signal.SIGKILL)
            killed.append(pid)
    return killed


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (killed but not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"


def _signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        if pid <= 1 or pid == os.getpid():  # whatever a scan found, never init or ourselves
            continue
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


# setpriv makes the kernel SIGKILL the child if pytest dies without running teardown or atexit
# (e.g. killed, or pytest-timeout's os._exit). The signal fires when the *thread* that forked
# exits, so it is only used for processes started from the main thread.
_SETPRIV = shutil.which("setpriv")


class ManagedProcess:
    """One real process (and its group/descendants) with its output in ``log_path``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        tag: str | None = None,
    ) -> None:
        self.argv = [str(a) for a in argv]
        self.name = name
        self.log_path = log_path
        self.env = dict(env or {})
        self.cwd = cwd
        self.tag = tag or new_tag()
        self.popen: subprocess.Popen[bytes] | None = None
        self.paused = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ManagedProcess:
        if self.running:
            raise RuntimeError(f"{self.describe()} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.argv
        if _SETPRIV and threading.current_thread() is threading.main_thread():
            argv = [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]
        env = {**os.environ, **self.env, TAG_VAR: self.tag}
        with open(self.log_path, "ab") as log:
            stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
            log.write(
                f"{HEADER_PREFIX}{stamp} start {self.name}: {shlex.join(self.argv)}\n"
                f"{HEADER_END}\n".encode()
            )
            log.flush()
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=self.cwd,
            )
        self.paused = False
        return self

    def restart(self, timeout: float = 5.0) -> ManagedProcess:
        self.terminate(timeout)
        return self.start()

    @property
    def pid(self) -> int:
        if self.popen is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.popen.pid

    @property
    def running(self) -> bool:
        """True while the main process has not exited (a paused process is still running)."""
        return self.popen is not None and self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        if self.popen is None:
            raise RuntimeError(f"{self.name} was never started")
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.describe()} did not exit within {timeout}s\n{self._log_section()}"
            ) from None

    # -- signals -----------------------------------------------------------------------------

    def _tree(self) -> set[int]:
        return process_tree(self.pid, self.tag) if self.popen is not None else set()

    def kill(self) -> None:
        """SIGKILL the whole group and every descendant, then reap the main process."""
        if self.popen is None:
            return
        first = self._tree()
        # Freeze first so nothing forks between the scan and the kill.
        _signal_pids(first, signal.SIGSTOP)
        everything = first | self._tree()
        _signal_pids(everything, signal.SIGKILL)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.popen.wait(10)
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP everything: sockets stay open but nothing answers (a hung node)."""
        if not self.running:
            raise RuntimeError(f"cannot pause {self.describe()}: not running")
        _signal_pids(self._tree(), signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        _signal_pids(self._tree(), signal.SIGCONT)
        self.paused = False

    def terminate(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL whatever of the tree is left."""
        if self.popen is None:
            return None
        tree = self._tree()
        if self.running:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            # A stopped process keeps SIGTERM pending until it is continued.
            _signal_pids(tree, signal.SIGCONT)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        # Descendants that escaped the group were orphaned when the main process exited; only
        # the scan taken before SIGTERM still knows them.
        _signal_pids(tree - {self.pid}, signal.SIGKILL)
        return self.popen.returncode

    # -- reporting ---------------------------------------------------------------------------

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, lines)

    def output(self) -> str:
        """What the process wrote, without the harness's ``=== ... start`` lines.

        Search this, not the raw log, for readiness text: the header lines quote the argv.
        """
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        # Header lines may span several lines when the argv holds newlines (python -c code).
        out, skipping = [], False
        for line in text.splitlines(keepends=True):
            if skipping and line.startswith(HEADER_END):
                skipping = False
                continue
            if line.startswith(HEADER_PREFIX) and " start " in line:
                skipping = True
            if not skipping:
                out.append(line)
        return "".join(out)

    def describe(self) -> str:
        pid = self.popen.pid if self.popen is not None else "-"
        return f"{self.name} (pid {pid}, log {self.log_path})"

    def _log_section(self, lines: int = LOG_TAIL_LINES) -> str:
        return f"--- last {lines} lines of {self.log_path} ---\n{self.tail(lines)}"

    def __repr__(self) -> str:
        if self.paused:
            state = "paused"
        else:
            state = "running" if self.running else f"exit {self.returncode}"
        return f"<ManagedProcess {self.describe()} {state}>"


_REGISTRIES: weakref.WeakSet[ProcessRegistry] = weakref.WeakSet()


class ProcessBacked:
    """Lifecycle controls for a server object that runs as one ``ManagedProcess`` (``self.proc``).

    Subclasses name themselves in ``self.name`` and start ``self.proc`` their own way.
    """

    proc: ManagedProcess | None
    name: str

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.running

    @property
    def paused(self) -> bool:
        return self.proc is not None and self.proc.paused

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate (escalating to SIGKILL): the server shutting down."""
        if self.proc is not None:
            self.proc.terminate(timeout)

    def kill(self) -> None:
        """SIGKILL the process tree: the machine crashing."""
        if self.proc is not None:
            self.proc.kill()

    def pause(self) -> None:
        """SIGSTOP: connections hang instead of failing (a hung node)."""
        assert self.proc is not None, f"{self.name} was never started"
        self.proc.pause()

    def resume(self) -> None:
        assert self.proc is not None, f"{self.name} was never started"
        self.proc.resume()


class ProcessRegistry:
    """Owns processes so that one ``close()`` (fixture teardown) ends all of them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._procs: list[ManagedProcess] = []
        self._lock = threading.Lock()
        _REGISTRIES.add(self)

    def _log_path(self, name: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        path = self.log_dir / f"{safe}.log"
        n = 2
        taken = {p.log_path for p in self._procs}
        while path in taken:
            path = self.log_dir / f"{safe}-{n}.log"
            n += 1
        return path

    def start(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        name: str,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        log_path: Path | None = None,
        tag: str | None = None,
    ) -> ManagedProcess:
        """Start ``argv`` (never through a shell). ``env`` is merged over ``os.environ``."""
        with self._lock:
            proc = ManagedProcess(
                [os.fspath(a) for a in argv],
                name=name,
                log_path=log_path or self._log_path(name),
                env=env,
                cwd=cwd,
                tag=tag,
            )
            self._procs.append(proc)
        return proc.start()

    def __iter__(self) -> Iterator[ManagedProcess]:
        return iter(list(self._procs))

    def close(self, timeout: float = 2.0) -> None:
        """End every process, newest first (dependants usually start after what they use)."""
        errors: list[str] = []
        for proc in reversed(list(self._procs)):
            try:
                proc.terminate(timeout)
            except Exception as e:  # one stubborn process must not leak the others
                errors.append(f"{proc.describe()}: {e!r}")
        if errors:
            raise RuntimeError("could not stop: " + "; ".join(errors))

    def kill_all(self) -> None:
        for proc in list(self._procs):
            try:
                proc.kill()
            except Exception:
                pass


@atexit.register
def _kill_everything_at_exit() -> None:
    for registry in list(_REGISTRIES):
        registry.kill_all()


# -- waiting -----------------------------------------------------------------------------------

LogSource = Union[Path, ManagedProcess]


def _as_list(x: LogSource | Iterable[LogSource] | None) -> list[LogSource]:
    if x is None:
        return []
    if isinstance(x, (Path, ManagedProcess)):
        return [x]
    return list(x)


def _log_sections(sources: Iterable[LogSource]) -> str:
    parts = []
    for src in sources:
        path = src.log_path if isinstance(src, ManagedProcess) else src
        parts.append(f"--- last {LOG_TAIL_LINES} lines of {path} ---\n{tail(path)}")
    return "\n".join(parts)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """This process's umask is ``mask`` inside the block (a process started there inherits it),
    and what it was after."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    *,
    interval: float = 0.05,
    message: str | None = None,
    logs: LogSource | Iterable[LogSource] | None = None,
    watch: ManagedProcess | Iterable[ManagedProcess] | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that.

    Raises AssertionError naming ``message`` (what was awaited), the last exception swallowed
    (only types in ``ignore`` are swallowed) and the tails of ``logs``. Processes in ``watch``
    must stay alive: if one exits, fail at once instead of waiting out the deadline.
    """
    what = message or getattr(predicate, "__qualname__", repr(predicate))
    watched = [w for w in _as_list(watch) if isinstance(w, ManagedProcess)]
    log_sources = _as_list(logs) + [w for w in watched if w not in _as_list(logs)]
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except ignore as e:
            last_error = e
        for proc in watched:
            if not proc.running:
                raise AssertionError(
                    f"{proc.describe()} exited with code {proc.returncode} while waiting for: "
                    f"{what}\n{_log_sections(log_sources)}"
                )
        now = time.monotonic()
        if now >= deadline:
            detail = f"\nlast error: {last_error!r}" if last_error is not None else ""
            logs_text = _log_sections(log_sources)
            raise AssertionError(
                f"timed out after {timeout}s waiting for: {what}{detail}"
                + (f"\n{logs_text}" if logs_text else "")
            )
        time.sleep(min(interval, deadline - now))


# -- ports -------------------------------------------------------------------------------------

_issued_ports: set[tuple[str, int]] = set()
_ports_lock = threading.Lock()
_rng = random.SystemRandom()  # tests (hypothesis) reseed the global `random`


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_range(low: int, high: int) -> tuple[int, int]:
    """This test process's share of ``low..high``: under pytest-xdist each worker picks from a
    slice of its own, so two workers never hand out the same port (free when each checked it,
    taken by the first to bind: CI saw an agent fail with EADDRINUSE this way)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return low, high
    index, share = int(worker[2:]), (high - low + 1) // int(count)
    return low + index * share, low + (index + 1) * share - 1


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that is free now and never handed out before in this process, nor by
    another worker of the same test run.

    Ports come from below the kernel's ephemeral range so that outgoing connections (which
    take ephemeral source ports) cannot grab a port between this call and the server's bind.
    """
    low, high = _worker_range(20000, min(32000, _ephemeral_low() - 1))
    with _ports_lock:
        for _ in range(500):
            port = _rng.randint(low, high)
            if (host, port) in _issued_ports:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _issued_ports.add((host, port))
            return port
    raise RuntimeError(f"no free TCP port found on {host} in {low}-{high}")


def tcp_connectable(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
