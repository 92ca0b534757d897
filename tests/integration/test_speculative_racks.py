"""Speculative reads cross a failure domain (issue 24 item 2), against real agents and a real
fault proxy in front of each.

Agents n1 and n2 sit in the reader's rack, n3 in another rack of the same region. The two in
the reader's rack answer late (the fault proxy delays them: no failure). The first request for
an entry goes to the nearest replica, one of n1 and n2; the second must cross to the other
rack — n3 — not go to the other replica in the reader's rack, which would be as late. Which
agents were asked is read off their proxies: the reader's pool connects to an agent the first
time it sends it a request (the delay applies to the bytes, not to the connection).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from dlctl.log.pool import AgentPool
from dlctl.log.reader import LogReader, ReadAhead
from dlctl.log.readpolicy import AdaptiveTimeout
from dlctl.log.writer import LogWriter
from dlctl.meta.records import LogConfig
from dlctl.meta.store import MetaStore
from dlctl.replication.source import RoutedAgentPool
from harness.agents import AgentNode, harness_credentials
from harness.faultproxy import FaultNetwork
from harness.procs import ProcessRegistry
from harness.zk import ZkNamespace, close_client, make_client

pytestmark = [pytest.mark.zk, pytest.mark.agent]

CLUSTER = "racks"
PLACES = {"n1": "rack-a", "n2": "rack-a", "n3": "rack-b"}
DELAY = 1.0  # seconds each way through the proxies of n1 and n2


@pytest.fixture(scope="module")
def agents(zk_server, tmp_path_factory) -> Iterator[tuple[ZkNamespace, dict[str, AgentNode]]]:
    zk_server.ensure_running()
    ns = ZkNamespace(zk_server, label="test_speculative_racks")
    registry = ProcessRegistry(tmp_path_factory.mktemp("racks-procs"))
    base = tmp_path_factory.mktemp("racks-agents")
    admin = ns.client()
    try:
        nodes = {n: AgentNode(registry, base, ns.connect_string, cluster=CLUSTER, node_id=n, region="r1", rack=rack) for n, rack in PLACES.items()}
        for node in nodes.values():
            node.start(wait=False)
        for node in nodes.values():
            node.wait_ready(admin)
        yield ns, nodes
    finally:
        close_client(admin)
        registry.close()
        ns.close()


def test_the_second_request_crosses_to_another_rack_when_two_replicas_share_the_readers(agents, fault_network: FaultNetwork):
    ns, nodes = agents
    proxies = {n: fault_network.proxy((a.host, a.port), node=n, name=f"reader->{n}") for n, a in nodes.items()}
    zkc = make_client(ns.connect_string)
    entries = 5

    async def main() -> None:
        meta = MetaStore(zkc, CLUSTER)
        meta.create_log("racked", LogConfig(ensemble_size=3, write_quorum=3, ack_quorum=2))
        direct = AgentPool(meta, harness_credentials())
        writer = await LogWriter.open(meta, direct, "racked")
        futures = []
        for i in range(entries):
            futures.append(writer.submit(f"r{i}".encode()))
            await writer.flush()  # an entry each
        await writer.close()
        await direct.close()
        written = [f.result() for f in futures]

        pool = RoutedAgentPool(meta, harness_credentials(), addresses={n: "%s:%d" % p.address for n, p in proxies.items()})
        await pool.refresh()
        for n in ("n1", "n2"):
            proxies[n].delay = DELAY
        reader = LogReader(meta, pool, "racked", region="r1", rack="rack-a", read_ahead=ReadAhead(max_entries=1),
                           speculative_timeout=AdaptiveTimeout(floor=0.05, ceiling=0.2, initial=0.05))
        try:
            async with reader:
                before = {n: p.accepted for n, p in proxies.items()}
                started = time.monotonic()
                first = await reader.read_next(10)
                took = time.monotonic() - started
                asked = {n: p.accepted - before[n] for n, p in proxies.items()}
                assert first is not None and first.dlsn == written[0]
                # Answered by n3 long before the delayed ones could have: the second request went
                # there; the replica left in the reader's rack was never asked.
                assert took < DELAY, took
                assert asked["n3"] > 0, asked
                assert sum(1 for n in ("n1", "n2") if asked[n] > 0) == 1, asked
                rest = [await reader.read_next(10) for _ in range(entries - 1)]
                assert [r.dlsn for r in rest] == written[1:]
        finally:
            await pool.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        close_client(zkc)
