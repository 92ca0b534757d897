"""Fencing and recovery against real ZooKeeper and three real agent processes.

Ports of BookKeeper's TestFencing, LedgerRecoveryTest, LedgerRecovery2Test and
ParallelLedgerRecoveryTest scenarios. Crashed writers are simulated for real (a child process
SIGKILLed mid-stream, a ZooKeeper session cut off by a partition) or, where the scenario needs an
exact replica layout, by storing entries on chosen agents with the plain agent client.
Everything is read back directly from the agents over the segment metadata.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import pytest

from dlctl.log import format as fmt
from dlctl.log.dlsn import DLSN
from dlctl.log.errors import FencedError, NoSuchEntryError
from dlctl.log.pool import AgentPool
from dlctl.log.records import Record, encode_records
from dlctl.log.recovery import RecoveryError, fence_log, recover_log, recover_segment
from dlctl.log.writer import LogWriter, WriterDeposedError
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.meta.store import MetaStore
from harness import owner_child
from harness.procs import wait_until
from harness.logcluster import NODES, LogEnv, agent_cluster, eventually, healed_env, run
from harness.logcluster import read_back as read_back_all

pytestmark = [pytest.mark.zk, pytest.mark.agent]



@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    yield from agent_cluster(zk_server, tmp_path_factory.mktemp("recovery-agents"), "recovery")


class Env(LogEnv):
    def in_progress_segment(self, seq: int = 1, nodes: tuple[str, ...] = NODES) -> SegmentRecord:
        """Metadata as a writer that crashed right after creating segment ``seq`` leaves it."""
        meta = self.meta()
        record = SegmentRecord(seq, SegmentState.INPROGRESS, (EnsembleChange(0, nodes),), 3, 2, time.time(), writer="crashed", first_txid=0)
        meta.create_segment(self.name, meta.get_log(self.name), record)
        return record


@pytest.fixture
def env(cluster, request):
    yield from healed_env(cluster, request.node.name, Env)


async def read_back(meta: MetaStore, pool: AgentPool, name: str) -> list[tuple[DLSN, Record]]:
    """Every data record of the log's completed segments (recovery completes them all)."""
    return await read_back_all(meta, pool, name, require_completed=True)


def raw_entry(log_id: int, entry_id: int, lac: int, seq: int = 1) -> bytes:
    """An entry as some other writer would store it: one record with txid = entry id, no totals."""
    payload = encode_records([Record(txid=entry_id, payload=f"raw-{entry_id}".encode())])
    return fmt.encode(fmt.Entry(log_id, seq, entry_id, lac, payload))


async def place(pool: AgentPool, log_id: int, layout: dict[int, tuple[tuple[str, ...], int]]) -> None:
    """Store entry id -> (agents, LAC it carries) exactly where the scenario wants it."""
    for entry_id, (nodes, lac) in sorted(layout.items()):
        for node in nodes:
            await (await pool.client(node)).add(raw_entry(log_id, entry_id, lac))


async def holders(pool: AgentPool, log_id: int, entry_id: int, seq: int = 1) -> set[str]:
    found = set()
    for node in NODES:
        try:
            await (await pool.client(node)).read(log_id, seq, entry_id)
            found.add(node)
        except NoSuchEntryError:
            pass
    return found


async def crash(writer: LogWriter) -> None:
    """The writer's process vanishes: its agent connections drop and its session ends."""
    await writer.pool.close()
    await asyncio.get_running_loop().run_in_executor(None, writer.meta.client.stop)


async def write_and_crash(env: Env, count: int) -> list[DLSN]:
    writer = await env.writer()
    dlsns = await asyncio.gather(*(writer.submit(f"rec-{i}".encode()) for i in range(count)))
    for i in range(count, count + 50):  # some in flight, never acknowledged
        writer.submit(f"rec-{i}".encode())
    await crash(writer)
    return list(dlsns)


def assert_prefix_with_every_acknowledged(back: list[tuple[DLSN, Record]], acked: list[DLSN]) -> None:
    txids = [r.txid for _, r in back]
    assert txids == list(range(len(txids))), "records out of order, duplicated or with a gap"
    assert all(r.payload == f"rec-{r.txid}".encode() for _, r in back)
    assert len(back) >= len(acked) and [d for d, _ in back[: len(acked)]] == acked


# -- LedgerRecoveryTest / LedgerRecovery2Test ---------------------------------------------------


def test_recovery_of_an_empty_segment_closes_it_with_no_entries_and_the_next_owner_goes_on(env):
    env.create_log()
    env.in_progress_segment()

    async def scenario():
        writer = await env.writer()
        (result,) = await writer.recovery_done()
        assert (result.segment_seq, result.lac, result.last_entry_id, result.records) == (1, -1, -1, 0)
        assert result.closed_by_us
        assert await writer.append(b"first") == DLSN(2, 0, 0)
        assert writer.last_txid == 0
        await writer.close()
        meta = env.meta()
        first = meta.segments(env.name)[0].value
        assert (first.state, first.last_entry_id, first.records, first.bytes) == (SegmentState.COMPLETED, -1, 0, 0)
        pool = env.pool(meta)
        for node in NODES:  # fencing an unknown replica leaves it empty and fenced
            infos = await (await pool.client(node)).list_segments()
            assert any(i.segment_seq == 1 and i.fenced and i.entries == 0 for i in infos)

    run(scenario())


def test_recovery_reads_past_the_lac_and_rewrites_recovered_entries_to_their_whole_write_set(env):
    log_id = env.create_log()
    env.in_progress_segment()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta)
        layout = {e: (NODES, e - 1) for e in range(5)}
        layout[5] = (("n1", "n2"), 4)  # acknowledged by A=2, never re-published
        await place(pool, log_id, layout)
        (result,) = await recover_log(meta, pool, env.name)
        assert (result.lac, result.last_entry_id, result.recovered_entries) == (4, 5, 1)
        assert (result.records, result.first_txid, result.last_txid) == (6, 0, 5)  # counted by scanning: no totals
        await eventually(lambda: _has(pool, log_id, "n3", 5), 5, "entry 5 re-written to n3")
        seg = meta.segments(env.name)[0].value
        assert (seg.state, seg.last_entry_id, seg.records) == (SegmentState.COMPLETED, 5, 6)

    run(scenario())


async def _has(pool: AgentPool, log_id: int, node: str, entry_id: int) -> bool:
    try:
        await (await pool.client(node)).read(log_id, 1, entry_id)
        return True
    except NoSuchEntryError:
        return False


def test_recovery_stops_at_the_first_entry_that_w_minus_a_plus_1_replicas_lack_even_if_later_ones_exist(env):
    log_id = env.create_log()
    env.in_progress_segment()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta)
        # Entry 3 is on no replica; entry 4 (written by a writer that never got 3 acknowledged,
        # so it cannot have been acknowledged either) must not be recovered.
        await place(pool, log_id, {0: (NODES, -1), 1: (NODES, 0), 2: (NODES, 1), 4: (NODES, 2)})
        (result,) = await recover_log(meta, pool, env.name)
        assert (result.lac, result.last_entry_id, result.recovered_entries) == (2, 2, 0)
        back = await read_back(meta, pool, env.name)
        assert [r.txid for _, r in back] == [0, 1, 2]

    run(scenario())


def test_unreachable_replicas_count_as_unknown_never_as_absent(env):
    log_id = env.create_log()
    env.in_progress_segment()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta, request_timeout=2.0)
        await place(pool, log_id, {0: (NODES, -1), 1: (NODES, 0), 2: (NODES, 1), 3: (("n1", "n2"), 2)})
        env.cluster.agents["n2"].proc.kill()
        # Entry 3: n1 has it, n3 lacks it, n2 is down. Were n2 counted absent, W - A + 1 = 2
        # "absent" votes could end the segment at 2 and lose an acknowledged entry.
        (result,) = await recover_log(meta, pool, env.name)
        assert (result.last_entry_id, result.recovered_entries) == (3, 1)
        assert "n2" in result.unreachable
        assert await _has(pool, log_id, "n3", 3)  # re-written: A replicas hold it before the close

    run(scenario())


def test_recovery_refuses_to_guess_when_too_many_replicas_are_unreachable(env):
    log_id = env.create_log()
    env.in_progress_segment()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta, request_timeout=1.0)
        await place(pool, log_id, {0: (NODES, -1)})
        for node in ("n1", "n2"):
            env.cluster.agents[node].proc.kill()
        with pytest.raises(RecoveryError, match=r"cannot fence segment 1 .* needs 2 fenced replicas of 3") as info:
            await recover_log(meta, pool, env.name, timeout=1.5)
        assert "n1" in str(info.value) and "n2" in str(info.value)
        assert meta.segments(env.name)[0].value.state is SegmentState.INPROGRESS  # nothing decided

    run(scenario())


def test_unclean_recovery_only_on_request_closes_at_the_last_readable_entry_and_names_the_range_at_risk(env):
    """Entries 0..9 on every replica, 10..14 acknowledged by n2 and n3 only; n2 and n3 are gone
    for good. Plain recovery refuses; with accept_data_loss the segment closes at 9 and the
    report says exactly what the scenario lost: entries from 10 on, held by n2 and n3."""
    log_id = env.create_log()
    env.in_progress_segment()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta, request_timeout=1.0)
        acknowledged = {i: (NODES, i - 1) for i in range(10)} | {i: (("n2", "n3"), i - 1) for i in range(10, 15)}
        await place(pool, log_id, acknowledged)
        for node in ("n2", "n3"):
            env.cluster.agents[node].proc.kill()
        with pytest.raises(RecoveryError):
            await recover_log(meta, pool, env.name, timeout=1.5)
        assert meta.segments(env.name)[0].value.state is SegmentState.INPROGRESS  # refused: nothing decided

        (result,) = await recover_log(meta, pool, env.name, timeout=1.5, accept_data_loss=True)
        lost = sorted(i for i, (nodes, _lac) in acknowledged.items() if "n1" not in nodes)  # the oracle: what n1 never had
        assert result.last_entry_id == lost[0] - 1 == 9
        risk = result.at_risk.to_dict()
        assert risk["first_entry"] == lost[0] and set(risk["unknown_replicas"]) == {"n2", "n3"}
        assert risk["under_ack_quorum"] == {"9": 1}  # the recovered entry 9 could only be re-written to n1
        assert [r.txid for _, r in await read_back(meta, pool, env.name)] == list(range(10))

    run(scenario())


def test_unclean_recovery_of_a_healthy_segment_reports_nothing_at_risk(env):
    log_id = env.create_log()
    env.in_progress_segment()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta)
        await place(pool, log_id, {i: (NODES, i - 1) for i in range(5)})
        (result,) = await recover_log(meta, pool, env.name, accept_data_loss=True)
        assert result.last_entry_id == 4 and result.at_risk is None and "at_risk" not in result.to_dict()

    run(scenario())


def test_recovery_with_one_agent_of_the_ensemble_down_recovers_every_acknowledged_record(env):
    env.create_log()

    async def scenario():
        acked = await write_and_crash(env, 1500)
        env.cluster.agents["n2"].proc.kill()
        writer = await env.writer(request_timeout=2.0)
        (result,) = await writer.recovery_done()
        assert result.last_entry_id >= acked[-1].entry_id and result.records >= len(acked)
        await writer.close()
        meta = env.meta()
        back = await read_back(meta, env.pool(meta), env.name)
        assert_prefix_with_every_acknowledged(back, acked)
        assert len(back) == result.records

    run(scenario())


def test_recovery_with_one_agent_slow_does_not_wait_for_it(env):
    env.create_log()

    async def scenario():
        acked = await write_and_crash(env, 1500)
        env.cluster.agents["n3"].proc.pause()  # SIGSTOP: connections stay open, nothing answers
        meta = env.meta()
        started = time.monotonic()
        (result,) = await recover_log(meta, env.pool(meta, request_timeout=10.0), env.name)
        assert time.monotonic() - started < 5  # well below the 10 s request timeout
        assert "n3" in result.unreachable and set(result.fenced) == {"n1", "n2"}
        env.cluster.agents["n3"].proc.resume()
        back = await read_back(meta, env.pool(meta), env.name)
        assert_prefix_with_every_acknowledged(back, acked)

    run(scenario())


# -- ParallelLedgerRecoveryTest ------------------------------------------------------------------


def test_two_recoveries_in_parallel_agree_on_the_same_last_entry(env):
    log_id = env.create_log()
    env.in_progress_segment()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta)
        layout = {e: (NODES, e - 1) for e in range(20)}
        layout[20] = (("n1",), 19)  # on one replica only: the two recoveries may see it differently
        await place(pool, log_id, layout)
        metas = [env.meta(), env.meta()]
        results = await asyncio.gather(*(recover_log(m, env.pool(m), env.name) for m in metas))
        ends = {r[0].last_entry_id for r in results}
        assert len(ends) == 1 and ends <= {19, 20}
        assert sum(r[0].closed_by_us for r in results) == 1  # the CAS picked one, the other adopted it
        seg = meta.segments(env.name)[0].value
        assert seg.last_entry_id in ends and seg.records == seg.last_entry_id + 1

    run(scenario())


def test_a_writer_closing_while_a_recovery_runs_settles_on_one_end_with_every_acknowledged_record(env):
    env.create_log()

    async def scenario():
        writer = await env.writer()
        acked = list(await asyncio.gather(*(writer.submit(f"rec-{i}".encode()) for i in range(500))))
        meta = env.meta()
        log_id = meta.get_log(env.name).value.log_id
        (in_progress,) = meta.segments(env.name)
        closing, result = await asyncio.gather(
            writer.close(), recover_segment(meta, env.pool(meta), env.name, log_id, in_progress), return_exceptions=True
        )
        assert closing is None or isinstance(closing, WriterDeposedError)  # the recovery won the CAS
        seg = meta.segments(env.name)[0].value
        assert (seg.state, seg.records, seg.last_txid) == (SegmentState.COMPLETED, 500, 499)
        assert result.last_entry_id == seg.last_entry_id and result.closed_by_us == (closing is not None)
        back = await read_back(meta, env.pool(meta), env.name)
        assert [d for d, _ in back] == acked

    run(scenario())


# -- TestFencing ---------------------------------------------------------------------------------


def test_deposed_writer_gets_fencing_errors_and_nothing_it_writes_after_the_fence_is_visible(env, fault_network):
    """Its ZooKeeper session expires (partitioned from ZooKeeper, not from the agents) while it
    keeps writing; a second writer takes over."""
    env.create_log()
    server = env.cluster.ns.backend
    zk_proxy = fault_network.proxy((server.host, server.client_port), name="zk-of-first-writer")

    async def scenario():
        first = await env.writer(session_timeout=1.0, connect=f"{zk_proxy.host}:{zk_proxy.port}{env.cluster.ns.path}")
        outcome: dict[int, Any] = {}
        submitted_after_takeover: list[int] = []
        takeover_done = asyncio.Event()

        async def keep_writing() -> None:
            i = 0
            while True:
                try:
                    fut = first.submit(f"rec-{i}".encode())
                except WriterDeposedError as exc:
                    outcome[i] = exc
                    return
                if takeover_done.is_set():
                    submitted_after_takeover.append(i)
                fut.add_done_callback(lambda f, i=i: outcome.__setitem__(i, f.exception() or f.result()))
                i += 1
                await asyncio.sleep(0.002)

        producer = asyncio.ensure_future(keep_writing())
        await eventually(lambda: sum(isinstance(v, DLSN) for v in outcome.values()) >= 100, 10, "100 acknowledged")
        zk_proxy.blackhole()  # the first writer can no longer reach ZooKeeper, but still the agents
        second = await env.writer(ownership_wait=20)
        (recovered,) = await second.recovery_done()  # fenced (open may return before: a fast takeover)
        takeover_done.set()
        await asyncio.wait_for(producer, 10)
        errors = [v for v in outcome.values() if isinstance(v, BaseException)]
        assert errors and all(isinstance(e, WriterDeposedError) for e in errors)
        assert any("fenced" in e.message for e in errors)  # deposed by fencing: its session news never came
        assert await second.append(b"from the second writer") == DLSN(2, 0, 0)
        await second.close()

        acked = sorted(i for i, v in outcome.items() if isinstance(v, DLSN))
        meta = env.meta()
        back = await read_back(meta, env.pool(meta), env.name)
        visible = [int(r.payload.split(b"-")[1]) for d, r in back if d.segment_seq == 1]
        assert visible == list(range(len(visible)))  # a prefix of what it submitted, no gaps
        assert set(acked) <= set(visible)  # every acknowledged record survived the takeover
        assert not set(submitted_after_takeover) & set(visible)  # nothing written after the fence
        assert all(not isinstance(outcome.get(i), DLSN) for i in submitted_after_takeover)
        assert len(visible) == recovered.records
        zk_proxy.blackhole(False)

    run(scenario(), timeout=60)


def test_first_writer_cannot_commit_an_entry_after_second_writer_closes_the_segment(env):
    env.create_log()

    async def scenario():
        first = await env.writer()
        acked = [await first.append(f"rec-{i}".encode()) for i in range(10)]
        meta = env.meta()
        (result,) = await recover_log(meta, env.pool(meta), env.name)  # fence + close, as `dlctl recover`
        assert (result.records, result.last_txid) == (10, 9)
        with pytest.raises(WriterDeposedError, match="fenced by a newer writer"):
            await first.append(b"after the close")
        with pytest.raises(WriterDeposedError):
            first.submit(b"later still")
        await first.close()
        seg = meta.segments(env.name)[0].value
        assert (seg.state, seg.last_entry_id, seg.records) == (SegmentState.COMPLETED, result.last_entry_id, 10)
        back = await read_back(meta, env.pool(meta), env.name)
        assert [d for d, _ in back] == acked

    run(scenario())


def test_fencing_alone_deposes_the_writer_and_the_next_owner_closes_the_segment(env):
    env.create_log()

    async def scenario():
        first = await env.writer(owner_id="first")
        acked = [await first.append(f"rec-{i}".encode()) for i in range(5)]
        meta = env.meta()
        outcome = await fence_log(meta, env.pool(meta), env.name)  # as `dlctl fence`
        assert list(outcome) == [1] and len(outcome[1].fenced) >= 2
        assert meta.segments(env.name)[0].value.state is SegmentState.INPROGRESS  # fenced, not closed
        with pytest.raises(WriterDeposedError, match="fenced"):
            await first.append(b"refused")
        await first.close()  # gives up ownership
        second = await env.writer(owner_id="second")
        (result,) = await second.recovery_done()
        await second.close()
        back = await read_back(meta, env.pool(meta), env.name)
        assert [d for d, _ in back[:5]] == acked and len(back) == result.records
        # The refused add may have reached a replica not fenced yet (fencing needs W - A + 1 of
        # them): never acknowledged, it may or may not be recovered — but only ever after the rest.
        assert [r.payload for _, r in back[5:]] in ([], [b"refused"])

    run(scenario())


def test_fenced_replicas_refuse_the_old_writers_adds_but_accept_recovery_adds(env):
    log_id = env.create_log()
    env.in_progress_segment()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta)
        await place(pool, log_id, {0: (NODES, -1)})
        (result,) = await recover_log(meta, pool, env.name)
        # Recovery goes on once W - A + 1 replicas answered the fence; a slow one is fenced later.
        assert len(result.fenced) >= 2
        for node in result.fenced:
            client = await pool.client(node)
            with pytest.raises(FencedError):
                await client.add(raw_entry(log_id, 1, 0))
            await client.add(raw_entry(log_id, 0, -1), recovery=True)  # idempotent recovery add

    run(scenario())


# -- an owner SIGKILLed mid-stream ---------------------------------------------------------------

def test_owner_sigkilled_mid_stream_next_owner_recovers_every_acknowledged_record_in_order_without_duplicates(env, tmp_path):
    env.create_log()
    acked_path = tmp_path / "acked.txt"
    node = env.cluster.agents["n1"]
    child = env.cluster.procs.start(
        [sys.executable, owner_child.SCRIPT, env.cluster.ns.connect_string, env.name, node.secret_file, node.zk_auth_file, acked_path], name="owner-child", env=owner_child.env(node)
    )

    wait_until(lambda: len(owner_child.acked_records(acked_path)) >= 3000, 30, message="3000 acknowledged records", watch=child)
    child.kill()
    acked = [(i, DLSN.parse(d)) for i, d in owner_child.acked_records(acked_path)]

    async def scenario():
        writer = await env.writer(ownership_wait=20)
        (result,) = await writer.recovery_done()
        await writer.close()
        meta = env.meta()
        back = await read_back(meta, env.pool(meta), env.name)
        assert [i for i, _ in acked] == list(range(len(acked)))  # acknowledged in order
        assert_prefix_with_every_acknowledged(back, [d for _, d in acked])
        assert len(back) == result.records

    run(scenario(), timeout=60)
