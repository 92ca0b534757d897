"""Fan-out benchmark: `true` over 64 real sshd nodes, with its one-node baseline in the same run.

    .venv/bin/python tests/benchmarks/bench_fanout.py [--nodes 64] [--regions 4] [--repeat 3]
                                                      [--login-rc] [--json] [--strict]

Starts ``--nodes`` sshd processes on loopback addresses (127.0.<region>.<i>, the test
harness's nodes), then times ``run_on_hosts(..., ["true"])`` through ``SshPool``:

  * baseline: the same fan-out over one node;
  * all nodes at max concurrency 1, 8 and 32.

Each figure is the median of ``--repeat`` runs, measured twice: **cold** (a new pool, so every
host pays TCP + key exchange + host key check + public key auth, then the command) and **warm**
(connections already open and reused: only the command). Target (issue 5): cold, concurrency
32 within 3 x the cold one-node time.

CPU is accounted too, because here every "node" shares this machine's CPUs with the client:
``client`` is this process's CPU time (all threads), ``machine`` is every CPU's busy time from
/proc/stat (client + the 64 sshds + whatever else runs). ``machine / cores`` is the wall-time
floor no scheduling can beat; when the fan-out's wall time sits on that floor, it is the
machine, not the fan-out, that limits it. On a real fleet each sshd has its own CPUs and only
the client's share stays.

The nodes' sessions get ``SHLVL=1`` so bash skips root's ``~/.bashrc`` (on this machine it runs
``pyenv init``: ~0.1 s of CPU per command, which would measure the node's shell, not the
fan-out); ``--login-rc`` keeps it. Every process started here is stopped at exit, also on
Ctrl-C. Exit code 0 unless ``--strict`` and the target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_TESTS))
sys.path.insert(0, str(_TESTS.parent))

from dlctl.remote.fanout import outcome, run_on_hosts  # noqa: E402
from dlctl.remote.ssh import SshOptions, SshPool  # noqa: E402
from harness.procs import ProcessRegistry  # noqa: E402
from harness.sshd import ClientIdentity, SshCluster, SshNodeFactory, missing_prerequisites  # noqa: E402

TARGET_FACTOR = 3.0
CONCURRENCIES = (1, 8, 32)


@dataclass(frozen=True)
class Target:
    id: str  # ssh config alias written by the harness
    region: str


@dataclass(frozen=True)
class Sample:
    wall: float
    client_cpu: float
    machine_cpu: float


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _machine_cpu() -> float:
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def fan_out_true(pool: SshPool, targets: Sequence[Target], concurrency: int) -> Sample:
    own, machine = _own_cpu(), _machine_cpu()
    start = time.perf_counter()
    results = run_on_hosts(targets, lambda t: pool.get(t.id), ["true"], timeout=60, max_concurrency=concurrency)
    elapsed = time.perf_counter() - start
    sample = Sample(elapsed, _own_cpu() - own, _machine_cpu() - machine)
    outcome(results, action="bench `true`")  # every host must have succeeded
    return sample


def cold(options: SshOptions, targets: Sequence[Target], concurrency: int) -> Sample:
    pool = SshPool(options)
    try:
        return fan_out_true(pool, targets, concurrency)
    finally:
        pool.close()  # teardown is not part of the figure


def warm(pool: SshPool, targets: Sequence[Target], concurrency: int) -> Sample:
    return fan_out_true(pool, targets, concurrency)


def median_of(repeat: int, fn: Callable[[], Sample]) -> Sample:
    samples = sorted((fn() for _ in range(repeat)), key=lambda s: s.wall)
    return samples[len(samples) // 2]


def start_nodes(workdir: Path, registry: ProcessRegistry, nodes: int, regions: int, login_rc: bool) -> SshCluster:
    identity = ClientIdentity.generate(workdir / "client")
    factory = SshNodeFactory(workdir / "nodes", registry, identity)
    return factory(nodes, regions, session_env=None if login_rc else {"SHLVL": "1"})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--regions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--login-rc", action="store_true", help="let bash read root's ~/.bashrc on every command")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)
    missing = missing_prerequisites()
    if missing:
        print("cannot run: " + "; ".join(missing), file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        workdir = Path(tmp)
        registry = ProcessRegistry(workdir / "procs")
        try:
            t0 = time.perf_counter()
            cluster = start_nodes(workdir, registry, args.nodes, args.regions, args.login_rc)
            startup = time.perf_counter() - t0
            options = SshOptions(config_path=cluster.ssh_config_path)
            targets = [Target(n.name, n.region) for n in cluster]
            one = targets[:1]

            # Warm-up: page in paramiko/cryptography and sshd binaries once, outside the figures.
            cold(options, one, 1)

            figures: dict[str, dict[str, Sample]] = {"cold": {}, "warm": {}}
            figures["cold"]["baseline"] = median_of(args.repeat, lambda: cold(options, one, 1))
            for c in CONCURRENCIES:
                figures["cold"][f"c{c}"] = median_of(args.repeat, lambda c=c: cold(options, targets, c))
            with SshPool(options) as pool:
                warm(pool, targets, 32)  # open every connection once
                figures["warm"]["baseline"] = median_of(args.repeat, lambda: warm(pool, one, 1))
                for c in CONCURRENCIES:
                    figures["warm"][f"c{c}"] = median_of(args.repeat, lambda c=c: warm(pool, targets, c))
        finally:
            registry.close()

    cores = os.cpu_count() or 1
    ratio = figures["cold"]["c32"].wall / figures["cold"]["baseline"].wall
    met = ratio <= TARGET_FACTOR
    report = {
        "nodes": args.nodes,
        "regions": args.regions,
        "repeat": args.repeat,
        "cpus": cores,
        "login_rc": args.login_rc,
        "sshd_startup_s": round(startup, 3),
        "seconds": {
            k: {n: {"wall": round(v.wall, 4), "client_cpu": round(v.client_cpu, 4), "machine_cpu": round(v.machine_cpu, 4), "cpu_floor": round(v.machine_cpu / cores, 4)} for n, v in d.items()}
            for k, d in figures.items()
        },
        "cold_c32_over_baseline": round(ratio, 2),
        "target": f"cold c32 <= {TARGET_FACTOR:g} x cold baseline",
        "target_met": met,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"fan-out of `true` over {args.nodes} sshd nodes in {args.regions} regions; {cores} CPUs; median of {args.repeat}; "
              f"login rc {'on' if args.login_rc else 'off (SHLVL=1)'}; sshd startup {startup:.1f}s")
        rows = [("baseline: 1 node", "baseline")] + [(f"{args.nodes} nodes, concurrency {c}", f"c{c}") for c in CONCURRENCIES]
        for kind, title in (("cold", "cold: connect + run"), ("warm", "warm: connection reused")):
            base = figures[kind]["baseline"].wall
            print(f"\n{title:28}{'wall':>9}{'vs 1 node':>11}{'client CPU':>12}{'machine CPU':>13}{'CPU floor':>11}")
            for label, key in rows:
                s = figures[kind][key]
                print(f"{label:28}{s.wall:>8.3f}s{s.wall / base:>10.1f}x{s.client_cpu:>11.3f}s{s.machine_cpu:>12.3f}s{s.machine_cpu / cores:>10.3f}s")
        print(f"\ntarget: cold concurrency 32 <= {TARGET_FACTOR:g} x cold 1-node -> {ratio:.2f}x: {'MET' if met else 'MISSED'}")
    return 1 if args.strict and not met else 0


if __name__ == "__main__":
    sys.exit(main())
