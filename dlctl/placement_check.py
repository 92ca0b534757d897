"""``dlctl placement check`` as a pure function: a policy against a topology, for every
combination of unavailable regions.

For each combination it says whether **new segments** can be placed (the policy, run on the
agents that remain, finds an ensemble satisfying the invariant), whether **writes to existing
segments** can continue (every write set of a reference ensemble keeps ≥ A surviving members)
and whether **reads** can (every write set keeps ≥ 1). The reference ensemble is the one the
policy places with every region up (seeded, so the report is reproducible); the policy spreads
evenly, so it stands for the segments the policy creates.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import RefusedError
from .output import Table
from .placement import PlacementPolicy, choose_ensemble, region_of, write_sets

MAX_REGIONS = 12  # 2^12 combinations; beyond that only up to MAX_DOWN regions down are listed
MAX_DOWN = 3


def hypothetical_nodes(regions: int, nodes_per_region: int, racks_per_region: int = 1) -> dict[str, dict]:
    """``region-1..R``, each with ``nodes_per_region`` agents spread round-robin over racks."""
    width = len(str(nodes_per_region))
    return {
        f"region-{r}-n{i:0{width}d}": {"region": f"region-{r}", "rack": f"rack-{1 + (i - 1) % racks_per_region}", "address": "hypothetical"}
        for r in range(1, regions + 1)
        for i in range(1, nodes_per_region + 1)
    }


@dataclass
class CheckReport:
    policy: PlacementPolicy
    regions: dict[str, int]  # region -> agents
    valid: bool
    message: str
    fix: str
    reference_ensemble: tuple[str, ...] | None
    scenarios: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.to_dict(),
            "regions": self.regions,
            "valid": self.valid,
            "verdict": "accepted" if self.valid else "refused",
            "reason": self.message,
            "fix": self.fix or None,
            "reference_ensemble": list(self.reference_ensemble) if self.reference_ensemble else None,
            "notes": self.notes,
            "scenarios": self.scenarios,
        }

    def to_table(self) -> Table:
        rows = [
            {
                "regions down": ",".join(s["down"]) or "(none)",
                "regions up": len(s["up"]),
                "new segments": s["new_segments"],
                "existing writes": s["existing_writes"],
                "reads": s["reads"],
                "why": s["why"],
            }
            for s in self.scenarios
        ]
        verdict = f"{'ACCEPTED' if self.valid else 'REFUSED'}: {self.message}" + (f"\nfix: {self.fix}" if self.fix else "")
        caption = "\n".join([verdict, *(f"note: {n}" for n in self.notes)])
        regions = ", ".join(f"{r}={c}" for r, c in self.regions.items())
        return Table(rows, ["regions down", "regions up", "new segments", "existing writes", "reads", "why"], title=f"placement check: {self.policy.describe} over {regions}", caption=caption)


def _existing(ensemble: tuple[str, ...], nodes: Mapping[str, dict], down: set[str], policy: PlacementPolicy) -> tuple[bool, bool, str]:
    worst = policy.write_quorum
    for ws in write_sets(policy.ensemble_size, policy.write_quorum):
        alive = sum(1 for p in ws if region_of(nodes[ensemble[p]]) not in down)
        worst = min(worst, alive)
    writes, reads = worst >= policy.ack_quorum, worst >= 1
    if not reads:
        why = "some entries have every replica in a region that is down"
    elif not writes:
        why = f"a write set keeps only {worst} of W={policy.write_quorum} members < A={policy.ack_quorum}"
    else:
        why = ""
    return writes, reads, why


@dataclass(frozen=True)
class LiveSegment:
    """A segment of the live cluster, as far as region loss is concerned."""

    log: str
    seq: int
    in_progress: bool
    ensemble: tuple[str, ...]
    write_quorum: int
    ack_quorum: int


def _live(segments: Sequence[LiveSegment], nodes: Mapping[str, dict], down: set[str]) -> tuple[bool, bool, str]:
    """Can the in-progress segments still reach their ack quorum, and can every entry of every
    segment still be read? A member whose region is unknown counts as down (it is not here)."""

    def alive(node: str) -> bool:
        return node in nodes and region_of(nodes[node]) not in down

    writes, reads, why = True, True, []
    for seg in segments:
        worst = min(sum(1 for p in ws if alive(seg.ensemble[p])) for ws in write_sets(len(seg.ensemble), seg.write_quorum))
        if worst < 1 and reads:
            reads = False
            why.append(f"segment {seg.seq} of log {seg.log} has entries with every replica down")
        if seg.in_progress and worst < seg.ack_quorum and writes:
            writes = False
            why.append(f"in-progress segment {seg.seq} of log {seg.log} keeps only {worst} of W={seg.write_quorum} < A={seg.ack_quorum}")
    return writes, reads, "; ".join(why)


def check_policy(policy: PlacementPolicy, nodes: Mapping[str, dict], *, seed: int = 0, segments: Sequence[LiveSegment] | None = None) -> CheckReport:
    """With ``segments`` (a live cluster), existing writes and reads are judged on those real
    segments; without, on the ensemble the policy would place with every region up."""
    regions: dict[str, int] = {}
    for record in nodes.values():
        regions[region_of(record)] = regions.get(region_of(record), 0) + 1
    regions = dict(sorted(regions.items()))
    problems = policy.problems()
    notes: list[str] = [f"{p.message}; fix: {p.fix}" for p in problems[1:]]
    reference = None
    try:
        reference = choose_ensemble(nodes, policy=policy, seed=seed)
        normal_error = None
    except RefusedError as exc:
        normal_error = exc
    if problems:
        valid, message, fix = False, problems[0].message, problems[0].fix
    elif normal_error is not None:
        valid, message, fix = False, f"with every region available: {normal_error.message}", normal_error.hint or ""
    else:
        spread = ", ".join(f"{r}={c}" for r, c in sorted(_count(reference, nodes).items()))
        valid, message, fix = True, f"{policy.describe} satisfies A ≥ m and A > W − ⌊W/m⌋; with every region up an ensemble spreads {spread}", ""
    names = list(regions)
    max_down = len(names) if len(names) <= MAX_REGIONS else MAX_DOWN
    if max_down < len(names):
        notes.append(f"{len(names)} regions: only combinations of up to {max_down} regions down are listed")
    scenarios = []
    for k in range(max_down + 1):
        for down in itertools.combinations(names, k):
            down_set = set(down)
            up_nodes = {n: r for n, r in nodes.items() if region_of(r) not in down_set}
            try:
                choose_ensemble(up_nodes, policy=policy, seed=seed)
                new, why = True, ""
            except RefusedError as exc:
                new, why = False, exc.message
            if segments is not None:
                writes, reads, why_existing = _live(segments, nodes, down_set)
            elif reference is not None:
                writes, reads, why_existing = _existing(reference, nodes, down_set, policy)
            else:
                writes = reads = None
                why_existing = "no reference ensemble (none can be placed with every region up)"
            scenarios.append(
                {
                    "down": list(down),
                    "up": [r for r in names if r not in down_set],
                    "new_segments": new,
                    "existing_writes": writes,
                    "reads": reads,
                    "why": "; ".join(x for x in (why, why_existing) if x),
                }
            )
            if valid and not new and len(names) - k >= policy.min_regions and k > 0:
                notes.append(f"with {', '.join(down)} down ({len(names) - k} regions ≥ m left) new segments cannot be placed: {why}")
    return CheckReport(policy, regions, valid, message, fix, reference, scenarios, notes)


def _count(ensemble, nodes) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in ensemble:
        out[region_of(nodes[n])] = out.get(region_of(nodes[n]), 0) + 1
    return out
