"""One error hierarchy for everything the operator can see, mapped to documented exit codes.

Library code raises these; the CLI catches ``DlctlError`` once, prints the message (and the
hint, which says what to do next) on stderr and exits with ``exit_code``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """Exit codes of every ``dlctl`` and ``dlagent`` command (documented in README and man)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    PARTIAL = 3  # some nodes or steps failed; details are in the output
    REFUSED = 4  # refused for safety (would lose data, break an invariant, or was not confirmed)
    INTERRUPTED = 130
    OUTPUT_CLOSED = 141  # the reader of stdout went away (`| head`): 128 + SIGPIPE, as a tool killed by it


class DlctlError(Exception):
    """Base of every user-facing failure: what happened, to what, and what to do next."""

    exit_code: ExitCode = ExitCode.FAILED
    default_hint: str | None = None  # what to do, for a kind of failure that always calls for the same

    def __init__(self, message: str, *, hint: str | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint
        # Structured detail (per-host results, the conflicting version, ...) for -o json.
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "error": type(self).__name__,
            "message": self.message,
            "exit_code": int(self.exit_code),
        }
        if self.hint:
            out["hint"] = self.hint
        if self.details is not None:
            out["details"] = self.details
        return out


class UsageError(DlctlError):
    """The command line or its arguments are wrong."""

    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    """A configuration or inventory file is missing or invalid; the message names file and key."""


class CorruptMetadata(DlctlError, ValueError):
    """A metadata record (a znode) that does not hold what dlctl writes there; the message names
    its path and what is wrong. Still the ``ValueError`` of malformed data to the decoders' callers."""

    default_hint = "dlctl did not write this (a hand edit, another tool, or a newer dlctl): compare it with a healthy record of its kind (zkCli.sh get PATH) and repair it"


class NotFoundError(DlctlError):
    """A named thing (cluster, log, stream, node, segment) does not exist."""


class ConflictError(DlctlError):
    """A compare-and-set lost a race: the metadata changed concurrently. Nothing was overwritten."""


class OutcomeUnknownError(DlctlError):
    """A write's answer was lost with the connection: it may or may not have taken effect."""


class RefusedError(DlctlError):
    """The operation would break a safety invariant or was not confirmed; nothing was changed."""

    exit_code = ExitCode.REFUSED


class PartialFailure(DlctlError):
    """Some hosts or steps failed and others succeeded; ``details`` holds the per-item results."""

    exit_code = ExitCode.PARTIAL


class TimeoutExpired(DlctlError):
    """A bounded wait ran out before its condition held."""


class Interrupted(DlctlError):
    """The operator interrupted the command (Ctrl-C)."""

    exit_code = ExitCode.INTERRUPTED
