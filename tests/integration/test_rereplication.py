"""Re-replication against real ZooKeeper and six real agents in three regions (2 per region).

Each test writes its own log with a real ``LogWriter``, declares agents lost (killing them where
the scenario needs it), runs the plan/apply of ``dlctl.ops.rereplicate`` and then checks what the
agents really hold: every member of every segment holds exactly the entries its position says
(digests recomputed from what the others serve), no lost agent is named any more, and every
acknowledged record reads back.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dlctl.log.auth import Credentials
from dlctl.log.pool import AgentPool
from dlctl.log.reader import LogReader
from dlctl.log.rereplication import digest_of, entries_on, members
from dlctl.log.format import decode_header
from dlctl.log.writer import LogWriter
from dlctl.meta.records import LogConfig, SegmentState
from dlctl.meta.store import MetaStore
from dlctl.log import rereplicator as rr
from harness.agents import AgentNode, harness_credentials
from harness.procs import ProcessRegistry, wait_until
from harness.zk import ZkNamespace, segment_record, scribbled

pytestmark = [pytest.mark.zk, pytest.mark.agent]

T = TypeVar("T")
CLUSTER = "c1"
LAYOUT = {f"{r}{i}": (r, f"rack{i}") for r in ("ra", "rb", "rc") for i in (1, 2)}  # node -> (region, rack)


@dataclass
class Cluster:
    ns: ZkNamespace
    agents: dict[str, AgentNode]
    admin: Any

    def heal(self) -> None:
        for node in self.agents.values():
            if node.proc is None or not node.proc.running:
                node.start(wait=False)
        for node in self.agents.values():
            node.wait_ready(self.admin)


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("rerepl-agents")
    ns = ZkNamespace(zk_server, label="rereplication")
    procs = ProcessRegistry(base / "procs")
    try:
        admin = ns.client()
        agents = {n: AgentNode(procs, base, ns.connect_string, cluster=CLUSTER, node_id=n, region=r, rack=k) for n, (r, k) in LAYOUT.items()}
        for node in agents.values():
            node.start(wait=False)
        for node in agents.values():
            node.wait_ready(admin)
        yield Cluster(ns, agents, admin)
    finally:
        procs.close()
        ns.close()


@pytest.fixture
def env(cluster):
    cluster.heal()
    clients: list[Any] = []

    def meta() -> MetaStore:
        client = cluster.ns.client()
        clients.append(client)
        return MetaStore(client, CLUSTER)

    yield meta
    for c in clients:
        c.stop()
        c.close()
    cluster.heal()


def run(coro: Awaitable[T], timeout: float = 120.0) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


async def write(meta: MetaStore, name: str, count: int, *, roll_bytes: int = 40_000, close: bool = True, secret: Credentials | None = None) -> tuple[LogWriter, AgentPool]:
    pool = AgentPool(meta, secret or harness_credentials(), request_timeout=5.0)
    writer = await LogWriter.open(meta, pool, name, roll_bytes=roll_bytes, batch_bytes=4096)
    for i in range(count):
        writer.submit(f"{name}-{i:06d}".encode() * 20)
    await writer.flush()
    if close:
        await writer.close()
    return writer, pool


async def read_back(meta: MetaStore, name: str, count: int) -> list[bytes]:
    pool = AgentPool(meta, harness_credentials(), request_timeout=5.0)
    try:
        async with LogReader(meta, pool, name, start_txid=0) as reader:
            out = []
            for _ in range(count):
                record = await reader.read_next(10)
                assert record is not None, f"log {name}: timed out after {len(out)} of {count} records"
                out.append(record.payload)
            assert await reader.read_next(0.2) is None
            return out
    finally:
        await pool.close()


async def assert_fully_replicated(meta: MetaStore, name: str, lost: set[str]) -> None:
    """Every member of every completed segment holds exactly its entries, with the same CRCs as
    every other holder (the digest of (id, CRC) pairs recomputed from another member's copy)."""
    pool = AgentPool(meta, harness_credentials(), request_timeout=5.0)
    await pool.refresh()
    log_id = meta.get_log(name).value.log_id
    try:
        for versioned in meta.segments(name):
            seg = versioned.value
            assert not members(seg) & lost, f"segment {seg.seq} still names lost agents: {sorted(members(seg) & lost)}"
            if seg.state is not SegmentState.COMPLETED or seg.last_entry_id < 0:
                continue
            crcs: dict[int, int] = {}
            for node in sorted(members(seg)):
                ids = entries_on(seg, node)
                client = await pool.client(node)
                for entry_id in ids:
                    if entry_id not in crcs:
                        crcs[entry_id] = decode_header(await client.read(log_id, seg.seq, entry_id)).crc
                got = await client.digest(log_id, seg.seq, ids[0], ids[-1])
                assert got.entries == len(ids), f"segment {seg.seq}: {node} holds {got.entries} of its {len(ids)} entries"
                assert got.digest == digest_of((i, crcs[i]) for i in ids), f"segment {seg.seq}: {node}'s entries differ"
    finally:
        await pool.close()


# -- (1) copy + verify + CAS ----------------------------------------------------------------------------


def test_recover_node_copies_verifies_and_replaces_the_member_in_place(env):
    meta = env()
    meta.create_log("one-node", LogConfig(3, 3, 2))
    _, pool = run(write(meta, "one-node", 600))
    run(pool.close())
    before = {s.value.seq: s.value for s in meta.segments("one-node")}
    assert len(before) >= 2
    lost = sorted(members(before[1]))[0]  # declared lost while still up: never read from
    plan = rr.plan(meta, [lost])
    affected = {w.seq for w in plan.work}
    assert affected == {seq for seq, s in before.items() if lost in members(s)}
    assert all(w.sources and lost not in w.sources and w.targets[lost] not in members(before[w.seq]) for w in plan.work)
    assert not plan.data_lost and plan.op_id is None

    report = run(_execute(meta, plan))
    assert report["committed"] == len(affected) and not report["stuck"] and not report["data_lost"]
    assert report["bytes"] > 0
    after = {s.value.seq: s.value for s in meta.segments("one-node")}
    for seq in affected:
        target = plan.work[[w.seq for w in plan.work].index(seq)].targets[lost]
        for old, new in zip(before[seq].ensembles, after[seq].ensembles):
            assert new.nodes == tuple(target if n == lost else n for n in old.nodes)  # position kept
    run(assert_fully_replicated(meta, "one-node", {lost}))
    payloads = run(read_back(meta, "one-node", 600))
    assert payloads == [f"one-node-{i:06d}".encode() * 20 for i in range(600)]
    op = meta.get_op(report["operation"]).value
    assert op["state"] == "done" and all(i["state"] == "committed" for i in op["items"])
    # Nothing left to do: a second plan finds no segment on the lost agent.
    assert rr.plan(meta, [lost]).work == []


def test_a_log_whose_metadata_cannot_be_read_is_named_and_the_other_logs_are_re_replicated(env):
    """A segment record scribbled over (not by dlctl) stopped the plan for every log of the
    cluster; now that log is named in the plan's notes, the others are copied, and once the
    record is put back the next plan finds that log's segments on the lost agent."""
    meta = env()
    meta.create_log("scribbled", LogConfig(3, 3, 2))
    _, pool = run(write(meta, "scribbled", 100))
    run(pool.close())
    lost = sorted(members(meta.segments("scribbled")[0].value))[0]
    # Another log with a segment on the same agent (placement picks its ensembles: write until one does).
    for attempt in range(20):
        meta.create_log(f"kept-up-{attempt}", LogConfig(3, 3, 2))
        _, pool = run(write(meta, f"kept-up-{attempt}", 100))
        run(pool.close())
        if any(lost in members(s.value) for s in meta.segments(f"kept-up-{attempt}")):
            break
    else:
        pytest.fail(f"no log placed a segment on {lost} in 20 tries")
    kept_up = f"kept-up-{attempt}"
    with scribbled(meta.client, segment_record(meta.client, meta.cluster, "scribbled")) as bad:
        plan = rr.plan(meta, [lost])
        assert kept_up in {w.log for w in plan.work} and "scribbled" not in {w.log for w in plan.work}
        assert any(n.startswith("log 'scribbled' is skipped") and bad in n for n in plan.notes), plan.notes
        report = run(_execute(meta, plan))
        assert report["committed"] == len(plan.work) and not report["stuck"] and not report["data_lost"]
        run(assert_fully_replicated(meta, kept_up, {lost}))
    assert {w.log for w in rr.plan(meta, [lost]).work} == {"scribbled"}


async def _execute(meta: MetaStore, plan: rr.RereplicationPlan, **kw: Any) -> dict[str, Any]:
    pool = AgentPool(meta, harness_credentials(), request_timeout=5.0)
    try:
        return await rr.execute(meta, pool, plan, **kw)
    finally:
        await pool.close()


# -- (3) resumability ------------------------------------------------------------------------------------


def test_an_interrupted_operation_is_continued_by_the_next_run(env):
    meta = env()
    meta.create_log("resume", LogConfig(3, 3, 2))
    _, pool = run(write(meta, "resume", 900, roll_bytes=30_000))
    run(pool.close())
    # The member of the most segments (ensembles are drawn at random at each roll): the run is
    # cut while copying a second segment of it, so it needs at least two.
    counts = Counter(n for s in meta.segments("resume") for n in members(s.value))
    node = max(sorted(counts), key=lambda n: counts[n])
    plan = rr.plan(meta, [node])
    assert len(plan.work) >= 2, counts

    async def interrupted() -> None:
        # Cancel the run once the first segment is committed and another copy is under way.
        pool = AgentPool(meta, harness_credentials(), request_timeout=5.0)
        stop = asyncio.Event()

        def watch(p: rr.Progress) -> None:
            if p.finished >= 1 and p.copied.entries > 0 and p.current:
                stop.set()

        task = asyncio.ensure_future(rr.execute(meta, pool, plan, parallel=1, window=4, on_progress=watch))
        await asyncio.wait([task, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pool.close()

    run(interrupted())
    again = rr.plan(meta, [node])
    assert again.op_id is not None, "the unfinished operation is found"
    record = meta.get_op(again.op_id).value
    assert record["state"] == "running" and any(i["state"] == "committed" for i in record["items"])
    assert len(again.work) < len(plan.work)  # committed segments no longer name the node
    kept = {(w.seq, w.targets[node]) for w in again.work}
    assert kept <= {(w.seq, w.targets[node]) for w in plan.work}  # targets chosen before are kept
    report = run(_execute(meta, again))
    assert report["operation"] == again.op_id and not report["stuck"]
    assert meta.get_op(again.op_id).value["state"] == "done"
    run(assert_fully_replicated(meta, "resume", {node}))
    assert len(run(read_back(meta, "resume", 900))) == 900


# -- data loss is reported, never hidden -----------------------------------------------------------------


def test_a_segment_whose_every_replica_is_lost_is_reported_and_left_alone(env):
    meta = env()
    meta.create_log("doomed", LogConfig(3, 3, 2))
    _, pool = run(write(meta, "doomed", 50, roll_bytes=10**9))
    run(pool.close())
    (seg,) = [s.value for s in meta.segments("doomed")]
    lost = sorted(members(seg))
    plan = rr.plan(meta, lost, logs=["doomed"])
    assert any(f"data lost: segment {seg.seq} of log doomed, entries 0..{seg.last_entry_id}" in n for n in plan.notes)
    report = run(_execute(meta, plan))
    assert [o["segment"] for o in report["data_lost"]] == [seg.seq] and "data lost" in report["data_lost"][0]["error"]
    assert meta.segments("doomed")[0].value == seg  # metadata untouched: the agents may come back
    assert meta.get_op(report["operation"]).value["state"] == "incomplete"


# -- (4) a region lost while a writer runs ------------------------------------------------------------------


def test_region_loss_with_a_running_writer_then_recover_region(env, cluster):
    """m = 2 over 3 regions: E = W = 4, A = 3 (A > W - W/m), so an acknowledged entry is always
    in two regions and, with one region down, four agents in two regions still form ensembles."""
    meta = env()
    meta.create_log("regional", LogConfig(4, 4, 3, roll_bytes=60_000))
    region = [n for n, (r, _) in LAYOUT.items() if r == "ra"]

    killed_at: list[int] = []  # the writer's segment when the region died

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        pool = AgentPool(meta, harness_credentials(), request_timeout=3.0)
        writer = await LogWriter.open(meta, pool, "regional", batch_bytes=4096, stall_timeout=60.0)
        acked: list[bytes] = []
        for i in range(400):
            payload = f"before-{i:05d}".encode() * 10
            await writer.append(payload)
            acked.append(payload)
        for node in region:  # the whole region dies, abruptly
            cluster.agents[node].proc.kill()
        killed_at.append(writer.segment_seq or 0)
        for i in range(400):
            payload = f"during-{i:05d}".encode() * 10
            await writer.append(payload)
            acked.append(payload)
        await writer.close()
        await pool.close()
        # Reading with the region still down never fails.
        return acked, await read_back(meta, "regional", len(acked))

    acked, read = run(scenario(), timeout=180)
    assert read == acked
    wait_until(lambda: not (set(region) & set(meta.available_nodes())), 20, message="region ra's agents gone from ZooKeeper")
    plan = rr.plan(meta, region, logs=["regional"])
    assert plan.work and not plan.data_lost
    for w in plan.work:
        assert all(t is not None and LAYOUT[t][0] != "ra" for t in w.targets.values())
    report = run(_execute(meta, plan), timeout=180)
    assert not report["stuck"] and not report["data_lost"], report
    # The writer probes the members of every new ensemble, so no segment created after the
    # kill (beyond the one that may already have been in creation) names a dead agent,
    # although the dead agents stayed registered in ZooKeeper for a while.
    late = [s.value for s in meta.segments("regional") if s.value.seq > killed_at[0] + 1]
    assert late, "the writer should have rolled after the kill (roll_bytes is small)"
    assert not [s.seq for s in late if set(s.ensembles[0].nodes) & set(region)], "segments created on dead agents"
    run(assert_fully_replicated(meta, "regional", set(region)))
    _assert_invariant(meta, "regional", ack_quorum=3, min_regions=2)
    assert run(read_back(meta, "regional", len(acked))) == acked


def _assert_invariant(meta: MetaStore, name: str, *, ack_quorum: int, min_regions: int) -> None:
    """No set of agents forming an ack quorum within any write set spans fewer than m regions."""
    for versioned in meta.segments(name):
        seg = versioned.value
        for change in seg.ensembles:
            e = len(change.nodes)
            for start in range(e):
                regions = [LAYOUT[change.nodes[(start + i) % e]][0] for i in range(seg.write_quorum)]
                counts = sorted((regions.count(r) for r in set(regions)), reverse=True)
                assert sum(counts[: min_regions - 1]) < ack_quorum, f"segment {seg.seq}: write set {regions} breaks the invariant"


# -- in-progress segments are fenced and recovered first ---------------------------------------------------


def test_an_abandoned_in_progress_segment_is_recovered_then_re_replicated(env, cluster):
    meta = env()
    meta.create_log("abandoned", LogConfig(3, 3, 2))
    writer_meta = env()
    writer, pool = run(write(writer_meta, "abandoned", 300, roll_bytes=10**9, close=False))
    run(pool.close())
    writer_meta.client.stop()  # the writer's session ends: no owner, the segment stays in progress
    wait_until(lambda: meta.owner_of("abandoned") is None, 20, message="the owner znode expired")
    (seg,) = [s.value for s in meta.segments("abandoned")]
    assert seg.state is SegmentState.INPROGRESS
    lost = sorted(members(seg))[0]
    plan = rr.plan(meta, [lost], logs=["abandoned"])
    (work,) = plan.work
    assert work.recover_first and not work.blocked
    report = run(_execute(meta, plan))
    assert report["committed"] == 1, report
    (after,) = [s.value for s in meta.segments("abandoned")]
    assert after.state is SegmentState.COMPLETED and lost not in members(after)
    run(assert_fully_replicated(meta, "abandoned", {lost}))
    assert len(run(read_back(meta, "abandoned", 300))) == 300


def test_a_segment_with_a_live_writer_is_named_as_stuck_not_fenced(env):
    meta = env()
    meta.create_log("live", LogConfig(3, 3, 2))

    async def scenario() -> tuple[rr.RereplicationPlan, dict]:
        writer, pool = await write(meta, "live", 20, roll_bytes=10**9, close=False)
        try:
            (seg,) = [s.value for s in meta.segments("live")]
            plan = rr.plan(meta, [sorted(members(seg))[0]], logs=["live"])
            report = await _execute(meta, plan)
            await writer.append(b"still writing")  # not deposed
            return plan, report
        finally:
            await writer.close()
            await pool.close()

    plan, report = run(scenario())
    assert "live writer" in plan.work[0].blocked and any("cannot be repaired now" in n for n in plan.notes)
    (stuck,) = report["stuck"]
    assert stuck["segment"] == 1 and "live writer" in stuck["error"]


# -- (2) the CLI: dry run, apply, exit codes --------------------------------------------------------------


@pytest.mark.slow
def test_cli_recover_node_dry_run_then_apply_on_a_sandbox(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from dlctl import inventory
    from dlctl.config import ConfigLocation
    from dlctl.session import ClusterSession

    env = {**os.environ, "DLCTL_SANDBOX_DIR": str(tmp_path / "sbx"), "DLCTL_CONFIG": str(tmp_path / "sbx" / "config.toml")}

    def dlctl(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dlctl.cli", *argv], capture_output=True, text=True, timeout=180, env=env)

    up = dlctl("--yes", "sandbox", "up", "--regions", "3", "--nodes-per-region", "2")
    assert up.returncode == 0, up.stderr
    try:
        # E = W = 4, A = 3: valid under m = 2 over three regions (A > W - W/m), whatever the sandbox policy.
        created = dlctl("--yes", "log", "create", "cli", "-e", "4", "-w", "4", "-a", "3")
        assert created.returncode == 0, created.stderr
        session = ClusterSession(inventory.load(ConfigLocation(Path(env["DLCTL_CONFIG"]), "test")).cluster(None))
        _, pool = run(write(session.meta, "cli", 300, secret=session.credentials))
        run(pool.close())
        (seg,) = [s.value for s in session.meta.segments("cli")][:1]
        lost = sorted(members(seg))[0]
        session.close()

        dry = dlctl("-o", "json", "recover", "node", lost, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        planned = json.loads(dry.stdout)
        assert planned["dry_run"] and planned["steps"]
        step = planned["steps"][0]["params"]
        assert step["log"] == "cli" and lost not in step["sources"] and step["targets"][lost] and step["bytes"] > 0

        applied = dlctl("-o", "json", "--yes", "recover", "node", lost)
        assert applied.returncode == 0, applied.stderr
        report = json.loads(applied.stdout)
        assert report["committed"] == len(planned["steps"]) and not report["stuck"]
        again = json.loads(dlctl("-o", "json", "recover", "node", lost, "--dry-run").stdout)
        assert again["steps"] == [] and "nothing to re-replicate" in again["notes"][0]
        lines = dlctl("-o", "json", "log", "read", "cli").stdout.splitlines()
        assert len(lines) == 300
    finally:
        dlctl("--yes", "sandbox", "down", "--purge")
