"""``dlctl truncate`` against real ZooKeeper and three real agent processes.

The agents run with housekeeping that never decides (``[housekeeping] enabled = false``, a long
interval): what is truncated and collected here is exactly what each test does. Records are
written by the real ``LogWriter`` and read by the real ``LogReader``; the CLI runs in-process
(``dlctl.cli.main.main``) on an inventory naming these agents.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness.agents import DEFAULT_SECRET, AgentNode, harness_credentials, heal_agents
from harness.logcluster import eventually, run
from harness.procs import ProcessRegistry
from harness.tls import tls_dir_for
from harness.zk import ZkNamespace, close_client, make_client, write_harness_zk_auth
from kazoo.client import KazooClient

from dlctl import inventory
from dlctl.cli.main import main
from dlctl.config import ConfigLocation
from dlctl.errors import ExitCode
from dlctl.log.dlsn import DLSN
from dlctl.log.pool import AgentPool
from dlctl.log.reader import LogReader
from dlctl.log.writer import LogWriter, WriterError
from dlctl.meta.pins import PinRecord, PinStore
from dlctl.meta.records import LogConfig, SegmentState
from dlctl.meta.store import MetaStore
from dlctl.meta.truncation import TruncationStore, marks_for, read_segments
from dlctl.ops import gc as gc_ops
from dlctl.session import ClusterSession
from dlctl.ops.truncate import apply_truncation, truncate_plan
from dlctl.plan import apply
from dlctl.secrets import write_secret_file

pytestmark = [pytest.mark.zk, pytest.mark.agent]

CLUSTER = "c1"
NODES = ("n1", "n2", "n3")
HOUSEKEEPING_OFF = "[housekeeping]\nenabled = false\ncheck_seconds = 3600\n"


def payload(i: int) -> bytes:
    return f"record-{i:06d}-".encode() + b"x" * 150


# -- the cluster and the CLI --------------------------------------------------------------------


@dataclass
class Cluster:
    ns: ZkNamespace
    agents: dict[str, AgentNode]
    admin: KazooClient
    config: Path

    def heal(self) -> None:
        heal_agents(self.agents.values(), self.admin)


def write_inventory(path: Path, zk_connect: str, agents: dict[str, AgentNode]) -> Path:
    write_secret_file(path.parent / "c1.secret", DEFAULT_SECRET)
    tls_dir_for(path.parent / "c1.secret", "c1")  # the inventory's default tls_dir: the harness CA
    nodes = "".join(f'[[clusters.c1.regions.r1.racks.rack1.nodes]]\nid = "{n}"\nhost = "{a.host}"\nlisten = "{a.address}"\n' for n, a in agents.items())
    zk_auth = write_harness_zk_auth(path.parent / "c1.zk-auth")
    path.write_text(f'default_cluster = "c1"\n[clusters.c1]\nzookeeper = "{zk_connect}"\nsecret_file = "c1.secret"\nzk_auth_file = "{zk_auth}"\n{nodes}')
    return path


def start_cluster(registry: ProcessRegistry, base: Path, ns: ZkNamespace, extra_config: str, nodes=NODES) -> Cluster:
    admin = ns.client()
    agents = {n: AgentNode(registry, base, ns.connect_string, cluster=CLUSTER, node_id=n, extra_config=extra_config) for n in nodes}
    for agent in agents.values():
        agent.start(wait=False)
    cluster = Cluster(ns, agents, admin, write_inventory(base / "config.toml", ns.connect_string, agents))
    cluster.heal()
    return cluster


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory) -> Iterator[Cluster]:
    zk_server.ensure_running()
    ns = ZkNamespace(zk_server, label="test_truncation")
    registry = ProcessRegistry(tmp_path_factory.mktemp("truncation-procs"))
    try:
        yield start_cluster(registry, tmp_path_factory.mktemp("truncation-agents"), ns, HOUSEKEEPING_OFF)
    finally:
        registry.close()
        ns.close()


class Env:
    """Per test: ZooKeeper clients (each its own session) and pools, closed afterwards."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._clients: list[KazooClient] = []
        self.meta = self.new_meta()

    def new_meta(self) -> MetaStore:
        client = make_client(self.cluster.ns.connect_string)
        self._clients.append(client)
        return MetaStore(client, CLUSTER)

    def pool(self, meta: MetaStore | None = None) -> AgentPool:
        return AgentPool(meta or self.meta, harness_credentials(), request_timeout=5.0)

    def session(self) -> ClusterSession:
        cluster = inventory.load(ConfigLocation(self.cluster.config, "test")).cluster(None)
        session = ClusterSession(cluster)
        self._sessions = getattr(self, "_sessions", []) + [session]
        return session

    def dlctl(self, capsys, *argv: str) -> tuple[int, object, str]:
        code = main(["--config", str(self.cluster.config), "-o", "json", *argv])
        out, err = capsys.readouterr()
        return code, (json.loads(out) if out.strip() else None), err

    async def writer(self, name: str, **options) -> LogWriter:
        meta = self.new_meta()
        return await LogWriter.open(meta, self.pool(meta), name, **options)

    def close(self) -> None:
        for session in getattr(self, "_sessions", []):
            session.close()
        for client in self._clients:
            close_client(client)


@pytest.fixture
def env(cluster) -> Iterator[Env]:
    cluster.heal()
    e = Env(cluster)
    yield e
    e.close()


async def fill(writer: LogWriter, start: int, count: int) -> dict[int, DLSN]:
    """Append records ``start`` .. ``start + count - 1`` (txid = i) and wait for every ack."""
    futures = {i: writer.submit(payload(i)) for i in range(start, start + count)}
    return {i: await f for i, f in futures.items()}


def gc_now(env: Env, *, force: bool = False) -> dict:
    """What `dlctl gc` does, from a worker thread (its steps run event loops of their own)."""
    session = env.session()

    async def build():
        pool = env.pool(session.meta)
        try:
            return await gc_ops.plan_gc(session.meta, pool, force=force)
        finally:
            await pool.close()

    built = asyncio.run(build())
    result = apply(gc_ops.as_plan(session.meta, harness_credentials(), CLUSTER, built))
    return gc_ops.report(built, result.outcomes)


# -- truncation under load ---------------------------------------------------------------------------


def test_truncate_and_gc_under_a_concurrent_writer_and_tailing_reader(env):
    name = "busy"
    env.meta.create_log(name, LogConfig(3, 3, 2))

    async def scenario():
        loop = asyncio.get_running_loop()
        writer = await env.writer(name, roll_bytes=4096, batch_bytes=1024)
        acked = await fill(writer, 0, 400)
        assert len(env.meta.segments(name)) >= 10
        rmeta = env.new_meta()
        tail = LogReader(rmeta, env.pool(rmeta), name, start_dlsn=acked[300])
        await tail.open()
        got = []
        stop, produced = asyncio.Event(), asyncio.Event()

        async def produce() -> None:
            i = 400
            while not stop.is_set():
                acked.update(await fill(writer, i, 20))
                i += 20

        async def consume() -> None:
            while True:
                record = await tail.read_next(timeout=15)
                assert record is not None, "the tailing reader stalled"
                got.append(record)
                if produced.is_set() and record.txid == max(acked):
                    return

        producer = asyncio.ensure_future(produce())
        consumer = asyncio.ensure_future(consume())
        await eventually(lambda: len(got) > 20, 20, "the tailing reader under way")
        # Truncate in the middle of a completed segment (not at an entry's start), while both run.
        cut = next(i for i in range(150, 300) if acked[i].entry_id >= 2 and acked[i].slot >= 1)
        point = acked[cut]
        session = env.session()
        plan = await loop.run_in_executor(None, lambda: truncate_plan(session, name, to=point))
        await loop.run_in_executor(None, apply, plan)
        truncated_at = max(acked)
        report = await loop.run_in_executor(None, gc_now, env)
        assert report["logs"] and report["logs"][0]["segments_collected"] > 0 and report["bytes_reclaimed"] > 0
        await eventually(lambda: max(acked) > truncated_at + 200, 30, "the writer appending on after the truncation and gc")
        stop.set()
        await producer
        produced.set()
        await asyncio.wait_for(consumer, 30)

        # The writer was never fenced or disturbed; the tailing reader missed nothing.
        assert writer.error is None
        last = max(acked)
        assert [r.txid for r in got] == list(range(300, last + 1))
        assert [r.dlsn for r in got] == [acked[i] for i in range(300, last + 1)]
        assert tail.truncation_skips == []
        await tail.close()
        await writer.close()

        # A reader asked to start before the point starts at the min-active DLSN, and says so.
        fresh_meta = env.new_meta()
        async with LogReader(fresh_meta, env.pool(fresh_meta), name, start_dlsn=DLSN(1, 0, 0)) as early:
            first = await early.read_next(timeout=10)
            assert first is not None and (first.dlsn, first.txid) == (point, cut)
            assert [s.start for s in early.truncation_skips] == [point]
        # From the beginning: the truncation point is where the log now starts (no complaint).
        async with LogReader(fresh_meta, env.pool(fresh_meta), name) as start:
            first = await start.read_next(timeout=10)
            assert first is not None and first.txid == cut and start.truncation_skips == []

    run(scenario(), timeout=150)

    segments = {s.value.seq: s.value for s in env.meta.segments(name)}
    point = TruncationStore(env.meta).get(name).value.point
    assert min(segments) == point.segment_seq  # everything before was collected
    boundary = segments[point.segment_seq]
    assert boundary.state is SegmentState.PARTIALLY_TRUNCATED and boundary.min_active_entry == point.entry_id
    for agent in env.cluster.agents.values():
        held = {i.segment_seq for i in agent.client().list_segments()}
        assert not {s for s in held if s < point.segment_seq}, f"{agent.node_id} still holds truncated replicas"


def test_a_reader_overtaken_by_truncation_and_gc_continues_at_the_point(env):
    name = "overtaken"
    env.meta.create_log(name, LogConfig(3, 3, 2))

    async def scenario():
        writer = await env.writer(name, roll_bytes=4096, batch_bytes=1024)
        acked = await fill(writer, 0, 300)
        rmeta = env.new_meta()
        from dlctl.log.reader import ReadAhead

        async with LogReader(rmeta, env.pool(rmeta), name, read_ahead=ReadAhead(max_entries=1)) as slow:
            first = await slow.read_next(timeout=10)
            assert first is not None and first.txid == 0
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: apply_truncation(env.meta, name, acked[200], reason="test", by="test"))
            await loop.run_in_executor(None, gc_now, env)
            # It was at the very start; it goes on at the point without an error, and says so.
            txids = [first.txid]
            while txids[-1] != 299:
                record = await slow.read_next(timeout=10)
                assert record is not None
                txids.append(record.txid)
            # What it had already fetched (one entry of read-ahead) it delivers; then the point.
            before = txids[: txids.index(200)]
            assert before == list(range(len(before))) and len(before) < 40
            assert txids[len(before):] == list(range(200, 300))
            assert [s.start for s in slow.truncation_skips] == [acked[200]]
        await writer.close()

    run(scenario(), timeout=90)


# -- refusals, force, idempotence --------------------------------------------------------------------


def test_truncate_refuses_the_in_progress_segment_and_a_pin_naming_the_stream_unless_forced(env, capsys):
    name = "guarded"
    env.meta.create_log(name, LogConfig(3, 3, 2))

    async def scenario():
        loop = asyncio.get_running_loop()
        cli = lambda *argv: loop.run_in_executor(None, lambda: env.dlctl(capsys, *argv))
        first = await env.writer(name, roll_bytes=4096, batch_bytes=1024)
        await fill(first, 0, 200)
        await first.close()
        writer = await env.writer(name)  # rolls at 256 MiB: its segment stays in progress
        await fill(writer, 200, 10)
        segments = env.meta.segments(name)
        live = segments[-1].value
        assert live.state is SegmentState.INPROGRESS
        before = [s.value for s in segments]

        code, _, err = await cli("--yes", "truncate", name, "--to", f"{live.seq}/1/0")
        assert code == ExitCode.REFUSED and f"segment {live.seq}" in err and "in progress" in err, (code, _, err)

        PinStore(env.meta).set(PinRecord(holder="east-to-west", log=name, position=DLSN(3, 0, 0), sink_cluster="west"))
        code, _, err = await cli("--yes", "truncate", name, "--to", "5/0/0")
        assert code == ExitCode.REFUSED and "east-to-west" in err and "3/0/0" in err and "west" in err
        # At the pin exactly is allowed; the dry run changes nothing.
        code, plan, _ = await cli("truncate", name, "--to", "3/0/0", "--dry-run")
        assert code == 0 and plan["dry_run"] and plan["steps"][0]["params"]["segments_truncated"] == 2
        assert [s.value for s in env.meta.segments(name)] == before and TruncationStore(env.meta).get(name) is None

        code, result, _ = await cli("--yes", "truncate", name, "--to", "5/0/0", "--force")
        assert code == 0 and result["ok"], result
        pin = PinStore(env.meta).get("east-to-west", name).value
        assert pin.needs_bootstrap and "forced truncation" in pin.reason and "5/0/0" in pin.reason
        states = {s.value.seq: s.value.state for s in env.meta.segments(name)}
        assert all(states[s] is SegmentState.TRUNCATED for s in range(1, 5)) and states[5] is SegmentState.COMPLETED
        assert states[live.seq] is SegmentState.INPROGRESS
        # The writer goes on as if nothing happened.
        more = await fill(writer, 210, 50)
        assert writer.error is None and len(more) == 50
        await writer.close()

    run(scenario(), timeout=90)


def test_truncate_is_idempotent_and_never_moves_the_point_backwards(env, capsys):
    name = "idempotent"
    env.meta.create_log(name, LogConfig(3, 3, 2))

    async def write():
        writer = await env.writer(name, roll_bytes=4096, batch_bytes=1024)
        acked = await fill(writer, 0, 200)
        await writer.close()
        return acked

    acked = run(write())
    point = acked[77]
    code, result, _ = env.dlctl(capsys, "--yes", "truncate", name, "--to", str(point))
    assert code == 0 and result["steps"][0]["result"]["moved"] is True
    after_first = [s.value for s in env.meta.segments(name)]
    for again in (str(point), "1/0/0", f"{point.segment_seq}/0/0"):
        code, plan, _ = env.dlctl(capsys, "--yes", "truncate", name, "--to", again)
        assert code == 0 and plan["steps"] == [] and "never moves backwards" in plan["notes"][0], plan
    assert TruncationStore(env.meta).get(name).value.point == point
    assert [s.value for s in env.meta.segments(name)] == after_first
    assert not marks_for(after_first, point)

    # By txid: the point is the record with that txid, to the slot.
    code, result, _ = env.dlctl(capsys, "--yes", "truncate", name, "--before-txid", "120")
    assert code == 0 and result["steps"][0]["result"]["point"] == str(acked[120])
    code, shown, _ = env.dlctl(capsys, "log", "show", name)
    assert shown["truncated_before"] == str(acked[120])

    async def read_from_txid():
        meta = env.new_meta()
        async with LogReader(meta, env.pool(meta), name, start_txid=100) as reader:
            record = await reader.read_next(timeout=10)
            return record, list(reader.truncation_skips)

    record, skips = run(read_from_txid())
    assert record.txid == 120 and record.dlsn == acked[120]
    assert skips and skips[0].requested == "txid 100"

    # Nothing completed is older than a day: nothing to do.
    code, plan, _ = env.dlctl(capsys, "--yes", "truncate", name, "--older-than", "1d")
    assert code == 0 and plan["steps"] == []


# -- races -------------------------------------------------------------------------------------------


def test_racing_truncations_converge_on_the_largest_point_by_cas(env):
    name = "race"
    env.meta.create_log(name, LogConfig(3, 3, 2))

    async def write():
        writer = await env.writer(name, roll_bytes=2048, batch_bytes=512)
        acked = await fill(writer, 0, 600)
        await writer.close()
        return acked

    acked = run(write())
    rng = random.Random(7)
    points = [acked[rng.randrange(0, 600)] for _ in range(24)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def truncator(k: int) -> None:
        meta = env.new_meta()
        barrier.wait()
        for p in points[k::4]:
            try:
                apply_truncation(meta, name, p, reason=f"racer {k}", by=f"racer {k}")
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    threads = [threading.Thread(target=truncator, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    winner = max(points)
    assert TruncationStore(env.meta).get(name).value.point == winner
    segments = [s.value for s in read_segments(env.meta, name)]
    assert not marks_for(segments, winner)  # every mark the largest point asks for is in place
    for s in segments:  # and none beyond it
        if s.seq > winner.segment_seq:
            assert s.state is SegmentState.COMPLETED and s.min_active_entry == 0

    async def first_record():
        meta = env.new_meta()
        async with LogReader(meta, env.pool(meta), name) as reader:
            return await reader.read_next(timeout=10)

    first = run(first_record())
    assert first.dlsn == winner and acked[first.txid] == winner


def test_a_truncation_racing_an_ownership_change_loses_nothing(env):
    name = "takeover"
    env.meta.create_log(name, LogConfig(3, 3, 2))

    async def scenario():
        loop = asyncio.get_running_loop()
        old = await env.writer(name, roll_bytes=2048, batch_bytes=512)
        acked = await fill(old, 0, 500)
        pending = {i: old.submit(payload(i)) for i in range(500, 700)}  # in flight at the takeover
        live = env.meta.segments(name)[-1].value
        assert live.state is SegmentState.INPROGRESS
        point = DLSN(live.seq, 0, 0)  # everything before the in-progress segment
        truncation = loop.run_in_executor(None, lambda: apply_truncation(env.new_meta(), name, point, reason="race", by="test"))
        # The old owner's ZooKeeper session ends (as when its process dies): a new owner takes
        # over, fences and recovers its in-progress segment, while the truncation runs.
        await loop.run_in_executor(None, old.meta.client.stop)
        new = await env.writer(name, ownership_wait=10.0)
        result = await truncation
        assert result["point"] == str(point)
        for i, fut in pending.items():
            try:
                acked[i] = await fut
            except WriterError:
                pass  # not acknowledged: may or may not be in the log
        more = await fill(new, new.last_txid + 1, 50)
        await new.close()
        return point, acked, more

    point, acked, more = run(scenario(), timeout=120)
    # Every acknowledged record at or after the point is still there, in order, exactly once.
    meta = env.new_meta()

    async def read_all():
        async with LogReader(meta, env.pool(meta), name) as reader:
            out = []
            while (record := await reader.read_next(timeout=3)) is not None:
                out.append((record.txid, record.dlsn))
            return out

    records = run(read_all())
    kept = {i: d for i, d in acked.items() if d >= point}
    assert kept, "nothing of the old writer's in-progress segment was acknowledged: the test proves nothing"
    by_txid = dict(records)
    assert len(by_txid) == len(records)
    assert all(by_txid.get(i) == d for i, d in kept.items())
    assert all(by_txid.get(i) == d for i, d in more.items())
    assert min(d for _, d in records) >= point
    recovered = env.meta.get_segment(name, point.segment_seq).value
    assert recovered.state is SegmentState.COMPLETED  # closed by the new owner, never marked
