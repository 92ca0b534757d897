"""Ensemble selection for 10 regions × 100 agents: µs per decision (target < 1 ms).

    .venv/bin/python tests/benchmarks/bench_placement.py [--decisions N]

Measures ``choose_ensemble`` from the availability records as the writer passes them (grouping
by region and rack included), for an unstriped and a striped policy, plus ``replace_member``.
"""

from __future__ import annotations

import argparse
import time

from dlctl.placement import PlacementPolicy, choose_ensemble, replace_member

TARGET_US = 1000.0


def topology(regions: int = 10, per_region: int = 100, racks: int = 5) -> dict[str, dict]:
    return {
        f"r{r}-n{i:03d}": {"region": f"r{r}", "rack": f"k{i % racks}", "address": f"10.{r}.0.{i}:3181"}
        for r in range(regions)
        for i in range(per_region)
    }


def per_decision_us(fn, n: int) -> float:
    fn(0)  # warm up
    start = time.perf_counter()
    for seed in range(n):
        fn(seed)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--decisions", type=int, default=2000)
    args = parser.parse_args()
    nodes = topology()
    cases = {
        "E=W=15 A=9 m=2": PlacementPolicy(15, 15, 9, 2),
        "E=5 W=3 A=2 m=2 (striped)": PlacementPolicy(5, 3, 2, 2),
        "E=9 W=6 A=4 m=3 (striped)": PlacementPolicy(9, 6, 4, 3),
    }
    print(f"ensemble selection over 10 regions × 100 agents ({len(nodes)} agents), {args.decisions} decisions each")
    worst = 0.0
    for label, policy in cases.items():
        us = per_decision_us(lambda s, p=policy: choose_ensemble(nodes, policy=p, seed=s), args.decisions)
        worst = max(worst, us)
        print(f"  choose_ensemble {label:28s} {us:8.1f} µs/decision")
    policy = cases["E=5 W=3 A=2 m=2 (striped)"]
    ensemble = choose_ensemble(nodes, policy=policy, seed=1)
    survivors = {n: r for n, r in nodes.items() if n != ensemble[2]}
    us = per_decision_us(lambda s: replace_member(ensemble, ensemble[2], survivors, policy=policy, seed=s, known=nodes), args.decisions)
    worst = max(worst, us)
    print(f"  replace_member  {'E=5 W=3 A=2 m=2':28s} {us:8.1f} µs/decision")
    print(f"worst: {worst:.1f} µs per decision; target < {TARGET_US:.0f} µs: {'met' if worst < TARGET_US else 'MISSED'}")


if __name__ == "__main__":
    main()
