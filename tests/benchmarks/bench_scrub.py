"""What scrubbing costs appends: append throughput with scrubbing at its default rate against
scrubbing off, measured in the same run, on the same agent and the same disk.

    .venv/bin/python tests/benchmarks/bench_scrub.py [--dir DIR] [--rounds 5] [--prefill-mib 256] [--quick] [-o json]

One real agent (``SegmentStore`` + ``AgentServer``, fsync on, default group commit, as in
bench_agent.py) listens on 127.0.0.1; the client runs in this process over TCP. It holds
``--prefill-mib`` of 1 KiB entries written before measuring and then dropped from the page cache,
so the scrubber reads cold data from the disk and verifies many small entries (the most CPU per
byte). Scrubbing is switched on (SIGUSR1: a Scrubber at the default ``[scrub] bytes_per_second``,
passes back to back — the worst case, an agent holding more than rate x interval) and off
(SIGUSR2) between measurements; the same process measures both ways, so nothing but scrubbing
differs (two processes measured apart differed by more than scrubbing costs).

Each round measures each workload both ways back to back, alternating which goes first, so that
whatever else the machine does weighs on both alike:

  * 1 KiB adds, 64 in flight over two connections: acknowledged adds/s (the event loop's limit)
  * 64 KiB adds, 16 in flight: MiB/s (the disk's limit)

Reported: the median over rounds each way, the ratio on/off of each round and its median (goal:
at least 0.95, i.e. appends lose at most 5 %), the agent's CPU time per add both ways (all its
threads: what scrubbing costs in CPU, steadier than throughput on a shared machine), the rate the
scrubber actually read at while it was measured (to show it was scrubbing all along, at its cap),
and the load average around the run (others' work shows in the spread of the rounds). Exit code
0 unless --strict and a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_agent import SECRET, Writer, harness_tls, start_agent  # noqa: E402 - the same client-side writer and agent start

from dlctl.log.client import AgentClient  # noqa: E402

KIB = 1024
MIB = 1024 * KIB
GOAL = 0.95
PREFILL_LOG = 1  # scrubbed first (passes go in key order): the cold data


# -- the agent under test (child process) ---------------------------------------------------------


def serve(data_dir: Path, port_file: Path) -> None:
    from dlagent.config import ScrubSettings
    from dlagent.server import AgentServer
    from dlagent.storage import SegmentStore, SyncPolicy
    from dlagent.storage.scrub import Scrubber

    async def main() -> None:
        store = SegmentStore(data_dir, SyncPolicy())
        await store.open()
        server = AgentServer(store, SECRET, "127.0.0.1", 0, tls=harness_tls.from_env())  # start_agent passes it
        await server.start()
        loop = asyncio.get_running_loop()
        scrubber: Scrubber | None = None

        def scrub_on() -> None:
            nonlocal scrubber
            if scrubber is None:
                # The agents' default rate; passes back to back (no idle interval between them).
                scrubber = Scrubber(store, ScrubSettings().bytes_per_second, interval=0.05, first_delay=0).start()

        async def scrub_off() -> None:
            nonlocal scrubber
            if scrubber is not None:
                stopping, scrubber = scrubber, None
                await stopping.stop()
                store.scrub_stats = None  # stat() says scrub_enabled: false once it is off

        loop.add_signal_handler(signal.SIGUSR1, scrub_on)
        loop.add_signal_handler(signal.SIGUSR2, lambda: asyncio.ensure_future(scrub_off()))
        port_file.write_text(str(server.address[1]))
        await asyncio.Event().wait()

    asyncio.run(main())


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drop_page_cache(root: Path) -> int:
    """Drop every clean page of the segment files under ``root`` (they were fdatasync'ed)."""
    total = 0
    for path in (root / "segments").rglob("*.log"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


# -- measurements -------------------------------------------------------------------------------


class Agent:
    def __init__(self, proc: subprocess.Popen, port: int, tls=None) -> None:  # noqa: ANN001 - TlsFiles | None
        self.proc, self.port, self.tls = proc, port, tls
        self.clients: list[AgentClient] = []
        self.next_seg = 1

    async def connect(self) -> None:
        self.clients = [AgentClient("127.0.0.1", self.port, SECRET, tls=self.tls, request_timeout=120) for _ in range(2)]
        for c in self.clients:
            await c.connect()

    async def scrub(self, on: bool) -> None:
        """Switch scrubbing on or off and wait until the agent says it is."""
        self.proc.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while (await self.clients[0].stat())["scrub_enabled"] != on:
            if time.monotonic() > deadline:
                raise SystemExit(f"the agent did not switch scrubbing {'on' if on else 'off'}")
            await asyncio.sleep(0.01)

    def seg(self) -> int:
        self.next_seg += 1
        return self.next_seg

    async def prefill(self, nbytes: int) -> None:
        per_seg = 64 * MIB // (KIB + 48)
        left = nbytes // (KIB + 48)
        seq = 1
        while left > 0:
            count = min(per_seg, left)
            await asyncio.gather(*(Writer(c, PREFILL_LOG, seq + i, os.urandom(KIB)).run(count // 2, 32) for i, c in enumerate(self.clients)))
            left -= count
            seq += 2

    async def small(self, count: int) -> float:
        """1 KiB adds, 64 in flight over two connections: adds/s."""
        per = count // 2
        start = time.perf_counter()
        await asyncio.gather(*(Writer(c, 2, self.seg(), os.urandom(KIB)).run(per, 32) for c in self.clients))
        return 2 * per / (time.perf_counter() - start)

    async def big(self, nbytes: int) -> float:
        """64 KiB adds, 16 in flight: MiB/s."""
        count = nbytes // (64 * KIB)
        elapsed = await Writer(self.clients[0], 3, self.seg(), os.urandom(64 * KIB)).run(count, 16)
        return count * (64 * KIB + 48) / elapsed / MIB


async def measure(agent: Agent, args: argparse.Namespace) -> dict:
    """Per round and workload, off and on back to back (the order alternating from round to
    round); the ratio is taken per round, then its median."""
    figures: dict[str, dict[str, list[float]]] = {w: {"off": [], "on": []} for w in ("small", "big")}
    cpu: dict[str, dict[str, list[float]]] = {w: {"off": [], "on": []} for w in ("small", "big")}  # agent CPU s per add
    scrub_rates: list[float] = []
    passes = 0
    for r in range(args.rounds):
        for workload in ("small", "big"):
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                await agent.scrub(mode == "on")
                before = await agent.clients[0].stat()
                t0, cpu0 = time.perf_counter(), cpu_seconds(agent.proc.pid)
                figure = await (agent.small(args.small_count) if workload == "small" else agent.big(args.big_mib * MIB))
                elapsed, used = time.perf_counter() - t0, cpu_seconds(agent.proc.pid) - cpu0
                after = await agent.clients[0].stat()
                figures[workload][mode].append(figure)
                cpu[workload][mode].append(used / (after["adds"] - before["adds"]))
                if mode == "on":
                    scrub_rates.append((after["scrub_bytes"] - before["scrub_bytes"]) / elapsed)
                    passes += after["scrub_passes"]
        print(f"round {r + 1}: " + ", ".join(f"{w} {m} {figures[w][m][-1]:,.1f}" for w in figures for m in ("off", "on")), file=sys.stderr)
    await agent.scrub(False)
    if passes:
        print("warning: the scrubber finished a pass while measured, so it was not reading cold data all along: raise --prefill-mib", file=sys.stderr)
    return {"figures": figures, "cpu": cpu, "scrub_rates": scrub_rates}


def report(result: dict, rate: int) -> list[dict]:
    rows = []
    units = {"small": ("1 KiB adds, 64 in flight", "adds/s", "{:,.0f}"), "big": ("64 KiB adds, 16 in flight", "MiB/s", "{:.1f}")}
    for workload, (label, unit, fmt) in units.items():
        off, on = result["figures"][workload]["off"], result["figures"][workload]["on"]
        ratios = [b / a for a, b in zip(off, on)]
        ratio = statistics.median(ratios)
        rows.append({
            "workload": label, "unit": unit,
            "scrub_off": statistics.median(off), "scrub_on": statistics.median(on),
            "rounds_off": [round(x, 1) for x in off], "rounds_on": [round(x, 1) for x in on],
            "ratio": round(ratio, 3), "ratios": [round(x, 3) for x in ratios], "goal": f">= {GOAL}", "ok": ratio >= GOAL,
            "text": f"{label}: scrub off {fmt.format(statistics.median(off))} {unit}, on {fmt.format(statistics.median(on))} {unit}; "
                    f"on/off {ratio:.3f} (median of the rounds' {', '.join(f'{x:.3f}' for x in ratios)})",
        })
        cpu_off, cpu_on = (statistics.median(result["cpu"][workload][m]) * 1e6 for m in ("off", "on"))
        rows.append({
            "workload": f"{label}: agent CPU per add", "unit": "us", "scrub_off": round(cpu_off, 1), "scrub_on": round(cpu_on, 1),
            "text": f"  agent CPU per add (all threads): off {cpu_off:.1f} us, on {cpu_on:.1f} us ({(cpu_on / cpu_off - 1) * 100:+.1f} %)",
        })
    scrubbed = statistics.median(result["scrub_rates"])
    rows.append({"workload": "scrubber read rate while measured", "unit": "MiB/s", "scrub_on": scrubbed / MIB,
                 "cap": rate / MIB, "rounds_on": [round(x / MIB, 2) for x in result["scrub_rates"]],
                 "text": f"the scrubber read {scrubbed / MIB:.2f} MiB/s while measured (cap {rate / MIB:.2f} MiB/s, plus its first chunk, read at once)"})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="a directory on the disk to measure (default: cwd)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds; medians are reported (default 5; 3 with --quick)")
    parser.add_argument("--prefill-mib", type=int, default=None, help="cold data the agent holds before measuring (default 256; 128 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smaller runs (figures are noisier)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a ratio is under the goal")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument("--serve", nargs=2, metavar=("DATA_DIR", "PORT_FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), Path(args.serve[1]))
        return 0
    args.small_count = 30_000 if args.quick else 60_000
    args.big_mib = 96 if args.quick else 256
    if args.prefill_mib is None:
        args.prefill_mib = 128 if args.quick else 256
    if args.rounds is None:
        args.rounds = 3 if args.quick else 5
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    from dlagent.config import ScrubSettings

    rate = ScrubSettings().bytes_per_second
    load = os.getloadavg()  # others' work on the machine shows in the spread of the rounds
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)  # a --dir that does not exist yet is made
    work = Path(tempfile.mkdtemp(prefix="dlctl-bench-scrub-", dir=args.dir))
    proc = None
    try:
        port_file = work / "port"
        proc, client_tls = start_agent(__file__, work, port_file)
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the benchmark agent did not start")
            time.sleep(0.05)

        async def run() -> dict:
            agent = Agent(proc, int(port_file.read_text()), client_tls)
            await agent.connect()
            try:
                print(f"prefilling the agent with {args.prefill_mib} MiB of 1 KiB entries in {work} ...", file=sys.stderr)
                await agent.prefill(args.prefill_mib * MIB)
                dropped = drop_page_cache(work / "agent")
                print(f"{dropped / MIB:.0f} MiB of segment files dropped from the page cache; measuring ...", file=sys.stderr)
                return await measure(agent, args)
            finally:
                for c in agent.clients:
                    await c.close()

        result = asyncio.run(run())
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)

    rows = report(result, rate)
    if args.output == "json":
        print(json.dumps([{k: v for k, v in r.items() if k != "text"} for r in rows], indent=2))
    else:
        print(f"scrubbing at the default rate ({rate / MIB:.0f} MiB/s, passes back to back) against scrubbing off, "
              f"{args.rounds} rounds, goal on/off >= {GOAL} (load average before/after: {load[0]:.2f}/{os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs):")
        for r in rows:
            print("  " + r["text"] + ("" if "ok" not in r else ("  ok" if r["ok"] else "  MISSED")))
    return 1 if args.strict and not all(r.get("ok", True) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
