"""Redundancy that erodes is seen and repaired (issue 18 items 1, 2 and 5), on a real sandbox.

A member of E = W = 3, A = 2 is SIGSTOPped mid-stream until the writer drops it and rolls to a
fresh ensemble, then killed and started again: its replica of the closed segment is short. (Only
resumed, it would read the entries the writer had sent it before dropping it, still waiting in
its socket, and might then hold them all: the record says short, the replica is whole.) ``dlctl cluster check``
reports exactly that member and cause, ``recover under-replicated`` refills it in place, and
afterwards every member's digest of the segment agrees and the check exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.procs import wait_until
from harness.zk import segment_record, scribbled

from dlctl import inventory
from dlctl.config import ConfigLocation
from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.meta.records import SegmentState
from dlctl.session import ClusterSession

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]


def dlctl(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dlctl.cli", *argv], capture_output=True, text=True, timeout=180, env={**os.environ, **env})


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    base = tmp_path_factory.mktemp("sbx-health")
    env = {"DLCTL_SANDBOX_DIR": str(base), "DLCTL_CONFIG": str(base / "config.toml")}
    up = dlctl(env, "--yes", "sandbox", "up", "--regions", "1", "--nodes-per-region", "4")
    assert up.returncode == 0, up.stderr
    yield env
    dlctl(env, "--yes", "sandbox", "down", "--purge")


def _pids(env: dict[str, str]) -> dict[str, int]:
    status = json.loads(dlctl(env, "-o", "json", "sandbox", "status").stdout)
    return {n["node"]: n["pid"] for n in status["nodes"]}


async def _digests(session: ClusterSession, log_id: int, seg) -> set[tuple[int, str]]:
    pool = AgentPool(session.meta, session.credentials)
    try:
        return {
            (d.entries, d.digest)
            for d in [await (await pool.client(n)).digest(log_id, seg.seq, 0, seg.last_entry_id) for n in seg.ensembles[0].nodes]
        }
    finally:
        await pool.close()


async def _append(session: ClusterSession, name: str, count: int) -> None:
    pool = AgentPool(session.meta, session.credentials)
    try:
        writer = await LogWriter.open(session.meta, pool, name)
        for i in range(count):
            writer.submit(f"x{i}".encode())
        await writer.close()
    finally:
        await pool.close()


def test_a_member_dropped_mid_segment_is_reported_short_then_refilled_and_the_check_turns_ok(sandbox):
    assert dlctl(sandbox, "--yes", "cluster", "auditor", "disable").returncode == 0  # the CLI repairs, not the auditor
    assert dlctl(sandbox, "log", "create", "sagging").returncode == 0
    session = ClusterSession(inventory.load(ConfigLocation(Path(sandbox["DLCTL_CONFIG"]), "test")).cluster(None))
    pids = _pids(sandbox)

    async def write_past_a_stopped_member() -> str:
        pool = AgentPool(session.meta, session.credentials, request_timeout=1.0)
        writer = await LogWriter.open(session.meta, pool, "sagging", ensemble_retry=0.2)
        for i in range(300):
            writer.submit(f"r{i}".encode())
        await writer.flush()
        first = session.meta.segments("sagging")[0].value
        stopped = first.ensembles[0].nodes[1]
        os.kill(pids[stopped], signal.SIGSTOP)
        try:
            i = 300
            while len(session.meta.segments("sagging")) < 2:  # until the writer rolled away from it
                for _ in range(20):
                    writer.submit(f"r{i}".encode())
                    i += 1
                await writer.flush()
            await writer.close()
        finally:
            os.kill(pids[stopped], signal.SIGKILL)  # what waits in its socket dies with it
        await pool.close()
        return stopped

    stopped = asyncio.run(asyncio.wait_for(write_past_a_stopped_member(), 120))
    started = dlctl(sandbox, "--yes", "agent", "start", "--node", stopped)
    assert started.returncode == 0, started.stdout + started.stderr
    wait_until(lambda: stopped in session.meta.available_nodes(), 30, message=f"{stopped} registered again")
    log_id = session.meta.get_log("sagging").value.log_id
    first = session.meta.segments("sagging")[0].value
    assert first.state is SegmentState.COMPLETED and stopped in first.ensembles[0].nodes
    # The writer that dropped it wrote down that it is short (item 1: the record is the truth).
    assert set(first.short) == {stopped} and first.short[stopped] < first.last_entry_id

    checked = dlctl(sandbox, "-o", "json", "cluster", "check")
    report = json.loads(checked.stdout)
    assert checked.returncode == 1 and report["status"] == "DEGRADED", checked.stdout + checked.stderr
    (problem,) = [p for p in report["problems"] if p["log"] == "sagging"]
    assert (problem["segment"], problem["node"], problem["cause"]) == (first.seq, stopped, "short")
    assert problem["held_entries"] < problem["expected_entries"] == first.last_entry_id + 1
    # The table says it in words (it printed the survey's dicts, the words being overwritten).
    table = dlctl(sandbox, "cluster", "check", "--log", "sagging")
    assert table.returncode == 1 and table.stdout.startswith("DEGRADED: cluster "), table.stdout
    assert f"segment {first.seq} of log 'sagging': " in table.stdout and f"{stopped}: short ({problem['held_entries']}/{problem['expected_entries']} entries)" in table.stdout, table.stdout
    assert "{'log'" not in table.stdout
    assert len(asyncio.run(_digests(session, log_id, first))) == 2  # the short member disagrees
    shown = json.loads(dlctl(sandbox, "-o", "json", "log", "show", "sagging").stdout)["segments"]
    assert shown[0]["replicas"].startswith(f"{stopped}: short ") and shown[1]["replicas"] in ("ok", "-")

    # Another log's segment record scribbled over (not by dlctl): it is named, and checking and
    # repairing every other log go on (they stopped at it, for the whole cluster).
    assert dlctl(sandbox, "log", "create", "scrawled").returncode == 0
    asyncio.run(_append(session, "scrawled", 5))
    with scribbled(session.meta.client, segment_record(session.meta.client, session.cluster.name, "scrawled")) as scrawled:
        whole = dlctl(sandbox, "-o", "json", "cluster", "check")
        report = json.loads(whole.stdout or "{}")
        assert whole.returncode == 1 and report["status"] == "DEGRADED", whole.stdout + whole.stderr
        assert [p["node"] for p in report["problems"] if p["log"] == "sagging"] == [stopped]
        assert list(report["unreadable_logs"]) == ["scrawled"] and scrawled in report["unreadable_logs"]["scrawled"]
        assert any(f.startswith("log 'scrawled': replicas not checked") for f in report["findings"]), report["findings"]
        dry = json.loads(dlctl(sandbox, "-o", "json", "recover", "under-replicated", "--dry-run").stdout or "{}")
        assert [s["action"] for s in dry["steps"]] == ["refill"] and stopped in dry["steps"][0]["target"]
        applied = dlctl(sandbox, "-o", "json", "--yes", "recover", "under-replicated")
        assert applied.returncode == 0, applied.stdout + applied.stderr

    ((entries, _digest),) = asyncio.run(_digests(session, log_id, first))  # one answer: every member agrees
    assert entries == first.last_entry_id + 1
    assert session.meta.segments("sagging")[0].value.short == {}  # and the record says so again
    again = dlctl(sandbox, "-o", "json", "cluster", "check", "--log", "sagging")
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "OK", again.stdout
    assert json.loads(dlctl(sandbox, "-o", "json", "log", "show", "sagging").stdout)["segments"][0]["replicas"] == "ok"
    session.close()
    assert dlctl(sandbox, "--yes", "cluster", "auditor", "enable").returncode == 0
