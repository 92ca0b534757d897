"""Disaster recovery benchmarks (issue 11), each next to a baseline measured in the same run.

    .venv/bin/python tests/benchmarks/bench_dr.py [--rate 2000] [--records 20000]

Real agents (three per cluster) and real ZooKeeper (the test harness); sinks reach sources
through the fault proxy (no delay added).

1. **Switchover under load**: a producer appends ``--rate`` records/s at a (through its
   agents) with a one-way stream a -> b; ``switchover_plan`` runs; reported: the time from the
   command to b accepting writes (b's logs promoted) and to the first record acknowledged at b
   by the moved producer, plus the whole switchover (reverse stream and verification
   included). Baseline: the same switchover of an idle stream (no load), same run.
2. **Failover under load**: the same load, then every agent of a is SIGKILLed and
   ``failover_plan`` runs; reported: command to b accepting writes. Baseline: ``dr promote`` of
   the same logs (the metadata part alone).
3. **dr recover**: a 3-cluster active-active cycle holds ``--records`` records per location;
   a's agents lose their disks; ``recover_plan`` runs; reported: records recovered per second
   (event phase) and the whole command. Baseline: the log reader reading the same number of
   records from a peer in this process (the recovery's input side).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the harness

from harness.agents import harness_credentials
from harness.faultproxy import FaultNetwork
from harness.procs import ProcessRegistry
from harness.twoclusters import read_all, replication_sites
from harness.zk import ZooKeeperServer

from dlctl.log.dlsn import DLSN
from dlctl.log.errors import ReadOnlyLogError
from dlctl.log.pool import AgentPool
from dlctl.log.producer import LogProducer
from dlctl.meta.records import LogConfig
from dlctl.ops import dr as dr_ops
from dlctl.ops import replication as ops
from dlctl.plan import apply

LOG = "bench"


class Load:
    def __init__(self, sites, clusters: list[str], rate: float) -> None:
        self.sites, self.clusters, self.rate = sites, clusters, rate
        self.first_ack: dict[str, float] = {}
        self.acked = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        batch = max(1, int(self.rate / 50))
        for cluster in self.clusters:
            meta = self.sites[cluster].meta()
            pool = AgentPool(meta, harness_credentials())
            producer = LogProducer(meta, pool, LOG)
            try:
                while not self.stop.is_set():
                    results = await asyncio.gather(*(producer.submit(b"x" * 100) for _ in range(batch)), return_exceptions=True)
                    ok = sum(isinstance(r, DLSN) for r in results)
                    if ok:
                        self.first_ack.setdefault(cluster, time.monotonic())
                        self.acked += ok
                    if any(isinstance(r, ReadOnlyLogError) for r in results):
                        if cluster != self.clusters[-1]:
                            break
                        await asyncio.sleep(0.01)
                        continue
                    if not ok:
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(batch / self.rate)
                if self.stop.is_set():
                    return
            finally:
                try:
                    await asyncio.wait_for(producer.close(), 3)
                except Exception:  # noqa: BLE001
                    pass
                await pool.close()


def setup(sites) -> None:
    sites["a"].meta().create_log(LOG, LogConfig())
    apply(ops.init_plan(sites["a"].session(), sites["b"].session(), patterns=(LOG,)).plan)


async def switchover(sites, rate: float | None) -> dict:
    setup(sites)
    load = Load(sites, ["a", "b"], rate or 1.0)
    task = asyncio.ensure_future(load.run()) if rate else None
    await asyncio.sleep(3.0)
    started = time.monotonic()
    result = await asyncio.get_running_loop().run_in_executor(None, lambda: apply(dr_ops.switchover_plan(sites["a"].session(), sites["b"].session())))
    total = time.monotonic() - started
    promoted = next(o.result for o in result.outcomes if o.step.action == "promote")["promoted_after_seconds"]
    if task is not None:
        deadline = time.monotonic() + 30
        while "b" not in load.first_ack and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        load.stop.set()
        await asyncio.wait_for(task, 30)
    first_b = load.first_ack.get("b")
    return {"promoted_s": promoted, "first_ack_at_b_s": round(first_b - started, 3) if first_b else None, "total_s": round(total, 3), "acked": load.acked}


async def failover(sites, rate: float) -> dict:
    setup(sites)
    load = Load(sites, ["a"], rate)
    task = asyncio.ensure_future(load.run())
    await asyncio.sleep(3.0)
    for node in sites["a"].agents.values():
        node.proc.kill()
    load.stop.set()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    started = time.monotonic()  # the plan reads what is at risk: part of the command
    result = await asyncio.get_running_loop().run_in_executor(None, lambda: apply(dr_ops.failover_plan(sites["b"].session())))
    promoted = next(o.result for o in result.outcomes if o.step.action == "promote")["promoted_after_seconds"]
    risk = next(o.result for o in result.outcomes if o.step.action == "settle")["at_risk"][LOG]
    baseline_sites_logs = [LOG]
    b = sites["b"].session()
    from dlctl.meta.access import AccessMode, AccessStore

    AccessStore(b.meta).set(LOG, AccessMode.REPLICA, stream="x", reason="bench baseline")
    t0 = time.monotonic()
    await asyncio.get_running_loop().run_in_executor(None, lambda: apply(dr_ops.promote_plan(b, tuple(baseline_sites_logs))))
    return {"promoted_s": promoted, "total_s": round(time.monotonic() - started, 3), "at_risk_estimate": risk["records_estimate"], "baseline_promote_s": round(time.monotonic() - t0, 3)}


async def recover(sites, records: int) -> dict:
    for n in "abc":
        sites[n].meta().create_log(LOG, LogConfig())
    for source, sink in (("a", "b"), ("b", "c"), ("c", "a")):
        apply(ops.init_plan(sites[source].session(), sites[sink].session(), patterns=(LOG,), causal=True).plan)

    async def write(n: str) -> None:
        pool = AgentPool(sites[n].meta(), harness_credentials())
        producer = LogProducer(sites[n].meta(), pool, LOG)
        try:
            for i in range(records):
                if i % 2000 == 0:
                    await producer.wait_writable()
                producer.submit(f"{n}-{i}".encode().ljust(100, b"."))
            await producer.flush()
        finally:
            await producer.close()
            await pool.close()

    await asyncio.gather(*(write(n) for n in "abc"))
    total = 3 * records
    for n in "abc":
        got = await read_all(sites[n].meta(), LOG, until=total, timeout=600)
        assert len(got) == total, (n, len(got))
    # Baseline: the input side — read c's log in this process.
    t0 = time.monotonic()
    await read_all(sites["c"].meta(), LOG, until=total, timeout=600)
    reader_rate = total / (time.monotonic() - t0)
    a = sites["a"]
    a.wipe_disks()
    started = time.monotonic()
    result = await asyncio.get_running_loop().run_in_executor(None, lambda: apply(dr_ops.recover_plan(a.session(), {"b": sites["b"].session(), "c": sites["c"].session()})))
    whole = time.monotonic() - started
    events = next(o.result for o in result.outcomes if o.step.action == "events")
    return {
        "recovered": events["recovered_records"],
        "event_rate": events["records_per_second"],
        "whole_command_s": round(whole, 2),
        "whole_rate": round(events["recovered_records"] / whole, 1),
        "baseline_reader_rate": round(reader_rate, 1),
    }


def with_sites(clusters: tuple[str, ...], fn, *args):
    base = Path(tempfile.mkdtemp(prefix="bench-dr-"))
    procs = ProcessRegistry(base / "procs")
    server = ZooKeeperServer(base / "zk", procs, name="zk")
    server.start()
    try:
        with FaultNetwork() as network:
            gen = replication_sites(server, base / "sites", procs, network, "bench", clusters=clusters)
            sites = next(gen)
            try:
                return asyncio.run(fn(sites, *args))
            finally:
                gen.close()
    finally:
        procs.close()
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=2000.0, help="records/s of the load during switchover and failover")
    parser.add_argument("--records", type=int, default=20000, help="records per location before dr recover")
    args = parser.parse_args()
    # The failover run kills a whole location, ZooKeeper included: kazoo's reconnect attempts
    # would otherwise print a line each to stderr between the figures.
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    idle = with_sites(("a", "b"), switchover, None)
    loaded = with_sites(("a", "b"), switchover, args.rate)
    print(f"switchover under {args.rate:g} rec/s: b accepts writes after {loaded['promoted_s']}s (first ack at b {loaded['first_ack_at_b_s']}s), whole command {loaded['total_s']}s")
    print(f"  baseline, idle stream: b accepts writes after {idle['promoted_s']}s, whole command {idle['total_s']}s")
    fo = with_sites(("a", "b"), failover, args.rate)
    print(f"failover under {args.rate:g} rec/s (every agent of a SIGKILLed): b accepts writes after {fo['promoted_s']}s (whole {fo['total_s']}s; about {fo['at_risk_estimate']} record(s) reported at risk)")
    print(f"  baseline, dr promote alone: {fo['baseline_promote_s']}s")
    rec = with_sites(("a", "b", "c"), recover, args.records)
    print(f"dr recover: {rec['recovered']} records back at {rec['event_rate']} rec/s (event phase); whole command {rec['whole_command_s']}s = {rec['whole_rate']} rec/s")
    print(f"  baseline, log reader alone reading a peer's log: {rec['baseline_reader_rate']} rec/s")


if __name__ == "__main__":
    main()
