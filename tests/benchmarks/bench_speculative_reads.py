"""Read latency with one replica delayed, the adaptive replica order vs the previous static one,
in the same run (issue 24, DistributedLog's speculative reads).

    .venv/bin/python tests/benchmarks/bench_speculative_reads.py [--entries 2000] [--delay-ms 20]

Three real agents in regions r1, r2, r3 (one real ZooKeeper: the test harness); a log of
``--entries`` one-record entries (E = W = 3). The reader sits in r1, so n1 is its nearest
replica, and n1 is reached through a fault proxy that adds ``--delay-ms`` to each round trip
(half each way): slower, never failing, always within the speculative timeout's ceiling. Each
entry is read on its own (read-ahead 1) and timed, once with the adaptive order
(``readpolicy.speculative_order`` fed by ``ReplicaScores``) and once with the order readers used
before it (``readpolicy.order_replicas``: nearest first, demoted only after a speculative
timeout). Prints p50, p99 and mean per read, and how many reads n1 served.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the harness

from harness.agents import harness_credentials
from harness.faultproxy import FaultNetwork
from harness.logcluster import CLUSTER, bench_agents

from dlctl.log.pool import AgentPool
from dlctl.log.reader import LogReader, ReadAhead
from dlctl.log.readpolicy import order_replicas
from dlctl.log.speculative import ReplicaReader
from dlctl.log.writer import LogWriter
from dlctl.meta.records import LogConfig
from dlctl.meta.store import MetaStore
from dlctl.replication.source import RoutedAgentPool

LOG = "reads"
REGIONS = {"n1": "r1", "n2": "r2", "n3": "r3"}


class StaticOrder(ReplicaReader):
    """The order readers used before the adaptive one: nearest first, suspects last."""

    def order(self, nodes: tuple[str, ...], lacking: frozenset[str] = frozenset(), *, salt: object = None) -> tuple[str, ...]:
        return order_replicas(nodes, self.pool.nodes, self.region, self.rack, self.suspects.active(self._clock()), lacking)


class Counting:
    """Which replica served each read (wraps ``_read_one``)."""

    def __init__(self, replicas: ReplicaReader) -> None:
        self.served: dict[str, int] = {}
        inner = replicas._read_one

        async def read_one(node: str, *args, **kwargs):
            entry = await inner(node, *args, **kwargs)
            self.served[node] = self.served.get(node, 0) + 1
            return entry

        replicas._read_one = read_one  # type: ignore[method-assign]


async def write(meta: MetaStore, entries: int) -> None:
    pool = AgentPool(meta, harness_credentials())
    writer = await LogWriter.open(meta, pool, LOG)
    try:
        for i in range(entries):
            await writer.append(f"record {i}".encode())  # one at a time: one record per entry
    finally:
        await writer.close()
        await pool.close()


async def read(meta: MetaStore, routes: dict[str, str], entries: int, static: bool) -> tuple[list[float], dict[str, int]]:
    pool = RoutedAgentPool(meta, harness_credentials(), addresses=routes)
    await pool.refresh()
    reader = LogReader(meta, pool, LOG, region="r1", read_ahead=ReadAhead(max_entries=1))
    if static:
        reader.replicas = StaticOrder(pool, region="r1", timeout=reader.replicas.timeout)
    counting = Counting(reader.replicas)
    took: list[float] = []
    try:
        async with reader:
            for _ in range(entries):
                started = time.perf_counter()
                record = await reader.read_next(10)
                took.append(time.perf_counter() - started)
                assert record is not None
    finally:
        await pool.close()
    return took, counting.served


def describe(name: str, took: list[float], served: dict[str, int]) -> str:
    ms = sorted(t * 1000 for t in took)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return f"{name:<10} p50 {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms   mean {statistics.fmean(ms):7.2f} ms   served by n1: {served.get('n1', 0)}/{len(took)}"


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--entries", type=int, default=2000)
    args.add_argument("--delay-ms", type=float, default=20.0)
    opts = args.parse_args(argv)
    with bench_agents("bench-spec-", regions=REGIONS) as up:
        agents = up.agents
        meta = MetaStore(up.admin, CLUSTER)
        meta.create_log(LOG, LogConfig(3, 3, 2))
        asyncio.run(write(meta, opts.entries))
        with FaultNetwork() as network:
            n1 = agents["n1"]
            proxy = network.proxy((n1.host, n1.port), node="n1", name="reader->n1")
            proxy.delay = opts.delay_ms / 2000  # half of the round trip each way
            routes = {"n1": "%s:%d" % proxy.address}
            print(f"{opts.entries} one-record entries, E=W=3 over r1/r2/r3; reader in r1; n1 (r1) delayed {opts.delay_ms:g} ms per round trip")
            static = asyncio.run(read(meta, routes, opts.entries, static=True))
            adaptive = asyncio.run(read(meta, routes, opts.entries, static=False))
            print(describe("static", *static))
            print(describe("adaptive", *adaptive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
