"""Agent startup time against the data it holds, with and without persisted entry indexes
(issue 24 item 7).

    .venv/bin/python tests/benchmarks/bench_agent_startup.py [--gib 1 20] [--entry-kib 64] [--segment-mib 256] [--dir PATH]

For each size, a data directory is filled with replica files of that many GiB (entries written
in the agent's on-disk format, as a writer's adds leave them), then the agent's segment store
(``dlagent.storage.SegmentStore``, what ``dlagent serve`` opens before it serves) is opened:

- ``scan``: no index checkpoint (as after a crash while every segment grew): every file is read
  and every entry's CRC checked — the baseline, measured in the same run;
- ``checkpoint``: after a clean stop, which leaves each replica's index beside it (``.idx``):
  only what lies past the checkpoint is read.

Page cache: the figures say whether the cache was dropped before each open (possible as root
with a writable /proc/sys/vm/drop_caches); otherwise both opens read from a warm cache, which
favours the scan.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dlagent.storage import SegmentStore  # noqa: E402
from dlctl.log.format import Entry, encode  # noqa: E402


def fill(root: Path, gib: float, entry_kib: int, segment_mib: int) -> tuple[int, int]:
    """Replica files holding ``gib`` GiB; (files, entries)."""
    payload = os.urandom(entry_kib * 1024 - 64)
    per_segment = max(1, segment_mib * 1024 // entry_kib)
    total = int(gib * 1024 * 1024 // entry_kib)
    files = entries = 0
    log_dir = root / "segments" / f"{1:016x}"
    log_dir.mkdir(parents=True, mode=0o700)
    seq = 0
    while entries < total:
        seq += 1
        count = min(per_segment, total - entries)
        with open(log_dir / f"{seq:016x}.log", "wb") as out:
            chunk = []
            for entry_id in range(count):
                chunk.append(encode(Entry(1, seq, entry_id, entry_id - 1, payload)))
                if len(chunk) == 256:
                    out.write(b"".join(chunk))
                    chunk = []
            out.write(b"".join(chunk))
        files += 1
        entries += count
    return files, entries


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed_open(root: Path) -> tuple[float, int, int]:
    async def go() -> tuple[float, int, int]:
        store = SegmentStore(root)
        start = time.perf_counter()
        report = await store.open()
        took = time.perf_counter() - start
        await store.close()  # a clean stop: leaves every replica's index checkpoint
        return took, report.entries, report.scanned_bytes

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, nargs="+", default=[1, 20], help="data held, GiB (one run each)")
    parser.add_argument("--entry-kib", type=int, default=64, help="entry size, KiB")
    parser.add_argument("--segment-mib", type=int, default=256, help="replica file size, MiB")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the data (default: a temporary directory)")
    args = parser.parse_args()
    print(f"{'held':>8} {'files':>6} {'entries':>9} {'open':>11} {'time':>11} {'read':>10} {'cache':>7}")
    for gib in args.gib:
        if args.dir is not None:
            args.dir.mkdir(parents=True, exist_ok=True)  # a --dir that does not exist yet is made
        root = Path(tempfile.mkdtemp(prefix="bench-startup-", dir=args.dir))
        try:
            files, entries = fill(root, gib, args.entry_kib, args.segment_mib)
            for how in ("scan", "checkpoint"):
                if how == "scan":
                    for idx in (root / "segments").rglob("*.idx"):
                        idx.unlink()
                cold = drop_caches()
                took, found, scanned = timed_open(root)
                assert found == entries, (found, entries)
                print(f"{gib:>6g}Gi {files:>6} {entries:>9} {how:>11} {took * 1000:>9.1f}ms {scanned / 2**30:>8.2f}Gi {'cold' if cold else 'warm':>7}", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
