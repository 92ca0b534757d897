"""Truncating 10,000 segments, and append throughput while `dlctl gc` reclaims them.

    .venv/bin/python tests/benchmarks/bench_truncation.py [--segments 10000] [--window 2] [--rest 10] [--rate R] [--strict]

Real parts: one ZooKeeper server and three ``dlagent`` processes (fsync on) on loopback, as in
the integration tests (``tests/harness``).

1. **Setup, done directly** (said in the output): the 10,000 segments of log ``old`` are
   created as metadata (one znode per completed segment, pipelined, then the log record's
   segment counter set once) plus one small entry per segment on each of the three agents
   (30,000 replica files). Writing 10,000 real segments through the writer would take far
   longer and measure the writer, not truncation.
2. **Truncation**: what ``dlctl truncate old --to <end>`` runs (plan: read every segment
   record; apply: move the truncation point, mark 10,000 segments by CAS in multi-op
   transactions), timed in-process.
3. **Append throughput with and without GC, same run**: a ``LogWriter`` appends 100-byte records
   to another log (E=W=3, A=2, on the same agents and disks) without pause. ``dlctl gc`` runs
   as its own process, as an operator would run it (records leave the metadata, then every
   agent deletes its 10,000 replicas, paced by ``--rate``). Spread over the whole GC, pairs of
   ``--window``-second windows are measured: one while it runs, one while it is paused
   (SIGSTOP), in alternating order; both see the same background load (this machine is
   shared). Between pairs GC runs on for ``--rest`` seconds while the appender rests (so that
   minutes of appends do not fill the disk).
   Target: while GC runs >= 90 % of while it is paused (means over the windows). Windows before
   and after GC are printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the harness

from harness.agents import DEFAULT_SECRET, AgentNode, harness_credentials
from harness.procs import ProcessRegistry
from harness.tls import tls_dir_for
from harness.zk import ZkNamespace, ZooKeeperServer, close_client, make_client, write_harness_zk_auth

from dlctl import inventory
from dlctl.config import ConfigLocation
from dlctl.log import format as fmt
from dlctl.log.client import AgentClient
from dlctl.log.dlsn import DLSN
from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.meta import paths
from dlctl.meta.records import (
    EnsembleChange,
    LogConfig,
    SegmentRecord,
    SegmentState,
    to_json,
)
from dlctl.meta.store import MetaStore
from dlctl.session import ClusterSession
from dlctl.ops.truncate import truncate_plan
from dlctl.plan import apply
from dlctl.secrets import write_secret_file

CLUSTER = "c1"
NODES = ("n1", "n2", "n3")
RECORD = b"r" * 100  # small: appends run for minutes while GC goes on, on a shared disk


def say(text: str) -> None:
    print(text, flush=True)


# -- setup --------------------------------------------------------------------------------------------


def start(work: Path) -> tuple[ProcessRegistry, ZooKeeperServer, ZkNamespace, dict[str, AgentNode], Path]:
    registry = ProcessRegistry(work / "procs")
    server = ZooKeeperServer(work / "zk", registry, name="zk-bench")
    server.start()
    ns = ZkNamespace(server, label="bench-truncation")
    # Housekeeping never decides and reclaims only on start: what is deleted, `dlctl gc` deletes.
    agents = {n: AgentNode(registry, work, ns.connect_string, cluster=CLUSTER, node_id=n, extra_config="[housekeeping]\nenabled = false\ncheck_seconds = 86400\n") for n in NODES}
    for agent in agents.values():
        agent.start(wait=False)
    admin = ns.client()
    for agent in agents.values():
        agent.wait_ready(admin)
    write_secret_file(work / "c1.secret", DEFAULT_SECRET)
    tls_dir_for(work / "c1.secret", "c1")  # the inventory's default tls_dir: the harness CA
    nodes = "".join(f'[[clusters.c1.regions.r1.racks.rack1.nodes]]\nid = "{n}"\nhost = "{a.host}"\nlisten = "{a.address}"\n' for n, a in agents.items())
    config = work / "config.toml"
    zk_auth = write_harness_zk_auth(work / "c1.zk-auth")
    config.write_text(f'default_cluster = "c1"\n[clusters.c1]\nzookeeper = "{ns.connect_string}"\nsecret_file = "c1.secret"\nzk_auth_file = "{zk_auth}"\n{nodes}')
    return registry, server, ns, agents, config


def create_segments_directly(meta: MetaStore, agents: dict[str, AgentNode], name: str, count: int) -> float:
    """``count`` completed one-entry segments: the metadata (pipelined creates, then the log
    record's counter) and one small replica file per segment on every agent (pipelined adds)."""
    t0 = time.perf_counter()
    log = meta.create_log(name, LogConfig(3, 3, 2))
    now = time.time()
    entry_size = fmt.HEADER_SIZE + 64
    pending = []
    for seq in range(1, count + 1):
        record = SegmentRecord(seq, SegmentState.COMPLETED, (EnsembleChange(0, NODES),), 3, 2, now, writer="bench", last_entry_id=0,
                               first_txid=seq - 1, last_txid=seq - 1, records=1, bytes=entry_size, completed=now)
        pending.append(meta.client.create_async(paths.segment(meta.cluster, name, seq), to_json(record), acl=meta.acl))
        if len(pending) >= 512:
            for p in pending:
                p.get()
            pending.clear()
    for p in pending:
        p.get()
    current = meta.get_log(name)
    meta.client.set(paths.log(meta.cluster, name), to_json(replace(current.value, max_segment_seq=count)), version=current.version)

    async def files() -> None:
        async def on(agent: AgentNode) -> None:
            client = AgentClient(agent.host, agent.port, DEFAULT_SECRET, tls=agent.client_tls, request_timeout=60)
            gate = asyncio.Semaphore(256)

            async def one(seq: int) -> None:
                async with gate:
                    await client.add(fmt.encode(fmt.Entry(log.log_id, seq, 0, -1, b"e" * 64)))

            try:
                await asyncio.gather(*(one(s) for s in range(1, count + 1)))
            finally:
                await client.close()

        await asyncio.gather(*(on(a) for a in agents.values()))

    asyncio.run(files())
    return time.perf_counter() - t0


def replica_files(agents: dict[str, AgentNode], log_id: int) -> int:
    return sum(len(list((a.data_dir / "segments" / f"{log_id:016x}").glob("*.log"))) if (a.data_dir / "segments" / f"{log_id:016x}").is_dir() else 0 for a in agents.values())


# -- throughput -------------------------------------------------------------------------------------


class Appender:
    """A writer appending without pause while ``running`` (a bounded number of records in
    flight); counts acknowledgements. Paused between measurements so that a long GC does not
    fill the disk with appends."""

    def __init__(self, writer: LogWriter, inflight: int = 2000) -> None:
        self.writer = writer
        self.acked = 0
        self.gate = asyncio.Semaphore(inflight)
        self.running = asyncio.Event()
        self.running.set()
        self.task: asyncio.Task | None = None

    async def run(self) -> None:
        while True:
            await self.running.wait()
            await self.gate.acquire()
            fut = self.writer.submit(RECORD)
            fut.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future) -> None:
        self.gate.release()
        if not fut.cancelled() and fut.exception() is None:
            self.acked += 1

    async def window(self, seconds: float) -> float:
        start, t0 = self.acked, time.perf_counter()
        await asyncio.sleep(seconds)  # a timed measurement window: nothing to await but time
        return (self.acked - start) / (time.perf_counter() - t0)


async def throughput(config: Path, meta: MetaStore, args: argparse.Namespace) -> dict:
    """Appends/s in windows with `dlctl gc` running and paused (SIGSTOP), in pairs spread over
    the whole GC (order alternating), until it is done: both kinds of window see the same
    background load, so the comparison is fair on a shared machine. Between pairs GC runs on
    unmeasured and the appender rests. Windows before and after GC are reported too."""
    meta.create_log("appends", LogConfig(3, 3, 2))
    pool = AgentPool(meta, harness_credentials())
    writer = await LogWriter.open(meta, pool, "appends")
    appender = Appender(writer)
    appender.task = asyncio.ensure_future(appender.run())
    on, off = [], []
    try:
        await appender.window(2.0)  # warm-up
        before = [await appender.window(args.window) for _ in range(args.baseline_windows)]
        say(f"appends before GC: {', '.join(f'{r:,.0f}' for r in before)} records/s ({args.window:g}s windows)")
        argv = [sys.executable, "-m", "dlctl.cli", "--config", str(config), "-o", "json", "-q", "--yes", "gc"]
        if args.rate is not None:
            argv += ["--rate", str(args.rate)]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        communicate = asyncio.ensure_future(proc.communicate())
        t0 = time.perf_counter()
        paused = 0.0

        async def paused_window() -> float:
            nonlocal paused
            os.kill(proc.pid, signal.SIGSTOP)
            stopped = time.perf_counter()
            try:
                return await appender.window(args.window)
            finally:
                os.kill(proc.pid, signal.SIGCONT)
                paused += time.perf_counter() - stopped

        pair = 0
        while not communicate.done():
            appender.running.set()
            await appender.window(0.5)  # back up to speed after the rest
            if pair % 2 == 0:
                on.append(await appender.window(args.window))
                ended = communicate.done()
                if not ended:
                    off.append(await paused_window())
            else:
                off.append(await paused_window())
                on.append(await appender.window(args.window))
                ended = communicate.done()
            if ended:  # gc ended inside the window: part of it ran without GC
                on.pop()
                off = off[: len(on)]
                break
            pair += 1
            appender.running.clear()
            await asyncio.wait([communicate], timeout=args.rest)
        appender.running.set()
        out, err = await communicate
        gc_seconds = time.perf_counter() - t0 - paused
        if proc.returncode != 0:
            raise SystemExit(f"dlctl gc failed ({proc.returncode}): {err.decode()[-2000:]}")
        report = json.loads(out)
        say(f"appends while `dlctl gc` runs:    {', '.join(f'{r:,.0f}' for r in on)} records/s")
        say(f"appends while `dlctl gc` is paused: {', '.join(f'{r:,.0f}' for r in off)} records/s")
        after = [await appender.window(args.window) for _ in range(args.baseline_windows)]
        say(f"appends after GC: {', '.join(f'{r:,.0f}' for r in after)} records/s")
    finally:
        appender.task.cancel()
        await asyncio.gather(appender.task, return_exceptions=True)
        await writer.close()
        await pool.close()
    return {"before": before, "after": after, "on": on, "off": off, "gc_seconds": gc_seconds, "gc": report}


# -- main ------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segments", type=int, default=10_000)
    parser.add_argument("--window", type=float, default=2.0, help="seconds per throughput window")
    parser.add_argument("--baseline-windows", type=int, default=2, help="windows before and after GC (reported, not compared)")
    parser.add_argument("--rest", type=float, default=10.0, help="seconds GC runs unmeasured (appender resting) between measured pairs")
    parser.add_argument("--rate", type=float, help="dlctl gc --rate (replica deletions per second per agent; default: dlctl's)")
    parser.add_argument("--dir", type=Path, help="where agents keep their data (default: a temporary directory)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)  # a --dir that does not exist yet is made
    work = Path(tempfile.mkdtemp(prefix="bench-truncation-", dir=args.dir))
    registry = None
    try:
        registry, server, ns, agents, config = start(work)
        client = make_client(ns.connect_string)
        meta = MetaStore(client, CLUSTER)
        say(f"setup: {args.segments:,} completed segments of log 'old' created DIRECTLY as metadata (pipelined znode creates) "
            f"+ one 64-byte entry per segment on each of {len(agents)} agents ({3 * args.segments:,} replica files), not through the writer")
        setup = create_segments_directly(meta, agents, "old", args.segments)
        log_id = meta.get_log("old").value.log_id
        say(f"setup took {setup:.1f}s; replica files on disk: {replica_files(agents, log_id):,}")

        session = ClusterSession(inventory.load(ConfigLocation(config, "bench")).cluster(None))
        t0 = time.perf_counter()
        plan = truncate_plan(session, "old", to=DLSN(args.segments + 1, 0, 0))
        t1 = time.perf_counter()
        result = apply(plan)
        t2 = time.perf_counter()
        marked = result.outcomes[0].result
        say(f"truncate {args.segments:,} segments: {t2 - t0:.2f}s total = plan {t1 - t0:.2f}s (read every segment record) "
            f"+ apply {t2 - t1:.2f}s (truncation point + {marked['truncated']:,} segments marked by CAS, {marked['cas_retries']} CAS retries)")
        truncate_seconds = t2 - t0
        session.close()

        figures = asyncio.run(throughput(config, meta, args))
        left = replica_files(agents, log_id)
        records_left = len(meta.client.get_children(paths.log_segments(CLUSTER, "old")))
        gc = figures["gc"]
        say(f"gc: {sum(l['segments_collected'] for l in gc['logs']):,} segment records collected, "
            f"{sum(n['deleted'] for n in gc['nodes']):,} replicas deleted, {gc['bytes_reclaimed']:,} bytes reclaimed in {figures['gc_seconds']:.1f}s of running time; "
            f"left: {records_left} record(s) (the last one keeps the log's last txid), {left} replica file(s)")
        if not figures["on"] or not figures["off"]:
            raise SystemExit("gc finished within one window: nothing to compare (use more --segments or a shorter --window)")
        # Means of equal windows: every append counts, the slow windows (gc starting, reading
        # 10,000 records) as much as the others; medians are printed for comparison.
        during, without = statistics.mean(figures["on"]), statistics.mean(figures["off"])
        ratio = during / without
        ok = ratio >= 0.9
        say(f"medians: {statistics.median(figures['on']):,.0f}/s while GC runs, {statistics.median(figures['off']):,.0f}/s while it is paused")
        say(f"RESULT: truncating {args.segments:,} segments took {truncate_seconds:.2f}s; appends while GC runs {during:,.0f}/s (mean of {len(figures['on'])} windows) = "
            f"{ratio:.0%} of {without:,.0f}/s while it is paused (mean of {len(figures['off'])} windows, alternating, same run; gc --rate "
            f"{args.rate if args.rate is not None else 'default'}; target >= 90 %): {'PASS' if ok else 'MISS'}")
        close_client(client)
        return 1 if args.strict and not ok else 0
    finally:
        if registry is not None:
            ns.close()
            registry.close()
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
