"""Owner-change latency under load: how long appends stop when a log's owner dies, with fast
takeover (issue 24 item 1: the new owner opens its own segment while the old one is still
being recovered) next to the baseline measured in the same run (recover first, then append).

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


async def takeover(meta: MetaStore, log: str, fast: bool) -> tuple[float, float, int]:
    pool = AgentPool(meta, harness_credentials())
    started = time.perf_counter()
    writer = await LogWriter.open(meta, pool, log, ownership_wait=10.0, fast_takeover=fast)
    opened = time.perf_counter() - started
    await writer.append(b"first record of the new owner")
    first = time.perf_counter() - started
    recovered = sum(r.recovered_entries for r in await writer.recovery_done())
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
        print(f"E=3 W=3 A=2, {opts.in_flight} records of {opts.size} B in flight when the owner dies ({opts.rounds} rounds each)")
        print(f"  {'':24} {'recover first (baseline)':>30} {'fast takeover':>30}")
        figures: dict[bool, tuple[list[float], list[float], list[int]]] = {False: ([], [], []), True: ([], [], [])}
        for r in range(opts.rounds):
            for fast in (False, True):  # interleaved: both see the same machine state
                log = f"owner-change-{r}-{'fast' if fast else 'slow'}"
                meta.create_log(log, LogConfig(3, 3, 2))
                asyncio.run(owner_dies(up.ns.connect_string, log, opts.in_flight, opts.size))
                for series, value in zip(figures[fast], asyncio.run(takeover(meta, log, fast))):
                    series.append(value)

        def cell(values: list[float]) -> str:
            return f"median {statistics.median(values) * 1000:6.1f} ms, max {max(values) * 1000:6.1f}"

        for label, index in (("new owner open", 0), ("new owner first ack", 1)):
            print(f"  {label:24} {cell(figures[False][index]):>30} {cell(figures[True][index]):>30}")
        print(f"  {'entries recovered':24} {statistics.median(figures[False][2]):>30.0f} {statistics.median(figures[True][2]):>30.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
