"""Replication streams between two real clusters (issue 8): real agents running the workers,
one real ZooKeeper holding both clusters, a fault proxy on every sink -> source connection.

Each test gets fresh clusters ``a`` and ``b``; records are written at ``a`` with the library
writer, read back at ``b`` with the log reader, and judged on payloads and origin headers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agents import harness_credentials
from harness.logcluster import eventually, log_writer, run
from harness.twoclusters import Sites, origin_of, read_all, sites_for_test, streams_now
from harness.zk import zk_retry

from dlctl.log.dlsn import DLSN
from dlctl.log.idempotence import PRODUCER_HEADER
from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.meta.access import replication_role
from dlctl.meta.records import LogConfig
from dlctl.ops import replication as ops
from dlctl.ops import streams as stream_ops
from dlctl.plan import apply
from dlctl.replication.records import StreamState
from dlctl.replication.store import StreamStore

pytestmark = pytest.mark.zk


@pytest.fixture
def sites(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request)


async def write(meta, name: str, payloads: list[bytes]) -> list[DLSN]:
    async with log_writer(meta, name) as writer:
        futures = []
        for p in payloads:
            if writer.pending_bytes > 8 * 1024 * 1024:
                await writer.wait_writable()
            futures.append(writer.submit(p))
        await writer.flush()
        return [f.result() for f in futures]


def setup_stream(sites: Sites, *patterns: str, bidirectional: bool = False) -> ops.InitPlan:
    built = ops.init_plan(sites["a"].session(), sites["b"].session(), patterns=patterns or ("*",), bidirectional=bidirectional)
    ops.refuse_unavailable_bootstrap(built)
    apply(built.plan)
    return built


def checkpoint(sites: Sites, log: str, stream: str = "a-to-b"):
    return zk_retry(lambda: StreamStore(sites["b"].meta()).get_checkpoint(stream, log).value, seconds=5.0)


def test_one_way_stream_applies_every_source_record_once_in_source_order(sites: Sites):
    a, b = sites["a"], sites["b"]
    a.meta().create_log("orders", LogConfig())
    payloads = [f"order-{i}".encode() for i in range(3000)]
    positions = run(write(a.meta(), "orders", payloads))
    built = setup_stream(sites, "orders")
    assert [(d.log, d.decision.value) for d in built.decisions] == [("orders", "start")]
    more = [f"order-{i}".encode() for i in range(3000, 4000)]
    positions += run(write(a.meta(), "orders", more))  # written while the stream runs

    records = run(read_all(b.meta(), "orders", until=4000, timeout=60))
    assert [r.payload for r in records] == payloads + more
    assert [origin_of(r) for r in records] == [("a", p) for p in positions]
    # Nothing more arrives (no duplicate after the last one).
    assert len(run(read_all(b.meta(), "orders", idle=1.5))) == 4000
    run(eventually(lambda: checkpoint(sites, "orders").next > positions[-1], timeout=10, message="checkpoint past the last record"))
    # The worker read the source through the fault proxies (so partition tests cut real traffic).
    assert sum(p.bytes_forwarded["down"] for p in sites.network.proxies if p.name.startswith("a") and p.name.endswith("-for-b")) > 4000 * 10


class Load:
    """A writer at the source appending numbered records until stopped (in the test's loop)."""

    def __init__(self, meta, name: str, rate: float | None = None) -> None:
        self.meta, self.name, self.rate = meta, name, rate
        self.positions: list[DLSN] = []
        self.payloads: list[bytes] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> Load:
        self._task = asyncio.ensure_future(self._run())
        return self

    async def _run(self) -> None:
        async with log_writer(self.meta, self.name) as writer:
            i = 0
            while not self._stop.is_set():
                batch = [f"rec-{i + k}".encode() for k in range(50)]
                futures = [writer.submit(p) for p in batch]
                await writer.flush()
                self.positions += [f.result() for f in futures]
                self.payloads += batch
                i += len(batch)
                await asyncio.sleep(0.01 if self.rate is None else len(batch) / self.rate)

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


def claimed_by(sites: Sites, log: str, stream: str = "a-to-b") -> str | None:
    claim = zk_retry(lambda: StreamStore(sites["b"].meta()).claims(stream).get(log), seconds=5.0)
    return claim["node"] if claim else None


@pytest.fixture
def four_node_sites(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, nodes=4)


def test_sigkill_of_the_worker_agent_moves_the_worker_and_the_sink_log_equals_the_source_log(four_node_sites: Sites):
    sites = four_node_sites
    a, b = sites["a"], sites["b"]
    # E=3, W=3, A=2 on four sink agents: with the worker's agent dead, the new worker can still
    # recover the sink log (2 of 3 replicas) and find a fresh ensemble of 3.
    a.meta().create_log("payments", LogConfig())
    setup_stream(sites, "payments")

    async def scenario() -> Load:
        load = Load(a.meta(), "payments").start()
        try:
            await eventually(lambda: checkpoint(sites, "payments").applied_records > 1000, timeout=30, message="replication under way")
            victim = claimed_by(sites, "payments")
            assert victim is not None
            b.agents[victim].proc.kill()  # SIGKILL, mid-stream
            await eventually(lambda: claimed_by(sites, "payments") not in (None, victim), timeout=30, message="another agent claims the worker")
            await eventually(lambda: checkpoint(sites, "payments").worker not in ("", victim), timeout=60, message="the new worker checkpoints")
            await asyncio.sleep(1.0)
        finally:
            await asyncio.wait_for(load.stop(), 60)
        return load

    load = run(scenario(), timeout=180)
    records = run(read_all(b.meta(), "payments", until=len(load.payloads), timeout=60))
    assert [r.payload for r in records] == load.payloads  # no gap, no duplicate, same order
    assert [origin_of(r) for r in records] == [("a", p) for p in load.positions]
    assert len(run(read_all(b.meta(), "payments", idle=1.5))) == len(load.payloads)


PARTITION_SECONDS = 30.0
LAG_THRESHOLD_SECONDS = 5.0


def test_partition_between_clusters_under_load_then_heal_lag_returns_under_threshold_and_logs_converge(sites: Sites):
    a, b = sites["a"], sites["b"]
    a.meta().create_log("events", LogConfig())
    setup_stream(sites, "events")
    source, sink = a.session(), b.session()

    async def scenario() -> Load:
        load = Load(a.meta(), "events", rate=1000).start()
        try:
            await eventually(lambda: checkpoint(sites, "events").applied_records > 500, timeout=30, message="replication under way")
            sites.network.partition("a", "b")
            applied = checkpoint(sites, "events").applied_records
            await asyncio.sleep(PARTITION_SECONDS)
            stuck = checkpoint(sites, "events").applied_records
            row = (await asyncio.get_running_loop().run_in_executor(None, stream_ops.stream_status, sink, source, "a-to-b"))["logs"][0]
            assert row["lag_records"] > 10_000 and row["lag_seconds"] >= PARTITION_SECONDS / 2, row  # visible in status
            sites.network.heal()
            assert stuck - applied < 1000, "records crossed a partition"  # at most what was in flight
            started = time.monotonic()

            def caught_up() -> bool:
                status = stream_ops.stream_status(sink, source, "a-to-b")
                row = status["logs"][0]
                return row["lag_seconds"] is not None and row["lag_seconds"] <= LAG_THRESHOLD_SECONDS and row["lag_records"] < 2000

            async def caught_up_now() -> bool:
                return await asyncio.get_running_loop().run_in_executor(None, caught_up)

            await eventually(caught_up_now, timeout=60, message="lag back under the threshold")
            catch_up = time.monotonic() - started

            # Keeping up with the load (never idle) must read as keeping up: over the next
            # 3,000 records the lag in seconds stays under the threshold.
            target = checkpoint(sites, "events").applied_records + 3000
            seen: list[float] = []

            def kept_up_for_a_while() -> bool:
                row = stream_ops.stream_status(sink, source, "a-to-b")["logs"][0]
                seen.append(row["lag_seconds"])
                assert row["lag_seconds"] is not None and row["lag_seconds"] <= LAG_THRESHOLD_SECONDS, f"lag grew while the worker kept up: {row}"
                return row["applied_records"] >= target

            async def kept_up_now() -> bool:
                return await asyncio.get_running_loop().run_in_executor(None, kept_up_for_a_while)

            await eventually(kept_up_now, timeout=30, message="3,000 more records applied")
            assert len(seen) > 3
        finally:
            await asyncio.wait_for(load.stop(), 60)
        return load, catch_up

    load, catch_up = run(scenario(), timeout=180)
    records = run(read_all(b.meta(), "events", until=len(load.payloads), timeout=60))
    assert [r.payload for r in records] == load.payloads
    assert catch_up < 60


def test_init_replication_interrupted_after_any_step_completes_when_rerun_and_never_runs_half_a_stream(sites: Sites):
    a, b = sites["a"], sites["b"]
    n_steps = None
    k = 0
    while n_steps is None or k < n_steps:
        name = f"log-{k}"
        a.meta().create_log(name, LogConfig())
        run(write(a.meta(), name, [f"{name}-{i}".encode() for i in range(100)]))
        built = ops.init_plan(a.session(), b.session(), patterns=(name,))
        steps = built.plan.steps
        n_steps = len(steps)
        assert [s.action for s in steps] == ["record-history", "register-stream", "pin", "create-sink-log", "checkpoint", "mark-replica", "activate"]
        for step in steps[:k]:  # the CLI dies after step k
            step.run()
        if k < n_steps:
            state = StreamStore(b.meta()).get_state("a-to-b").value.state if k > 1 else None  # (step 1 only records the history)
            assert state in (None, StreamState.SETTING_UP)
            time.sleep(1.0)  # several worker rounds: none may start on a half stream
            assert StreamStore(b.meta()).claims("a-to-b") == {}
        rerun = ops.init_plan(a.session(), b.session(), patterns=(name,))
        assert [(d.log, d.decision.value) for d in rerun.decisions] == [(name, "resume" if k >= 5 else "start")]
        apply(rerun.plan)
        records = run(read_all(b.meta(), name, until=100, timeout=30))
        # (once seen in a stress run at k = 4, not reproduced: no record at b in 30 s)
        assert [r.payload for r in records] == [f"{name}-{i}".encode() for i in range(100)], f"k = {k}, {len(records)} records at b\n{streams_now(sites, 'b')}"
        # Clean up for the next round: delete removes both sides' state and pins.
        apply(stream_ops.delete_plan(b.session(), a.session(), "a-to-b"))
        assert not StreamStore(b.meta()).exists("a-to-b")
        from dlctl.meta.pins import PinStore

        assert "a-to-b" not in PinStore(a.meta()).holders()
        k += 1


@pytest.fixture
def lone_agents(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    """Clusters a, b and c of one agent each: every stream into b has its worker on b's agent."""
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b", "c"), nodes=1)


def test_a_worker_slow_to_stop_does_not_hold_up_the_other_streams_of_its_agent(lone_agents: Sites):
    """A worker waits for its sink log's ownership (a predecessor that has not let go) and its
    stream is paused: it stops only when the wait ends (or after 30 s). Another stream's new
    log must not wait for that: the agent's rounds used to await each stop, so no stream of the
    agent was claimed or started meanwhile (found reading the worker runtime)."""
    sites = lone_agents
    a, b, c = sites["a"], sites["b"], sites["c"]
    a.meta().create_log("held", LogConfig(1, 1, 1))
    c.meta().create_log("free", LogConfig(1, 1, 1))
    run(write(a.meta(), "held", [f"held-{i}".encode() for i in range(10)]))
    run(write(c.meta(), "free", [f"free-{i}".encode() for i in range(10)]))
    sink = StreamStore(b.meta())

    async def scenario() -> list:
        loop = asyncio.get_running_loop()

        async def do(plan) -> None:
            await loop.run_in_executor(None, apply, plan)

        await do(ops.init_plan(a.session(), b.session(), patterns=("held",)).plan)
        assert len(await read_all(b.meta(), "held", until=10, timeout=30)) == 10
        await do(stream_ops.pause_plan(b.session(), "a-to-b"))
        await eventually(lambda: sink.claims("a-to-b") == {}, 30, "the paused stream's worker gone")
        # A predecessor still holding b's log (as a worker cut off from ZooKeeper would, until its
        # session expires): the next worker waits for it in opening its writer.
        meta = b.meta()
        holder = await LogWriter.open(meta, AgentPool(meta, harness_credentials()), "held", owner_id="predecessor", role=replication_role("a-to-b"))
        try:
            await do(stream_ops.resume_plan(b.session(), "a-to-b"))
            await eventually(lambda: "held" in sink.claims("a-to-b"), 30, "a worker waiting for the log's ownership")
            await do(stream_ops.pause_plan(b.session(), "a-to-b"))
            # Still starting, it is stopped at once (it waited up to 30 s) and lets its claim go.
            await eventually(lambda: sink.claims("a-to-b") == {}, 10, "the starting worker's claim let go")
            await do(ops.init_plan(c.session(), b.session(), patterns=("free",)).plan)
            return await read_all(b.meta(), "free", until=10, timeout=20)
        finally:
            await holder.close()
            await holder.pool.close()

    records = run(scenario(), timeout=120)
    assert [r.payload for r in records] == [f"free-{i}".encode() for i in range(10)], f"{len(records)} records at b in 20 s\n{streams_now(sites, 'b')}"


@pytest.fixture
def slow_pins(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    """Sites whose workers look at their retention pins every 30 s only (the default is 5 s)."""
    yield from sites_for_test(zk_server, tmp_path, request, pin_seconds=30.0)


def test_a_source_truncated_under_a_cut_off_stream_stops_it_for_a_bootstrap_without_a_gap_at_the_sink(slow_pins: Sites, tmp_path: Path):
    """While the sink is cut off from the source, the source gets more records, then a forced
    truncation (past the stream's pin) and gc. Back in touch, the stream's reader finds its next
    records gone and moves on to the truncation point. The worker applied what came after it
    (a gap at the sink, checkpointed past) until it next looked at its pin (found in review).
    Now it stops at the skip and asks for a bootstrap: the sink holds a prefix of the source."""
    sites = slow_pins
    a, b = sites["a"], sites["b"]
    a.meta().create_log("cut", LogConfig())
    run(write(a.meta(), "cut", [f"early-{i}".encode() for i in range(200)]))
    setup_stream(sites, "cut")
    assert len(run(read_all(b.meta(), "cut", until=200, timeout=30))) == 200
    sites.network.partition("a", "b")
    try:
        for tag in range(4):  # segments 2-5
            run(write(a.meta(), "cut", [f"late-{tag}-{i}".encode() for i in range(100)]))
        inventory = _inventory(sites, tmp_path / "inventory.toml")
        code, out = dlctl(inventory, "--cluster", "a", "-o", "json", "truncate", "cut", "--to", "5/0/0", "--force")
        assert code == 0, out
        code, out = dlctl(inventory, "--cluster", "a", "-o", "json", "gc", "--nice", "0")
        assert code == 0, out
    finally:
        sites.network.heal()
    kept = [r.payload for r in run(read_all(a.meta(), "cut", idle=1.0))]
    everything = [f"early-{i}".encode() for i in range(200)] + [f"late-{t}-{i}".encode() for t in range(4) for i in range(100)]
    assert kept == everything[-100:]  # (the scenario: segments 1-4 gone at the source)
    try:
        run(eventually(lambda: checkpoint(sites, "cut").needs_bootstrap != "", timeout=30, message="the worker asking for a bootstrap"), timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{checkpoint(sites, 'cut')}\n{streams_now(sites, 'b')}") from None
    held = [r.payload for r in run(read_all(b.meta(), "cut", idle=2.0))]
    assert held == everything[: len(held)], f"a gap at the sink: {len(held)} records, the last {held[-1]!r}"
    assert checkpoint(sites, "cut").applied_records <= len(held)


def _inventory(sites: Sites, path: Path) -> Path:
    return sites.write_inventory(path)


def dlctl(inventory: Path, *argv: str) -> tuple[int, str]:
    import io
    import json  # noqa: F401
    from contextlib import redirect_stdout

    from dlctl.cli.main import main

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["--config", str(inventory), "--yes", *argv])
    return code, out.getvalue()


def test_status_check_wait_drain_pause_resume_and_delete_through_the_cli(sites: Sites, tmp_path: Path):
    import json

    a, b = sites["a"], sites["b"]
    inventory = _inventory(sites, tmp_path / "inventory.toml")
    a.meta().create_log("audit", LogConfig())
    run(write(a.meta(), "audit", [f"a-{i}".encode() for i in range(2000)]))

    code, out = dlctl(inventory, "init-replication", "--source", "a", "--sink", "b", "--logs", "aud*", "--dry-run", "-o", "json")
    assert code == 0
    plan = json.loads(out)
    assert any("audit: start" in n for n in plan["notes"]) and plan["dry_run"]
    assert not StreamStore(b.meta()).exists("a-to-b")  # a dry run changes nothing
    code, out = dlctl(inventory, "init-replication", "--source", "a", "--sink", "b", "--logs", "aud*", "-o", "json")
    assert code == 0 and json.loads(out)["ok"]

    code, out = dlctl(inventory, "replication", "wait-drain", "a-to-b", "--timeout", "60", "-o", "json")
    assert code == 0 and json.loads(out)["drained"]
    assert len(run(read_all(b.meta(), "audit", until=2000, timeout=10))) == 2000
    code, out = dlctl(inventory, "replication", "check", "a-to-b", "--max-lag-records", "10", "--max-lag-seconds", "30", "-o", "json")
    assert code == 0, out
    code, out = dlctl(inventory, "replication", "status", "a-to-b", "-o", "json")
    row = json.loads(out)["logs"][0]
    assert row["lag_records"] == 0 and row["state"] == "running" and row["worker"] in b.agents and row["worker_region"] == "r-b"
    assert row["last_applied"] is not None and row["last_error"] is None

    code, out = dlctl(inventory, "replication", "pause", "a-to-b", "-o", "json")
    assert code == 0
    run(eventually(lambda: StreamStore(b.meta()).claims("a-to-b") == {}, timeout=10, message="workers stop when paused"))
    run(write(a.meta(), "audit", [f"b-{i}".encode() for i in range(500)]))
    code, out = dlctl(inventory, "replication", "status", "-o", "json")
    row = json.loads(out)[0]["logs"][0]
    assert row["state"] == "paused" and row["lag_records"] == 500 and row["worker"] is None
    code, out = dlctl(inventory, "replication", "check", "a-to-b", "--max-lag-records", "100", "-o", "json")
    assert code == 2 and json.loads(out)["status"] == "CRITICAL"
    code, out = dlctl(inventory, "replication", "check", "a-to-b", "--max-lag-records", "1000")
    assert code == 1 and out.startswith("WARNING")  # under the threshold, but paused

    code, _ = dlctl(inventory, "replication", "resume", "a-to-b")
    assert code == 0
    code, out = dlctl(inventory, "replication", "wait-drain", "a-to-b", "--timeout", "60", "-o", "json")
    assert code == 0
    records = run(read_all(b.meta(), "audit", until=2500, timeout=10))
    assert [r.payload for r in records] == [f"a-{i}".encode() for i in range(2000)] + [f"b-{i}".encode() for i in range(500)]
    code, out = dlctl(inventory, "replication", "list", "-o", "json")
    assert [(r["stream"], r["state"]) for r in json.loads(out)] == [("a-to-b", "running")]

    # Re-running init on a running stream resumes: nothing to change.
    code, out = dlctl(inventory, "init-replication", "--source", "a", "--sink", "b", "--logs", "audit", "--dry-run", "-o", "json")
    assert code == 0 and any("audit: resume" in n for n in json.loads(out)["notes"])

    code, out = dlctl(inventory, "replication", "delete", "a-to-b", "-o", "json")
    assert code == 0 and json.loads(out)["ok"]
    from dlctl.meta.pins import PinStore

    assert not StreamStore(b.meta()).exists("a-to-b") and PinStore(a.meta()).holders() == []
    assert len(run(read_all(b.meta(), "audit", idle=1.0))) == 2500  # the sink log stays


def test_init_replication_refuses_with_exit_4_when_the_sink_already_has_data(sites: Sites, tmp_path: Path):
    import json

    a, b = sites["a"], sites["b"]
    inventory = _inventory(sites, tmp_path / "inventory.toml")
    a.meta().create_log("ledger", LogConfig())
    b.meta().create_log("ledger", LogConfig())
    run(write(b.meta(), "ledger", [b"local"]))
    code, out = dlctl(inventory, "init-replication", "--source", "a", "--sink", "b", "--dry-run", "-o", "json")
    assert code == 0 and any("ledger: bootstrap" in n and "already holds 1 record" in n for n in json.loads(out)["notes"])
    # On a machine without a Java runtime (PATH without java, no JAVA_HOME) the copy cannot run:
    # refused with exit 4 before anything changed, saying why.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)
    assert ops.bootstrap_available()  # here, the test's own process has Java
    proc = subprocess.run(
        [sys.executable, "-c", "from dlctl.cli.main import run; run()", "--config", str(inventory), "--yes", "init-replication", "--source", "a", "--sink", "b", "-o", "json"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 4, proc.stderr
    said = " ".join(proc.stderr.split())  # (wrapped to the terminal's width)
    assert "bootstrap copy is required for: ledger" in said and "Java runtime" in said
    assert not StreamStore(b.meta()).exists("a-to-b")  # refused before anything changed


def test_pins_keep_a_paused_streams_segments_until_the_maximum_age_then_status_reports_needs_bootstrap(sites: Sites):
    from dlctl.meta.pins import PinStore

    a, b = sites["a"], sites["b"]
    a.meta().create_log("metrics", LogConfig())
    for chunk in range(4):  # each writer starts a segment: several segments to pin
        run(write(a.meta(), "metrics", [f"m-{chunk}-{i}".encode() for i in range(50)]))
    built = ops.init_plan(a.session(), b.session(), patterns=("metrics",), pin_max_age=4.0)
    apply(built.plan)
    source, sink = a.session(), b.session()
    run(eventually(lambda: checkpoint(sites, "metrics").applied_records == 200, timeout=30, message="caught up"))
    apply(stream_ops.pause_plan(sink, "a-to-b"))
    run(eventually(lambda: StreamStore(b.meta()).claims("a-to-b") == {}, timeout=10, message="workers stopped"))
    for chunk in range(3):
        run(write(a.meta(), "metrics", [f"n-{chunk}-{i}".encode() for i in range(50)]))
    pins = PinStore(a.meta())
    pin = pins.get("a-to-b", "metrics").value
    segs = [s.value.seq for s in a.meta().segments("metrics")]
    assert len(segs) == 7 and 1 < pin.position.segment_seq < 7
    protecting = pins.protecting("metrics", segs)
    # Every segment from the paused stream's position on is kept for it; none before.
    assert all(protecting[s] == ["a-to-b"] for s in segs if s >= pin.position.segment_seq)
    assert all(protecting[s] == [] for s in segs if s < pin.position.segment_seq)
    from dlctl.errors import RefusedError
    from dlctl.ops.truncate import truncate_plan

    with pytest.raises(RefusedError, match="pin"):  # truncation keeps what the paused stream needs
        truncate_plan(a.session(), "metrics", to=DLSN(segs[-1], 0, 0))
    # Past the maximum age the pin protects nothing, and status says the stream is in danger.
    run(eventually(lambda: all(v == [] for v in pins.protecting("metrics", segs).values()), timeout=30, message="the pin past its maximum age protects nothing"))
    row = stream_ops.stream_status(sink, source, "a-to-b")["logs"][0]
    assert "pin expired" in row["needs_bootstrap"]
    # Truncation now goes past the pin and marks it; the resumed worker stops for good.
    apply(truncate_plan(a.session(), "metrics", to=DLSN(segs[-1], 0, 0)))
    assert pins.get("a-to-b", "metrics").value.needs_bootstrap
    apply(stream_ops.resume_plan(sink, "a-to-b"))
    run(eventually(lambda: checkpoint(sites, "metrics").needs_bootstrap != "", timeout=30, message="worker marks needs bootstrap"))
    status = stream_ops.stream_status(sink, source, "a-to-b")
    assert status["logs"][0]["state"] == "NEEDS BOOTSTRAP", status
    assert stream_ops.check(status, max_lag_seconds=None, max_lag_records=None)[0] == 2
    assert len(run(read_all(b.meta(), "metrics", idle=1.0))) == 200  # no record past the gap


# -- atomic producer requests (issue #20 item 5) ------------------------------------------------------


def _requests(records) -> list[list[int]]:
    """A log's producer requests (indexes into ``records``, in log order): a record marked
    ``dl.p`` and the next count - 1; an unmarked record is a request of its own."""
    from dlctl.log.idempotence import producer_mark

    out, i = [], 0
    while i < len(records):
        mark = producer_mark(records[i].headers)
        n = mark.count if mark is not None else 1
        out.append(list(range(i, min(i + n, len(records)))))
        i += n
    return out


def split_groups(records, groups: list[list[bytes]], *, requests: bool = True) -> list[list[bytes]]:
    """The groups (payloads) whose records in ``records`` are not in one entry, or (with
    ``requests``) not in one producer request."""
    where = {r.payload: i for i, r in enumerate(records)}
    request_of = {i: k for k, req in enumerate(_requests(records)) for i in req}
    split = []
    for group in groups:
        at = [where[p] for p in group]
        entries = {(records[i].dlsn.segment_seq, records[i].dlsn.entry_id) for i in at}
        if len(entries) > 1 or (requests and len({request_of[i] for i in at}) > 1):
            split.append(group)
    return split


async def write_groups(meta, name: str, groups: list[list[bytes]], options=None) -> None:
    """Each group with ``submit_group`` (one request), or with ``options``, record by record."""
    from dlctl.log.producer import LogProducer
    from dlctl.log.records import Record

    pool = AgentPool(meta, harness_credentials())
    producer = LogProducer(meta, pool, name, options=options)
    try:
        for group in groups:
            if options is None:
                producer.submit_group([Record(0, p) for p in group])
            else:
                for p in group:
                    producer.submit(p)
        await producer.flush()
    finally:
        await producer.close()
        await pool.close()


@pytest.mark.parametrize("sink", ["writer", "producer"])
def test_a_source_producer_request_is_one_request_in_one_entry_at_the_sink(sites: Sites, sink: str):
    """A source request (several groups of records submitted together) arrives in the sink
    whole: in one sink entry and, through a write proxy (``producer``: the sink takes local
    writes, so the worker appends through the owner), one sink request. Written before the
    stream starts and while it runs: catching up, the worker reads many requests at once
    (appended one by one, they would be cut at the sink's own entry / request size)."""
    from dlctl.log.producer import ProducerOptions

    a, b = sites["a"], sites["b"]
    a.meta().create_log("baskets", LogConfig())
    if sink == "producer":
        b.meta().create_log("baskets", LogConfig())
    pad = b"." * 3000

    def groups(tag: str, n: int) -> list[list[bytes]]:
        return [[f"{tag}-{k}-{i}".encode() + pad for i in range(2 + k % 6)] for k in range(n)]

    before, during = groups("before", 150), groups("during", 150)
    # Negative: groups appended record by record through requests of 2 records are split at
    # the source already, and the judge says so.
    loose = groups("loose", 6)[2:]
    size = len(loose[0][0]) + 64
    run(write_groups(a.meta(), "baskets", before))
    run(write_groups(a.meta(), "baskets", loose, options=ProducerOptions(max_request_bytes=2 * size)))
    apply(ops.init_plan(a.session(), b.session(), patterns=("baskets",), causal=sink == "producer").plan)
    run(write_groups(a.meta(), "baskets", during))

    total = sum(len(g) for g in before + loose + during)
    source = run(read_all(a.meta(), "baskets", until=total, timeout=60))
    records = run(read_all(b.meta(), "baskets", until=total, timeout=90))
    assert [r.payload for r in records] == [r.payload for r in source]
    assert split_groups(source, loose) == loose
    assert split_groups(source, before + during) == []
    source_requests = [[source[i].payload for i in req] for req in _requests(source)]
    assert sum(len(r) > 7 for r in source_requests) >= 10  # requests of several groups (a group has at most 7)
    assert split_groups(records, source_requests, requests=sink == "producer") == []
    if sink == "producer":  # every sink record is in a request the owner marked
        assert all(PRODUCER_HEADER in records[req[0]].headers for req in _requests(records))
    else:
        assert all(PRODUCER_HEADER not in r.headers for r in records)


# -- active-active ---------------------------------------------------------------------------------


@pytest.fixture
def three_sites(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b", "c"))


async def local_writer(site, name: str, rounds: int, per_round: int, others: tuple[str, ...]) -> None:
    """Writes at one location through the log's owner, in rounds; between rounds it waits until
    it has seen a record of another location, so later records causally follow earlier ones."""
    from dlctl.log.producer import LogProducer

    meta = site.meta()
    pool = AgentPool(meta, harness_credentials())
    producer = LogProducer(meta, pool, name)
    try:
        for r in range(rounds):
            futures = [producer.submit(f"{site.name}-{r}-{i}".encode()) for i in range(per_round)]
            await asyncio.gather(*futures)
            if r < rounds - 1 and others:
                await eventually(
                    lambda: _seen_from(meta, name, others), timeout=30, message=f"{site.name} sees records of {others}"
                )
    finally:
        await producer.close()
        await pool.close()


async def _seen_from(meta, name: str, others: tuple[str, ...]) -> bool:
    records = await read_all(meta, name, idle=0.2)
    return any((origin_of(r) or ("",))[0] in others for r in records)


def judge_locations(sites: Sites, name: str, expected: int) -> None:
    """Every location: the same records, each once, with the same vector timestamps, in an order
    that never puts a record before one of its causal predecessors."""
    from dlctl.replication.causal import SourceClock, dominated
    from dlctl.replication.origin import Origin

    identities = {}
    stamps: dict[tuple, dict] = {}
    for loc, site in sites.sites.items():
        records = run(read_all(site.meta(), name, until=expected, timeout=90))
        records += run(read_all(site.meta(), name, idle=1.0))[len(records):]
        clock = SourceClock(loc)
        ids, vts = [], []
        for r in records:
            origin = Origin.from_headers(r.headers)
            vt = clock.stamp(origin)
            ident = (origin.cluster, origin.dlsn) if origin else (loc, r.dlsn)
            ids.append(ident)
            vts.append(vt)
            assert stamps.setdefault(ident, vt) == vt, f"{ident} has different timestamps at different locations"
        assert len(ids) == len(set(ids)) == expected, f"{loc}: {len(ids)} records, {len(set(ids))} distinct, {expected} expected"
        identities[loc] = set(ids)
        for j in range(len(vts)):
            for i in range(j):
                assert not (dominated(vts[j], vts[i]) and vts[j] != vts[i]), f"{loc}: {ids[j]} precedes its cause {ids[i]}? order broken"
    first = next(iter(identities.values()))
    assert all(ids == first for ids in identities.values())


def test_active_active_concurrent_writers_converge_without_duplicates_in_causal_order(sites: Sites):
    a, b = sites["a"], sites["b"]
    a.meta().create_log("carts", LogConfig())
    built = setup_stream(sites, "carts", bidirectional=True)
    assert sorted((d.stream, d.decision.value) for d in built.decisions) == [("a-to-b", "start"), ("b-to-a", "start")]

    async def writers() -> None:
        await asyncio.gather(local_writer(a, "carts", 4, 100, ("b",)), local_writer(b, "carts", 4, 100, ("a",)))

    run(writers(), timeout=180)
    judge_locations(sites, "carts", 800)


def test_active_active_three_cluster_cycle_converges_without_duplicates_in_causal_order(three_sites: Sites):
    sites = three_sites
    for name in ("a", "b", "c"):
        sites[name].meta().create_log("profiles", LogConfig())
    for source, sink in (("a", "b"), ("b", "c"), ("c", "a")):
        built = ops.init_plan(sites[source].session(), sites[sink].session(), patterns=("profiles",), causal=True)
        apply(built.plan)

    async def writers() -> None:
        await asyncio.gather(*(local_writer(sites[n], "profiles", 3, 60, tuple(o for o in "abc" if o != n)) for n in "abc"))

    run(writers(), timeout=240)
    judge_locations(sites, "profiles", 540)


def test_active_active_three_cluster_full_mesh_applies_each_record_once_in_causal_order(three_sites: Sites):
    """Every location receives from both others, so each record reaches it twice (directly and
    relayed): the owner of the sink log applies each origin event once."""
    sites = three_sites
    for name in ("a", "b", "c"):
        sites[name].meta().create_log("mesh", LogConfig())
    for source in "abc":
        for sink in "abc":
            if source != sink:
                apply(ops.init_plan(sites[source].session(), sites[sink].session(), patterns=("mesh",), causal=True).plan)

    async def writers() -> None:
        await asyncio.gather(*(local_writer(sites[n], "mesh", 3, 60, tuple(o for o in "abc" if o != n)) for n in "abc"))

    run(writers(), timeout=240)
    judge_locations(sites, "mesh", 540)
