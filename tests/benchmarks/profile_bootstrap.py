"""Where a bootstrap copy spends its CPU: seconds per GiB copied, per component.

    .venv/bin/python tests/benchmarks/profile_bootstrap.py up --dir DIR [--gib 0.5] [--segments 20]
    .venv/bin/python tests/benchmarks/profile_bootstrap.py run --dir DIR [--sink-w 1] [--spark --parallelism N] [--cprofile N]
    .venv/bin/python tests/benchmarks/profile_bootstrap.py down --dir DIR

``up`` starts a two-cluster sandbox in DIR and writes the source log (as ``bench_bootstrap.py``
does); ``run`` bootstraps it to the sink cluster — in this process without Spark (the
in-process engine, ``dlctl.spark.local``, on ``--parallelism`` threads; 1: one segment after
the other, the copy's own cost), or with ``--spark`` through the real engine — and prints wall time, rate, and CPU seconds per GiB of: the copying process
(driver + tasks, or with Spark the driver, the JVM and the Python workers), the source
agents and the sink agents; plus, for scale, a plain file copy of the same segment files and a
bare TLS copy of them (``tls_floor.py``: the least an encrypted copy does).
``--cprofile N`` prints the N costliest functions of the in-process copy. The sink copy is
removed after each run, so ``run`` can be repeated on the same data. An investigation tool
for issue 9; ``bench_bootstrap.py`` is the benchmark.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_bootstrap as B

from dlctl.meta.records import LogConfig
from dlctl.ops.bootstrap import bootstrap_logs

GIB = 1024**3
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK


def _machine() -> list[int]:
    """The machine's CPU time so far (/proc/stat, in ticks): user+nice, system+irq+softirq, idle, iowait."""
    with open("/proc/stat") as f:
        u, n, s, i, w, q, sq, st = (int(x) for x in f.readline().split()[1:9])
    return [u + n, s + q + sq, i, w, st]


def _machine_shares(before: list[int], after: list[int]) -> str:
    """How the machine's cores spent the interval: is the copy bound by CPU or by waiting?"""
    delta = [b - a for a, b in zip(before, after)]
    total = max(1, sum(delta))
    return ", ".join(f"{name} {d / total:.0%}" for name, d in zip(("user", "system", "idle", "iowait", "steal"), delta))


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def _agents(directory: Path) -> dict[str, list[int]]:
    from dlctl.sandbox import sandbox

    out: dict[str, list[int]] = {}
    for node in sandbox.status(directory / "sbx")["nodes"]:
        out.setdefault(node["cluster"], []).append(int(node["pid"]))
    return out


def _env(directory: Path) -> dict[str, str]:
    return {"DLCTL_SANDBOX_DIR": str(directory / "sbx"), "DLCTL_CONFIG": str(directory / "sbx" / "config.toml")}


def up(args: argparse.Namespace) -> int:
    args.dir.mkdir(parents=True, exist_ok=True)
    env = _env(args.dir)
    res = B.dlctl(env, "--yes", "sandbox", "up", "--clusters", "2", "--regions", "1", "--nodes-per-region", "3")
    if res.returncode != 0:
        print(res.stderr, file=sys.stderr)
        return 1
    import asyncio

    with B.session(Path(env["DLCTL_CONFIG"]), "east") as src, B.session(Path(env["DLCTL_CONFIG"]), "west") as dst:
        seconds = asyncio.run(B.fill(src, int(args.gib * GIB), args.segments, int(args.record_kib * 1024)))
        nbytes = sum(s.value.bytes for s in src.meta.segments(B.LOG))
        B.declare_source(src, dst)  # the sink agents can pull (run --relay: they do not)
    print(f"source: {nbytes / 2**20:.0f} MiB in {args.segments} segments (written in {seconds:.1f}s)")
    return 0


def down(args: argparse.Namespace) -> int:
    B.dlctl(_env(args.dir), "--yes", "sandbox", "down", "--purge")
    return 0


def run(args: argparse.Namespace) -> int:
    env = _env(args.dir)
    config = Path(env["DLCTL_CONFIG"])
    agents = _agents(args.dir)
    me = os.getpid()
    with B.session(config, "east") as src, B.session(config, "west") as dst:
        nbytes = sum(s.value.bytes for s in src.meta.segments(B.LOG))
        files = B.source_files(config, src)
        base, _ = B.plain_copy_rate(files, args.dir, rounds=1)
        floor = B.tls_copy_rate(files, args.dir, *B.source_tls(config), rounds=1)
        if B.LOG in dst.meta.list_logs():
            B.drop_sink_copy(dst)  # left by a run that failed
        if args.sink_w != 3:
            dst.meta.create_log(B.LOG, LogConfig(ensemble_size=args.sink_w, write_quorum=args.sink_w, ack_quorum=args.sink_w))
        import dlctl.spark.transform as T

        saved_speedups = T._speedups
        if args.no_speedups:
            T._speedups = None  # the Python loops (in this process; Spark's workers import their own)

        before = {c: sum(_cpu(p) for p in pids) for c, pids in agents.items()}
        t0 = os.times()
        kids_before = {p: _cpu(p) for p in _descendants(me)}
        prof = cProfile.Profile() if args.cprofile else None
        kids_seen: dict[int, float] = {}
        names: dict[int, str] = {}
        try:
            if prof:
                prof.enable()
            if args.spark:
                import threading

                stop = threading.Event()

                def watch() -> None:  # children die with the engine: sample their CPU while they live
                    while not stop.wait(0.2):
                        for p in _descendants(me):
                            kids_seen[p] = _cpu(p)
                            if p not in names:
                                try:
                                    with open(f"/proc/{p}/cmdline", "rb") as f:
                                        names[p] = f.read().replace(b"\0", b" ")[:120].decode(errors="replace")
                                except OSError:
                                    names[p] = "?"

                watcher = threading.Thread(target=watch, daemon=True)
                watcher.start()
            machine_before = _machine()
            started = time.monotonic()
            # In-process: the engine a copy below --local-below takes (dlctl.spark.local), on
            # --parallelism threads; --spark: forced onto Spark.
            result = bootstrap_logs(src, dst, [B.LOG], holder="bootstrap-profile", parallelism=args.parallelism, local_below=0 if args.spark else 1 << 62, relay=args.relay)
            wall = time.monotonic() - started
            machine_after = _machine()
            if args.spark:
                stop.set()
                watcher.join()
        finally:
            if prof:
                prof.disable()
            T._speedups = saved_speedups
        t1 = os.times()
        after = {c: sum(_cpu(p) for p in pids) for c, pids in agents.items()}
        own = (t1.user - t0.user) + (t1.system - t0.system)
        kids = sum(v - kids_before.get(p, 0.0) for p, v in kids_seen.items())
        gib = nbytes / GIB
        print(f"{'relayed' if args.relay else f'pulled ({result.pulled_segments} segments)'}, {'spark' if args.spark else 'in-process'} copy{' (Python loops)' if args.no_speedups else ''}, sink W={args.sink_w}, parallelism {args.parallelism}: {nbytes / 2**20:.0f} MiB in {wall:.2f}s = {nbytes / 2**20 / wall:.1f} MiB/s (job's own figure {result.seconds:.2f}s); plain file copy {base / 2**20:.0f} MiB/s ({nbytes / wall / base:.0%}); bare TLS copy {floor / 2**20:.0f} MiB/s ({nbytes / wall / floor:.0%})")
        print(f"CPU s/GiB: copy process {own / gib:.2f}" + (f", Spark JVM + workers {kids / gib:.2f}" if args.spark else "") + f", source agents {(after['east'] - before['east']) / gib:.2f}, sink agents {(after['west'] - before['west']) / gib:.2f}")
        print(f"the machine's cores during the copy: {_machine_shares(machine_before, machine_after)}")
        if args.spark and args.verbose:
            for p, v in sorted(kids_seen.items(), key=lambda kv: -kv[1]):
                print(f"  pid {p}: {v - kids_before.get(p, 0.0):.2f} CPU s  {names.get(p, '?')}")
        B.drop_sink_copy(dst)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.cprofile)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["up", "run", "down"])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--gib", type=float, default=0.5)
    parser.add_argument("--segments", type=int, default=20)
    parser.add_argument("--record-kib", type=float, default=4)
    parser.add_argument("--sink-w", type=int, default=1)
    parser.add_argument("--spark", action="store_true")
    parser.add_argument("--relay", action="store_true", help="every byte through the copying process, not pulled by the sink agents")
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--cprofile", type=int, default=0)
    parser.add_argument("--no-speedups", action="store_true", help="in-process: the Python loops instead of dlctl._speedups")
    parser.add_argument("--verbose", action="store_true", help="with --spark: CPU of each process Spark started")
    args = parser.parse_args()
    return {"up": up, "run": run, "down": down}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
