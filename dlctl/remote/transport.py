"""The one interface for running things on a node: ``Transport`` (SSH for a fleet, local for the sandbox).

Contract shared by every implementation:

* A remote command is an **argv list**. Over SSH it becomes one command line by
  ``shlex.join`` (the remote login shell parses it back into exactly the same words);
  nothing ever builds a shell string out of user data.
* **Secrets travel on stdin** only. argv and ``env`` are visible to every user of the node
  (``/proc/<pid>/cmdline``, ``/proc/<pid>/environ`` for the same uid, ``ps``) and end up in
  logs; stdin is not logged (only its length).
* A non-zero exit status is a result, not an exception (``CommandResult.check()`` turns it
  into one); not being able to run the command at all — host down, host key refused,
  timeout — raises a ``DlctlError`` that names the host and says what to do.
"""

from __future__ import annotations

import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from types import TracebackType
from typing import Any

from ..errors import DlctlError, TimeoutExpired

# What a remote shell accepts as a variable name; anything else could smuggle syntax.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Enough of a failing command's stderr to say why, without flooding the terminal.
_STDERR_TAIL = 2000


class CommandFailed(DlctlError):
    """A command ran and exited non-zero (raised by ``CommandResult.check()``)."""


class CommandTimeout(TimeoutExpired):
    """A command (or the connection it needed) did not finish within its timeout; it was killed."""


class HostUnreachable(DlctlError):
    """The node could not be reached at all (refused, unresolvable, no route, connection lost)."""


class AuthenticationFailed(DlctlError):
    """The node refused every key offered for the login user."""


@dataclass(frozen=True)
class CommandResult:
    """What one command did on one host. ``stdout``/``stderr`` are raw bytes."""

    host: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (undecodable bytes replaced, never an exception)."""
        return self.stdout.decode("utf-8", "replace")

    def check(self) -> CommandResult:
        """Return self if the command succeeded, else raise ``CommandFailed`` with stderr's tail."""
        if self.ok:
            return self
        tail = self.stderr.decode("utf-8", "replace").strip()[-_STDERR_TAIL:]
        raise CommandFailed(
            f"{self.host}: `{shlex.join(self.argv)}` exited with status {self.exit_code}"
            + (f": {tail}" if tail else " (no output on stderr)"),
            hint=f"run the command on {self.host} by hand to see the whole output",
            details=self.to_dict(),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "argv": list(self.argv),
            "exit_code": self.exit_code,
            "stdout": self.stdout.decode("utf-8", "replace"),
            "stderr": self.stderr.decode("utf-8", "replace"),
            "duration": round(self.duration, 6),
        }


class Transport(ABC):
    """Runs argv lists and uploads files on one host. Reusable for many calls; ``close()`` ends it.

    Implementations are safe to call from several threads at once (fan-out runs several
    commands on one host concurrently when asked to).
    """

    #: The name used in results and error messages (inventory node id or ssh host alias).
    host: str

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run ``argv`` and wait for it, at most ``timeout`` seconds in all (connecting included).

        ``stdin`` is written to the command's standard input, then closed (no stdin = an
        immediate EOF, so a command that reads stdin never hangs waiting for a terminal).
        ``env`` adds variables; it is **not** for secrets (see the module doc). On timeout the
        command is killed and ``CommandTimeout`` is raised. The arguments are checked here, the
        same for every transport, before ``execute`` runs them.
        """
        return self.execute(check_argv(self.host, argv), stdin=stdin, timeout=check_timeout(self.host, timeout), env=check_env(self.host, env))

    @abstractmethod
    def execute(self, words: tuple[str, ...], *, stdin: bytes | None, timeout: float, env: dict[str, str]) -> CommandResult:
        """``run`` with its arguments checked: the argv's words, the variables to add."""

    @abstractmethod
    def put(self, local_path: str | PathLike[str], remote_path: str, mode: int = 0o644, *, timeout: float = 600.0) -> None:
        """Upload a file atomically: write a temporary name next to ``remote_path`` with
        ``mode`` already set, then rename over it. Readers see the old file or the new one,
        never a partial one, and a secret is never readable with a wider mode, even briefly.
        The parent directory must exist. ``timeout`` bounds the whole upload.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the connection. Idempotent."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def check_argv(host: str, argv: Sequence[str]) -> tuple[str, ...]:
    """Validate an argv list and return it as a tuple; raise ``DlctlError`` naming what is wrong.

    A bare string is refused on purpose: ``run("rm -rf x")`` would otherwise be split into
    characters or, worse, tempt someone to hand it to a shell.
    """
    if isinstance(argv, (str, bytes)):
        raise DlctlError(
            f"{host}: a command must be an argv list, got the string {argv!r}",
            hint="pass a list such as ['systemctl', 'status', 'dlagent'], never a shell string",
        )
    words = tuple(argv)
    if not words:
        raise DlctlError(f"{host}: empty command", hint="pass at least the program to run")
    for word in words:
        if not isinstance(word, str):
            raise DlctlError(f"{host}: argv items must be strings, got {type(word).__name__} {word!r}")
        # The kernel cannot pass NUL inside an argument; a NUL would silently cut it short.
        if "\x00" in word:
            raise DlctlError(f"{host}: argv item {word!r} contains a NUL byte, which no program can receive")
    return words


def check_env(host: str, env: Mapping[str, str] | None) -> dict[str, str]:
    """Validate environment additions (names are shell-safe; values have no NUL)."""
    out: dict[str, str] = {}
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise DlctlError(f"{host}: invalid environment variable name {name!r}", hint="use letters, digits and '_', not starting with a digit")
        if not isinstance(value, str) or "\x00" in value:
            raise DlctlError(f"{host}: environment variable {name} must be a string without NUL bytes")
        out[name] = value
    return out


def check_remote_path(host: str, path: str) -> str:
    """A remote path for uploads: absolute, no NUL, not a directory name."""
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path or path.endswith("/"):
        raise DlctlError(
            f"{host}: remote path {path!r} must be an absolute file path",
            hint="give the full destination file name, e.g. /var/lib/dlagent/agent.toml",
        )
    return path


def check_timeout(host: str, timeout: float) -> float:
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise DlctlError(f"{host}: timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def describe(argv: Sequence[str]) -> str:
    """argv for messages and logs. Safe to show: by contract argv never holds a secret."""
    return shlex.join(argv)
