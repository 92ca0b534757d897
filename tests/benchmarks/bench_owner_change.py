"""Owner-change latency under load: how long appends stop when a log's owner dies (issue 24
item 1's "before"; the same script measures the "after" once a new owner opens its segment
while the old one is still being recovered).

    .venv/bin/python tests/benchmarks/bench_owner_change.py [--rounds 5] [--in-flight 200] [--size 1024]

Three real agents (one real ZooKeeper: the test harness); logs with E = W = 3, A = 2. Per round,
owner A appends ``--size``-byte records, keeping ``--in-flight`` unacknowledged, and dies
mid-stream: its ZooKeeper session is closed (the owner znode goes, as after a crash once the
session expires) and its connections dropped, with entries still in flight. A new owner B then
takes the log over — fence, recover and close A's in-progress segment, open its own — and
appends. Timed from B's start:

- ``open``: until B may append (``LogWriter.open`` returned);
- ``first ack``: until B's first record is acknowledged, the gap a producer sees.

The session-expiry wait before B may start is left out (ZooKeeper's session timeout decides it,
not the writer), and so is the proxy's producer-table rebuild.
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
from harness.logcluster import CLUSTER, bench_agents
from harness.zk import close_client, make_client

from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.meta.records import LogConfig
from dlctl.meta.store import MetaStore


async def owner_dies(connect: str, log: str, in_flight: int, size: int) -> int:
    """Owner A appends with ``in_flight`` records outstanding, then dies; the records acknowledged."""
    zk = make_client(connect)
    meta = MetaStore(zk, CLUSTER)
    pool = AgentPool(meta, harness_credentials())
    writer = await LogWriter.open(meta, pool, log)
    payload = b"x" * size
    acked = 0
    pending: list[asyncio.Future] = []
    for _ in range(20 * in_flight):
        pending.append(writer.submit(payload))
        if len(pending) >= in_flight:
            await pending.pop(0)
            acked += 1
    close_client(zk)  # the session ends: the owner znode goes with it
    await pool.close()  # and the connections, with entries in flight
    for f in pending:
        f.cancel()
    return acked


async def takeover(meta: MetaStore, log: str) -> tuple[float, float, int]:
    pool = AgentPool(meta, harness_credentials())
    started = time.perf_counter()
    writer = await LogWriter.open(meta, pool, log, ownership_wait=10.0)
    opened = time.perf_counter() - started
    await writer.append(b"first record of the new owner")
    first = time.perf_counter() - started
    recovered = sum(r.recovered_entries for r in writer.recovered)
    await writer.close()
    await pool.close()
    return opened, first, recovered


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--rounds", type=int, default=5)
    args.add_argument("--in-flight", type=int, default=200)
    args.add_argument("--size", type=int, default=1024)
    opts = args.parse_args(argv)
    with bench_agents("bench-owner-") as up:
        meta = MetaStore(up.admin, CLUSTER)
        opened, first, recovered = [], [], []
        for r in range(opts.rounds):
            log = f"owner-change-{r}"
            meta.create_log(log, LogConfig(3, 3, 2))
            asyncio.run(owner_dies(up.ns.connect_string, log, opts.in_flight, opts.size))
            o, f, n = asyncio.run(takeover(meta, log))
            opened.append(o)
            first.append(f)
            recovered.append(n)
        print(f"E=3 W=3 A=2, {opts.in_flight} records of {opts.size} B in flight when the owner dies ({opts.rounds} rounds)")
        print(f"  new owner open        median {statistics.median(opened) * 1000:8.1f} ms   max {max(opened) * 1000:8.1f} ms")
        print(f"  new owner first ack   median {statistics.median(first) * 1000:8.1f} ms   max {max(first) * 1000:8.1f} ms")
        print(f"  entries recovered     median {statistics.median(recovered):8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
