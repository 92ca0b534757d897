"""Retention and garbage collection against real ZooKeeper and three real agent processes:
the elected housekeeper's TTL, ``dlctl gc`` with an agent down (it reclaims when it restarts),
orphans (reported, deleted only with ``--force``), and ``cluster status`` showing what came back.

Each test starts its own agents (it kills them, or needs housekeeping configured its way).
The CLI runs inside the test process, so ``gc`` gets ``--nice 0`` (it would lower this
process's CPU priority for the tests after it).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from harness.logcluster import eventually, run
from harness.procs import wait_until
from harness.zk import close_client, make_client, scribbled, segment_record
from kazoo.security import make_digest_acl
from test_truncation import CLUSTER, Env, fill, start_cluster

from dlctl.log import format as fmt
from dlctl.log.dlsn import DLSN
from dlctl.log.reader import LogReader
from dlctl.meta import paths
from dlctl.meta.pins import PinRecord, PinStore
from dlctl.meta.records import LogConfig, SegmentState
from dlctl.meta.truncation import TruncationStore

pytestmark = [pytest.mark.zk, pytest.mark.agent]


def housekeeping(enabled: bool = True, check: float = 3600.0) -> str:
    return f"[housekeeping]\nenabled = {str(enabled).lower()}\ncheck_seconds = {check}\n"


def held(agent, log_id: int) -> dict[int, int]:
    """Segment seq -> replica size in bytes, as the agent itself reports it."""
    return {i.segment_seq: i.size_bytes for i in agent.client().list_segments() if i.log_id == log_id}


def disk_usage(agent, log_id: int) -> int:
    """Bytes of the log's replica data files on the agent's disk (markers and 12-byte .acked
    records aside)."""
    directory = agent.data_dir / "segments" / f"{log_id:016x}"
    return sum(p.stat().st_size for p in directory.glob("*.log")) if directory.is_dir() else 0


async def write_closed(env: Env, name: str, start: int, count: int, **options) -> dict[int, DLSN]:
    writer = await env.writer(name, roll_bytes=4096, batch_bytes=1024, **options)
    acked = await fill(writer, start, count)
    await writer.close()
    return acked


# -- TTL by the elected housekeeper -------------------------------------------------------------------


def test_ttl_expiry_removes_exactly_the_expired_completed_segments_and_keeps_in_progress_and_pinned(procs, tmp_path, zk, capsys):
    cluster = start_cluster(procs, tmp_path, zk, housekeeping(check=0.5))
    env = Env(cluster)
    gap, ttl = 6.0, 3.0
    names = ("ttl-a", "ttl-b")
    for name in names:
        env.meta.create_log(name, LogConfig(3, 3, 2))
    ids = {name: env.meta.get_log(name).value.log_id for name in names}
    seqs = lambda name: {s.value.seq for s in env.meta.segments(name)}

    async def scenario():
        loop = asyncio.get_running_loop()
        for name in names:
            await write_closed(env, name, 0, 120)
        old = {name: seqs(name) for name in names}
        aged_from = max(s.value.completed for name in names for s in env.meta.segments(name))
        # The old segments must be clearly older than the TTL when it is set, the new ones clearly younger.
        await eventually(lambda: time.time() > aged_from + gap, gap + 5, "the first batch to age")
        writers = []
        for name in names:
            await write_closed(env, name, 120, 60)
            writers.append(await env.writer(name))  # rolls at 256 MiB: stays in progress
            await fill(writers[-1], 180, 5)
        young = {name: seqs(name) - old[name] for name in names}
        newest = max(s.value.completed or 0 for name in names for s in env.meta.segments(name))
        pinned_seq = sorted(old["ttl-b"])[1]
        PinStore(env.meta).set(PinRecord(holder="b-to-west", log="ttl-b", position=DLSN(pinned_seq, 2, 0), sink_cluster="west"))
        for name in names:
            code, result, _ = await loop.run_in_executor(None, lambda name=name: env.dlctl(capsys, "log", "retention", name, "--age", f"{ttl:g}s"))
            assert code == 0 and result["ok"], result

        def collected() -> bool:
            return not (seqs("ttl-a") & old["ttl-a"]) and min(seqs("ttl-b")) == pinned_seq

        await eventually(collected, 20, "the housekeeper to collect the expired segments")
        assert time.time() < newest + ttl, "the second batch expired too before the check: the test proves nothing"
        # Exactly the expired completed segments went; the young ones and the in-progress ones stay.
        segments_a = {s.value.seq: s.value for s in env.meta.segments("ttl-a")}
        assert set(segments_a) == young["ttl-a"]
        assert any(s.state is SegmentState.INPROGRESS for s in segments_a.values())
        assert TruncationStore(env.meta).get("ttl-a").value.point == DLSN(min(young["ttl-a"]), 0, 0)
        # The pin stopped retention at its segment: the pinned one and everything after stay.
        assert seqs("ttl-b") == {s for s in old["ttl-b"] | young["ttl-b"] if s >= pinned_seq}
        assert not PinStore(env.meta).get("b-to-west", "ttl-b").value.needs_bootstrap
        # Every agent deleted its own replicas of what went (each reclaims every 0.5 s).
        for agent in cluster.agents.values():
            for name in names:
                await eventually(lambda agent=agent, name=name: set(held(agent, ids[name])) == seqs(name), 15, f"{agent.node_id} reclaiming {name}")
        for writer in writers:
            assert writer.error is None
            await writer.close()

    run(scenario(), timeout=90)
    # One elected agent decided; every agent reclaimed its own files.
    deciders = [n for n, a in cluster.agents.items() if "housekeeping: log 'ttl-a' truncated to" in a.proc.output()]
    assert len(deciders) == 1, deciders
    for agent in cluster.agents.values():
        wait_until(lambda agent=agent: "stale replica(s) of truncated segments" in agent.proc.output(), 10, message=f"{agent.node_id} reporting what it reclaimed")
    env.close()


# -- an agent down during gc ----------------------------------------------------------------------------


def test_an_agent_down_during_gc_deletes_its_stale_replicas_when_it_restarts(procs, tmp_path, zk, capsys):
    # Housekeeping reclaims only on start here (a long interval): what n3 deletes, it deletes
    # because it starts, and what n1/n2 delete, `dlctl gc` asked for.
    cluster = start_cluster(procs, tmp_path, zk, housekeeping(enabled=False))
    env = Env(cluster)
    name = "reclaim"
    env.meta.create_log(name, LogConfig(3, 3, 2))
    acked = run(write_closed(env, name, 0, 300))
    log_id = env.meta.get_log(name).value.log_id
    seqs = sorted(s.value.seq for s in env.meta.segments(name))
    assert len(seqs) >= 8
    cut = seqs[len(seqs) // 2]
    n3 = cluster.agents["n3"]
    before = held(n3, log_id)
    assert set(before) == set(seqs)
    # Space preallocated behind the data goes once the segments are idle (two trim periods).
    wait_until(lambda: disk_usage(n3, log_id) == sum(before.values()), 10, message="n3's idle segments trimmed")
    expected = sum(size for seq, size in before.items() if seq >= cut)

    n3.proc.kill()
    wait_until(lambda: "n3" not in env.meta.available_nodes(), 20, message="n3's registration to expire")
    code, result, _ = env.dlctl(capsys, "--yes", "truncate", name, "--to", f"{cut}/0/0")
    assert code == 0 and result["ok"], result
    code, report, err = env.dlctl(capsys, "--yes", "gc", "--nice", "0")
    assert code == 0, err
    assert report["logs"][0]["segments_collected"] == len([s for s in seqs if s < cut])
    assert {n["node"] for n in report["nodes"]} == {"n1", "n2"} and all(n["bytes_reclaimed"] > 0 for n in report["nodes"])
    assert report["deferred"] == [{"node": "n3", "replicas": len([s for s in seqs if s < cut])}]
    # The metadata went first, then the files of the live agents.
    assert min(s.value.seq for s in env.meta.segments(name)) == cut
    for node in ("n1", "n2"):
        assert set(held(cluster.agents[node], log_id)) == {s for s in seqs if s >= cut}
    assert set(int(p.stem, 16) for p in (n3.data_dir / "segments" / f"{log_id:016x}").glob("*.log")) == set(seqs)

    n3.start(zk=cluster.admin)
    wait_until(lambda: set(held(n3, log_id)) == {s for s in seqs if s >= cut}, 20, message="n3 reclaiming on start", watch=n3.proc)
    # The files go (and the agent says so) once each unlink is durable, just after the listing shows it.
    wait_until(lambda: disk_usage(n3, log_id) == expected, 10, message="n3's disk usage back to what the kept segments need")
    wait_until(lambda: "stale replica(s) of truncated segments" in n3.proc.output(), 10, message="n3 reporting what it reclaimed")

    code, status, _ = env.dlctl(capsys, "cluster", "status")
    assert code == 0
    reclaimed = {row["node"]: row["reclaimed_bytes"] for row in status}
    assert reclaimed["n3"] == sum(size for seq, size in before.items() if seq < cut)
    assert reclaimed["n1"] > 0 and reclaimed["n2"] > 0

    # What was kept still reads back, from the cut on.
    async def read_all():
        meta = env.new_meta()
        async with LogReader(meta, env.pool(meta), name) as reader:
            out = []
            while (record := await reader.read_next(timeout=3)) is not None:
                out.append(record.txid)
            return out

    txids = run(read_all())
    first = min(i for i, d in acked.items() if d.segment_seq >= cut)
    assert txids == list(range(first, 300))
    env.close()


# -- orphans --------------------------------------------------------------------------------------------


def test_orphans_are_reported_and_deleted_only_with_force(procs, tmp_path, zk, capsys):
    cluster = start_cluster(procs, tmp_path, zk, housekeeping(check=0.5))
    env = Env(cluster)
    env.meta.create_log("kept", LogConfig(3, 3, 2))
    env.meta.create_log("doomed", LogConfig(3, 3, 2))
    run(write_closed(env, "kept", 0, 100))
    run(write_closed(env, "doomed", 0, 100))
    kept_id, doomed_id = env.meta.get_log("kept").value.log_id, env.meta.get_log("doomed").value.log_id
    kept_before = {n: held(a, kept_id) for n, a in cluster.agents.items()}
    doomed_files = {n: held(a, doomed_id) for n, a in cluster.agents.items()}
    assert all(doomed_files.values())
    code, _, err = env.dlctl(capsys, "--yes", "log", "delete", "doomed")
    assert code == 0, err
    # A replica of a segment the log never had (as an interrupted copy might leave).
    stray = max(kept_before["n1"]) + 50
    with cluster.agents["n1"].client() as client:
        client.add(fmt.encode(fmt.Entry(kept_id, stray, 0, -1, b"stray")))

    # The housekeeping saw them and left them alone.
    for node, agent in cluster.agents.items():
        wait_until(lambda agent=agent: f"orphan replica log id {doomed_id}" in agent.proc.output(), 15, message=f"{node} reporting orphans")
    assert all(set(held(a, doomed_id)) == set(doomed_files[n]) for n, a in cluster.agents.items())

    code, report, _ = env.dlctl(capsys, "--yes", "gc", "--nice", "0")
    assert code == 0
    orphans = {(o["node"], o["log_id"], o["segment"]) for o in report["orphans"]}
    expected = {(n, doomed_id, s) for n, files in doomed_files.items() for s in files} | {("n1", kept_id, stray)}
    assert orphans == expected
    assert all("no log has this id" in o["why"] for o in report["orphans"] if o["log_id"] == doomed_id)
    assert all(set(held(a, doomed_id)) == set(doomed_files[n]) for n, a in cluster.agents.items())

    code, plan, _ = env.dlctl(capsys, "gc", "--force", "--dry-run", "--nice", "0")
    assert code == 0 and plan["dry_run"]
    (step,) = plan["steps"]
    assert step["target"] == "n1,n2,n3" and {n: v["orphans"] for n, v in step["params"]["nodes"].items()} == {
        n: len(files) + (1 if n == "n1" else 0) for n, files in doomed_files.items()
    }
    assert all(set(held(a, doomed_id)) == set(doomed_files[n]) for n, a in cluster.agents.items())

    code, report, err = env.dlctl(capsys, "--yes", "gc", "--force", "--nice", "0")
    assert code == 0, err
    total = sum(sum(files.values()) for files in doomed_files.values())
    assert report["bytes_reclaimed"] >= total and report["orphans"] == []
    for node, agent in cluster.agents.items():
        assert held(agent, doomed_id) == {}
        assert held(agent, kept_id) == kept_before[node]  # nothing of the live log was touched
    env.close()


# -- damaged metadata -------------------------------------------------------------------------------------


def test_a_log_whose_metadata_cannot_be_read_is_left_alone_and_the_other_logs_are_collected(procs, tmp_path, zk, capsys):
    """One log's segment record and another's log record hold bytes dlctl did not write, and a
    third log's record carries an ACL that refuses the cluster's credentials. Before, every
    agent's reclaim failed each round (no stale replica of any log was deleted) and `gc` failed
    outright; a log whose own record was damaged or refused even had its replicas listed as
    orphans, which `gc --force` deletes (so would a ZooKeeper error while reading it). Now only
    those three logs are left alone, named, and kept whole."""
    cluster = start_cluster(procs, tmp_path, zk, housekeeping(check=0.5))
    env = Env(cluster)
    damaged = ("broken", "nameless", "hidden")
    for name in ("tidy", *damaged):
        env.meta.create_log(name, LogConfig(3, 3, 2))
        run(write_closed(env, name, 0, 200))
    ids = {name: env.meta.get_log(name).value.log_id for name in ("tidy", *damaged)}
    seqs = sorted(s.value.seq for s in env.meta.segments("tidy"))
    cut = seqs[len(seqs) // 2]
    before = {name: {n: held(a, log_id) for n, a in cluster.agents.items()} for name, log_id in ids.items()}
    client = env.meta.client
    admin = make_client(zk.connect_string, superuser=True)
    hidden = paths.log(CLUSTER, "hidden")
    acl, _ = admin.get_acls(hidden)
    admin.set_acls(hidden, [make_digest_acl("someone", "else", all=True)])  # its record refused to the cluster's credentials
    with scribbled(client, segment_record(client, CLUSTER, "broken", -1)), scribbled(client, paths.log(CLUSTER, "nameless")):
        code, result, _ = env.dlctl(capsys, "--yes", "truncate", "tidy", "--to", f"{cut}/0/0")
        assert code == 0 and result["ok"], result
        # The housekeeping alone (elected: collect; every agent: reclaim) gets tidy's space back.
        for node, agent in cluster.agents.items():
            wait_until(lambda agent=agent: set(held(agent, ids["tidy"])) == {s for s in seqs if s >= cut}, 20, message=f"{node} reclaiming tidy's truncated segments", watch=agent.proc)
            wait_until(lambda agent=agent: all(f"housekeeping: log '{n}': its metadata cannot be read" in agent.proc.output() for n in damaged), 10, message=f"{node} naming the damaged logs")

        code, report, err = env.dlctl(capsys, "--yes", "gc", "--force", "--nice", "0")
        assert code == 0, err
        assert set(report["unreadable_logs"]) == set(damaged) and "ZooKeeper refuses" in report["unreadable_logs"]["hidden"], report
        assert report["orphans"] == []
        for name in damaged:
            for node, agent in cluster.agents.items():
                assert held(agent, ids[name]) == before[name][node], f"{node} lost replicas of {name}"
    admin.set_acls(hidden, acl)
    close_client(admin)
    # Repaired, both are whole and judged again: nothing of theirs is an orphan.
    code, report, err = env.dlctl(capsys, "--yes", "gc", "--nice", "0")
    assert code == 0 and report["unreadable_logs"] == {} and report["orphans"] == [], (err, report)
    env.close()
