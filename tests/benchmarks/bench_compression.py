"""Catch-up of one replication stream on compressible records, plain and zstd-compressed, in the
same run (issue 23): bytes on the wire, records/s, and the agents' CPU for each.

    .venv/bin/python tests/benchmarks/bench_compression.py [--records 200000] [--items 4]

Two one-agent clusters (real agents, one real ZooKeeper: the test harness); the sink's agent
reaches the source's through a fault proxy, which counts the bytes it forwards. The source holds
``--records`` JSON-like events (an order with ``--items`` line items) before the stream is set
up; the catch-up runs from applying init-replication until the sink's checkpoint has applied
them all. Twice, on fresh clusters: ``--compression none``, then ``zstd``. Per run: the bytes
the source's agent sent the sink's (the wire: TLS, probes and long polls included), the ratio
``replication status`` reports (the worker's count: answers decoded / on the wire), records/s,
and the CPU seconds of the source's agent (it compresses) and of the sink's (it decompresses
and appends). First, the codec alone on the same records cut into entry-sized bodies, at zstd
levels 1 and 3 (the level the agent uses is ``dlctl.log.compression.LEVEL``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the harness

from harness.agents import harness_credentials
from harness.faultproxy import FaultNetwork
from harness.procs import ProcessRegistry
from harness.twoclusters import Sites, replication_sites
from harness.zk import ZooKeeperServer, bench_zookeeper

from dlctl.log.compression import LEVEL, Compressor, Decompressor
from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.meta.records import LogConfig
from dlctl.ops import replication as ops
from dlctl.ops import streams as stream_ops
from dlctl.plan import apply
from dlctl.replication.store import StreamStore

LOG = "events"
ENTRY_BYTES = 128 * 1024  # about what the writer puts in one entry while catching up


_RNG = random.Random(23)


def event(i: int, items: int) -> bytes:
    """One order event: repeated keys and values, as application JSON has, and a random trace id
    and prices, which do not compress (synthetic data that repeats everything would flatter
    zstd)."""
    rng = _RNG
    return json.dumps({
        "id": i, "type": "order.created", "trace": f"{rng.getrandbits(128):032x}", "customer": f"customer-{rng.randrange(100_000):06d}",
        "created": 1_700_000_000 + i,
        "items": [{"sku": f"SKU-{rng.randrange(10_000):05d}", "qty": rng.randrange(1, 6), "price_cents": rng.randrange(99, 50_000)} for _ in range(items)],
        "status": "pending", "shipping": {"method": rng.choice(("standard", "express", "pickup")), "region": "eu-west-1"},
    }).encode()


async def fill(meta, count: int, items: int) -> int:
    pool = AgentPool(meta, harness_credentials())
    total = 0
    try:
        writer = await LogWriter.open(meta, pool, LOG)
        try:
            for i in range(count):
                if i & 1023 == 0:
                    await writer.wait_writable()
                body = event(i, items)
                total += len(body)
                writer.submit(body)
            await writer.flush()
        finally:
            await writer.close()
    finally:
        await pool.close()
    return total


def codec(records: int, items: int) -> None:
    """The codec alone: ratio and MB/s per level on entry-sized bodies of these records."""
    bodies, body = [], bytearray()
    for i in range(min(records, 50_000)):
        body += event(i, items)
        if len(body) >= ENTRY_BYTES:
            bodies.append(bytes(body))
            body = bytearray()
    size = sum(map(len, bodies))
    print(f"codec alone ({len(bodies)} bodies of about {ENTRY_BYTES // 1024} KiB, one context each way):")
    for level in (1, 3):
        compressor, decompressor = Compressor(level), Decompressor()
        started = time.process_time()
        packed = [compressor.compress(b) for b in bodies]
        compress_s = time.process_time() - started
        started = time.process_time()
        for p in packed:
            decompressor.decompress(p, 1 << 30, "bench")
        decompress_s = time.process_time() - started
        wire = sum(map(len, packed))
        print(
            f"  level {level}{' (the agent)' if level == LEVEL else '           '}  ratio {size / wire:5.2f}  compress {size / compress_s / 1e6:7.0f} MB/s"
            f"  decompress {size / decompress_s / 1e6:7.0f} MB/s"
        )


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wire_bytes(sites: Sites) -> int:
    return sum(p.bytes_forwarded["down"] for p in sites.network.proxies if p.name.endswith("-for-b") and p.name.split("-for-")[0] in sites["a"].agents)


def one_run(zk: ZooKeeperServer, work: Path, records: int, items: int, compression: str) -> dict:
    with FaultNetwork() as network:
        gen = replication_sites(zk, work / compression, ProcessRegistry(work / f"procs-{compression}"), network, f"bench-compression-{compression}", nodes=1)
        sites = next(gen)
        try:
            a, b = sites["a"], sites["b"]
            a.meta().create_log(LOG, LogConfig(ensemble_size=1, write_quorum=1, ack_quorum=1, roll_bytes=256 * 1024 * 1024))
            payload = asyncio.run(fill(a.meta(), records, items))
            source_pid, sink_pid = a.agents["a1"].proc.pid, b.agents["b1"].proc.pid
            wire_before, cpu_before = wire_bytes(sites), (cpu_seconds(source_pid), cpu_seconds(sink_pid))
            built = ops.init_plan(a.session(), b.session(), patterns=(LOG,), compression=compression)
            started = time.perf_counter()
            apply(built.plan)
            streams = StreamStore(b.meta())
            deadline = time.monotonic() + 900
            while True:  # the checkpoint (every 0.2 s here) says when every record is applied
                try:
                    if streams.get_checkpoint("a-to-b", LOG).value.applied_records >= records:
                        break
                except Exception:  # noqa: BLE001 - not registered yet
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"{compression}: the stream did not catch up within 900 s")
                time.sleep(0.05)
            seconds = time.perf_counter() - started
            cpu_after = (cpu_seconds(source_pid), cpu_seconds(sink_pid))
            row = stream_ops.stream_status(b.session(), a.session(), "a-to-b")["logs"][0]
            return {
                "payload": payload,
                "wire": wire_bytes(sites) - wire_before,
                "seconds": seconds,
                "records_per_s": records / seconds,
                "source_cpu": cpu_after[0] - cpu_before[0],
                "sink_cpu": cpu_after[1] - cpu_before[1],
                "in_effect": row["compression"],
                "ratio": row["compression_ratio"],
            }
        finally:
            gen.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--items", type=int, default=4, help="line items per event (about 70 bytes each)")
    args = parser.parse_args()
    sample = event(0, args.items)
    print(f"{args.records:,} JSON-like events of about {len(sample)} bytes, e.g. {sample[:90].decode()}...")
    codec(args.records, args.items)
    work, procs, zk = bench_zookeeper("bench-compression-")
    try:
        runs = {c: one_run(zk, work, args.records, args.items, c) for c in ("none", "zstd")}
    finally:
        procs.close()
    plain, packed = runs["none"], runs["zstd"]
    print(f"catch-up of one stream, {args.records:,} records, {plain['payload']:,} payload bytes (one agent per cluster, loopback):")
    print(f"  {'':22s} {'--compression none':>20s} {'--compression zstd':>20s}")
    for label, key, fmt in (
        ("wire bytes (proxy)", "wire", "{:,.0f}"), ("records/s", "records_per_s", "{:,.0f}"), ("seconds", "seconds", "{:.2f}"),
        ("source agent CPU s", "source_cpu", "{:.2f}"), ("sink agent CPU s", "sink_cpu", "{:.2f}"), ("status: in effect", "in_effect", "{}"),
        ("status: ratio", "ratio", "{}"),
    ):
        print(f"  {label:22s} {fmt.format(plain[key]):>20s} {fmt.format(packed[key]):>20s}")
    print(f"  wire bytes saved: {1 - packed['wire'] / plain['wire']:.0%}; at 100 Mbit/s the wire alone would take "
          f"{plain['wire'] * 8 / 100e6:.1f} s plain, {packed['wire'] * 8 / 100e6:.1f} s compressed (computed, not measured)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
