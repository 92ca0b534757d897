"""The log writer against real ZooKeeper and three real agent processes.

Everything written is read back directly from the agents (``AgentClient.read`` over the segment
metadata), not through the log reader, so these tests judge the writer alone. The agents are
shared by the module; a test that kills or pauses one gets it back before the next test.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from dlctl.errors import ConflictError
from dlctl.log import format as fmt
from dlctl.log.dlsn import DLSN
from dlctl.log.errors import NoSuchEntryError
from dlctl.log.ownership import OwnershipError
from dlctl.log.records import Record, decode_records
from dlctl.log.writer import LogWriter, TxidOrderError, WriterClosedError, WriterDeposedError, WriterError
from dlctl.meta.records import LogConfig, SegmentState
from harness.agents import AgentNode
from harness.procs import wait_until
from harness.logcluster import CLUSTER, agent_cluster, eventually, healed_env, read_back, read_entry, run
from harness.zk import expire_session

pytestmark = [pytest.mark.zk, pytest.mark.agent]



@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    yield from agent_cluster(zk_server, tmp_path_factory.mktemp("writer-agents"), "writer")


@pytest.fixture
def env(cluster, request):
    """Per test: a fresh log name and a way to make writers (each with its own ZooKeeper session)."""
    yield from healed_env(cluster, request.node.name)


# -- appending -----------------------------------------------------------------------------------


def test_pipelined_appends_are_acknowledged_in_order_and_read_back_exactly(env):
    env.create_log()

    async def scenario():
        writer = await env.writer()
        futures = [writer.submit(f"record-{i}".encode()) for i in range(3000)]
        dlsns = await asyncio.gather(*futures)
        await writer.close()
        assert dlsns == sorted(dlsns) and len(set(dlsns)) == len(dlsns)
        meta = env.meta()
        back = await read_back(meta, env.pool(meta), env.name)
        assert [r.payload for _, r in back] == [f"record-{i}".encode() for i in range(3000)]
        assert [r.txid for _, r in back] == list(range(3000))  # writer-assigned: last + 1 from 0
        assert [d for d, _ in back] == dlsns
        (seg,) = meta.segments(env.name)
        assert seg.value.state is SegmentState.COMPLETED
        assert (seg.value.records, seg.value.first_txid, seg.value.last_txid) == (3000, 0, 2999)
        assert seg.value.last_entry_id == dlsns[-1].entry_id

    run(scenario())


def test_a_record_held_back_while_an_entry_is_in_flight_goes_out_when_that_entry_is_acknowledged(env):
    """Records submitted while an entry is in flight wait for the batch (Nagle), but only until
    nothing is in flight: they waited the whole batch_delay, which a lone append met when the
    idle LAC's control entry was still in flight (found beside CPU burners). Two of the three
    agents are paused so the first entry stays in flight as long as the test wants."""
    env.create_log()

    async def scenario():
        writer = await env.writer(batch_delay=30.0, request_timeout=60.0)
        await writer.append(b"first")  # the segment exists; the write set is every agent
        paused = [a for name, a in env.cluster.agents.items() if name != "n1"]
        for agent in paused:
            agent.proc.pause()
        try:
            held = writer.submit(b"in flight")  # goes out at once: nothing was in flight
            await asyncio.sleep(0)
            behind = writer.submit(b"behind it")  # something is in flight: waits for the batch
            await asyncio.sleep(0.5)
            assert not held.done() and not behind.done()
        finally:
            for agent in paused:
                agent.proc.resume()
        await asyncio.wait_for(behind, 10)  # not the 30 s batch_delay
        assert held.result() < behind.result()
        await writer.close()

    run(scenario(), timeout=120)


def test_batching_packs_concurrent_records_into_few_entries_and_a_lone_append_goes_out_at_once(env):
    env.create_log()

    async def scenario():
        writer = await env.writer(batch_delay=3.0)
        dlsns = await asyncio.gather(*(writer.submit(b"x" * 100) for _ in range(1000)))
        assert len({d.entry_id for d in dlsns}) <= 3  # submitted together: batched together
        started = time.monotonic()
        await writer.append(b"alone")  # nothing in flight: not held back for batch_delay
        assert time.monotonic() - started < 2.0
        await writer.close()

    run(scenario())


def test_entries_are_cut_by_size(env):
    env.create_log()

    async def scenario():
        writer = await env.writer(batch_bytes=4096, batch_delay=0.3)
        dlsns = await asyncio.gather(*(writer.submit(b"y" * 1000) for _ in range(40)))
        per_entry: dict[int, int] = {}
        for d in dlsns:
            per_entry[d.entry_id] = per_entry.get(d.entry_id, 0) + 1
        assert len(per_entry) >= 10 and max(per_entry.values()) <= 4
        await writer.close()

    run(scenario())


def test_application_txids_must_increase_and_a_refused_one_appends_nothing(env):
    env.create_log()

    async def scenario():
        writer = await env.writer()
        await writer.append(b"a", txid=10)
        await writer.append(b"b", txid=20)
        for bad in (20, 15):
            with pytest.raises(TxidOrderError, match=f"txid {bad} refused.*last one is 20"):
                writer.submit(b"c", txid=bad)
        await writer.append(b"d")  # writer-assigned continues from the last: 21
        await writer.close()
        meta = env.meta()
        back = await read_back(meta, env.pool(meta), env.name)
        assert [(r.txid, r.payload) for _, r in back] == [(10, b"a"), (20, b"b"), (21, b"d")]

    run(scenario())


def test_keys_and_headers_round_trip_and_control_records_cannot_be_appended(env):
    env.create_log()

    async def scenario():
        writer = await env.writer()
        await writer.append(b"p1", key=b"k1", headers={"h": b"v"})
        await writer.append(Record(txid=100, payload=b"p2", key=b"k2"))
        with pytest.raises(ValueError, match="control records"):
            writer.submit(Record(txid=200, payload=b"", control=True))
        await writer.close()
        meta = env.meta()
        back = [r for _, r in await read_back(meta, env.pool(meta), env.name)]
        assert [(r.txid, r.key, dict(r.headers), r.payload) for r in back] == [
            (0, b"k1", {"h": b"v"}, b"p1"),
            (100, b"k2", {}, b"p2"),
        ]

    run(scenario())


def test_an_idle_writer_publishes_the_lac_with_a_control_record_so_readers_see_the_tail(env):
    env.create_log()

    async def scenario():
        writer = await env.writer()
        dlsn = await writer.append(b"only")
        meta = env.meta()
        pool = env.pool(meta)
        log_id = meta.get_log(env.name).value.log_id
        (seg,) = meta.segments(env.name)
        # Without the control entry every replica would stay at LAC -1: entry 0 carried LAC -1.
        for node in seg.value.ensembles[0].nodes:
            client = await pool.client(node)
            await eventually(lambda c=client: _lac_at_least(c, log_id, seg.value.seq, dlsn.entry_id), 5, f"LAC on {node}")
        entry = fmt.decode(await read_entry(pool, log_id, seg.value, dlsn.entry_id + 1))
        assert entry.is_control and all(r.control for r in decode_records(entry.payload))
        await writer.close()

    run(scenario())


async def _lac_at_least(client, log_id: int, seq: int, entry_id: int) -> bool:
    return await client.read_lac(log_id, seq) >= entry_id


def test_segments_roll_by_size_and_each_completed_one_carries_its_totals(env):
    env.create_log(LogConfig(roll_bytes=20_000))

    async def scenario():
        writer = await env.writer(batch_bytes=2000)
        for i in range(600):
            writer.submit(f"{i:05d}".encode() * 20)
        await writer.close()
        meta = env.meta()
        pool = env.pool(meta)
        back = await read_back(meta, pool, env.name)
        assert [r.txid for _, r in back] == list(range(600))
        segments = [s.value for s in meta.segments(env.name)]
        assert len(segments) >= 3
        assert all(s.state is SegmentState.COMPLETED for s in segments)
        assert [s.seq for s in segments] == list(range(1, len(segments) + 1))
        log_id = meta.get_log(env.name).value.log_id
        for seg in segments:
            mine = [r for d, r in back if d.segment_seq == seg.seq]
            stored = sum([len(await read_entry(pool, log_id, seg, e)) for e in range(seg.last_entry_id + 1)])
            assert (seg.records, seg.first_txid, seg.last_txid, seg.bytes) == (len(mine), mine[0].txid, mine[-1].txid, stored)

    run(scenario())


async def segments_ending_at(meta, pool, name: str, roll_bytes: int) -> list:
    """The log's segments, asserting that in each but the last every entry but the last went out
    while the segment was below ``roll_bytes``."""
    segments = [s.value for s in meta.segments(name)]
    log_id = meta.get_log(name).value.log_id
    for seg in segments[:-1]:
        sizes = [len(await read_entry(pool, log_id, seg, e)) for e in range(seg.last_entry_id + 1)]
        assert sum(sizes[:-1]) < roll_bytes, f"segment {seg.seq}: {sum(sizes)} bytes in {len(sizes)} entries, roll_bytes {roll_bytes}"
    return segments


def test_entries_appended_while_a_roll_looks_for_its_next_ensemble_go_to_the_next_segment(env):
    """A segment ends within one entry of roll_bytes although appends keep arriving while the roll
    asks ZooKeeper and probes agents for the next ensemble. They went into the old segment then,
    so segments overshot roll_bytes by whatever arrived meanwhile (found beside CPU burners: a
    162,505-byte segment against roll_bytes 40,000). Four appenders each wait for their previous
    record, so some record is always being submitted during a roll."""
    roll_bytes = 4_000
    env.create_log(LogConfig(roll_bytes=roll_bytes))

    async def scenario():
        writer = await env.writer()

        async def appender(k: int) -> None:
            for i in range(150):
                await writer.append(f"{k}-{i:04d}".encode() * 25)

        await asyncio.gather(*(appender(k) for k in range(4)))
        await writer.close()
        meta = env.meta()
        pool = env.pool(meta)
        back = await read_back(meta, pool, env.name)
        assert sorted(r.payload for _, r in back) == sorted(f"{k}-{i:04d}".encode() * 25 for k in range(4) for i in range(150))
        segments = await segments_ending_at(meta, pool, env.name, roll_bytes)
        assert len(segments) >= 600 * 150 // roll_bytes // 2

    run(scenario())


def test_a_burst_of_entries_cut_while_a_roll_starts_goes_to_the_next_segment(env):
    """The same when the entries come in one burst: every record submitted in one go, so each
    batch is cut before the roll's task first runs. They went into the old segment (a review
    found it): the roll held entries only once its task had started."""
    roll_bytes = 4_000
    env.create_log(LogConfig(roll_bytes=roll_bytes))
    payloads = [f"{i:04d}".encode() * 25 for i in range(600)]

    async def scenario():
        writer = await env.writer(batch_bytes=300)
        await writer.append(payloads[0])  # the segment is open: the burst goes to it at once
        futures = [writer.submit(p) for p in payloads[1:]]  # no await between them
        await asyncio.gather(*futures)
        await writer.close()
        meta = env.meta()
        pool = env.pool(meta)
        back = await read_back(meta, pool, env.name)
        assert [r.payload for _, r in back] == payloads
        segments = await segments_ending_at(meta, pool, env.name, roll_bytes)
        assert len(segments) >= 600 * 100 // roll_bytes // 2

    run(scenario())


def test_an_open_cancelled_while_it_claims_ownership_leaves_no_owner_behind(env):
    """A writer's open cancelled while its claim of the owner znode is in flight (an agent
    stopping a replication worker that is starting): the create goes through in ZooKeeper's
    thread all the same, and the znode stayed for as long as the session lived (an agent's:
    until it restarts), so no writer could own the log. Cancels at times from 0 to 20 ms after
    the open started cover the claim; none may leave an owner behind."""
    env.create_log()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta)
        for step in range(40):
            task = asyncio.ensure_future(LogWriter.open(meta, pool, env.name, owner_id=f"cancelled-{step}"))
            await asyncio.sleep(step * 0.0005)
            task.cancel()
            (outcome,) = await asyncio.gather(task, return_exceptions=True)
            if isinstance(outcome, LogWriter):
                await outcome.close()  # opened before the cancel: closing lets go
            await eventually(lambda: meta.owner_of(env.name) is None, 5, f"no owner after the cancel at {step * 0.5} ms")
        writer = await LogWriter.open(meta, pool, env.name, ownership_wait=0.0)  # and the log can be owned at once
        await writer.close()

    run(scenario(), timeout=120)


def test_segments_roll_by_time(env):
    env.create_log(LogConfig(roll_seconds=0.3))

    async def scenario():
        writer = await env.writer()
        await writer.append(b"first")
        await eventually(lambda: writer.segment_seq is None, 5, "the time roll")  # completed, next one lazily
        await writer.append(b"second")
        assert writer.segment_seq == 2
        await writer.close()
        meta = env.meta()
        assert [(s.value.seq, s.value.state, s.value.records) for s in meta.segments(env.name)] == [
            (1, SegmentState.COMPLETED, 1),
            (2, SegmentState.COMPLETED, 1),
        ]

    run(scenario())


# -- ownership -----------------------------------------------------------------------------------


def test_a_second_writer_is_refused_with_the_owner_named_or_waits_until_it_closes(env):
    env.create_log()

    async def scenario():
        first = await env.writer(owner_id="first-writer")
        with pytest.raises(OwnershipError, match="owned by first-writer") as info:
            await env.writer(owner_id="second-writer")
        assert isinstance(info.value, ConflictError) and info.value.owner == "first-writer"
        await first.append(b"from first")
        waiting = asyncio.ensure_future(env.writer(owner_id="second-writer", ownership_wait=10))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await first.close()
        second = await waiting
        assert second.recovered == ()  # the first closed its segment cleanly
        assert await second.append(b"from second") == DLSN(2, 0, 0)
        assert second.last_txid == 1
        await second.close()
        with pytest.raises(WriterClosedError):
            second.submit(b"late")

    run(scenario())


def test_a_writer_whose_session_expires_fails_pending_and_later_appends(env):
    env.create_log()

    async def scenario():
        writer = await env.writer(batch_delay=30, flush_when_idle=False)
        await writer.flush()
        pending = writer.submit(b"held in the batch")  # batch_delay keeps it unsent
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, expire_session, writer.meta.client, env.cluster.ns.connect_string)
        with pytest.raises(WriterDeposedError, match="session .* expired"):
            await pending
        with pytest.raises(WriterDeposedError):
            writer.submit(b"after")
        await eventually(lambda: env.meta().owner_of(env.name) is None, 5, "the owner znode to vanish")
        await writer.close()  # quietly: its appends already reported the error

    run(scenario())


# -- agent failures ------------------------------------------------------------------------------


def test_writes_continue_when_one_agent_of_e3_w3_a2_dies_mid_stream_and_every_acknowledged_record_is_readable(env):
    env.create_log(LogConfig(3, 3, 2))

    async def scenario():
        writer = await env.writer(request_timeout=2.0, batch_bytes=2000)
        acked: list[tuple[DLSN, int]] = []
        errors: list[BaseException] = []

        async def produce(n: int) -> None:
            for i in range(n):
                fut = writer.submit(f"r{i}".encode() * 10)
                fut.add_done_callback(lambda f, i=i: errors.append(f.exception()) if f.exception() else acked.append((f.result(), i)))
                if i % 50 == 0:
                    await asyncio.sleep(0.005)

        first = asyncio.ensure_future(produce(4000))
        await eventually(lambda: len(acked) >= 500, 20, "500 acknowledged records")
        env.cluster.agents["n3"].proc.kill()
        await first
        await writer.flush()
        assert not errors and writer.error is None
        # Only three agents: no fresh ensemble, so the writer stays on the degraded segment.
        assert "n3" in writer._segment.failed
        await writer.close()
        assert [i for _, i in acked] == list(range(4000))
        meta = env.meta()
        back = await read_back(meta, env.pool(meta), env.name)
        assert [d for d, _ in back] == [d for d, _ in acked]
        assert [r.txid for _, r in back] == list(range(4000))

    run(scenario(), timeout=90)


def test_a_degraded_segment_that_cannot_roll_keeps_acknowledging_while_the_writer_retries(env):
    """A member fails (killed), comes back registered but does not answer (paused), and there is
    no spare agent: every ensemble_retry the writer probes it again, which takes the probe's 1 s.
    The segment still acknowledges with the other two, so appends go on during those retries.
    They waited for each retry's outcome while rolls held new entries on every attempt (found in
    review): appends stalled about half the time for as long as the member stayed that way."""
    env.create_log()

    async def scenario():
        writer = await env.writer(request_timeout=2.0, ensemble_retry=0.5)
        await writer.append(b"first")
        n3 = env.cluster.agents["n3"]
        n3.proc.kill()
        await writer.append(b"after the kill")  # acknowledged by n1 and n2; its add to n3 fails
        seg = writer._segment
        await eventually(lambda: "n3" in seg.failed, 10, "n3 a failed member")
        n3.start(zk=env.cluster.admin)  # registered again, as a candidate for the next ensemble
        n3.proc.pause()
        loop = asyncio.get_running_loop()
        during_retries = after_retries = 0
        retries = set()
        deadline = loop.time() + 5.0
        while loop.time() < deadline:
            retry = writer._transition
            await writer.append(b"while degraded")
            if retry is not None:
                retries.add(retry)
                if writer._transition is retry:
                    during_retries += 1  # acknowledged while the retry under way at submit still ran
                else:
                    after_retries += 1
            await asyncio.sleep(0.01)
        assert writer._segment is seg and "n3" in seg.failed, "the writer rolled: the scenario went wrong"
        assert len(retries) >= 2, f"{len(retries)} retries seen"
        assert during_retries >= 10, f"{during_retries} appends acknowledged during a retry, {after_retries} only after it"
        n3.proc.resume()
        await writer.close()

    run(scenario(), timeout=90)


def test_when_an_agent_dies_and_quorum_is_lost_unacknowledged_entries_move_to_a_fresh_ensemble(env):
    """A = W = 3: one dead agent leaves in-flight entries unable to reach quorum, so the writer
    completes the segment at its last acknowledged entry and re-sends the rest on a new one."""
    env.create_log(LogConfig(3, 3, 3))
    spare = AgentNode(env.cluster.procs, env.cluster.base, env.cluster.ns.connect_string, cluster=CLUSTER, node_id="n4")
    spare.start(zk=env.cluster.admin)
    try:

        async def scenario():
            writer = await env.writer(request_timeout=2.0, batch_bytes=2000)
            dlsns = list(await asyncio.gather(*(writer.submit(b"before" * 10) for _ in range(200))))
            victim = next(n for n in writer._segment.ensemble if n in env.cluster.agents)
            pending = [writer.submit(b"in flight" * 10) for _ in range(300)]
            env.cluster.agents[victim].proc.kill()
            dlsns += await asyncio.gather(*pending)
            dlsns += await asyncio.gather(*(writer.submit(b"after" * 10) for _ in range(100)))
            assert victim not in writer._segment.ensemble and writer.segment_seq == 2
            await writer.close()
            meta = env.meta()
            first, second = (s.value for s in meta.segments(env.name))
            assert victim in first.ensembles[0].nodes and victim not in second.ensembles[0].nodes
            assert (first.state, second.state) == (SegmentState.COMPLETED, SegmentState.COMPLETED)
            assert first.last_txid + 1 == second.first_txid and first.records + second.records == 600
            back = await read_back(meta, env.pool(meta), env.name)
            assert [d for d, _ in back] == dlsns  # every acknowledged record, where it was acknowledged
            assert [r.txid for _, r in back] == list(range(600))

        run(scenario(), timeout=90)
    finally:
        spare.proc.terminate()
        wait_until(lambda: spare.registration(env.cluster.admin) is None, 15, message="spare agent to unregister")


def test_a_silent_replica_the_ack_quorum_needs_costs_about_silent_after_not_the_request_timeout(env):
    """A = W = 3 and one member SIGSTOPped: no reset, no answer, the connection open — a silent
    agent. The writer must give up on it after ``silent_after`` (not the 4 s request timeout),
    roll the unacknowledged entries to a fresh ensemble and lose nothing. Control: the same with
    silence detection off waits for the request timeout."""
    env.create_log(LogConfig(3, 3, 3))
    spare = AgentNode(env.cluster.procs, env.cluster.base, env.cluster.ns.connect_string, cluster=CLUSTER, node_id="n4")
    spare.start(zk=env.cluster.admin)

    async def stall(silent_after: float | None) -> float:
        writer = await env.writer(request_timeout=4.0, silent_after=silent_after)
        dlsns = [await writer.append(b"before %d" % i) for i in range(20)]
        victim = next(n for n in writer._segment.ensemble if n in env.cluster.agents)
        env.cluster.agents[victim].proc.pause()
        try:
            started = time.monotonic()
            dlsns.append(await writer.append(b"while silent"))
            took = time.monotonic() - started
            dlsns += [await writer.append(b"after %d" % i) for i in range(20)]
            assert victim not in writer._segment.ensemble
        finally:
            env.cluster.agents[victim].proc.resume()
        await writer.close()
        meta = env.meta()
        back = await read_back(meta, env.pool(meta), env.name)
        assert [d for d, _ in back][-len(dlsns):] == dlsns  # every acknowledged record, where it was acknowledged
        return took

    try:
        fast = run(stall(0.3), timeout=60)
        assert fast < 2.0, fast
        slow = run(stall(None), timeout=60)
        assert slow >= 3.5, slow  # the control: without it, the request timeout
    finally:
        spare.proc.terminate()
        wait_until(lambda: spare.registration(env.cluster.admin) is None, 15, message="spare agent to unregister")


def test_writer_fails_pending_appends_after_stall_timeout_when_ack_quorum_is_lost(env):
    env.create_log(LogConfig(3, 3, 2))

    async def scenario():
        writer = await env.writer(request_timeout=1.0, stall_timeout=2.0)
        await writer.append(b"before")
        for node in ("n2", "n3"):
            env.cluster.agents[node].proc.pause()
        started = time.monotonic()
        with pytest.raises(WriterError, match="stalled"):
            await writer.append(b"cannot reach two agents")
        assert time.monotonic() - started < 15
        with pytest.raises(WriterError):
            writer.submit(b"later")
        await writer.close()

    run(scenario(), timeout=60)


def test_striping_e3_w2_puts_every_entry_on_exactly_its_write_set(env):
    env.create_log(LogConfig(3, 2, 2))

    async def scenario():
        writer = await env.writer(batch_bytes=500)
        dlsns = await asyncio.gather(*(writer.submit(f"s{i}".encode() * 50) for i in range(120)))
        await writer.close()
        meta = env.meta()
        pool = env.pool(meta)
        log_id = meta.get_log(env.name).value.log_id
        (versioned,) = meta.segments(env.name)
        seg = versioned.value
        assert seg.last_entry_id == dlsns[-1].entry_id >= 10
        for entry_id in range(seg.last_entry_id + 1):
            holders = set()
            for node in seg.ensembles[0].nodes:
                try:
                    await (await pool.client(node)).read(log_id, seg.seq, entry_id)
                    holders.add(node)
                except NoSuchEntryError:
                    pass
            assert holders == set(seg.write_set(entry_id)), f"entry {entry_id}"
        back = await read_back(meta, pool, env.name)
        assert [d for d, _ in back] == dlsns

    run(scenario())
