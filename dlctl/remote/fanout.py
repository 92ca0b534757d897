"""Run one operation over many hosts: bounded concurrency, a deadline per host, a result per host.

Strategies, after cstar:
  * all at once, at most ``max_concurrency`` hosts in flight;
  * ``region_serial=True``: one region at a time — every host of region A has finished (or
    been given up on) before the first host of region B starts; regions go in the order they
    first appear in ``targets``;
  * ``stop_on_failure=True``: after the first failure or timeout nothing new starts (what is
    already running finishes); the hosts never started are reported as ``skipped``.

Those rules are one pure function, ``next_to_start(policy, started, in_flight, failed)`` over
immutable state (unit-tested alone); threads, deadlines and results are the mechanics around it.

Each host's operation gets a ``Deadline`` (``timeout`` seconds from its own start) and should
pass ``deadline.remaining()`` to the transport calls it makes. If it still runs at the deadline,
fan-out records the host as timed out right then (the operation's transport is meanwhile killing
the remote command); ``cancel_after`` seconds later it calls ``cancel(target)`` (e.g. close that
host's connection); it keeps the host's concurrency slot until the operation really returns or
``straggler_grace`` seconds after the deadline. Keeping the slot is deliberate: with
``max_concurrency=1`` for a rolling restart, a host that is "timed out" but still restarting
must not let the next host go down at the same time.

Nothing here prints. ``progress`` (optional) receives a ``FanoutEvent`` as each host starts and
finishes, always on the calling thread, so it may drive a rich progress bar directly.
``outcome`` turns the results into the command's outcome: data, ``PartialFailure`` (exit 3) or
``DlctlError`` (exit 1), both carrying the per-host detail.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

from ..errors import DlctlError, ExitCode, PartialFailure, RefusedError, TimeoutExpired
from .transport import CommandResult, Transport

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_MAX_CONCURRENCY = 16
# After a host's deadline: when to call cancel() (time for its transport to kill the remote
# command first), and when to stop waiting for an operation that ignores both.
DEFAULT_CANCEL_AFTER = 3.0
DEFAULT_STRAGGLER_GRACE = 10.0


class HostStatus(str, Enum):
    OK = "ok"
    FAILED = "failed"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"  # never started (stop_on_failure stopped the run first)


@dataclass(frozen=True)
class Deadline:
    """When one host's operation must be done, on the ``time.monotonic()`` clock."""

    at: float

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at


@dataclass(frozen=True)
class HostResult(Generic[R]):
    """The outcome for one host; ``error``/``hint`` say what went wrong and what to do."""

    host: str
    region: str | None
    status: HostStatus
    value: R | None = None
    error: str | None = None
    error_type: str | None = None
    hint: str | None = None
    duration: float = 0.0
    # Refused for safety (an unknown or changed host key...): when every host was refused, the
    # whole command is refused (exit 4) rather than merely failed.
    refused: bool = False

    @property
    def ok(self) -> bool:
        return self.status is HostStatus.OK

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host, "region": self.region, "status": self.status.value, "duration": round(self.duration, 3)}
        if self.value is not None:
            to_dict = getattr(self.value, "to_dict", None)
            out["value"] = to_dict() if callable(to_dict) else self.value
        for key in ("error", "error_type", "hint"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True)
class FanoutEvent:
    """A progress report: ``kind`` is ``"started"`` or ``"finished"`` (then ``result`` is set)."""

    kind: str
    host: str
    region: str | None
    done: int
    total: int
    result: HostResult[Any] | None = None


def _default_name(target: object) -> str:
    for attr in ("id", "name", "host"):
        value = getattr(target, attr, None)
        if isinstance(value, str) and value:
            return value
    return str(target)


def _default_region(target: object) -> str | None:
    value = getattr(target, "region", None)
    return value if isinstance(value, str) else None


# -- the policy: which hosts may start now (pure) ---------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """The scheduling rules of one fan-out, over target indexes: ``groups`` run one after the
    other (region-serial: one group per region, in order of first appearance; otherwise one
    group of everything), at most ``max_concurrency`` hosts in flight, and nothing new after
    a failure when ``stop_on_failure``."""

    groups: tuple[tuple[int, ...], ...]
    max_concurrency: int
    stop_on_failure: bool

    @classmethod
    def of(cls, regions: Sequence[str | None], *, max_concurrency: int, region_serial: bool, stop_on_failure: bool) -> Policy:
        if region_serial:
            by_region: dict[str | None, list[int]] = {}
            for i, r in enumerate(regions):
                by_region.setdefault(r, []).append(i)
            groups = tuple(tuple(g) for g in by_region.values())
        else:
            groups = (tuple(range(len(regions))),)
        return cls(groups, max_concurrency, stop_on_failure)


def next_to_start(policy: Policy, *, started: frozenset[int], in_flight: frozenset[int], failed: bool) -> list[int]:
    """The targets to start now, in order: from the first group with a target not started yet,
    once no target of an earlier group is still in flight (a timed-out host keeps its slot
    until it really returns), as many as free slots allow; none after a failure when the policy
    stops on one."""
    if failed and policy.stop_on_failure:
        return []
    for number, group in enumerate(policy.groups):
        waiting = [i for i in group if i not in started]
        if not waiting:
            continue
        earlier = {i for g in policy.groups[:number] for i in g}
        if in_flight & earlier:
            return []
        return waiting[: max(0, policy.max_concurrency - len(in_flight))]
    return []


# -- the mechanics: threads, deadlines, results ------------------------------------------------------


class _Run:
    """A host in flight: its thread, deadline and whether its result was already recorded."""

    __slots__ = ("index", "thread", "started", "deadline", "recorded", "cancelled")

    def __init__(self, index: int, thread: threading.Thread, started: float, deadline: float) -> None:
        self.index = index
        self.thread = thread
        self.started = started
        self.deadline = deadline
        self.recorded = False
        self.cancelled = False


def fan_out(
    targets: Sequence[T],
    operation: Callable[[T, Deadline], R],
    *,
    timeout: float,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    region_serial: bool = False,
    stop_on_failure: bool = False,
    progress: Callable[[FanoutEvent], None] | None = None,
    cancel: Callable[[T], None] | None = None,
    name: Callable[[T], str] = _default_name,
    region: Callable[[T], str | None] = _default_region,
    cancel_after: float = DEFAULT_CANCEL_AFTER,
    straggler_grace: float = DEFAULT_STRAGGLER_GRACE,
) -> list[HostResult[R]]:
    """Run ``operation(target, deadline)`` for every target; return one result per target, in
    ``targets`` order. Exceptions become per-host results (``TimeoutExpired`` → timeout, any
    other → failed); only interrupting the caller (Ctrl-C) escapes, after cancelling what runs.
    """
    if not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise DlctlError(f"max concurrency must be a whole number >= 1, got {max_concurrency!r}")
    if not timeout > 0:
        raise DlctlError(f"per-host timeout must be positive, got {timeout!r}")
    names = [name(t) for t in targets]
    regions = [region(t) for t in targets]
    duplicates = sorted(n for n, count in Counter(names).items() if count > 1)
    if duplicates:
        # Results are keyed by host; two targets with one name would hide a failure.
        raise DlctlError(f"the same host appears more than once: {', '.join(duplicates)}", hint="pass each node once")

    total = len(targets)
    results: list[HostResult[R] | None] = [None] * total
    cond = threading.Condition()
    finished: deque[tuple[int, HostResult[R]]] = deque()
    running: dict[int, _Run] = {}
    done = 0
    stopped = False

    def emit(event: FanoutEvent) -> None:
        if progress is not None:
            progress(event)

    def work(index: int, deadline: float) -> None:
        start = time.monotonic()
        try:
            value = operation(targets[index], Deadline(deadline))
            res: HostResult[R] = HostResult(names[index], regions[index], HostStatus.OK, value=value, duration=time.monotonic() - start)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes this host's result
            res = _failure(names[index], regions[index], exc, time.monotonic() - start)
        with cond:
            finished.append((index, res))
            cond.notify()

    def record(index: int, res: HostResult[R]) -> None:
        nonlocal done, stopped
        results[index] = res
        done += 1
        if stop_on_failure and not res.ok and not stopped:
            stopped = True
            log.info("stopping after %s %s; hosts not started yet are skipped", res.host, res.status.value)
        emit(FanoutEvent("finished", res.host, res.region, done, total, res))

    def start(index: int) -> None:
        now = time.monotonic()
        thread = threading.Thread(target=work, args=(index, now + timeout), name=f"fanout-{names[index]}", daemon=True)
        running[index] = _Run(index, thread, now, now + timeout)
        emit(FanoutEvent("started", names[index], regions[index], done, total))
        thread.start()

    policy = Policy.of(regions, max_concurrency=max_concurrency, region_serial=region_serial, stop_on_failure=stop_on_failure)
    started: set[int] = set()

    try:
        while True:
            for index in next_to_start(policy, started=frozenset(started), in_flight=frozenset(running), failed=stopped):
                started.add(index)
                start(index)
            if not running:
                break  # nothing in flight and nothing may start: every host done, or stopped
            with cond:
                if not finished:
                    cond.wait(_next_wake(running.values(), cancel_after, straggler_grace))
                arrived = list(finished)
                finished.clear()
            for index, res in arrived:
                run = running.pop(index, None)
                if run is None:
                    log.info("%s finished after fan-out stopped waiting for it", res.host)
                elif run.recorded:
                    log.info("%s finished %.1fs after it was reported as timed out", res.host, res.duration - timeout)
                else:
                    record(index, res)
            now = time.monotonic()
            for run in list(running.values()):
                if not run.recorded and now >= run.deadline:
                    run.recorded = True
                    record(run.index, _timed_out(names[run.index], regions[run.index], timeout))
                if run.recorded and not run.cancelled and now >= run.deadline + min(cancel_after, straggler_grace):
                    run.cancelled = True
                    _cancel(cancel, targets[run.index], names[run.index])
                if run.recorded and now >= run.deadline + straggler_grace:
                    # It ignores its deadline and cancel(); stop waiting so one stuck host
                    # cannot hang the command. Its thread is a daemon and dies with us.
                    log.warning("%s: operation still running %.0fs after its deadline; no longer waiting for it", names[run.index], straggler_grace)
                    del running[run.index]
    except BaseException:
        # Ctrl-C (or a failing progress callback): stop every host still in flight, then let
        # the caller report the interruption.
        for run in running.values():
            _cancel(cancel, targets[run.index], names[run.index])
        raise

    out: list[HostResult[R]] = []
    for i in range(total):
        res = results[i]
        if res is None:
            res = HostResult(names[i], regions[i], HostStatus.SKIPPED, error="not started: an earlier host failed and stop-on-failure is on", hint="fix that host and re-run")
        out.append(res)
    return out


def _next_wake(runs: Any, cancel_after: float, grace: float) -> float:
    now = time.monotonic()
    wakes = [r.deadline if not r.recorded else r.deadline + (grace if r.cancelled else min(cancel_after, grace)) for r in runs]
    return max(0.0, min(wakes) - now) + 0.001 if wakes else 0.0


def _cancel(cancel: Callable[[T], None] | None, target: T, host: str) -> None:
    if cancel is None:
        return
    try:
        cancel(target)
    except Exception as exc:  # cancelling is best effort; the result is already recorded
        log.debug("%s: cancel failed: %r", host, exc)


def _timed_out(host: str, region: str | None, timeout: float) -> HostResult[Any]:
    return HostResult(
        host,
        region,
        HostStatus.TIMEOUT,
        error=f"{host}: did not finish within {timeout:g}s",
        error_type="TimeoutExpired",
        hint=f"check {host} (is it hung or overloaded?) or raise the per-host timeout",
        duration=timeout,
    )


def _failure(host: str, region: str | None, exc: BaseException, duration: float) -> HostResult[Any]:
    status = HostStatus.TIMEOUT if isinstance(exc, TimeoutExpired) else HostStatus.FAILED
    refused = isinstance(exc, DlctlError) and exc.exit_code == ExitCode.REFUSED
    if isinstance(exc, DlctlError):
        message, hint = exc.message, exc.hint
    else:
        # Not one of ours: a bug or an unexpected library error. Keep the traceback in the log.
        log.warning("%s: unexpected error", host, exc_info=exc)
        message, hint = f"{host}: unexpected {type(exc).__name__}: {exc}", "this looks like a bug in dlctl; the log has the traceback"
    return HostResult(host, region, status, error=message, error_type=type(exc).__name__, hint=hint, duration=duration, refused=refused)


def outcome(results: Sequence[HostResult[R]], *, action: str) -> dict[str, R]:
    """All ok → ``{host: value}``; some not ok → ``PartialFailure`` (exit 3); none ok →
    ``DlctlError`` (exit 1). Errors name every failed host with its reason, and ``details``
    holds every host's result (``to_dict``) for ``-o json``."""
    bad = [r for r in results if not r.ok]
    if not bad:
        return {r.host: r.value for r in results}  # type: ignore[misc]
    good = len(results) - len(bad)
    listing = "; ".join(_short(r) for r in bad)
    details = [r.to_dict() for r in results]
    hints = {r.hint for r in bad if r.hint}
    hint = "; ".join(sorted(hints)) if len(hints) <= 3 else "see each host's hint in the details (-o json)"
    if good:
        raise PartialFailure(f"{action}: {len(bad)} of {len(results)} hosts did not succeed ({good} ok): {listing}", hint=hint, details=details)
    if all(r.refused for r in bad):
        raise RefusedError(f"{action}: refused on all {len(results)} hosts: {listing}", hint=hint, details=details)
    raise DlctlError(f"{action}: failed on all {len(results)} hosts: {listing}", hint=hint, details=details)


def _short(r: HostResult[Any]) -> str:
    reason = r.error or r.status.value
    # Messages from transports already start with the host name.
    if reason.startswith(f"{r.host}: "):
        reason = reason[len(r.host) + 2 :]
    return f"{r.host} [{r.status.value}] {reason}"


def run_on_hosts(
    targets: Sequence[T],
    transport_for: Callable[[T], Transport],
    argv: Sequence[str],
    *,
    timeout: float,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    close_on_timeout: bool = True,
    **strategy: Any,
) -> list[HostResult[CommandResult]]:
    """``fan_out`` of one command. ``check=True``: a non-zero exit status fails the host.
    ``strategy`` takes ``fan_out``'s keywords (max_concurrency, region_serial, ...).
    ``close_on_timeout``: close a host's transport when fan-out gives up on it, which ends a
    hung connection (the next use reconnects)."""

    def op(target: T, deadline: Deadline) -> CommandResult:
        result = transport_for(target).run(argv, stdin=stdin, timeout=max(0.001, deadline.remaining()), env=env)
        return result.check() if check else result

    def cancel(target: T) -> None:
        transport_for(target).close()

    return fan_out(targets, op, timeout=timeout, cancel=cancel if close_on_timeout else None, **strategy)
