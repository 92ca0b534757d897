"""Cold storage rates (issue 25): `log backup` (read a segment from its replicas, write it as one
object, read it back and check its SHA-256, write the manifest), `log restore`'s reading of
the copies (fetch, check, decode) and `log read --from-cold`'s (the same, as positioned records
with their append times), next to a plain upload and download of the same bytes to the same
store, measured in the same run.

    .venv/bin/python tests/benchmarks/bench_cold_backup.py [--mib 64] [--segment-mib 8] [--dir /work]

Three real agents (fsync on) on a scratch ZooKeeper; two stores: a directory under ``--dir``
and moto's S3 server on loopback (its own process).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the harness

from harness.agents import harness_credentials
from harness.logcluster import CLUSTER, bench_agents
from harness.procs import ProcessRegistry
from harness.s3server import start_s3_server

from dlctl.cold.config import ColdStorageConfig
from dlctl.cold.history import cold_records
from dlctl.cold.store import FilesystemStore
from dlctl.cold.s3 import S3Store
from dlctl.log.dlsn import DLSN
from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.meta.records import LogConfig, SegmentState
from dlctl.meta.store import MetaStore
from dlctl.cold.copy import copy_segment, load_manifest
from dlctl.ops.restore import read_copy
from dlctl.ratelimit import TokenBucket


async def fill(meta: MetaStore, log: str, mib: int) -> None:
    pool = AgentPool(meta, harness_credentials())
    writer = await LogWriter.open(meta, pool, log)
    payload = bytes(range(256)) * 16  # 4 KiB, not compressible to nothing
    for _ in range(mib * 256):
        await writer.wait_writable()
        writer.submit(payload)
    await writer.close()
    await pool.close()


async def backup_all(meta: MetaStore, store, log: str, rate_limit: float = 0.0) -> int:
    pool = AgentPool(meta, harness_credentials())
    log_id = meta.get_log(log).value.log_id
    throttle = TokenBucket(rate_limit)  # as the housekeeper's offload_bytes_per_second
    total = 0
    try:
        for seg in (s.value for s in meta.segments(log)):
            if seg.state is SegmentState.COMPLETED:
                total += (await copy_segment(meta, store, pool, log, log_id, seg, throttle=throttle)).bytes
    finally:
        await pool.close()
    return total


def rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 2**20:8.1f} MiB/s"


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--mib", type=int, default=64)
    args.add_argument("--segment-mib", type=int, default=8)
    args.add_argument("--dir", type=Path, default=None)
    args.add_argument("--throttle-mib", type=int, default=16, help="an offload rate limit to measure too (MiB/s)")
    opts = args.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-cold-", dir=opts.dir))
    procs = ProcessRegistry(scratch / "procs")
    try:
        s3 = start_s3_server(procs, scratch / "s3")
        s3.create_bucket("bench")
        stores = {
            "filesystem": lambda: FilesystemStore(scratch / "cold"),
            "s3 (moto)": lambda: S3Store(ColdStorageConfig("s3", bucket="bench", endpoint=s3.endpoint, credentials_file=s3.credentials_file)),
        }
        (scratch / "cold").mkdir()
        with bench_agents("bench-cold-") as up:
            meta = MetaStore(up.admin, CLUSTER)
            print(f"{opts.mib} MiB in {opts.segment_mib} MiB segments, 3 agents (E=W=3, A=2)")
            print(f"  {'store':12} {'plain upload':>16} {'log backup':>16} {'plain download':>16} {'restore read':>16} {'cold read':>16}")
            for label, make in stores.items():
                log = f"cold-{label.split()[0]}"
                meta.create_log(log, LogConfig(3, 3, 2, roll_bytes=opts.segment_mib * 2**20))
                asyncio.run(fill(meta, log, opts.mib))
                store = make()
                started = time.perf_counter()
                nbytes = asyncio.run(backup_all(meta, store, log))
                backup_s = time.perf_counter() - started
                log_id = meta.get_log(log).value.log_id
                manifests = [load_manifest(store, log, log_id, s.value.seq) for s in meta.segments(log) if s.value.state is SegmentState.COMPLETED]
                blobs = [store.get(m.object) for m in manifests]
                started = time.perf_counter()
                for i, blob in enumerate(blobs):  # the baseline: the same bytes, put as they are
                    store.put(f"plain/{i}", blob)
                upload_s = time.perf_counter() - started
                started = time.perf_counter()
                for i in range(len(blobs)):
                    store.get(f"plain/{i}")
                download_s = time.perf_counter() - started
                started = time.perf_counter()
                for m in manifests:
                    read_copy(store, m)
                restore_s = time.perf_counter() - started
                started = time.perf_counter()
                for _ in cold_records(store, manifests, DLSN(2**62, 0, 0)):
                    pass
                cold_s = time.perf_counter() - started
                print(
                    f"  {label:12} {rate(nbytes, upload_s):>16} {rate(nbytes, backup_s):>16} {rate(nbytes, download_s):>16} "
                    f"{rate(nbytes, restore_s):>16} {rate(nbytes, cold_s):>16}"
                )
                if label == "filesystem":  # the housekeeper's throttle holds offload near its rate
                    (scratch / "cold-throttled").mkdir()
                    started = time.perf_counter()
                    asyncio.run(backup_all(meta, FilesystemStore(scratch / "cold-throttled"), log, rate_limit=opts.throttle_mib * 2**20))
                    print(f"  {'(offload_bytes_per_second = ' + str(opts.throttle_mib) + ' MiB)':46} {rate(nbytes, time.perf_counter() - started):>16}")
    finally:
        procs.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
