"""PULL_RANGE against real agents registered in a real ZooKeeper: a target agent copies a range
of a segment straight from a source agent (one network leg, over TLS), stops at its byte cap or
at the source's first gap and says why, never connects anywhere but to a registered agent, and
``copy_replica`` uses it by default, falling over between sources, with the same verified result
as the copy through the copier (the control)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dlctl.log.errors import BadRequestError, NoSuchSegmentError
from dlctl.log.format import Entry, decode_header, encode
from dlctl.log.pool import AgentPool
from dlctl.log.rereplication import digest_of, entries_on
from dlctl.log.rereplication_copy import copy_replica
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.meta.store import MetaStore
from harness.agents import AgentNode, harness_credentials
from harness.procs import ProcessRegistry
from harness.zk import ZkNamespace

pytestmark = [pytest.mark.zk, pytest.mark.agent]

CLUSTER = "pull"
LAYOUT = {"a": "rack1", "b": "rack2", "t": "rack1"}  # "a" shares the target's rack: tried first


@pytest.fixture(scope="module")
def agents(zk_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("pull-agents")
    ns = ZkNamespace(zk_server, label="pull-range")
    procs = ProcessRegistry(base / "procs")
    admin = ns.client()
    try:
        nodes = {n: AgentNode(procs, base, ns.connect_string, cluster=CLUSTER, node_id=n, region="r1", rack=k) for n, k in LAYOUT.items()}
        for node in nodes.values():
            node.start(wait=False)
        for node in nodes.values():
            node.wait_ready(admin)
        yield nodes, MetaStore(admin, CLUSTER)
    finally:
        admin.stop()
        admin.close()
        procs.close()
        ns.close()


def run(meta: MetaStore, body: Callable[[AgentPool], Awaitable[None]]) -> None:
    """``body`` with a pool of the cluster's agents (closed after), bounded in time."""

    async def bounded() -> None:
        pool = AgentPool(meta, harness_credentials())
        try:
            async with asyncio.timeout(120):
                await body(pool)
        finally:
            await pool.close()

    asyncio.run(bounded())


def entries(log_id: int, seq: int, count: int) -> list[bytes]:
    return [encode(Entry(log_id, seq, i, i - 1, os.urandom(1000 + (i * 7919) % 5000))) for i in range(count)]


async def put(pool: AgentPool, node: str, data: list[bytes], ids: range | list[int]) -> None:
    client = await pool.client(node)
    await asyncio.gather(*(client.add(data[i]) for i in ids))


async def requests(pool: AgentPool, node: str) -> int:
    return (await (await pool.client(node)).stat())["server"]["requests"]


async def pulled(pool: AgentPool, node: str) -> dict[str, int]:
    return (await (await pool.client(node)).stat())["pull"]


def test_a_pull_copies_the_range_over_one_connection_and_answers_its_crcs(agents) -> None:
    nodes, meta = agents

    async def body(pool: AgentPool) -> None:
        data = entries(21, 1, 300)
        await put(pool, "a", data, range(300))
        target = await pool.client("t")
        before_a, before = await requests(pool, "a"), await pulled(pool, "t")
        got = await target.pull_range(21, 1, 0, 299, "a", 64 * 1024 * 1024)
        assert (got.entries, got.reason) == (300, "")
        assert got.bytes == sum(map(len, data))
        assert list(got.crcs) == [decode_header(d).crc for d in data]
        for i in (0, 1, 150, 299):
            assert await target.read(21, 1, i) == data[i]
        digest = await target.digest(21, 1, 0, 299)
        assert (digest.entries, digest.digest) == (300, digest_of((i, decode_header(d).crc) for i, d in enumerate(data)))
        # The target read ranges, not entries: a handful of requests served by the source.
        served = await requests(pool, "a") - before_a - 1
        assert 0 < served < 10, f"{served} requests to the source for 300 entries"
        after = await pulled(pool, "t")
        assert after["pulled_entries"] - before["pulled_entries"] == 300
        assert after["pulled_bytes"] - before["pulled_bytes"] == got.bytes
        # Pulling again is idempotent: identical bytes count as stored.
        again = await target.pull_range(21, 1, 0, 299, "a", 64 * 1024 * 1024)
        assert (again.entries, again.reason, again.crcs) == (300, "", got.crcs)

    run(meta, body)


def test_a_pull_stops_at_its_byte_cap_and_at_the_sources_first_gap_and_says_why(agents) -> None:
    nodes, meta = agents

    async def body(pool: AgentPool) -> None:
        data = entries(22, 1, 200)
        await put(pool, "b", data, [*range(100), *range(150, 200)])  # b lacks 100..149
        target = await pool.client("t")
        cap = sum(map(len, data[:10]))
        short = await target.pull_range(22, 1, 0, 199, "b", cap)
        assert short.reason == "", "stopping at the byte cap is not a failure"
        assert 1 <= short.entries <= 10 and short.bytes == sum(map(len, data[: short.entries]))
        gap = await target.pull_range(22, 1, short.entries, 199, "b", 64 * 1024 * 1024)
        assert gap.entries == 100 - short.entries
        assert "source b" in gap.reason and "NoSuchEntry" in gap.reason and "entry 100" in gap.reason, gap.reason
        digest = await target.digest(22, 1, 0, 199)
        assert digest.entries == 100, "exactly the entries answered, nothing past the gap"

    run(meta, body)


def test_a_pull_only_ever_reaches_registered_agents(agents) -> None:
    """The source is a node id looked up in the cluster's availability records: the agent
    itself is refused, and an unknown name or a raw address (even a real agent's) reaches no one."""
    nodes, meta = agents

    async def body(pool: AgentPool) -> None:
        data = entries(23, 1, 5)
        await put(pool, "a", data, range(5))
        target = await pool.client("t")
        with pytest.raises(BadRequestError, match="this agent"):
            await target.pull_range(23, 1, 0, 4, "t", 1 << 20)
        for source in ("nosuch", nodes["a"].address):
            got = await target.pull_range(23, 1, 0, 4, source, 1 << 20)
            assert got.entries == 0 and "not available" in got.reason, (source, got)
        with pytest.raises(NoSuchSegmentError):
            await target.digest(23, 1, 0, 4)

    run(meta, body)


def test_copy_replica_pulls_by_default_falls_over_between_sources_and_matches_the_copy_through_the_copier(agents) -> None:
    nodes, meta = agents

    async def body(pool: AgentPool) -> None:
        await pool.refresh()
        results: dict[bool, Any] = {}
        for seq, pull in ((1, True), (2, False)):
            seg = SegmentRecord(seq, SegmentState.COMPLETED, (EnsembleChange(0, ("a", "b", "lost")),), 3, 2, time.time(), last_entry_id=399)
            data = entries(24, seq, 400)
            await put(pool, "a", data, range(250))  # the nearer source lost its tail: the rest comes from b
            await put(pool, "b", data, range(400))
            before = await pulled(pool, "t")
            results[pull] = await copy_replica(pool, 24, seg, "lost", "t", {"lost"}, batch_bytes=256 * 1024, pull=pull)
            after = await pulled(pool, "t")
            ids = entries_on(seg, "lost")
            expected = digest_of((i, decode_header(data[i]).crc) for i in ids)
            assert (results[pull].entries, results[pull].digest, results[pull].bytes) == (400, expected, sum(map(len, data)))
            digest = await (await pool.client("t")).digest(24, seq, 0, 399)
            assert (digest.entries, digest.digest) == (400, expected)
            moved = after["pulled_entries"] - before["pulled_entries"]
            cut = after["pulls_cut_short"] - before["pulls_cut_short"]
            if pull:
                assert moved == 400, "every entry was pulled by the target"
                assert cut >= 1, "a pull from a stopped at its gap and b served the rest"
            else:
                assert (moved, cut) == (0, 0), "the control copies through this process"

    run(meta, body)
