"""Bytes crossing each edge of a 3-location full mesh, with and without source-side filtering
(issue 21), measured in the same run.

    .venv/bin/python tests/benchmarks/bench_mesh_filtering.py [--records 100000] [--payload 200]

Three locations of real agents (one real ZooKeeper server, the test harness; a fault proxy on every
link between two locations counts the bytes), a full mesh of causal streams (each location a sink
of both others), and a writer at each location appending its third of ``--records`` records of
``--payload`` bytes, all at once. Every record reaches each location twice, directly and relayed.

Run twice on fresh clusters: first the agents' ``[replication] source_filtering = false`` (the
baseline: every relayed record crosses its edge whole and is dropped by the sink's owner), then
``true`` (the sink's version vector goes with every read and the source sends what the sink holds
as stubs). Per edge: bytes from the source's agents to the sink's (agent traffic, not ZooKeeper),
records applied and left at the source; every location must end holding every record once (the
run fails otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the harness

from harness.agents import harness_credentials
from harness.faultproxy import FaultNetwork
from harness.procs import ProcessRegistry
from harness.twoclusters import Sites, replication_sites
from harness.zk import ZooKeeperServer, bench_zookeeper

from dlctl.log.pool import AgentPool
from dlctl.log.producer import LogProducer
from dlctl.meta.records import LogConfig
from dlctl.ops import replication as ops
from dlctl.plan import apply
from dlctl.replication.positions import log_end
from dlctl.replication.store import StreamStore

LOG = "mesh"
LOCATIONS = "abc"


async def write_share(site, count: int, payload: int) -> None:
    pool = AgentPool(site.meta(), harness_credentials())
    producer = LogProducer(site.meta(), pool, LOG)
    body = site.name.encode() * payload
    try:
        for start in range(0, count, 2000):
            await asyncio.gather(*(producer.submit(body[:payload]) for _ in range(start, min(count, start + 2000))))
    finally:
        await producer.close()
        await pool.close()


async def held(site) -> int:
    pool = AgentPool(site.meta(), harness_credentials())
    try:
        return (await log_end(site.meta(), pool, LOG)).records
    finally:
        await pool.close()


def edge_bytes(sites: Sites, source: str, sink: str) -> int:
    return sum(
        p.bytes_forwarded["down"] for p in sites.network.proxies
        if p.name.endswith(f"-for-{sink}") and not p.name.startswith("zk-") and p.name.split("-for-")[0] in sites[source].agents
    )


def one_run(zk: ZooKeeperServer, work: Path, records: int, payload: int, filtering: bool) -> dict[tuple[str, str], dict[str, int]]:
    label = "filtering" if filtering else "plain"
    with FaultNetwork() as network:
        gen = replication_sites(
            zk, work / label, ProcessRegistry(work / f"procs-{label}"), network, f"bench-mesh-{label}", clusters=tuple(LOCATIONS),
            nodes=1, replication_options=f"source_filtering = {'true' if filtering else 'false'}",
        )
        sites = next(gen)
        try:
            for name in LOCATIONS:
                sites[name].meta().create_log(LOG, LogConfig(ensemble_size=1, write_quorum=1, ack_quorum=1))
            for source in LOCATIONS:
                for sink in LOCATIONS:
                    if source != sink:
                        apply(ops.init_plan(sites[source].session(), sites[sink].session(), patterns=(LOG,), causal=True).plan)
            before = {(s, t): edge_bytes(sites, s, t) for s in LOCATIONS for t in LOCATIONS if s != t}
            share = records // len(LOCATIONS)
            total = share * len(LOCATIONS)
            started = time.perf_counter()

            async def write_all() -> None:
                await asyncio.gather(*(write_share(sites[n], share, payload) for n in LOCATIONS))

            asyncio.run(write_all())
            deadline = time.monotonic() + 600
            while True:
                counts = {n: asyncio.run(held(sites[n])) for n in LOCATIONS}
                if all(c == total for c in counts.values()):
                    break
                if any(c > total for c in counts.values()) or time.monotonic() > deadline:
                    raise SystemExit(f"{label}: locations hold {counts} records, {total} expected")
                time.sleep(0.5)
            seconds = time.perf_counter() - started
            out = {}
            for (s, t), b in before.items():
                cp = StreamStore(sites[t].meta()).get_checkpoint(f"{s}-to-{t}", LOG).value
                out[(s, t)] = {"bytes": edge_bytes(sites, s, t) - b, "applied": cp.applied_records, "left": cp.left_at_source, "processed": cp.processed_records}
            print(f"  {label}: every location holds {total:,} records after {seconds:.1f} s")
            return out
        finally:
            gen.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--payload", type=int, default=200)
    args = parser.parse_args()
    work, procs, zk = bench_zookeeper("bench-mesh-")
    try:
        print(f"3-location full mesh, {args.records:,} records of {args.payload} bytes written at the three locations at once:")
        plain = one_run(zk, work, args.records, args.payload, filtering=False)
        filtered = one_run(zk, work, args.records, args.payload, filtering=True)
    finally:
        procs.close()
    print(f"  {'edge':8s} {'plain bytes':>14s} {'filtered bytes':>15s} {'saved':>7s} {'applied':>9s} {'left at source':>15s}")
    for edge in sorted(plain):
        p, f = plain[edge], filtered[edge]
        saved = 1 - f["bytes"] / p["bytes"] if p["bytes"] else 0.0
        print(f"  {edge[0]} -> {edge[1]}   {p['bytes']:>14,} {f['bytes']:>15,} {saved:>6.0%} {f['applied']:>9,} {f['left']:>15,}")
    total_plain = sum(v["bytes"] for v in plain.values())
    total_filtered = sum(v["bytes"] for v in filtered.values())
    print(f"  all edges: {total_plain:,} -> {total_filtered:,} bytes ({1 - total_filtered / total_plain:.0%} saved by source-side filtering)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
