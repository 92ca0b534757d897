"""Write proxies under many producers, against one library writer, on this machine, in one run.

    .venv/bin/python tests/benchmarks/bench_proxy.py [--producers 50] [--records 300000]
        [--record-size 100] [--window 256] [--clients 2] [--rounds 3] [--json]

What runs: ``dlctl sandbox up --regions 1 --nodes-per-region 3`` in a temporary directory (three
real agents with fsync on), two logs with E=W=3, A=2. Each round measures, alternating the
order from round to round:

* **proxy**: ``--producers`` ``LogProducer`` instances append ``--records`` records in total to
  one log through its owning agent. The producers run in ``--clients`` processes (asyncio inside
  each; producers of a process share one connection per agent), each keeping up to ``--window``
  records submitted and unacknowledged. The owning agent batches every producer's records into
  the same entries. Latency = submit → acknowledgement of each record.
* **baseline, one library writer**: one ``LogWriter`` appending the same number of records to the
  other log from one process, pipelined under its own back-pressure (this process owns the log).

A run ends when its last record is acknowledged. Reported: median over rounds of aggregate
records/s and of each round's p50/p99 latency, every round's figures, and the load average.
Goal (issue 7): proxy >= 50,000 records/s aggregate for 50 producers of 100-byte records.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dlctl.config import locate_config
from dlctl.inventory import load
from dlctl.log.pool import AgentPool
from dlctl.log.producer import LogProducer, ProducerOptions, ProxyRouter
from dlctl.log.writer import LogWriter
from dlctl.ops.session import ClusterSession

GOAL = 50_000


def dlctl(env: dict[str, str], *argv: str, timeout: float = 600) -> str:
    result = subprocess.run([sys.executable, "-m", "dlctl.cli", *argv], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise RuntimeError(f"dlctl {' '.join(argv)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result.stdout


def session_for(config: str) -> ClusterSession:
    inventory = load(locate_config(config, {}))
    return ClusterSession(inventory.cluster(next(iter(inventory.clusters))))


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def _produce(config: str, log: str, producers: int, records: int, size: int, window: int) -> list[float]:
    session = session_for(config)
    pool = AgentPool(session.meta, session.credentials, request_timeout=30)
    router = ProxyRouter(pool)
    latencies: list[float] = []
    payload = b"x" * size
    per = records // producers
    opts = ProducerOptions(max_in_flight=8)

    async def one(producer: LogProducer) -> None:
        outstanding: set[asyncio.Future] = set()
        for _ in range(per):
            while len(outstanding) >= window:
                _, outstanding = await asyncio.wait(outstanding, return_when=asyncio.FIRST_COMPLETED)
            started = time.perf_counter()
            fut = producer.submit(payload)
            fut.add_done_callback(lambda f, s=started: latencies.append(time.perf_counter() - s))
            outstanding.add(fut)
        await producer.flush()

    group = [LogProducer(session.meta, pool, log, options=opts, router=router) for _ in range(producers)]
    await group[0].append(b"warm")  # route and connection ready before the clock starts
    await asyncio.gather(*(one(p) for p in group))
    for producer in group:
        await producer.close()
    await pool.close()
    session.close()
    return latencies


def _client_main(config: str, log: str, producers: int, records: int, size: int, window: int, ready: Any, go: Any, out: Any) -> None:
    async def main() -> list[float]:
        ready.set()
        while not go.is_set():
            await asyncio.sleep(0.005)
        return await _produce(config, log, producers, records, size, window)

    out.put(asyncio.run(main()))


def run_proxy(config: str, log: str, args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs, readies = [], []
    for c in range(args.clients):
        share = args.producers // args.clients + (1 if c < args.producers % args.clients else 0)
        ready = ctx.Event()
        proc = ctx.Process(target=_client_main, args=(config, log, share, args.records * share // args.producers, args.record_size, args.window, ready, go, out))
        proc.start()
        procs.append(proc)
        readies.append(ready)
    for ready in readies:
        ready.wait(60)
    started = time.perf_counter()
    go.set()
    latencies: list[float] = []
    for _ in procs:
        latencies += out.get(timeout=600)
    elapsed = time.perf_counter() - started
    for proc in procs:
        proc.join(60)
    return {"records_per_second": len(latencies) / elapsed, "p50_ms": percentile(latencies, 0.5) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000, "records": len(latencies)}


async def _writer_run(config: str, log: str, records: int, size: int) -> dict[str, Any]:
    session = session_for(config)
    pool = AgentPool(session.meta, session.credentials)
    writer = await LogWriter.open(session.meta, pool, log)
    payload = b"x" * size
    latencies: list[float] = []
    started = time.perf_counter()
    for _ in range(records):
        await writer.wait_writable()
        t = time.perf_counter()
        writer.submit(payload).add_done_callback(lambda f, s=t: latencies.append(time.perf_counter() - s))
    await writer.flush()
    elapsed = time.perf_counter() - started
    await writer.close()
    await pool.close()
    session.close()
    return {"records_per_second": records / elapsed, "p50_ms": percentile(latencies, 0.5) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000, "records": records}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=50)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--window", type=int, default=256, help="records each producer keeps unacknowledged")
    parser.add_argument("--clients", type=int, default=2, help="client processes the producers are spread over")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        sandbox = Path(tmp) / "sandbox"
        env = {"DLCTL_CONFIG": str(sandbox / "config.toml"), "DLCTL_SANDBOX_DIR": str(sandbox)}
        config = env["DLCTL_CONFIG"]
        print("starting a 3-agent sandbox ...", file=sys.stderr, flush=True)
        dlctl(env, "--yes", "sandbox", "up", "--regions", "1", "--nodes-per-region", "3", "--dir", str(sandbox))
        try:
            dlctl(env, "--yes", "log", "create", "via-proxy", "-e", "3", "-w", "3", "-a", "2")
            dlctl(env, "--yes", "log", "create", "via-writer", "-e", "3", "-w", "3", "-a", "2")
            rounds = []
            for r in range(args.rounds):
                order = ["proxy", "writer"] if r % 2 == 0 else ["writer", "proxy"]
                result: dict[str, Any] = {}
                for which in order:
                    print(f"round {r + 1}/{args.rounds}: {which} ...", file=sys.stderr, flush=True)
                    if which == "proxy":
                        result["proxy"] = run_proxy(config, "via-proxy", args)
                    else:
                        result["writer"] = asyncio.run(_writer_run(config, "via-writer", args.records, args.record_size))
                rounds.append(result)
        finally:
            dlctl(env, "--yes", "sandbox", "down", "--purge", "--dir", str(sandbox), timeout=120)

    def med(which: str, key: str) -> float:
        return statistics.median(r[which][key] for r in rounds)

    summary = {
        "producers": args.producers,
        "client_processes": args.clients,
        "record_size": args.record_size,
        "records_per_round": args.records,
        "proxy": {k: round(med("proxy", k), 2) for k in ("records_per_second", "p50_ms", "p99_ms")},
        "baseline_one_library_writer": {k: round(med("writer", k), 2) for k in ("records_per_second", "p50_ms", "p99_ms")},
        "rounds": rounds,
        "loadavg": os.getloadavg(),
        "goal_records_per_second": GOAL,
    }
    summary["goal_met"] = summary["proxy"]["records_per_second"] >= GOAL
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        p, w = summary["proxy"], summary["baseline_one_library_writer"]
        print(f"{args.producers} producers through the owning agent ({args.clients} client processes), {args.record_size} B records, median of {args.rounds} rounds:")
        print(f"  proxy:                 {p['records_per_second']:>10,.0f} records/s   p50 {p['p50_ms']:.2f} ms   p99 {p['p99_ms']:.2f} ms")
        print(f"  one library writer:    {w['records_per_second']:>10,.0f} records/s   p50 {w['p50_ms']:.2f} ms   p99 {w['p99_ms']:.2f} ms   (baseline, same run)")
        print(f"  goal >= {GOAL:,} records/s aggregate: {'met' if summary['goal_met'] else 'MISSED'}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        for i, r in enumerate(rounds, 1):
            print(f"  round {i}: proxy {r['proxy']['records_per_second']:,.0f}/s p99 {r['proxy']['p99_ms']:.1f} ms; writer {r['writer']['records_per_second']:,.0f}/s p99 {r['writer']['p99_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
