"""Fan-out orchestration with scripted operations and a scripted transport (pure logic, no I/O).

Real SSH behaviour (dead and hung nodes over real sshd) is in
tests/integration/test_remote_ssh.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from os import PathLike
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlctl.errors import DlctlError, ExitCode, PartialFailure, RefusedError
from dlctl.remote.fanout import Deadline, FanoutEvent, HostResult, HostStatus, Policy, fan_out, next_to_start, outcome, run_on_hosts
from dlctl.remote.transport import CommandResult, CommandTimeout, HostUnreachable, Transport
from harness.procs import wait_until


@dataclass(frozen=True)
class Host:
    id: str
    region: str


def hosts(spec: str) -> list[Host]:
    """'r1:a,b r2:c' -> [Host(a, r1), Host(b, r1), Host(c, r2)]."""
    out = []
    for part in spec.split():
        region, names = part.split(":")
        out += [Host(n, region) for n in names.split(",")]
    return out


class Gauge:
    """Counts operations in flight and remembers the most ever seen at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.started: list[str] = []

    def enter(self, host: str) -> None:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.started.append(host)

    def leave(self) -> None:
        with self.lock:
            self.active -= 1


def in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # surfaced by the test through box["error"]
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


# -- concurrency ---------------------------------------------------------------------------------


def test_concurrency_bound_is_reached_but_never_exceeded_while_hosts_finish_one_by_one() -> None:
    targets = hosts("r1:a,b,c,d,e,f,g")
    gauge = Gauge()
    gates = {t.id: threading.Event() for t in targets}

    def op(target: Host, deadline: Deadline) -> str:
        gauge.enter(target.id)
        try:
            assert gates[target.id].wait(10)
            return target.id
        finally:
            gauge.leave()

    thread, box = in_background(lambda: fan_out(targets, op, timeout=30, max_concurrency=3))
    wait_until(lambda: gauge.active == 3, message="three hosts in flight")
    released = 0
    while released < len(targets):
        # Release the oldest running host; fan-out must refill exactly up to the bound.
        with gauge.lock:
            first_running = next(h for h in gauge.started if not gates[h].is_set())
        gates[first_running].set()
        released += 1
        expected = min(3, len(targets) - released)
        wait_until(lambda: gauge.active == expected and len(gauge.started) == min(len(targets), released + 3), message=f"{expected} in flight after {released} released")
    thread.join(10)
    assert gauge.peak == 3
    assert [r.status for r in box["value"]] == [HostStatus.OK] * len(targets)


def test_max_concurrency_one_runs_hosts_strictly_in_order() -> None:
    targets = hosts("r1:a,b r2:c,d")
    gauge = Gauge()

    def op(target: Host, deadline: Deadline) -> None:
        gauge.enter(target.id)
        gauge.leave()

    fan_out(targets, op, timeout=5, max_concurrency=1)
    assert gauge.peak == 1
    assert gauge.started == ["a", "b", "c", "d"]


# -- region strategies ---------------------------------------------------------------------------


def test_region_serial_finishes_every_host_of_a_region_before_the_next_region_starts() -> None:
    # Interleaved on purpose: order of first appearance is r2, r1, r3.
    targets = [Host("b1", "r2"), Host("a1", "r1"), Host("b2", "r2"), Host("c1", "r3"), Host("a2", "r1"), Host("b3", "r2")]
    log: list[tuple[str, str]] = []
    lock = threading.Lock()
    # Every host of a region waits for all the others of its region: proves that a region's
    # hosts do run at the same time (concurrency 8 > region size), only regions are serial.
    barriers = {r: threading.Barrier(sum(t.region == r for t in targets)) for r in ("r1", "r2", "r3")}

    def op(target: Host, deadline: Deadline) -> None:
        with lock:
            log.append(("start", target.region))
        barriers[target.region].wait(5)
        with lock:
            log.append(("end", target.region))

    results = fan_out(targets, op, timeout=5, max_concurrency=8, region_serial=True)
    assert all(r.ok for r in results)
    regions_started = [region for kind, region in log if kind == "start"]
    assert regions_started == ["r2", "r2", "r2", "r1", "r1", "r3"]
    for region in ("r2", "r1"):
        last_end = max(i for i, (kind, r) in enumerate(log) if kind == "end" and r == region)
        later_starts = [i for i, (kind, r) in enumerate(log) if kind == "start" and r != region and regions_started.index(r) > regions_started.index(region)]
        assert all(i > last_end for i in later_starts), log
    # Results stay in target order whatever the execution order.
    assert [r.host for r in results] == [t.id for t in targets]


def test_region_parallel_default_runs_regions_at_the_same_time() -> None:
    targets = hosts("r1:a r2:b r3:c")
    gauge = Gauge()
    release = threading.Event()

    def op(target: Host, deadline: Deadline) -> None:
        gauge.enter(target.id)
        try:
            assert release.wait(10)
        finally:
            gauge.leave()

    thread, box = in_background(lambda: fan_out(targets, op, timeout=30, max_concurrency=8))
    wait_until(lambda: gauge.active == 3, message="all three regions in flight at once")
    release.set()
    thread.join(10)
    assert all(r.ok for r in box["value"])


# -- timeouts ------------------------------------------------------------------------------------


def test_hung_host_is_reported_timed_out_at_its_deadline_while_the_others_succeed() -> None:
    targets = hosts("r1:a,b r2:hung")
    cancelled = threading.Event()
    events: list[tuple[float, FanoutEvent]] = []

    def op(target: Host, deadline: Deadline) -> str:
        if target.id == "hung":
            cancelled.wait(10)  # ignores its deadline; only cancel() frees it
            return "too late"
        return f"ok-{target.id}"

    start = time.monotonic()
    results = fan_out(
        targets,
        op,
        timeout=0.3,
        cancel=lambda t: cancelled.set(),
        cancel_after=0.1,
        progress=lambda e: events.append((time.monotonic() - start, e)),
    )
    by_host = {r.host: r for r in results}
    assert by_host["a"].value == "ok-a" and by_host["b"].value == "ok-b"
    hung = by_host["hung"]
    assert hung.status is HostStatus.TIMEOUT
    assert hung.value is None  # the late "too late" is not taken as success
    assert "hung" in (hung.error or "") and "0.3s" in (hung.error or "")
    reported_at = next(at for at, e in events if e.kind == "finished" and e.host == "hung")
    assert 0.3 <= reported_at < 0.3 + 0.25
    assert cancelled.is_set()


def test_operation_raising_a_timeout_error_counts_as_timeout() -> None:
    def op(target: Host, deadline: Deadline) -> None:
        raise CommandTimeout(f"{target.id}: `sleep 9` did not finish within 1s; it was killed on the node")

    [res] = fan_out(hosts("r1:a"), op, timeout=5)
    assert res.status is HostStatus.TIMEOUT
    assert res.error_type == "CommandTimeout"


def test_operation_gets_a_deadline_of_its_own_start_plus_timeout() -> None:
    seen: dict[str, float] = {}

    def op(target: Host, deadline: Deadline) -> None:
        seen[target.id] = deadline.remaining()
        assert not deadline.expired

    fan_out(hosts("r1:a,b"), op, timeout=7, max_concurrency=1)
    assert all(6.5 < v <= 7 for v in seen.values())


def test_timed_out_host_keeps_its_slot_until_its_operation_returns() -> None:
    # max_concurrency=1 is a rolling operation: b must not start while a is still busy,
    # even though a has already been reported as timed out.
    order: list[str] = []
    a_may_return = threading.Event()

    def op(target: Host, deadline: Deadline) -> None:
        order.append(f"start-{target.id}")
        if target.id == "a":
            a_may_return.wait(10)
            order.append("return-a")

    def cancel(target: Host) -> None:
        order.append(f"cancel-{target.id}")
        a_may_return.set()

    results = fan_out(hosts("r1:a,b"), op, timeout=0.2, max_concurrency=1, cancel=cancel, cancel_after=0.2)
    assert order == ["start-a", "cancel-a", "return-a", "start-b"]
    assert [r.status for r in results] == [HostStatus.TIMEOUT, HostStatus.OK]


def test_operation_that_ignores_cancel_is_abandoned_after_the_straggler_grace() -> None:
    never = threading.Event()

    def op(target: Host, deadline: Deadline) -> None:
        if target.id == "stuck":
            never.wait(30)

    start = time.monotonic()
    results = fan_out(hosts("r1:stuck,b"), op, timeout=0.2, max_concurrency=1, cancel_after=0.05, straggler_grace=0.3)
    elapsed = time.monotonic() - start
    never.set()
    assert [r.status for r in results] == [HostStatus.TIMEOUT, HostStatus.OK]
    assert elapsed < 0.2 + 0.3 + 1.0


# -- stop on failure -----------------------------------------------------------------------------


def test_stop_on_first_failure_skips_hosts_not_yet_started() -> None:
    def op(target: Host, deadline: Deadline) -> None:
        if target.id == "b":
            raise HostUnreachable("b: connection refused by 127.0.1.2:22: nothing listens there", hint="is sshd running?")

    results = fan_out(hosts("r1:a,b r2:c,d"), op, timeout=5, max_concurrency=1, stop_on_failure=True)
    assert [r.status for r in results] == [HostStatus.OK, HostStatus.FAILED, HostStatus.SKIPPED, HostStatus.SKIPPED]
    with pytest.raises(PartialFailure) as info:
        outcome(results, action="agent restart")
    assert "b [failed] connection refused" in info.value.message
    assert "c [skipped]" in info.value.message


def test_stop_on_failure_with_region_serial_does_not_start_the_next_region() -> None:
    started: list[str] = []

    def op(target: Host, deadline: Deadline) -> None:
        started.append(target.id)
        if target.id == "a2":
            raise DlctlError("a2: boom")

    results = fan_out(hosts("r1:a1,a2 r2:b1,b2"), op, timeout=5, max_concurrency=4, region_serial=True, stop_on_failure=True)
    assert sorted(started) == ["a1", "a2"]
    assert [r.status for r in results][2:] == [HostStatus.SKIPPED, HostStatus.SKIPPED]


# -- outcome and exit codes ----------------------------------------------------------------------


def _result(host: str, status: HostStatus, value: Any = None) -> HostResult[Any]:
    error = None if status is HostStatus.OK else f"{host}: went wrong"
    return HostResult(host, "r1", status, value=value, error=error, hint=None if error is None else f"check {host}")


def test_outcome_all_ok_returns_values_by_host() -> None:
    assert outcome([_result("a", HostStatus.OK, 1), _result("b", HostStatus.OK, 2)], action="x") == {"a": 1, "b": 2}


def test_outcome_some_failed_is_partial_failure_exit_3_naming_each_failed_host() -> None:
    results = [_result("a", HostStatus.OK, 1), _result("b", HostStatus.FAILED), _result("c", HostStatus.TIMEOUT)]
    with pytest.raises(PartialFailure) as info:
        outcome(results, action="agent status")
    err = info.value
    assert err.exit_code == ExitCode.PARTIAL == 3
    assert err.message.startswith("agent status: 2 of 3 hosts did not succeed (1 ok)")
    assert "b [failed] went wrong" in err.message and "c [timeout] went wrong" in err.message
    assert [d["host"] for d in err.details] == ["a", "b", "c"]
    assert [d["status"] for d in err.details] == ["ok", "failed", "timeout"]
    assert err.hint == "check b; check c"
    json.dumps(err.to_dict())  # -o json must be able to render it


def test_outcome_all_failed_is_plain_failure_exit_1_with_per_host_detail() -> None:
    with pytest.raises(DlctlError) as info:
        outcome([_result("a", HostStatus.FAILED), _result("b", HostStatus.TIMEOUT)], action="agent stop")
    err = info.value
    assert not isinstance(err, PartialFailure)
    assert err.exit_code == ExitCode.FAILED == 1
    assert "failed on all 2 hosts" in err.message
    assert {d["host"]: d["status"] for d in err.details} == {"a": "failed", "b": "timeout"}


def test_exceptions_become_results_with_type_message_and_hint() -> None:
    def op(target: Host, deadline: Deadline) -> None:
        if target.id == "refused":
            raise RefusedError("refused: host key of refused is not known", hint="use --ssh-accept-new")
        raise KeyError("bug")

    results = {r.host: r for r in fan_out(hosts("r1:refused,buggy"), op, timeout=5)}
    assert results["refused"].status is HostStatus.FAILED
    assert results["refused"].error_type == "RefusedError"
    assert results["refused"].hint == "use --ssh-accept-new"
    assert results["buggy"].status is HostStatus.FAILED
    assert "unexpected KeyError" in (results["buggy"].error or "")


# -- progress ------------------------------------------------------------------------------------


def test_progress_reports_start_and_finish_of_every_host_on_the_calling_thread() -> None:
    events: list[FanoutEvent] = []
    threads: set[int] = set()

    def progress(event: FanoutEvent) -> None:
        threads.add(threading.get_ident())
        events.append(event)

    fan_out(hosts("r1:a,b r2:c"), lambda t, d: None, timeout=5, max_concurrency=2, progress=progress)
    assert threads == {threading.get_ident()}
    assert sorted(e.host for e in events if e.kind == "started") == ["a", "b", "c"]
    finished = [e for e in events if e.kind == "finished"]
    assert [e.done for e in finished] == [1, 2, 3]
    assert all(e.total == 3 and e.result is not None and e.result.ok for e in finished)


# -- validation ----------------------------------------------------------------------------------


def test_duplicate_hosts_and_bad_bounds_are_refused_up_front() -> None:
    with pytest.raises(DlctlError, match="more than once: a"):
        fan_out(hosts("r1:a,a"), lambda t, d: None, timeout=5)
    with pytest.raises(DlctlError, match="max concurrency"):
        fan_out(hosts("r1:a"), lambda t, d: None, timeout=5, max_concurrency=0)
    with pytest.raises(DlctlError, match="timeout"):
        fan_out(hosts("r1:a"), lambda t, d: None, timeout=0)


def test_no_targets_gives_no_results() -> None:
    assert fan_out([], lambda t, d: None, timeout=1) == []
    assert outcome([], action="x") == {}


# -- run_on_hosts with a scripted transport ------------------------------------------------------


class ScriptedTransport(Transport):
    """Answers ``run`` from a script: a (exit_code, stdout, stderr) tuple or an exception."""

    def __init__(self, host: str, answer: tuple[int, bytes, bytes] | BaseException) -> None:
        self.host = host
        self.answer = answer
        self.calls: list[tuple[tuple[str, ...], bytes | None, float]] = []
        self.closed = False

    def execute(self, words: tuple[str, ...], *, stdin: bytes | None, timeout: float, env: dict[str, str]) -> CommandResult:
        self.calls.append((words, stdin, timeout))
        if isinstance(self.answer, BaseException):
            raise self.answer
        code, out, err = self.answer
        return CommandResult(self.host, words, code, out, err, 0.001)

    def put(self, local_path: str | PathLike[str], remote_path: str, mode: int = 0o644, *, timeout: float = 600.0) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


def test_run_on_hosts_turns_exit_codes_and_errors_into_host_results() -> None:
    transports = {
        "a": ScriptedTransport("a", (0, b"up\n", b"")),
        "b": ScriptedTransport("b", (3, b"", b"dlagent is not running\n")),
        "c": ScriptedTransport("c", HostUnreachable("c: connection refused by 127.0.2.1:22: nothing listens there")),
    }
    targets = hosts("r1:a,b r2:c")
    results = run_on_hosts(targets, lambda t: transports[t.id], ["dlagent", "status"], timeout=5, stdin=b"s3cret")
    by_host = {r.host: r for r in results}
    assert by_host["a"].ok and by_host["a"].value is not None and by_host["a"].value.text == "up\n"
    assert by_host["b"].status is HostStatus.FAILED
    assert "exited with status 3: dlagent is not running" in (by_host["b"].error or "")
    assert by_host["c"].status is HostStatus.FAILED and by_host["c"].error_type == "HostUnreachable"
    argv, stdin, timeout = transports["a"].calls[0]
    assert argv == ("dlagent", "status") and stdin == b"s3cret" and 0 < timeout <= 5
    with pytest.raises(PartialFailure) as info:
        outcome(results, action="agent status")
    assert "c [failed] connection refused" in info.value.message

    unchecked = run_on_hosts(targets[1:2], lambda t: transports[t.id], ["dlagent", "status"], timeout=5, check=False)
    assert unchecked[0].ok and unchecked[0].value is not None and unchecked[0].value.exit_code == 3


# -- properties ----------------------------------------------------------------------------------

OUTCOMES = st.sampled_from(["ok", "fail", "timeout"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(st.tuples(st.sampled_from(["r1", "r2", "r3"]), OUTCOMES), min_size=0, max_size=12),
    bound=st.integers(min_value=1, max_value=5),
    region_serial=st.booleans(),
)
def test_every_host_gets_exactly_its_scripted_result_within_the_bound(plan: list[tuple[str, str]], bound: int, region_serial: bool) -> None:
    targets = [Host(f"h{i}", region) for i, (region, _) in enumerate(plan)]
    script = {f"h{i}": what for i, (_, what) in enumerate(plan)}
    gauge = Gauge()
    regions_seen: list[str] = []

    def op(target: Host, deadline: Deadline) -> str:
        gauge.enter(target.id)
        regions_seen.append(target.region)
        try:
            if script[target.id] == "fail":
                raise DlctlError(f"{target.id}: failed")
            if script[target.id] == "timeout":
                raise CommandTimeout(f"{target.id}: too slow")
            return target.id
        finally:
            gauge.leave()

    results = fan_out(targets, op, timeout=5, max_concurrency=bound, region_serial=region_serial)
    assert [r.host for r in results] == [t.id for t in targets]
    expected = {"ok": HostStatus.OK, "fail": HostStatus.FAILED, "timeout": HostStatus.TIMEOUT}
    assert [r.status for r in results] == [expected[script[t.id]] for t in targets]
    assert gauge.peak <= bound
    if region_serial:
        # Each region's hosts run as one contiguous block, in order of first appearance.
        blocks = [r for i, r in enumerate(regions_seen) if i == 0 or regions_seen[i - 1] != r]
        assert blocks == list(dict.fromkeys(t.region for t in targets))
    bad = [r for r in results if not r.ok]
    if not bad:
        assert outcome(results, action="x") == {t.id: t.id for t in targets}
    else:
        with pytest.raises(DlctlError) as info:
            outcome(results, action="x")
        assert info.value.exit_code == (ExitCode.PARTIAL if len(bad) < len(results) else ExitCode.FAILED)


def test_outcome_all_refused_for_safety_is_exit_4_but_mixed_refusals_are_exit_1() -> None:
    def refuse(target: str, deadline: Deadline) -> None:
        raise RefusedError(f"{target}: host key is not known; refusing to connect")

    refused = fan_out(["a", "b"], refuse, timeout=5)
    with pytest.raises(RefusedError) as info:
        outcome(refused, action="probe")
    assert info.value.exit_code == ExitCode.REFUSED and "refused on all 2 hosts" in info.value.message

    def mixed(target: str, deadline: Deadline) -> None:
        if target == "a":
            raise RefusedError("a: host key is not known")
        raise HostUnreachable("b: connection refused")

    with pytest.raises(DlctlError) as info:
        outcome(fan_out(["a", "b"], mixed, timeout=5), action="probe")
    assert info.value.exit_code == ExitCode.FAILED


# -- the policy alone (next_to_start): pure decisions over immutable state ----------------------------


def _policy(regions: list[str], *, bound: int = 16, serial: bool = False, stop: bool = False) -> Policy:
    return Policy.of(regions, max_concurrency=bound, region_serial=serial, stop_on_failure=stop)


def test_the_policy_fills_free_slots_in_target_order() -> None:
    p = _policy(["r1"] * 5, bound=2)
    assert next_to_start(p, started=frozenset(), in_flight=frozenset(), failed=False) == [0, 1]
    assert next_to_start(p, started=frozenset({0, 1}), in_flight=frozenset({0, 1}), failed=False) == []
    assert next_to_start(p, started=frozenset({0, 1}), in_flight=frozenset({1}), failed=False) == [2]
    assert next_to_start(p, started=frozenset(range(5)), in_flight=frozenset(), failed=False) == []


def test_the_policy_starts_a_region_only_once_the_one_before_has_nothing_in_flight() -> None:
    p = _policy(["a", "b", "a", "c", "b"], bound=8, serial=True)
    assert p.groups == ((0, 2), (1, 4), (3,))  # regions in order of first appearance
    assert next_to_start(p, started=frozenset(), in_flight=frozenset(), failed=False) == [0, 2]
    # One host of region a still in flight (a timed-out one keeps its slot): b waits.
    assert next_to_start(p, started=frozenset({0, 2}), in_flight=frozenset({2}), failed=False) == []
    assert next_to_start(p, started=frozenset({0, 2}), in_flight=frozenset(), failed=False) == [1, 4]
    # Without region-serial every region goes at once.
    assert next_to_start(_policy(["a", "b", "a"]), started=frozenset(), in_flight=frozenset(), failed=False) == [0, 1, 2]


def test_the_policy_starts_nothing_after_a_failure_only_when_it_stops_on_one() -> None:
    args = {"started": frozenset({0}), "in_flight": frozenset(), "failed": True}
    assert next_to_start(_policy(["r"] * 3, stop=True), **args) == []
    assert next_to_start(_policy(["r"] * 3, stop=False), **args) == [1, 2]
