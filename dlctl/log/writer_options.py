"""The log writer's options and errors: what every part of the writer (``dlctl.log.writer`` and
the rooms it is built from) shares. ``dlctl.log.writer`` re-exports them; import them from there."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import DlctlError, RefusedError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriterOptions:
    batch_bytes: int = 256 * 1024  # cut an entry once its records reach this size
    batch_delay: float = 0.002  # ... or this long after its first record
    flush_when_idle: bool = True  # cut at once when nothing is in flight (low latency when idle)
    lac_delay: float = 0.002  # idle this long after an ack: write a control entry to publish LAC
    max_pending_bytes: int = 64 * 1024 * 1024  # append() waits while more are unacknowledged
    ensemble_retry: float = 1.0  # degraded segment: how often to look for a fresh ensemble
    stall_timeout: float = 30.0  # how long entries may wait for agents before the writer fails
    ownership_wait: float = 0.0  # open(): how long to wait for a current owner to go away
    recovery_timeout: float = 30.0  # open(): bound on recovering the previous owner's segment
    roll_bytes: int | None = None  # override the log's config
    roll_seconds: float | None = None  # override the log's config
    # A replica that has not answered the add of the oldest unacknowledged entry this long (at
    # least; longer when adds are slow: SILENT_FACTOR times their smoothed latency) is taken
    # for failed: a silent agent (packets dropped, no reset) costs this, not a request timeout.
    # None: wait for the request timeout.
    silent_after: float | None = 1.0
    # The wall clock entries' append times come from (seconds since the epoch). A host whose
    # clock is behind the previous owner's never appends earlier times: the log's last time is
    # a floor. (Replaceable to play such a host.)
    clock: Callable[[], float] = time.time
    # open(): when the previous owner left a segment in progress, open our own segment while
    # that one is still being recovered, above the bounds it reserved (dlctl.log.takeover), so
    # appends resume before its recovery ends. False: recover first, then append (txids then
    # continue without a gap). Either way readers read our segment only after that one.
    fast_takeover: bool = True

    def __post_init__(self) -> None:
        if self.batch_bytes < 1 or self.batch_delay < 0 or self.lac_delay < 0:
            raise ValueError("batch_bytes must be >= 1 and delays >= 0")


class WriterError(DlctlError):
    """The writer stopped: appends pending at that moment and every later one fail with it."""


class WriterDeposedError(WriterError):
    """Another writer took the log over (fenced our segment, or our ownership was lost)."""


class WriterClosedError(WriterError):
    """The writer was closed; open a new one to append."""


class TxidOrderError(RefusedError):
    """An application-given txid does not increase; nothing was appended."""


def deposed(owner_id: str, name: str, why: str) -> WriterDeposedError:
    return WriterDeposedError(
        f"writer {owner_id} of log {name!r} was deposed: {why}",
        hint="records not yet acknowledged may or may not be in the log; reopen the log to continue",
    )


def stopped_by(name: str, exc: Exception, what: str | None = None) -> WriterError:
    """The error that stops the writer of log ``name`` when ``exc`` ended ``what`` it was doing
    (a bug included: it must fail the appends, not hang them)."""
    if isinstance(exc, WriterError):
        return exc
    doing = f"{what}: " if what else ""
    if isinstance(exc, DlctlError):
        return WriterError(f"writer of log {name!r} stopped: {doing}{exc.message}", hint=exc.hint)
    log.error("writer of log %r failed%s", name, f": {what}" if what else "", exc_info=exc)
    return WriterError(f"writer of log {name!r} failed unexpectedly: {doing}{exc!r}")


__all__ = ["TxidOrderError", "WriterClosedError", "WriterDeposedError", "WriterError", "WriterOptions", "deposed", "stopped_by"]
