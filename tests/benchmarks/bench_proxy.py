"""Write proxies under many producers, against one library writer, on this machine, in one run.

    .venv/bin/python tests/benchmarks/bench_proxy.py [--producers 50] [--records 300000]
        [--record-size 100] [--window 256] [--clients 2] [--rounds 3] [--json]
        [--kill-records 100000] [--no-kill]

What runs: ``dlctl sandbox up --regions 1 --nodes-per-region 3`` in a temporary directory (three
real agents with fsync on), two logs with E=W=3, A=2. Each round measures, rotating the order
from round to round:

* **proxy**: ``--producers`` ``LogProducer`` instances append ``--records`` records in total to
  one log through its owning agent. The producers run in ``--clients`` processes (asyncio inside
  each; producers of a process share one connection per agent), each keeping up to ``--window``
  records submitted and unacknowledged. The owning agent batches every producer's records into
  the same entries. Latency = submit → acknowledgement of each record.
* **proxy, idempotence off**: the same, with ``ProducerOptions(idempotent=False)`` (at-least-once
  producers: no request numbers, no deduplication at the owner), to the *same* log, so through
  the same owning agent (logs of different names hash to different owners, and on one machine
  the agents differed by more than the 5 % measured here). The proxy run above uses the
  default, exactly-once producers.
* **baseline, one library writer**: one ``LogWriter`` appending the same number of records to the
  other log from one process, pipelined under its own back-pressure (this process owns the log).

A run ends when its last record is acknowledged. Reported: median over rounds of aggregate
records/s and of each round's p50/p99 latency, every round's figures, and the load average.
Goal (issue 7): proxy >= 50,000 records/s aggregate for 50 producers of 100-byte records.
Goal (exactly-once producers): with idempotence on, at most 5 % fewer records/s than off
(ratio of the medians >= 0.95).

Then (unless ``--no-kill``) **owner kill**, once with idempotence on and once off for contrast:
``--producers`` producers in this process append ``--kill-records`` uniquely numbered records to a
fresh log (E=W=3, A=2); once 30 % are acknowledged the owning agent is SIGKILLed and restarted at
once (``dlagent start``, as a supervisor would); the producers fail over to the next owner (another
agent, or the restarted one, once the dead owner's session has expired). After
the last acknowledgement the log is released (its segment closed) and read back whole with the log
reader: duplicates = records in the log minus distinct records. Goal: 0 duplicates with idempotence
on (and no acknowledged record missing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dlctl.config import locate_config
from dlctl.inventory import load
from dlctl.log.errors import AgentError
from dlctl.log.ownership import owner_info
from dlctl.log.pool import AgentPool
from dlctl.log.producer import LogProducer, ProducerOptions, ProxyRouter
from dlctl.log.reader import LogReader
from dlctl.log.writer import LogWriter
from dlctl.session import ClusterSession
from dlctl.sandbox import sandbox as sandbox_state

GOAL = 50_000
IDEMPOTENCE_MIN_RATIO = 0.95  # idempotence on: at most 5 % fewer records/s than off
KILL_AT = 0.3  # the owner is SIGKILLed once this share of the kill run's records is acknowledged


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


async def _produce(config: str, log: str, producers: int, records: int, size: int, window: int, idempotent: bool = True) -> list[float]:
    session = session_for(config)
    pool = AgentPool(session.meta, session.credentials, request_timeout=30)
    router = ProxyRouter(pool)
    latencies: list[float] = []
    payload = b"x" * size
    per = records // producers
    opts = ProducerOptions(max_in_flight=8, idempotent=idempotent)

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


def _client_main(config: str, log: str, producers: int, records: int, size: int, window: int, ready: Any, go: Any, out: Any, idempotent: bool = True) -> None:
    async def main() -> list[float]:
        ready.set()
        while not go.is_set():
            await asyncio.sleep(0.005)
        return await _produce(config, log, producers, records, size, window, idempotent)

    out.put(asyncio.run(main()))


def run_proxy(config: str, log: str, args: argparse.Namespace, idempotent: bool = True) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs, readies = [], []
    for c in range(args.clients):
        share = args.producers // args.clients + (1 if c < args.producers % args.clients else 0)
        ready = ctx.Event()
        proc = ctx.Process(target=_client_main, args=(config, log, share, args.records * share // args.producers, args.record_size, args.window, ready, go, out, idempotent))
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


def _agent_configs(directory: Path) -> dict[str, Path]:
    """node id -> agent.toml of every agent of the sandbox in ``directory``."""
    state = sandbox_state.read_state(directory) or {"nodes": []}
    return {n["node_id"]: Path(n["dir"]) / "agent.toml" for n in state["nodes"]}


def _agent_pid(config: Path) -> int:
    result = subprocess.run([sys.executable, "-m", "dlagent", "status", "--config", str(config), "-o", "json"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if result.returncode != 0 or not json.loads(result.stdout).get("pid"):
        raise RuntimeError(f"dlagent status --config {config}: {result.stderr.strip() or result.stdout.strip()}")
    return int(json.loads(result.stdout)["pid"])


def _start_agent(config: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "dlagent", "start", "--config", str(config), "-o", "json"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise RuntimeError(f"dlagent start --config {config} exited {result.returncode}: {result.stderr.strip()}")


async def _proxy_counter(pool: AgentPool, key: str) -> dict[str, int]:
    """Each reachable agent's write-proxy counter ``key`` (STAT)."""
    await pool.refresh()
    out = {}
    for node in pool.nodes:
        try:
            out[node] = (await (await pool.client(node)).stat()).get("proxy", {}).get(key, 0)
        except AgentError:
            pass
    return out


async def _kill_run(config: str, directory: Path, log: str, producers: int, records: int, size: int, window: int, idempotent: bool) -> dict[str, Any]:
    """Owner kill under load (see the module docstring): what the log holds afterwards."""
    session = session_for(config)
    pool = AgentPool(session.meta, session.credentials, request_timeout=5)
    router = ProxyRouter(pool)
    agents = _agent_configs(directory)
    loop = asyncio.get_running_loop()
    opts = ProducerOptions(max_in_flight=8, idempotent=idempotent, retry_timeout=120)
    group = [LogProducer(session.meta, pool, log, options=opts, router=router) for _ in range(producers)]
    per = records // producers
    acked: dict[bytes, Any] = {}
    failed: list[BaseException] = []
    await group[0].append(b"warm")
    acked[b"warm"] = None
    before = await _proxy_counter(pool, "duplicate_requests")

    def done(data: bytes, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            failed.append(fut.exception() if not fut.cancelled() else asyncio.CancelledError())
        else:
            acked[data] = fut.result()

    async def one(i: int, producer: LogProducer) -> None:
        outstanding: set[asyncio.Future] = set()
        for seq in range(per):
            while len(outstanding) >= window:
                _, outstanding = await asyncio.wait(outstanding, return_when=asyncio.FIRST_COMPLETED)
            data = f"{i:04d}-{seq:09d}".encode().ljust(size, b".")
            fut = producer.submit(data)
            fut.add_done_callback(lambda f, d=data: done(d, f))
            outstanding.add(fut)
        if outstanding:
            await asyncio.wait(outstanding)

    started = time.perf_counter()
    tasks = [asyncio.ensure_future(one(i, p)) for i, p in enumerate(group)]
    while len(acked) < KILL_AT * per * producers and not all(t.done() for t in tasks):
        await asyncio.sleep(0.01)
    current = await loop.run_in_executor(None, session.meta.owner_of, log)
    owner = owner_info(current[0])["node"] if current else None
    if owner is None or all(t.done() for t in tasks):
        raise RuntimeError(f"owner kill run on {log!r}: no owner to kill (owner {owner!r}, {len(acked)} acknowledged)")
    pid = await loop.run_in_executor(None, _agent_pid, agents[owner])
    acked_at_kill = len(acked)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.perf_counter()
    await loop.run_in_executor(None, _start_agent, agents[owner])  # restarted at once, as by a supervisor
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    stats = [dict(p.stats) for p in group]
    for producer in group:
        await producer.close()
    after = await _proxy_counter(pool, "duplicate_requests")
    deduplicated = sum(n - (before.get(node, 0) if node != owner else 0) for node, n in after.items())
    # Close the segment (a graceful handoff), so the reader sees every entry, then read it all.
    current = await loop.run_in_executor(None, session.meta.owner_of, log)
    new_owner = owner_info(current[0])["node"] if current else None
    if new_owner is not None:
        await (await pool.client(new_owner)).release(log)
    found: Counter[bytes] = Counter()
    async with LogReader(session.meta, pool, log) as reader:
        while (record := await reader.read_next(2.0)) is not None:
            found[record.payload] += 1
    await pool.close()
    session.close()
    submitted = per * producers + 1
    return {
        "idempotent": idempotent,
        "records_submitted": submitted,
        "records_acknowledged": len(acked),
        "records_failed": len(failed),
        "acknowledged_at_kill": acked_at_kill,
        "killed_owner": owner,
        "new_owner": new_owner,
        "seconds": round(elapsed, 2),
        "seconds_after_kill": round(time.perf_counter() - killed_at, 2),
        "records_in_log": sum(found.values()),
        "distinct_records_in_log": len(found),
        "duplicates": sum(n - 1 for n in found.values()),
        "acknowledged_missing": sum(1 for data in acked if data not in found),
        "resent_requests": sum(s["resent_requests"] for s in stats),
        "ambiguous_failed": sum(s["ambiguous_failed"] for s in stats),
        "owner_deduplicated_requests": deduplicated,
        "failed_examples": [str(e) for e in failed[:3]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=50)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--window", type=int, default=256, help="records each producer keeps unacknowledged")
    parser.add_argument("--clients", type=int, default=2, help="client processes the producers are spread over")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kill-records", type=int, default=100_000, help="records of each owner-kill run")
    parser.add_argument("--no-kill", action="store_true", help="skip the owner-kill runs")
    args = parser.parse_args(argv)

    kills: dict[str, dict[str, Any]] = {}
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
            kinds = ["proxy", "proxy_off", "writer"]
            for r in range(args.rounds):
                order = kinds[r % 3:] + kinds[: r % 3]  # each measurement first, middle and last in turn
                result: dict[str, Any] = {}
                for which in order:
                    print(f"round {r + 1}/{args.rounds}: {which} ...", file=sys.stderr, flush=True)
                    if which == "proxy":
                        result["proxy"] = run_proxy(config, "via-proxy", args)
                    elif which == "proxy_off":
                        result["proxy_off"] = run_proxy(config, "via-proxy", args, idempotent=False)  # same log, same owner
                    else:
                        result["writer"] = asyncio.run(_writer_run(config, "via-writer", args.records, args.record_size))
                rounds.append(result)
            if not args.no_kill:
                for mode, idempotent in (("on", True), ("off", False)):
                    log = f"owner-kill-idempotence-{mode}"
                    dlctl(env, "--yes", "log", "create", log, "-e", "3", "-w", "3", "-a", "2")
                    print(f"owner kill, idempotence {mode} ...", file=sys.stderr, flush=True)
                    kills[mode] = asyncio.run(_kill_run(config, sandbox, log, args.producers, args.kill_records, args.record_size, args.window, idempotent))
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
        "proxy_no_idempotence": {k: round(med("proxy_off", k), 2) for k in ("records_per_second", "p50_ms", "p99_ms")},
        "baseline_one_library_writer": {k: round(med("writer", k), 2) for k in ("records_per_second", "p50_ms", "p99_ms")},
        "rounds": rounds,
        "loadavg": os.getloadavg(),
        "goal_records_per_second": GOAL,
    }
    summary["goal_met"] = summary["proxy"]["records_per_second"] >= GOAL
    ratio = summary["proxy"]["records_per_second"] / summary["proxy_no_idempotence"]["records_per_second"]
    summary["idempotence"] = {
        "records_per_second_on": summary["proxy"]["records_per_second"],
        "records_per_second_off": summary["proxy_no_idempotence"]["records_per_second"],
        "ratio_on_to_off": round(ratio, 3),
        "round_ratios": [round(r["proxy"]["records_per_second"] / r["proxy_off"]["records_per_second"], 3) for r in rounds],
        "goal_min_ratio": IDEMPOTENCE_MIN_RATIO,
        "goal_met": ratio >= IDEMPOTENCE_MIN_RATIO,
    }
    if kills:
        summary["owner_kill"] = {**kills, "goal_duplicates_on": 0, "goal_met": kills["on"]["duplicates"] == 0 and kills["on"]["acknowledged_missing"] == 0 and kills["on"]["records_failed"] == 0}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        p, o, w = summary["proxy"], summary["proxy_no_idempotence"], summary["baseline_one_library_writer"]
        idem = summary["idempotence"]
        print(f"{args.producers} producers through the owning agent ({args.clients} client processes), {args.record_size} B records, median of {args.rounds} rounds:")
        print(f"  proxy:                 {p['records_per_second']:>10,.0f} records/s   p50 {p['p50_ms']:.2f} ms   p99 {p['p99_ms']:.2f} ms   (idempotence on, the default)")
        print(f"  proxy, no idempotence: {o['records_per_second']:>10,.0f} records/s   p50 {o['p50_ms']:.2f} ms   p99 {o['p99_ms']:.2f} ms")
        print(f"  one library writer:    {w['records_per_second']:>10,.0f} records/s   p50 {w['p50_ms']:.2f} ms   p99 {w['p99_ms']:.2f} ms   (baseline, same run)")
        print(f"  goal >= {GOAL:,} records/s aggregate: {'met' if summary['goal_met'] else 'MISSED'}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        print(
            f"  idempotence on vs off: {idem['records_per_second_on']:,.0f} vs {idem['records_per_second_off']:,.0f} records/s = "
            f"{idem['ratio_on_to_off']:.3f} (per round {', '.join(f'{x:.3f}' for x in idem['round_ratios'])}); "
            f"target >= {IDEMPOTENCE_MIN_RATIO:.2f} (at most 5 % fewer): {'PASS' if idem['goal_met'] else 'MISS'}"
        )
        for i, r in enumerate(rounds, 1):
            print(
                f"  round {i}: proxy {r['proxy']['records_per_second']:,.0f}/s p99 {r['proxy']['p99_ms']:.1f} ms; "
                f"no idempotence {r['proxy_off']['records_per_second']:,.0f}/s p99 {r['proxy_off']['p99_ms']:.1f} ms; "
                f"writer {r['writer']['records_per_second']:,.0f}/s p99 {r['writer']['p99_ms']:.1f} ms"
            )
        if kills:
            on, off = kills["on"], kills["off"]
            print(f"owner SIGKILLed after {KILL_AT:.0%} of {args.kill_records:,} records ({args.producers} producers), restarted at once; log read back whole:")
            for mode, k in (("on", on), ("off", off)):
                print(
                    f"  idempotence {mode:>3}: {k['duplicates']:>6,} duplicate(s) in the log; {k['acknowledged_missing']} acknowledged missing; "
                    f"{k['records_failed']} failed; {k['resent_requests']} request(s) resent, {k['owner_deduplicated_requests']} answered as duplicates by owners; "
                    f"owner {k['killed_owner']} -> {k['new_owner']}{' (restarted)' if k['new_owner'] == k['killed_owner'] else ''}, "
                    f"{k['seconds_after_kill']:.1f}s from the kill to the last ack"
                )
            print(f"  duplicates after an owner kill with idempotence on: {on['duplicates']} (off: {off['duplicates']}); target 0: {'PASS' if summary['owner_kill']['goal_met'] else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
