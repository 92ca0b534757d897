"""What recording the clock base costs a truncation (``dlctl.replication.truncation_base``).

    .venv/bin/python tests/benchmarks/bench_truncation_clock.py [--segments 50] [--records 2000] [--size 100]

Real parts: one ZooKeeper server and three ``dlagent`` processes (fsync on) on loopback, as in
the integration tests. Two logs get the same content through the real writer (``--segments``
completed segments of ``--records`` records of ``--size`` bytes each):

- ``plain`` is replicated by nobody: its truncation records no clock base (no read);
- ``replicated`` has a stream's retention pin (set directly, past its end): its truncation first
  reads every record before the point once from the agents (the scan), then moves the point.

Both are truncated to their end with what ``dlctl truncate LOG --to <end>`` runs (plan, then
apply), timed in-process in the same run: the ``plain`` figure is the baseline. A second
truncation of ``replicated`` to its (new) end after more segments shows the scan is
incremental: only the records since the last base are read.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the harness
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the truncation benchmark's setup

from bench_truncation import CLUSTER, start
from harness.agents import harness_credentials
from harness.zk import close_client, make_client

from dlctl import inventory
from dlctl.config import ConfigLocation
from dlctl.log.dlsn import DLSN
from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.meta.pins import PinRecord, PinStore
from dlctl.meta.records import LogConfig
from dlctl.meta.store import MetaStore
from dlctl.session import ClusterSession
from dlctl.ops.truncate import truncate_plan
from dlctl.plan import apply
from dlctl.replication.clock import ClockStore


def say(text: str) -> None:
    print(text, flush=True)


async def fill(meta: MetaStore, name: str, segments: int, records: int, size: int) -> None:
    pool = AgentPool(meta, harness_credentials())
    payload = b"x" * size
    try:
        for _ in range(segments):
            writer = await LogWriter.open(meta, pool, name)
            for _ in range(records):
                if writer.pending_bytes > 8 * 1024 * 1024:
                    await writer.wait_writable()
                writer.submit(payload)
            await writer.flush()
            await writer.close()
    finally:
        await pool.close()


def truncate_to_end(session: ClusterSession, meta: MetaStore, name: str) -> tuple[float, dict]:
    end = DLSN(meta.get_log(name).value.max_segment_seq + 1, 0, 0)
    t0 = time.perf_counter()
    result = apply(truncate_plan(session, name, to=end))
    return time.perf_counter() - t0, result.outcomes[0].result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segments", type=int, default=50)
    parser.add_argument("--records", type=int, default=2000, help="records per segment")
    parser.add_argument("--size", type=int, default=100, help="bytes per record")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-truncation-clock-"))
    registry = None
    try:
        registry, _server, ns, _agents, config = start(work)
        client = make_client(ns.connect_string)
        meta = MetaStore(client, CLUSTER)
        total = args.segments * args.records
        for name in ("plain", "replicated"):
            meta.create_log(name, LogConfig(3, 3, 2))
            t0 = time.perf_counter()
            asyncio.run(fill(meta, name, args.segments, args.records, args.size))
            say(f"setup: log {name!r}: {args.segments} segments x {args.records:,} records x {args.size} bytes written through the writer in {time.perf_counter() - t0:.1f}s")
        PinStore(meta).set(PinRecord(holder="c1-to-elsewhere", log="replicated", position=DLSN(10**9, 0, 0), sink_cluster="elsewhere"))
        session = ClusterSession(inventory.load(ConfigLocation(config, "bench")).cluster(None))
        plain, _ = truncate_to_end(session, meta, "plain")
        say(f"baseline: truncate 'plain' ({total:,} records, not replicated: no clock base): {plain:.2f}s")
        scanned, result = truncate_to_end(session, meta, "replicated")
        say(f"truncate 'replicated' ({total:,} records read once for the clock base): {scanned:.2f}s "
            f"({total / max(scanned - plain, 1e-9):,.0f} records/s scanned beyond the baseline); base {ClockStore(meta).truncation_base('replicated')}; {result.get('clock_base', {}).get('clock_base')}")
        more = max(1, args.segments // 10)
        asyncio.run(fill(meta, "replicated", more, args.records, args.size))
        again, result = truncate_to_end(session, meta, "replicated")
        say(f"truncate 'replicated' again after {more} more segment(s): {again:.2f}s ({result.get('clock_base', {}).get('clock_base')}: incremental)")
        say(f"RESULT: truncating {total:,} records took {plain:.2f}s without a clock base (baseline, same run) and {scanned:.2f}s with the scan "
            f"({scanned / max(plain, 1e-9):.1f}x); the next truncation read only the {more * args.records:,} new records ({again:.2f}s)")
        session.close()
        close_client(client)
        return 0
    finally:
        if registry is not None:
            ns.close()
            registry.close()


if __name__ == "__main__":
    raise SystemExit(main())
