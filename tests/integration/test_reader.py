"""The log reader against real ZooKeeper and three real agent processes.

Data is produced without the writer: ``Feeder`` creates the log and its segments with
``MetaStore`` and adds encoded entries (records batched, LAC piggybacked) straight to the agents,
which also crafts precise states: an entry on one replica beyond LAC, an in-progress segment,
a segment that rolls. Agents n1/n2/n3 sit in regions r1/r2/r3, so a reader in r1 asks n1 first
and faults on n1 land on the replica it prefers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest
from kazoo.client import KazooClient

from dlctl.log import format as fmt
from dlctl.log.dlsn import DLSN
from dlctl.log.pool import AgentPool
from dlctl.log.reader import EntryReadError, LogReader, ReadAhead, ReadRecord
from dlctl.log.readpolicy import AdaptiveTimeout
from dlctl.log.records import Record, control_record, encode_records
from dlctl.meta import roles
from dlctl.meta.records import EnsembleChange, LogConfig, SegmentRecord, SegmentState, Versioned
from dlctl.meta.store import MetaStore
from dlctl.replication.source import RoutedAgentPool
from harness.agents import AgentNode, harness_credentials, heal_agents
from harness.faultproxy import FaultNetwork
from harness.logcluster import eventually
from harness.procs import ProcessRegistry
from harness.zk import ZkNamespace, close_client, make_client

pytestmark = [pytest.mark.zk, pytest.mark.agent]

CLUSTER = "c1"
NODES = ("n1", "n2", "n3")


@dataclass
class Cluster:
    ns: ZkNamespace
    agents: dict[str, AgentNode]
    admin: KazooClient

    def heal(self) -> None:
        """Undo what a test did to the agents: resume paused ones, restart dead ones."""
        heal_agents(self.agents.values(), self.admin)


@pytest.fixture(scope="module")
def reader_cluster(zk_server, tmp_path_factory) -> Iterator[Cluster]:
    zk_server.ensure_running()
    ns = ZkNamespace(zk_server, label="test_reader")
    registry = ProcessRegistry(tmp_path_factory.mktemp("reader-procs"))
    base = tmp_path_factory.mktemp("reader-agents")
    try:
        admin = ns.client()
        agents = {
            node: AgentNode(registry, base, ns.connect_string, cluster=CLUSTER, node_id=node, region=f"r{i}", rack="rack1")
            for i, node in enumerate(NODES, start=1)
        }
        for agent in agents.values():
            agent.start(wait=False)
        cluster = Cluster(ns, agents, admin)
        cluster.heal()
        yield cluster
    finally:
        registry.close()
        ns.close()


@pytest.fixture
def cluster(reader_cluster: Cluster) -> Iterator[Cluster]:
    reader_cluster.heal()
    yield reader_cluster
    reader_cluster.heal()


@pytest.fixture
def zkc(reader_cluster: Cluster) -> Iterator[KazooClient]:
    """The test's own ZooKeeper session (readers' watches die with it)."""
    client = make_client(reader_cluster.ns.connect_string)
    yield client
    close_client(client)


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Feeder:
    """Writes a log by hand the way a writer would (see the module docstring).

    Each data entry holds ``per_entry`` records with consecutive txids; an entry carries LAC =
    the previous entry id unless told otherwise, so an entry becomes readable once the next one
    (often a control entry, as an idle writer sends) is stored.
    """

    def __init__(self, meta: MetaStore, pool: AgentPool, name: str, nodes: tuple[str, ...] = NODES, w: int = 3) -> None:
        self.meta, self.pool, self.name, self.nodes, self.w = meta, pool, name, nodes, w
        self.log_id = 0
        self.txid = 0
        self.seg: Versioned[SegmentRecord] | None = None
        self.next_entry = 0
        self.records = 0
        self.expected: list[tuple[DLSN, int]] = []  # every data record written: (dlsn, txid)

    async def create(self) -> Feeder:
        record = await asyncio.to_thread(self.meta.create_log, self.name, LogConfig(3, self.w, 2))
        self.log_id = record.log_id
        return self

    async def new_segment(self) -> int:
        log = await asyncio.to_thread(self.meta.get_log, self.name)
        seq = log.value.max_segment_seq + 1
        segment = SegmentRecord(
            seq=seq, state=SegmentState.INPROGRESS, ensembles=(EnsembleChange(0, self.nodes),),
            write_quorum=self.w, ack_quorum=2, created=time.time(), first_txid=self.txid + 1,
        )
        _, self.seg = await asyncio.to_thread(self.meta.create_segment, self.name, log, segment)
        self.next_entry, self.records = 0, 0
        return seq

    async def add(self, records: list[Record], *, lac: int | None = None, only: tuple[str, ...] | None = None) -> int:
        assert self.seg is not None
        seg = self.seg.value
        entry_id = self.next_entry
        self.next_entry += 1
        control = all(r.control for r in records)
        encoded = fmt.encode(
            fmt.Entry(self.log_id, seg.seq, entry_id, entry_id - 1 if lac is None else lac, encode_records(records),
                      fmt.FLAG_CONTROL if control else 0)
        )
        targets = only if only is not None else seg.write_set(entry_id)
        clients = [await self.pool.client(n) for n in targets]
        await asyncio.gather(*(c.add(encoded) for c in clients))
        return entry_id

    async def append(self, count: int = 3, *, only: tuple[str, ...] | None = None, payload_size: int = 0,
                     with_control: bool = False) -> list[int]:
        """A data entry of ``count`` records (optionally with a control record mixed in)."""
        assert self.seg is not None
        records = []
        txids = []
        for _ in range(count):
            self.txid += 1
            txids.append(self.txid)
            body = f"payload-{self.txid}".encode().ljust(payload_size, b".")
            records.append(Record(txid=self.txid, payload=body, key=f"k{self.txid % 7}".encode(),
                                  headers={"dl.test": str(self.txid).encode()} if self.txid % 2 else {}))
        if with_control:
            records.insert(1, control_record(self.txid))
        entry_id = await self.add(records, only=only)
        slot = 0
        for record in records:
            if not record.control:
                self.expected.append((DLSN(self.seg.value.seq, entry_id, slot), record.txid))
            slot += 1
        self.records += count
        return txids

    async def flush(self) -> int:
        """A control-only entry: makes every entry before it readable (LAC = previous entry)."""
        return await self.add([control_record(self.txid)])

    async def complete(self) -> None:
        """Close the segment in metadata at its last added entry (what recovery/close would do)."""
        assert self.seg is not None
        closed = self.seg.value.completed_with(self.next_entry - 1, self.txid, self.records, 0, time.time())
        self.seg = await asyncio.to_thread(self.meta.update_segment, self.name, self.seg, closed)

    async def set_segment(self, seq: int, **changes) -> None:
        current = next(s for s in await asyncio.to_thread(self.meta.segments, self.name) if s.value.seq == seq)
        await asyncio.to_thread(self.meta.update_segment, self.name, current, replace(current.value, **changes))


async def setup(zkc: KazooClient, name: str, **pool_options) -> tuple[MetaStore, AgentPool, Feeder]:
    meta = MetaStore(zkc, CLUSTER)
    pool = AgentPool(meta, harness_credentials(), **pool_options)
    await pool.refresh()
    feeder = await Feeder(meta, pool, name).create()
    return meta, pool, feeder


async def read_all(reader: LogReader, count: int, timeout: float = 10.0) -> list[ReadRecord]:
    out = []
    for _ in range(count):
        record = await reader.read_next(timeout)
        assert record is not None, f"timed out after {len(out)} of {count} records"
        out.append(record)
    return out


async def three_closed_segments(feeder: Feeder, *, in_progress: bool = True) -> None:
    """Segments 1, 2 closed (10 entries of 3 records + control entries); 3 in progress."""
    for _ in range(2):
        await feeder.new_segment()
        for e in range(10):
            await feeder.append(3, with_control=(e == 4))
            if e % 4 == 3:
                await feeder.flush()
        await feeder.complete()
    await feeder.new_segment()
    for _ in range(6):
        await feeder.append(3)
    await feeder.flush()
    if not in_progress:
        await feeder.complete()


# -- positioning ---------------------------------------------------------------------------------


def test_reader_positioned_by_txid_gets_exactly_the_expected_records(cluster, zkc):
    async def main():
        meta, pool, feeder = await setup(zkc, "by-txid")
        await three_closed_segments(feeder)
        last = feeder.txid  # 60 in segments 1-2, 18 more in segment 3 (in progress)
        try:
            for start in (1, 2, 3, 4, 29, 30, 31, 59, 60, 61, 62, 70, last):
                async with LogReader(meta, pool, "by-txid", start_txid=start) as reader:
                    got = await read_all(reader, last - start + 1)
                    assert [r.txid for r in got] == list(range(start, last + 1)), f"start txid {start}"
                    assert [(r.dlsn, r.txid) for r in got] == [x for x in feeder.expected if x[1] >= start]
                    assert all(r.payload == f"payload-{r.txid}".encode() and r.key == f"k{r.txid % 7}".encode() for r in got)
                    assert all(r.headers == ({"dl.test": str(r.txid).encode()} if r.txid % 2 else {}) for r in got)
                    assert await reader.read_next(0.2) is None  # nothing past the end (LAC)
            async with LogReader(meta, pool, "by-txid", start_txid=last + 1) as reader:
                assert await reader.read_next(0.2) is None
                (txid,) = await feeder.append(1)
                await feeder.flush()
                got = await reader.read_next(5)
                assert got is not None and got.txid == txid == last + 1
        finally:
            await pool.close()

    run(main())


def test_reader_positioned_by_dlsn_starts_exactly_there(cluster, zkc):
    async def main():
        meta, pool, feeder = await setup(zkc, "by-dlsn")
        await three_closed_segments(feeder)
        expected = feeder.expected
        try:
            for index in (0, 1, 2, 13, 29, 30, 31, 59, 60, len(expected) - 1):
                start = expected[index][0]
                async with LogReader(meta, pool, "by-dlsn", start_dlsn=start) as reader:
                    got = await read_all(reader, len(expected) - index)
                    assert [(r.dlsn, r.txid) for r in got] == expected[index:], f"start {start}"
                    assert await reader.read_next(0.2) is None
            # Past the end of closed segment 1: segment 2 is next.
            async with LogReader(meta, pool, "by-dlsn", start_dlsn=DLSN(1, 500, 0)) as reader:
                first = await reader.read_next(5)
                assert first is not None and (first.dlsn, first.txid) == expected[30]
            # The slot after the last record of an entry: the next entry's first record.
            async with LogReader(meta, pool, "by-dlsn", start_dlsn=DLSN(1, 0, 3)) as reader:
                first = await reader.read_next(5)
                assert first is not None and first.txid == 4
        finally:
            await pool.close()

    run(main())


def test_truncated_segments_are_skipped_and_partially_truncated_ones_start_at_min_active(cluster, zkc):
    async def main():
        meta, pool, feeder = await setup(zkc, "truncated")
        await three_closed_segments(feeder)
        await feeder.set_segment(1, state=SegmentState.TRUNCATED)
        await feeder.set_segment(2, state=SegmentState.PARTIALLY_TRUNCATED, min_active_entry=5)
        kept = [x for x in feeder.expected if x[0] >= DLSN(2, 5, 0)]
        try:
            for options in ({}, {"start_dlsn": DLSN(1, 3, 0)}, {"start_dlsn": DLSN(2, 1, 1)}, {"start_txid": 1}, {"start_txid": 33}):
                async with LogReader(meta, pool, "truncated", **options) as reader:
                    got = await read_all(reader, len(kept))
                    assert [(r.dlsn, r.txid) for r in got] == kept, options
        finally:
            await pool.close()

    run(main())


# -- LAC ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 8])  # one long poll per replica, or polls 8 entries ahead
def test_reader_never_observes_an_entry_beyond_lac(cluster, zkc, depth):
    name = f"beyond-lac-{depth}"

    async def main():
        meta, pool, feeder = await setup(zkc, name)
        await feeder.new_segment()
        for _ in range(5):
            await feeder.append(2)  # entries 0-4; entry 4 carries LAC 3
        confirmed = list(feeder.expected)
        # Entry 5 reached only n1 (the replica this reader prefers): it carries LAC 4, so n1
        # reports LAC 4, but entry 5 itself is unconfirmed and recovery will drop it.
        seg = feeder.seg.value.seq
        phantom_id = await feeder.add([Record(txid=999, payload=b"phantom")], only=("n1",))
        try:
            async with LogReader(meta, pool, name, region="r1", long_poll_timeout=10, poll_depth=depth) as reader:
                got = await read_all(reader, 8)  # entries 0-3
                assert [(r.dlsn, r.txid) for r in got] == confirmed[:8]
                got += await read_all(reader, 2)  # entry 4: confirmed by n1's LAC
                assert await reader.read_next(0.5) is None, "an entry beyond LAC was delivered"
                # Recovery: n2 and n3 (W - A + 1 = 2) lack entry 5, so the segment closes at 4.
                feeder.next_entry = phantom_id
                await feeder.complete()
                await feeder.new_segment()
                await feeder.append(2)  # segment 2, entry 0: LAC -1, not readable yet
                assert await reader.read_next(0.5) is None, "an entry beyond LAC was delivered"
                await feeder.append(2)  # entry 1 carries LAC 0
                got += await read_all(reader, 2, timeout=5)
                assert [(r.dlsn, r.txid) for r in got] == feeder.expected[:12]
                assert all(r.payload != b"phantom" for r in got) and got[-1].dlsn.segment_seq == seg + 1
                assert await reader.read_next(0.3) is None
        finally:
            await pool.close()

    run(main())


def test_control_records_are_never_delivered(cluster, zkc):
    async def main():
        meta, pool, feeder = await setup(zkc, "control")
        await feeder.new_segment()
        await feeder.flush()  # a segment that starts with a control-only entry
        for e in range(6):
            await feeder.append(3, with_control=True)
            await feeder.flush()
            await feeder.flush()
        try:
            async with LogReader(meta, pool, "control") as reader:
                got = await read_all(reader, 18)
                assert [(r.dlsn, r.txid) for r in got] == feeder.expected
                assert await reader.read_next(0.3) is None
        finally:
            await pool.close()

    run(main())


# -- replica faults -------------------------------------------------------------------------------


def test_a_replica_in_limbo_from_a_flipped_bit_is_survived(cluster, zkc):
    async def main():
        meta, pool, feeder = await setup(zkc, "limbo")
        try:
            await feeder.new_segment()
            for _ in range(10):
                await feeder.append(4, payload_size=64)
            await feeder.complete()
        finally:
            await pool.close()
        return meta, feeder

    async def read(meta: MetaStore, feeder: Feeder):
        pool = AgentPool(meta, harness_credentials())
        try:
            # A patient speculative timeout: n1, just restarted and perhaps slow on a loaded
            # machine, must be the one that answers entry 0 (with "limbo"), not be overtaken.
            async with LogReader(meta, pool, "limbo", region="r1", read_ahead=ReadAhead(max_entries=1),
                                 speculative_timeout=AdaptiveTimeout(floor=1.0, ceiling=3.0, initial=3.0)) as reader:
                got = await read_all(reader, 40)
                assert [(r.dlsn, r.txid) for r in got] == feeder.expected
                assert [r.payload.rstrip(b".") for r in got] == [f"payload-{r.txid}".encode() for r in got]
                return reader.replicas.stats
        finally:
            await pool.close()

    meta, feeder = run(main())
    # The agents' auditor refills a replica in limbo from its peers: off while we look, or on
    # a slow machine it may have repaired n1's before the reader asks (a flake CI showed).
    roles.write_auditor_switch(cluster.admin, CLUSTER, False)
    try:
        n1 = cluster.agents["n1"]
        n1.proc.kill()
        path = n1.data_dir / "segments" / f"{feeder.log_id:016x}" / f"{1:016x}.log"
        data = bytearray(path.read_bytes())
        data[fmt.HEADER_SIZE + 40] ^= 0x04  # inside entry 0's payload: corruption before valid data
        path.write_bytes(bytes(data))
        n1.start(zk=cluster.admin)
        stats = run(read(meta, feeder))
    finally:
        roles.write_auditor_switch(cluster.admin, CLUSTER, True)
    assert stats.replica_failures >= 1  # n1 was asked first and answered "limbo"


def test_slow_replica_costs_about_one_timeout_not_a_failure(cluster, zkc):
    floor, ceiling = 0.02, 0.25

    async def main():
        # A 30 s request timeout: had a read waited for the hung replica, it would show.
        meta, pool, feeder = await setup(zkc, "slow", request_timeout=30.0)
        await feeder.new_segment()
        for _ in range(20):
            await feeder.append(2)
        await feeder.complete()
        cluster.agents["n1"].proc.pause()  # hung: the socket stays open, nothing answers
        try:
            # suspect_seconds=0: n1 stays first in line for every entry, so every read pays the
            # speculative timeout (the default demotes it after the first and pays it once).
            reader = LogReader(meta, pool, "slow", region="r1", read_ahead=ReadAhead(max_entries=1), suspect_seconds=0,
                               speculative_timeout=AdaptiveTimeout(floor=floor, ceiling=ceiling))
            async with reader:
                durations = []
                got = []
                for _ in range(40):
                    started = time.monotonic()
                    got.append(await reader.read_next(10))
                    durations.append(time.monotonic() - started)
                assert [(r.dlsn, r.txid) for r in got] == feeder.expected
                assert reader.replicas.stats.speculative >= 20  # one per entry: n1 never answered
                # Each entry: at most one timeout (<= ceiling) plus a fast replica's answer.
                assert max(durations) < ceiling + 0.25, durations
                assert sum(durations) < 20 * (ceiling + 0.05)
            demoting = LogReader(meta, pool, "slow", region="r1", read_ahead=ReadAhead(max_entries=1),
                                 speculative_timeout=AdaptiveTimeout(floor=floor, ceiling=ceiling))
            firsts = []  # the replica each read asks first (a spy: the order itself is the reader's)
            plain_order = demoting.replicas.order

            def order(*args, **kwargs):
                chosen = plain_order(*args, **kwargs)
                firsts.append(chosen[0] if chosen else None)
                return chosen

            demoting.replicas.order = order
            async with demoting:
                started = time.monotonic()
                got = await read_all(demoting, 40)
                assert [(r.dlsn, r.txid) for r in got] == feeder.expected
                # n1 demoted after its first timeout (or, once its ZooKeeper session has expired,
                # not even asked first: an unregistered node is tried last). Not "one speculative
                # read in all": on a loaded machine a healthy replica can miss the timeout too
                # (seen beside two CPU burners: 2).
                assert firsts.count("n1") <= 1 and len(firsts) >= 20, firsts
                assert time.monotonic() - started < ceiling + 1.0
        finally:
            cluster.agents["n1"].proc.resume()
            await pool.close()

    run(main())


def test_a_segment_opened_while_the_previous_one_is_in_progress_is_read_only_after_that_one_closes(cluster, zkc):
    """The reader rule fast takeover relies on (issue 24 item 1): a new owner may open segment 2
    while segment 1 is still being recovered. A reader delivers segment 1 up to its LAC, nothing
    of segment 2 while segment 1 stays open, and segment 2 once segment 1 is closed: in order."""

    async def main():
        meta, pool, feeder = await setup(zkc, "two-in-progress")
        await feeder.new_segment()
        for _ in range(3):
            await feeder.append(2)
        await feeder.flush()  # entries 0-2 readable
        old, old_end, old_records, old_txid = feeder.seg, feeder.next_entry - 1, feeder.records, feeder.txid
        first_part = list(feeder.expected)
        await feeder.new_segment()  # segment 1 is still in progress
        for _ in range(2):
            await feeder.append(2)
        await feeder.flush()
        second_part = feeder.expected[len(first_part):]
        try:
            async with LogReader(meta, pool, "two-in-progress", region="r1", long_poll_timeout=1) as reader:
                got = await read_all(reader, len(first_part))
                assert [(r.dlsn, r.txid) for r in got] == first_part
                assert await reader.read_next(1.0) is None  # segment 2 is not read while segment 1 is open
                assert old is not None
                closed = old.value.completed_with(old_end, old_txid, old_records, 0, time.time())
                await asyncio.to_thread(meta.update_segment, "two-in-progress", old, closed)  # recovery closes it
                got = await read_all(reader, len(second_part))
                assert [(r.dlsn, r.txid) for r in got] == second_part
        finally:
            await pool.close()

    run(main())


def test_reads_move_away_from_a_delayed_replica_within_a_few_requests(cluster, zkc, fault_network: FaultNetwork):
    """n1, the replica nearest the reader, is delayed 50 ms each way by the fault proxy: no
    failure, and it answers within the speculative ceiling. The reader's scores must find the
    faster replicas within a few reads. Control: the same reader without memory of what it saw
    (``suspect_seconds=0``) keeps asking n1 first and pays the delay on nearly every read."""
    n1 = cluster.agents["n1"]
    proxy = fault_network.proxy((n1.host, n1.port), node="n1", name="reader->n1")
    proxy.delay = 0.05
    entries = 30

    async def main():
        meta, direct, feeder = await setup(zkc, "delayed")
        await feeder.new_segment()
        for _ in range(entries):
            await feeder.append(1)
        await feeder.complete()

        async def slow_reads(**options) -> tuple[int, tuple[str, ...]]:
            pool = RoutedAgentPool(meta, harness_credentials(), addresses={"n1": "%s:%d" % proxy.address})
            await pool.refresh()
            reader = LogReader(meta, pool, "delayed", region="r1", read_ahead=ReadAhead(max_entries=1),
                               speculative_timeout=AdaptiveTimeout(floor=0.01, ceiling=1.0, initial=0.5), **options)
            try:
                async with reader:
                    slow, got = 0, []
                    for _ in range(entries):
                        started = time.monotonic()
                        got.append(await reader.read_next(10))
                        slow += time.monotonic() - started > 0.08  # a round trip through the delay
                    assert [(r.dlsn, r.txid) for r in got] == feeder.expected
                    return slow, reader.replicas.order(("n1", "n2", "n3"))
            finally:
                await pool.close()

        try:
            adaptive, order = await slow_reads()
            assert adaptive <= 3 and order[0] != "n1", (adaptive, order)
            fixed, _ = await slow_reads(suspect_seconds=0)
            assert fixed >= entries - 3, fixed  # the control: without scores, n1 every time
        finally:
            await direct.close()

    run(main())


def test_a_quorum_lac_read_sees_what_a_lagging_first_replica_missed(cluster, zkc, fault_network: FaultNetwork):
    """Entries 6-10 reached n2 and n3 only (an ack quorum of 2 of 3), so n1 tells LAC 4 while
    they tell 9; n2 and n3 answer slowly (the fault proxy). A best-effort LAC read (tailing)
    returns what the first replica to answer said, plus whatever else arrives within one
    speculative timeout: 4. A quorum LAC read (E - A + 1 = 2 answers: what wait-drain targets,
    a stream's end in replication status and log show use) cannot miss an acknowledged entry: 9."""
    from dlctl.log.speculative import ReplicaReader

    async def main():
        meta, direct, feeder = await setup(zkc, "quorum-lac")
        await feeder.new_segment()
        for _ in range(6):
            await feeder.append(1)
        for _ in range(5):
            await feeder.append(1, only=("n2", "n3"))
        proxies = {}
        for name in ("n2", "n3"):
            agent = cluster.agents[name]
            proxies[name] = fault_network.proxy((agent.host, agent.port), node=name, name=f"reader->{name}")
            proxies[name].delay = 0.15
        pool = RoutedAgentPool(meta, harness_credentials(), addresses={n: "%s:%d" % p.address for n, p in proxies.items()})
        await pool.refresh()
        try:
            seg = feeder.seg.value
            best_effort = await ReplicaReader(pool, region="r1", timeout=AdaptiveTimeout(floor=0.01, ceiling=0.05, initial=0.05)).read_lac(feeder.log_id, seg)
            quorum = await ReplicaReader(pool, region="r1").read_lac(feeder.log_id, seg, quorum=True)
            assert (best_effort, quorum) == (4, 9)
        finally:
            await pool.close()
            await direct.close()

    run(main())


def test_dead_replica_reads_and_tailing_still_succeed(cluster, zkc):
    async def main():
        meta, pool, feeder = await setup(zkc, "dead")
        await feeder.new_segment()
        for _ in range(10):
            await feeder.append(2)
        await feeder.flush()
        cluster.agents["n1"].proc.kill()
        try:
            async with LogReader(meta, pool, "dead", region="r1", long_poll_timeout=10) as reader:
                got = await read_all(reader, 20)
                # The writer goes on with its ack quorum (n2, n3); the tailing reader follows.
                for _ in range(5):
                    await feeder.append(2, only=("n2", "n3"))
                await feeder.add([control_record(feeder.txid)], only=("n2", "n3"))
                got += await read_all(reader, 10, timeout=5)
                assert [(r.dlsn, r.txid) for r in got] == feeder.expected
                assert reader.replicas.stats.replica_failures >= 1
        finally:
            await pool.close()

    run(main())


def test_an_entry_no_replica_serves_is_an_error_naming_each_replica_and_a_retry_succeeds(cluster, zkc):
    async def main():
        meta, pool, feeder = await setup(zkc, "unservable")
        feeder.nodes = ("n1", "ghost1", "ghost2")  # registered nowhere: unreachable
        await feeder.new_segment()
        records = [Record(txid=1, payload=b"one")]
        encoded = fmt.encode(fmt.Entry(feeder.log_id, 1, 0, -1, encode_records(records)))
        feeder.next_entry = 1
        await feeder.complete()
        try:
            async with LogReader(meta, pool, "unservable") as reader:
                with pytest.raises(EntryReadError) as info:
                    await reader.read_next(10)
                message = str(info.value)
                assert "entry 0 of segment 1" in message
                assert all(node in message for node in ("n1", "ghost1", "ghost2"))
                assert info.value.failures["n1"].startswith("NoSuchSegmentError")  # never written there
                await (await pool.client("n1")).add(encoded)
                record = await reader.read_next(10)  # the reader retries the same entry
                assert record is not None and (record.dlsn, record.payload) == (DLSN(1, 0, 0), b"one")
        finally:
            await pool.close()

    run(main())


def test_an_in_progress_segment_no_replica_answers_for_is_not_taken_for_an_empty_one(cluster, zkc):
    """Where a log ends is unknown while no replica of its in-progress segment answers: the LAC
    read says so (naming them) instead of answering -1, which would make the log's end the
    previous segment's — a replication lag of 0 and "nothing at risk" in a failover."""
    from dlctl.log.errors import AgentUnavailableError
    from dlctl.log.speculative import ReplicaReader
    from dlctl.replication.positions import log_end

    async def main():
        meta, pool, feeder = await setup(zkc, "unreachable-tail")
        try:
            await feeder.new_segment()
            await feeder.add([Record(txid=1, payload=b"one")])
            await feeder.add([control_record(2)], lac=0)
            assert await ReplicaReader(pool).read_lac(feeder.log_id, feeder.seg.value) == 0
            feeder.nodes = ("ghost1", "ghost2", "ghost3")  # registered nowhere: unreachable
            await feeder.new_segment()
            seg = feeder.seg.value
            with pytest.raises(AgentUnavailableError, match="no replica of segment 2") as info:
                await ReplicaReader(pool).read_lac(feeder.log_id, seg)
            assert all(node in str(info.value) for node in feeder.nodes)
            with pytest.raises(AgentUnavailableError):
                await log_end(meta, pool, "unreachable-tail")
            # A segment its replicas answer for but hold nothing of yet is empty, as before.
            feeder.nodes = NODES
            await feeder.new_segment()
            assert await ReplicaReader(pool).read_lac(feeder.log_id, feeder.seg.value) == -1
        finally:
            await pool.close()

    run(main())


# -- tailing --------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 8])
def test_tailing_reader_gets_appends_promptly_and_follows_a_segment_roll_without_gaps(cluster, zkc, depth):
    long_poll = 10.0  # far above every bound below: delivery must come from the long poll
    name = f"tail-{depth}"

    async def main():
        meta, pool, feeder = await setup(zkc, name)
        await feeder.new_segment()
        await feeder.append(2)
        await feeder.flush()
        received: list[tuple[ReadRecord, float]] = []
        try:
            async with LogReader(meta, pool, name, long_poll_timeout=long_poll, poll_depth=depth) as reader:

                changed = asyncio.Condition()

                async def consume() -> None:
                    async for record in reader.tail():
                        received.append((record, time.monotonic()))
                        async with changed:
                            changed.notify_all()

                consumer = asyncio.ensure_future(consume())

                async def until(count: int, timeout: float = 5.0) -> None:
                    try:
                        async with changed:
                            await asyncio.wait_for(changed.wait_for(lambda: len(received) >= count), timeout)
                    except TimeoutError:
                        raise AssertionError(f"{len(received)} of {count} records after {timeout}s") from None

                await until(2)
                delays = []
                for _ in range(15):
                    await feeder.append(2)
                    flushed = time.monotonic()
                    await feeder.flush()  # the idle writer's control entry makes it readable
                    await until(len(feeder.expected))
                    delays.append(received[-1][1] - flushed)  # includes the control entry's add
                # Roll. The last data entry of segment 1 is never confirmed by a later entry's LAC:
                # only the close in metadata (seen through a watch) makes it readable.
                await feeder.append(2)
                await feeder.complete()
                closed = time.monotonic()
                await until(len(feeder.expected))
                roll_delay = received[-1][1] - closed
                await feeder.new_segment()
                for _ in range(5):
                    await feeder.append(3)
                await feeder.flush()
                await until(len(feeder.expected))
                await asyncio.sleep(0.2)  # nothing more arrives: no duplicates
                consumer.cancel()
                await asyncio.gather(consumer, return_exceptions=True)
                assert [(r.dlsn, r.txid) for r, _ in received] == feeder.expected
                assert max(delays) < 0.5, delays
                assert roll_delay < 2.0, roll_delay
                assert reader.stats.entries_from_polls >= 1  # entries rode on the long polls
        finally:
            await pool.close()

    run(main())


@pytest.mark.parametrize("depth", [1, 8])
def test_polls_ahead_bring_a_burst_of_new_entries_without_a_read_each(cluster, zkc, fault_network: FaultNetwork, depth):
    """Caught up across a slow link (50 ms each way to every replica), a reader polling 8 entries
    ahead gets the entries of a burst carried by the polls already waiting for them at the
    agents; with one poll per replica only the first comes that way and the others need a read
    each, a round trip more (the control)."""
    name = f"ahead-{depth}"
    proxies = {n: fault_network.proxy((a.host, a.port), node=n, name=f"wan->{n}") for n, a in cluster.agents.items()}
    for proxy in proxies.values():
        proxy.delay = 0.05

    async def main():
        meta, direct, feeder = await setup(zkc, name)
        await feeder.new_segment()
        await feeder.append(1)
        await feeder.flush()
        pool = RoutedAgentPool(meta, harness_credentials(), addresses={n: "%s:%d" % p.address for n, p in proxies.items()})
        await pool.refresh()
        try:
            async with LogReader(meta, pool, name, long_poll_timeout=10, poll_depth=depth) as reader:
                await read_all(reader, 1)
                await eventually(lambda: len(reader._polls) >= 3 + depth - 1, 5, "the polls to be armed")
                fetched, from_polls = reader.stats.entries_fetched, reader.stats.entries_from_polls
                for _ in range(5):
                    await feeder.append(1)  # each carries the LAC of the one before
                await feeder.flush()
                got = await read_all(reader, 5)
                assert [(r.dlsn, r.txid) for r in got] == feeder.expected[1:]
                carried = reader.stats.entries_from_polls - from_polls
                read = reader.stats.entries_fetched - fetched - carried
                if depth == 1:
                    assert read >= 2, (carried, read)  # the control: reads after the first
                else:
                    assert carried >= 4 and read <= 1, ("entries of the burst were read instead of carried", carried, read)
        finally:
            await pool.close()
            await direct.close()

    run(main())


def test_read_next_times_out_with_none_and_close_ends_tail(cluster, zkc):
    async def main():
        meta, pool, feeder = await setup(zkc, "idle")
        await feeder.new_segment()
        try:
            reader = await LogReader(meta, pool, "idle", long_poll_timeout=10).open()
            started = time.monotonic()
            assert await reader.read_next(0.3) is None
            assert 0.25 < time.monotonic() - started < 2.0
            records = []

            async def consume() -> None:
                async for record in reader.tail():
                    records.append(record)

            consumer = asyncio.ensure_future(consume())
            await asyncio.sleep(0.1)
            await reader.close()
            await asyncio.wait_for(consumer, 5)
            assert records == []
        finally:
            await pool.close()

    run(main())


# -- read-ahead -----------------------------------------------------------------------------------


def test_read_ahead_is_bounded_by_count_and_bytes(cluster, zkc):
    async def main():
        meta, pool, feeder = await setup(zkc, "read-ahead")
        await feeder.new_segment()
        for _ in range(60):
            await feeder.append(2, payload_size=1000)
        await feeder.complete()
        entry_size = fmt.HEADER_SIZE + len(encode_records([Record(txid=1, payload=b"x" * 1000, key=b"k1", headers={"dl.test": b"1"}),
                                                           Record(txid=2, payload=b"x" * 1000, key=b"k2")]))

        async def settled(reader: LogReader, entries: int) -> None:
            while reader.stats.entries_fetched < entries:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.3)  # asserting an absence: nothing more may be fetched

        try:
            async with LogReader(meta, pool, "read-ahead", read_ahead=ReadAhead(max_entries=5, max_bytes=1 << 20, adaptive=False)) as reader:
                await settled(reader, 5)
                assert reader.stats.entries_fetched == 5 and reader.stats.buffered_entries == 5
                await read_all(reader, 2)  # one entry consumed: one more fetched
                await settled(reader, 6)
                assert reader.stats.entries_fetched == 6
                got = await read_all(reader, 118)
                assert reader.stats.max_buffered_entries <= 5
                assert [r.txid for r in got] == list(range(3, 121))
            bound = 4 * entry_size + 8
            async with LogReader(meta, pool, "read-ahead", read_ahead=ReadAhead(max_entries=1000, max_bytes=bound, adaptive=False)) as reader:
                await settled(reader, 4)
                assert reader.stats.entries_fetched == 4
                assert reader.stats.buffered_bytes <= bound
                got = await read_all(reader, 120)
                assert [r.txid for r in got] == list(range(1, 121))
                assert reader.stats.max_buffered_bytes <= bound
                assert reader.stats.max_buffered_entries <= 4
        finally:
            await pool.close()

    run(main())


def test_read_ahead_follows_the_consumer_wide_for_a_fast_one_narrow_for_a_slow_one(cluster, zkc):
    """Catching up, a consumer faster than one fetch at a time gets a window that grows until it
    covers the fetch latency; a slow consumer holds only a few entries in memory. Control: the
    fixed read-ahead of the same bound buffers its whole bound for the slow consumer."""
    entries = 150

    async def main():
        meta, pool, feeder = await setup(zkc, "adaptive-read-ahead")
        await feeder.new_segment()
        for _ in range(entries):
            await feeder.append(1, payload_size=200)
        await feeder.complete()

        async def consume(adaptive: bool, pause: float) -> tuple[LogReader, list[ReadRecord]]:
            reader = LogReader(meta, pool, "adaptive-read-ahead", read_ahead=ReadAhead(max_entries=64, adaptive=adaptive))
            async with reader:
                got = []
                for _ in range(entries if pause == 0 else 60):
                    got.append(await reader.read_next(10))
                    if pause:
                        await asyncio.sleep(pause)
            return reader, got

        try:
            fast, got = await consume(True, 0)
            assert [(r.dlsn, r.txid) for r in got] == feeder.expected
            assert fast.window.grown >= 2 and fast.window.size >= 16, (fast.window.size, fast.window.grown)
            slow, got = await consume(True, 0.02)
            assert [(r.dlsn, r.txid) for r in got] == feeder.expected[:60]
            # (its first read waits for the first fetch, which doubles the window once)
            assert slow.stats.max_buffered_entries <= 8 and slow.window.size <= 4, (slow.stats.max_buffered_entries, slow.window.size)
            fixed, _ = await consume(False, 0.02)
            assert fixed.stats.max_buffered_entries >= 32, fixed.stats.max_buffered_entries  # the control
        finally:
            await pool.close()

    run(main())


@pytest.mark.parametrize("depth", [1, 8])
def test_striped_ensemble_reads_each_entry_from_its_write_set_and_tails(cluster, zkc, depth):
    name = f"striped-{depth}"

    async def main():
        meta = MetaStore(zkc, CLUSTER)
        pool = AgentPool(meta, harness_credentials())
        await pool.refresh()
        feeder = await Feeder(meta, pool, name, w=2).create()  # E=3, W=2: no node has every entry
        await feeder.new_segment()
        for _ in range(6):
            await feeder.append(2)
        await feeder.flush()
        try:
            async with LogReader(meta, pool, name, region="r1", long_poll_timeout=10, poll_depth=depth) as reader:
                got = await read_all(reader, 12)
                for _ in range(6):
                    await feeder.append(1)
                    await feeder.flush()
                    got += await read_all(reader, 1, timeout=2)
                assert [(r.dlsn, r.txid) for r in got] == feeder.expected
                assert await reader.read_next(0.2) is None
        finally:
            await pool.close()

    run(main())


def test_reader_follows_a_roll_after_its_zookeeper_session_expired(cluster, zkc):
    async def main():
        _, pool, feeder = await setup(cluster.admin, "expiry")  # the writer's session lives on
        meta = MetaStore(zkc, CLUSTER)
        await feeder.new_segment()
        await feeder.append(2)
        await feeder.flush()
        try:
            async with LogReader(meta, pool, "expiry", long_poll_timeout=30) as reader:
                got = await read_all(reader, 2)
                # Watches die with the session; the reader re-reads and re-arms on reconnection.
                await asyncio.to_thread(cluster.ns.expire, zkc)
                await feeder.append(2)
                await feeder.complete()  # only metadata says entry 2 is readable
                await feeder.new_segment()
                await feeder.append(2)
                await feeder.flush()
                got += await read_all(reader, 4, timeout=10)
                assert [(r.dlsn, r.txid) for r in got] == feeder.expected
        finally:
            await pool.close()

    run(main())


def test_tailing_reader_follows_the_real_writer_across_owners(cluster, zkc):
    from dlctl.log.writer import LogWriter  # the writer is built alongside; only this test needs it

    async def main():
        meta = MetaStore(zkc, CLUSTER)
        pool = AgentPool(meta, harness_credentials())
        await pool.refresh()
        await asyncio.to_thread(meta.create_log, "written", LogConfig(3, 3, 2))
        try:
            async with LogReader(meta, pool, "written", long_poll_timeout=10) as reader:
                acked = []
                for owner in ("w1", "w2"):  # the second owner starts a new segment: a roll
                    writer = await LogWriter.open(meta, pool, "written", owner_id=owner)
                    try:
                        futures = [writer.submit(f"rec-{owner}-{i}".encode(), key=b"k" if i % 3 else b"") for i in range(150)]
                        acked += [(await f) for f in futures]
                    finally:
                        await writer.close()
                got = await read_all(reader, 300, timeout=10)
                assert [r.dlsn for r in got] == acked
                assert [r.txid for r in got] == list(range(got[0].txid, got[0].txid + 300))  # writer-assigned
                assert [r.payload for r in got] == [f"rec-{o}-{i}".encode() for o in ("w1", "w2") for i in range(150)]
                assert {r.dlsn.segment_seq for r in got} == {1, 2}
                assert await reader.read_next(0.2) is None
            for index in (0, 77, 149, 150, 221, 299):
                async with LogReader(meta, pool, "written", start_txid=got[index].txid) as by_txid:
                    assert [r.dlsn for r in await read_all(by_txid, 300 - index)] == acked[index:]
                async with LogReader(meta, pool, "written", start_dlsn=acked[index]) as by_dlsn:
                    assert [r.txid for r in await read_all(by_dlsn, 300 - index)] == [r.txid for r in got[index:]]
        finally:
            await pool.close()

    run(main())
