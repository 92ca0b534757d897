"""Re-replication copy rate vs this disk's sequential write bandwidth, measured in the same run.

    .venv/bin/python tests/benchmarks/bench_rereplication.py [--dir DIR] [--mib 256] [--entry-kib 64] [--rounds 3]

Two real agent processes (``SegmentStore`` + ``AgentServer``, fsync on, default group commit)
share one data disk: the *source* holds a completed segment of ``--mib`` MiB, the *target* gets it
through ``dlctl.log.rereplication_copy.copy_replica`` (pipelined CRC-checked reads, recovery adds,
digest verification — the exact code ``dlctl recover node`` runs). The baseline is a plain
sequential write + fdatasync loop (fdatasync every 512 KiB, the agent's group-commit size) of
the same volume on the same directory, re-measured right before each copy. Median of
``--rounds``. Target (issue 6): copy rate >= 50 % of the baseline. Exit 0 unless --strict.

``--in-place`` measures the repair of a live member instead (issue 18: ``dlctl recover
under-replicated`` and the auditor, ``dlctl.log.repair``): the target is itself a member of the
segment whose replica was lost (limbo, cut, replaced disk), refilled from its peer — the very
``copy_replica`` call ``repair_replica`` makes. Same baseline, same target (>= 50 %).

By default the target pulls the entries from the source itself (PULL_RANGE, the path the
auditor and ``dlctl recover`` take): one connection carries each byte. ``--no-pull`` copies
through the benchmark process instead (READ_RANGE + ADD_BATCH: two connections, three
processes), for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The agent launcher and the disk baseline are the agent benchmark's (this folder is on the
# script's path), so both benchmarks compare against the very same plain write+fdatasync loop.
from bench_agent import KIB, MIB, SECRET, baseline_sequential_bandwidth, harness_tls, serve

from dlctl.log import format as fmt
from dlctl.log.client import AgentClient
from dlctl.log.rereplication_copy import copy_replica
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState


def start_agent(work: Path, name: str, *, plaintext: bool, peers: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    """An agent in a child process: mutual TLS with a harness certificate, as production runs
    (the files passed in the environment), or plaintext; ``peers`` (node id: address) are the
    agents its PULL_RANGE can read from."""
    port_file = work / f"{name}.port"
    env = dict(os.environ)
    if not plaintext:
        env.update(harness_tls.child_env(harness_tls.agent_tls(work / f"{name}-tls", "127.0.0.1")))
    command = [sys.executable, __file__, "--serve", str(work / name), str(port_file), json.dumps(peers or {})]
    proc = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"agent {name} did not start")
        time.sleep(0.05)  # a child process's port file: nothing to await on
    return proc, int(port_file.read_text())


class Pool:
    """The two agents by node id, as ``copy_replica`` expects of an ``AgentPool``."""

    def __init__(self, clients: dict[str, AgentClient]) -> None:
        self.clients = clients
        self.nodes = {n: {"region": "r1", "rack": "k1", "address": c.address} for n, c in clients.items()}

    async def client(self, node: str) -> AgentClient:
        return self.clients[node]


async def fill(client: AgentClient, log_id: int, seq: int, count: int, payload: bytes) -> None:
    sem = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        try:
            await client.add(fmt.encode(fmt.Entry(log_id, seq, i, i - 1, payload)))
        finally:
            sem.release()

    tasks = []
    for i in range(count):
        await sem.acquire()
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(src_port: int, dst_port: int, args: argparse.Namespace, directory: Path, pids: tuple[int, int]) -> list[tuple[float, float, float]]:
    tls = None if args.plaintext else harness_tls.client_tls()
    src = AgentClient("127.0.0.1", src_port, SECRET, request_timeout=60, tls=tls)
    dst = AgentClient("127.0.0.1", dst_port, SECRET, request_timeout=60, tls=tls)
    payload = os.urandom(args.entry_kib * KIB)
    count = max(1, args.mib * MIB // len(payload))
    rounds = []
    try:
        for r in range(args.rounds):
            seq = r + 1
            await fill(src, 1, seq, count, payload)
            # "lost" is the replica being rebuilt; "src" serves every entry (E = W = 2). In place,
            # the member being refilled is the target itself.
            member = "dst" if args.in_place else "lost"
            segment = SegmentRecord(seq, SegmentState.COMPLETED, (EnsembleChange(0, ("src", member)),), 2, 2, time.time(), last_entry_id=count - 1)
            base = baseline_sequential_bandwidth(directory, count * len(payload))
            before = (cpu_seconds(pids[0]), cpu_seconds(pids[1]), time.process_time())
            result = await copy_replica(Pool({"src": src, "dst": dst}), 1, segment, member, "dst", {member}, window=args.window, pull=not args.no_pull)
            rate = result.bytes / result.seconds
            spent = [after - was for was, after in zip(before, (cpu_seconds(pids[0]), cpu_seconds(pids[1]), time.process_time()))]
            per_gib = sum(spent) / (result.bytes / (1024 * MIB))
            rounds.append((rate, base, per_gib))
            print(
                f"round {r + 1}: copied {result.bytes / MIB:.0f} MiB in {result.seconds:.2f}s = {rate / MIB:.1f} MiB/s; baseline {base / MIB:.1f} MiB/s ({rate / base:.0%}); "
                f"CPU s source {spent[0]:.2f} target {spent[1]:.2f} copier {spent[2]:.2f} = {per_gib:.2f} s/GiB",
                flush=True,
            )
            await src.delete_segment(1, seq)
            await dst.delete_segment(1, seq)
    finally:
        await src.close()
        await dst.close()
    return rounds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help="a directory on the disk to measure (default: a temporary one)")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--entry-kib", type=int, default=64)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--plaintext", action="store_true", help="agents without TLS (default: mutual TLS, as production)")
    parser.add_argument("--in-place", action="store_true", help="refill a member in place (repair) instead of copying to a replacement")
    parser.add_argument("--no-pull", action="store_true", help="copy through this process (READ_RANGE + ADD_BATCH) instead of the target pulling (PULL_RANGE)")
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), Path(args.serve[1]), json.loads(args.serve[2]))
        return 0
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)  # a --dir that does not exist yet is made
    work = Path(tempfile.mkdtemp(prefix="bench-rerepl-", dir=args.dir))
    procs = []
    try:
        src, src_port = start_agent(work, "source", plaintext=args.plaintext)
        dst, dst_port = start_agent(work, "target", plaintext=args.plaintext, peers={"src": f"127.0.0.1:{src_port}"})
        procs = [src, dst]
        rounds = asyncio.run(measure(src_port, dst_port, args, work, (src.pid, dst.pid)))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)
    ratio = statistics.median(rate / base for rate, base, _ in rounds)
    rate = statistics.median(rate for rate, _, _ in rounds)
    cpu = statistics.median(per_gib for _, _, per_gib in rounds)
    verdict = "PASS" if ratio >= 0.5 else "MISS"
    what = ("repair (in place)" if args.in_place else "re-replication") + (", plaintext" if args.plaintext else ", TLS") + (", through the copier" if args.no_pull else ", pulled by the target")
    print(f"{what} copy rate: {rate / MIB:.1f} MiB/s = {ratio:.0%} of sequential write+fdatasync bandwidth (target >= 50 %): {verdict}; CPU {cpu:.2f} s per GiB (all three processes)")
    return 1 if args.strict and ratio < 0.5 else 0


if __name__ == "__main__":
    sys.exit(main())
