"""``LocalTransport``: the ``Transport`` interface for nodes on this machine (the sandbox).

Same semantics as ``SshTransport`` so operations cannot tell the two apart: argv without a
shell, secrets on stdin, exit status 127/126 when the program is missing/not executable (what
a remote shell reports), the command's whole process group killed on timeout.
"""

from __future__ import annotations

import logging
import os
import secrets as _random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from os import PathLike
from pathlib import Path

from ..errors import DlctlError
from .transport import (
    CommandResult,
    CommandTimeout,
    Transport,
    check_remote_path,
    describe,
)

log = logging.getLogger(__name__)

# After SIGTERM on timeout, how long a command may take to clean up before SIGKILL.
KILL_GRACE = 1.0
_COPY_CHUNK = 1 << 20


class LocalTransport(Transport):
    """Runs commands as child processes of this one; ``host`` only names it in results."""

    def __init__(self, host: str = "localhost", *, base_env: Mapping[str, str] | None = None, kill_grace: float = KILL_GRACE) -> None:
        self.host = host
        # Children inherit our environment (PATH, HOME, ...) the way a login shell would give
        # a remote command one; ``base_env`` replaces it for hermetic callers.
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._kill_grace = kill_grace
        self._closed = False
        self._children: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()

    def execute(self, words: tuple[str, ...], *, stdin: bytes | None, timeout: float, env: dict[str, str]) -> CommandResult:
        if self._closed:
            raise DlctlError(f"{self.host}: transport is closed", hint="create a new LocalTransport")
        log.debug("%s: running %s (stdin: %d bytes)", self.host, describe(words), len(stdin or b""))
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                list(words),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**self._base_env, **env},
                # Its own process group, so a timeout kills what it started too.
                start_new_session=True,
                close_fds=True,
            )
        except FileNotFoundError:
            return CommandResult(self.host, words, 127, b"", f"{words[0]}: command not found\n".encode(), time.monotonic() - start)
        except PermissionError:
            return CommandResult(self.host, words, 126, b"", f"{words[0]}: permission denied\n".encode(), time.monotonic() - start)
        with self._lock:
            self._children.add(proc)
        try:
            try:
                out, err = proc.communicate(input=stdin or b"", timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill(proc)
                raise CommandTimeout(
                    f"{self.host}: `{describe(words)}` did not finish within {timeout:g}s; it was killed",
                    hint="raise the timeout if the command is legitimately slow, or look at what it waits for",
                    details={"host": self.host, "argv": list(words), "timeout": timeout},
                ) from None
        finally:
            with self._lock:
                self._children.discard(proc)
        return CommandResult(self.host, words, proc.returncode, out, err, time.monotonic() - start)

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM the command's process group, SIGKILL it after the grace period, reap it."""
        for sig, wait in ((signal.SIGTERM, self._kill_grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # Collect what is left and close our pipe ends. A grandchild that left the process group
        # may still hold them open; do not wait for it.
        try:
            proc.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()

    def put(self, local_path: str | PathLike[str], remote_path: str, mode: int = 0o644, *, timeout: float = 600.0) -> None:
        # ``timeout`` is accepted for the interface; a local copy has no network to hang on.
        dest = Path(check_remote_path(self.host, remote_path))
        src = Path(local_path)
        if not dest.parent.is_dir():
            raise DlctlError(
                f"{self.host}: cannot upload to {dest}: directory {dest.parent} does not exist",
                hint=f"create {dest.parent} first (e.g. as part of agent install)",
            )
        tmp = dest.parent / f".{dest.name}.dlctl-tmp-{_random.token_hex(6)}"
        try:
            with open(src, "rb") as fin:
                # Created with the final mode (umask cannot widen it, fchmod fixes narrowing),
                # so a secret is never readable by others, not even while being written.
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode & 0o7777)
                try:
                    os.fchmod(fd, mode & 0o7777)
                    with os.fdopen(fd, "wb", closefd=False) as fout:
                        shutil.copyfileobj(fin, fout, _COPY_CHUNK)
                        fout.flush()
                        os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(tmp, dest)
        except FileNotFoundError as exc:
            tmp.unlink(missing_ok=True)
            raise DlctlError(f"{self.host}: cannot upload {src}: {exc.strerror}: {exc.filename}", hint="check the local file name") from None
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DlctlError(f"{self.host}: cannot upload {src} to {dest}: {exc.strerror or exc}") from None
        log.debug("%s: uploaded %s to %s (mode %04o)", self.host, src, dest, mode)

    def close(self) -> None:
        """Kill commands still running from this transport (another thread's run was abandoned)."""
        self._closed = True
        with self._lock:
            children = list(self._children)
        for proc in children:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __repr__(self) -> str:
        return f"<LocalTransport {self.host}>"
