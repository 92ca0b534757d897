"""Region-aware ensemble placement (DESIGN.md §6): pure decisions over availability records.

The policy (``PlacementPolicy``): E, W, A, ``min_regions_for_durability`` (m), the regions to
write (empty: all) and the drained regions (no new placement there). Ensembles spread as evenly
as the available agents allow over the eligible regions and, inside a region, over racks; the
choice is random (load spreads) and reproducible under a seed.

**The invariant**, checked on every ensemble and every replacement this module returns: *no set
of agents that satisfies the ack quorum spans fewer than m regions*. For one write set that is:
the largest m − 1 region counts sum to less than A (otherwise those A agents could all sit in
m − 1 regions). With striping (E > W) the write set of entry e is the W members from position
``e mod E`` on, round-robin, so every one of the E cyclic windows must satisfy it. Nothing here
knows about the future: an ensemble is checked against the agents available *now* (degraded
mode included); a policy whose quorums could not survive losing regions down to m is caught by
``PlacementPolicy.problems`` (BookKeeper's ``A ≥ m`` and ``A > W − ⌊W/m⌋``), which ``dlctl
placement set|check`` apply.

Selection is exact: it refuses only when no ensemble satisfying the invariant exists among the
eligible agents (tests compare it with a brute-force oracle). For E = W the most even region
counts (water-filling under each region's capacity) minimise every "largest k counts" sum, so
they decide. For E > W the same counts give a necessary condition (a window holds on average
W/E of every region set), and a depth-first search over region labels, tried in the smooth
"most behind its share first" order, finds an arrangement (usually its first leaf).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .errors import RefusedError

NO_REGION = "?"  # records without a region count as one (unknown) region: never as several
NO_RACK = "?"
SEARCH_BUDGET = 50_000  # search nodes for E > W arrangements before giving up (and saying so)


@dataclass(frozen=True)
class Problem:
    """A constraint a policy or an ensemble fails, and what would satisfy it."""

    constraint: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {"constraint": self.constraint, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class PlacementPolicy:
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    min_regions: int = 1  # m: min_regions_for_durability
    regions: tuple[str, ...] = ()  # regions to write; empty = every region
    drained: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        e, w, a, m = self.ensemble_size, self.write_quorum, self.ack_quorum, self.min_regions
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (e, w, a, m)):
            raise ValueError("E, W, A and m must be integers")
        if not e >= w >= a >= 1:
            raise ValueError(f"quorums must satisfy E >= W >= A >= 1 (got E={e}, W={w}, A={a})")
        if m < 1:
            raise ValueError(f"min_regions_for_durability must be >= 1 (got {m})")
        object.__setattr__(self, "regions", tuple(sorted(set(self.regions))))
        object.__setattr__(self, "drained", frozenset(self.drained))

    @property
    def describe(self) -> str:
        out = f"E={self.ensemble_size} W={self.write_quorum} A={self.ack_quorum} m={self.min_regions}"
        if self.regions:
            out += f" regions={','.join(self.regions)}"
        if self.drained:
            out += f" drained={','.join(sorted(self.drained))}"
        return out

    def to_dict(self) -> dict:
        return {
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "min_regions_for_durability": self.min_regions,
            "regions": list(self.regions),
            "drained": sorted(self.drained),
        }

    def problems(self) -> list[Problem]:
        """What makes the policy unsafe whatever the topology (empty: valid).

        ``A > W − ⌊W/m⌋``: when regions are lost down to m, the most even spread of a write set
        over m regions leaves the smallest region ⌊W/m⌋ replicas at least, so the other m − 1
        hold W − ⌊W/m⌋; an ack quorum no larger than that could span m − 1 regions.
        """
        w, a, m = self.write_quorum, self.ack_quorum, self.min_regions
        out = []
        if a < m:
            out.append(
                Problem(
                    "A >= m",
                    f"A={a} < m={m}: an ack quorum of {a} agent(s) can span at most {a} region(s), fewer than m={m}",
                    f"A must be ≥ {m} (or m ≤ {a})",
                )
            )
        elif m >= 2 and a <= w - w // m:
            in_top = w - w // m
            out.append(
                Problem(
                    "A > W - floor(W/m)",
                    f"A={a} is too small for m={m}: with only {m} regions available (regions down or drained), "
                    f"a write set of W={w} puts at least {in_top} replicas in {m - 1} region(s) "
                    f"(most even spread {_even_spread(w, m)}), so an ack quorum of {a} could span {m - 1} region(s) < m={m}",
                    f"A must be ≥ {in_top + 1} (A > W − ⌊W/m⌋ = {w} − {w // m}), or lower W or m",
                )
            )
        if self.regions and len(self.regions) < m:
            out.append(
                Problem(
                    "regions to write >= m",
                    f"only {len(self.regions)} region(s) to write ({', '.join(self.regions)}) but m={m}",
                    f"list at least {m} regions to write, or lower m",
                )
            )
        return out

    def validate(self) -> None:
        problems = self.problems()
        if problems:
            raise RefusedError(
                f"placement policy {self.describe} refused: {problems[0].message}",
                hint=problems[0].fix,
                details={"policy": self.to_dict(), "problems": [p.to_dict() for p in problems]},
            )


def _even_spread(total: int, parts: int) -> str:
    return "/".join(str(total // parts + (1 if i < total % parts else 0)) for i in range(parts))


# -- the invariant ---------------------------------------------------------------------------


def write_sets(ensemble_size: int, write_quorum: int) -> list[tuple[int, ...]]:
    """Positions of every distinct write set: W consecutive members from ``e mod E``, cyclic."""
    if write_quorum == ensemble_size:
        return [tuple(range(ensemble_size))]
    return [tuple((s + j) % ensemble_size for j in range(write_quorum)) for s in range(ensemble_size)]


def _top(counts: Iterable[int], k: int) -> int:
    return sum(sorted(counts, reverse=True)[:k]) if k > 0 else 0


def violations(labels: Sequence[str | None], write_quorum: int, ack_quorum: int, min_regions: int) -> list[dict]:
    """The write sets of an ensemble (its members' regions, in position order) that break the
    invariant. ``None`` is a member whose region is unknown: counted against us (it could be in
    any of the m − 1 largest regions)."""
    out = []
    for ws in write_sets(len(labels), write_quorum):
        counts: dict[str, int] = {}
        unknown = 0
        for pos in ws:
            if labels[pos] is None:
                unknown += 1
            else:
                counts[labels[pos]] = counts.get(labels[pos], 0) + 1
        worst = _top(counts.values(), min_regions - 1) + (unknown if min_regions > 1 else 0)
        if worst >= ack_quorum:
            out.append({"first_position": ws[0], "positions": list(ws), "regions": dict(sorted(counts.items())), "unknown": unknown, "in_m_minus_1_regions": worst})
    return out


def violation_text(v: dict, ack_quorum: int, min_regions: int) -> str:
    spread = ", ".join(f"{r}={c}" for r, c in v["regions"].items()) + (f", unknown={v['unknown']}" if v["unknown"] else "")
    return (
        f"the write set from position {v['first_position']} ({spread}) has {v['in_m_minus_1_regions']} replicas in "
        f"{min_regions - 1} region(s), so an ack quorum of A={ack_quorum} could span fewer than m={min_regions} regions"
    )


# -- topology ----------------------------------------------------------------------------------


def region_of(record: Mapping | None) -> str:
    return str((record or {}).get("region") or NO_REGION)


def _group(nodes: Mapping[str, dict], skip: Collection[str]) -> dict[str, dict[str, list[str]]]:
    """region -> rack -> node ids."""
    # The hot loop of every decision (1000 agents): no sorting here; a rack's list is sorted
    # only when agents are drawn from it (_pick_in_region), which is what a seed needs.
    out: dict[str, dict[str, list[str]]] = {}
    for node_id, record in nodes.items():
        if node_id in skip:
            continue
        record = record or {}
        region = record.get("region") or NO_REGION
        racks = out.get(region)
        if racks is None:
            racks = out[region] = {}
        rack = record.get("rack") or NO_RACK
        ids = racks.get(rack)
        if ids is None:
            racks[rack] = [node_id]
        else:
            ids.append(node_id)
    return out


def _eligible(grouped: dict[str, dict[str, list[str]]], policy: PlacementPolicy) -> tuple[dict[str, dict[str, list[str]]], dict[str, str]]:
    """The regions new members may go to, and why each other region may not."""
    keep, why = {}, {}
    for region, racks in grouped.items():
        if region in policy.drained:
            why[region] = "drained"
        elif policy.regions and region not in policy.regions:
            why[region] = "not a region to write"
        else:
            keep[region] = racks
    for region in policy.regions:
        if region not in grouped and region not in policy.drained:
            why[region] = "no available agents"
    for region in policy.drained:
        why.setdefault(region, "drained")
    return keep, why


def _waterfill(caps: Mapping[str, int], total: int, order: Sequence[str]) -> dict[str, int]:
    """The most even counts summing to ``total`` with ``counts[k] <= caps[k]``; ties go to the
    earliest key in ``order``. Majorised by every other feasible vector, so it minimises every
    "sum of the largest k counts" (the invariant's measure)."""
    counts = {k: 0 for k in order}
    rank = {k: i for i, k in enumerate(order)}
    level_keys = sorted(order, key=lambda k: rank[k])
    for _ in range(total):
        best = None
        for k in level_keys:
            if counts[k] < caps[k] and (best is None or counts[k] < counts[best]):
                best = k
        if best is None:
            raise ValueError("total exceeds capacity")
        counts[best] += 1
    return counts


def _arrange(targets: dict[str, int], caps: dict[str, int], order: Sequence[str], e: int, w: int, a: int, m: int, budget: int) -> list[str] | None | bool:
    """Region labels for positions 0..E−1 with every cyclic window of W satisfying the
    invariant: a list, ``None`` when none exists, ``False`` when the search budget ran out.

    Depth-first, trying at each position the region most behind its share of ``targets`` first
    (a smooth interleaving, usually valid at once); regions with equal capacity not used yet
    are interchangeable, so only the first of them is tried (symmetry breaking keeps it exact)."""
    labels: list[str] = []
    used = {k: 0 for k in order}
    rank = {k: i for i, k in enumerate(order)}
    nodes_left = [budget]
    # Starts of the windows holding position p (none to check when m = 1: any order is valid).
    windows_of = [[s % e for s in range(p - w + 1, p + 1)] for p in range(e)] if m > 1 else [[] for _ in range(e)]

    def ok(p: int) -> bool:
        for s in windows_of[p]:
            counts: dict[str, int] = {}
            for j in range(w):
                q = (s + j) % e
                if q <= p:
                    counts[labels[q]] = counts.get(labels[q], 0) + 1
            if _top(counts.values(), m - 1) >= a:
                return False
        return True

    def go(p: int) -> bool | None:
        if p == e:
            return True
        nodes_left[0] -= 1
        if nodes_left[0] < 0:
            return None
        fresh_caps: set[int] = set()
        candidates = sorted(
            (k for k in order if used[k] < caps[k]),
            key=lambda k: (-((p + 1) * targets[k] / e - used[k]), rank[k]),
        )
        for k in candidates:
            if used[k] == 0:
                if caps[k] in fresh_caps:
                    continue
                fresh_caps.add(caps[k])
            labels.append(k)
            used[k] += 1
            if ok(p):
                found = go(p + 1)
                if found is None:
                    return None
                if found:
                    return True
            labels.pop()
            used[k] -= 1
        return False

    found = go(0)
    if found is None:
        return False
    return labels if found else None


def _pick_in_region(racks: dict[str, list[str]], count: int, rng: random.Random) -> list[str]:
    """``count`` nodes spread as evenly as possible over racks, ordered rack by rack in turn
    (so consecutive positions of one region are on different racks)."""
    order = sorted(racks, key=str)
    rng.shuffle(order)
    per_rack = _waterfill({r: len(racks[r]) for r in order}, count, order)
    chosen = {r: rng.sample(sorted(racks[r]), per_rack[r]) for r in order if per_rack[r]}
    out = []
    while any(chosen.values()):
        for r in order:
            if chosen.get(r):
                out.append(chosen[r].pop())
    return out


def _policy_for(policy: PlacementPolicy | None, size: int | None) -> PlacementPolicy:
    if policy is None:
        if size is None:
            raise ValueError("give a size or a policy")
        if size < 1:
            raise ValueError(f"ensemble size must be >= 1, not {size}")
        # Without a policy: any distinct agents (m = 1), still spread over regions and racks.
        return PlacementPolicy(size, size, 1, 1)
    if size is not None and size != policy.ensemble_size:
        raise ValueError(f"size {size} disagrees with the policy's E={policy.ensemble_size}")
    return policy


def choose_ensemble(
    nodes: Mapping[str, dict],
    size: int | None = None,
    *,
    exclude: Collection[str] = (),
    seed: int | None = None,
    policy: PlacementPolicy | None = None,
) -> tuple[str, ...]:
    """E distinct agents from ``nodes`` (node id -> availability record), none in ``exclude``,
    whose every write set satisfies the invariant of ``policy`` (without one: ``size`` agents,
    m = 1). Random, reproducible with ``seed``. Raises ``RefusedError`` saying which constraint
    failed and what would satisfy it when no such ensemble exists among the eligible agents."""
    policy = _policy_for(policy, size)
    e, w, a, m = policy.ensemble_size, policy.write_quorum, policy.ack_quorum, policy.min_regions
    rng = random.Random(seed)
    grouped, why_not = _eligible(_group(nodes, exclude), policy)
    caps = {r: sum(len(v) for v in racks.values()) for r, racks in grouped.items()}
    skipped = "; ".join(f"{r}: {why}" for r, why in sorted(why_not.items()))
    if sum(caps.values()) < e:
        pool = sorted(n for racks in grouped.values() for ids in racks.values() for n in ids)
        excluded = sorted(set(exclude) & set(nodes))
        raise RefusedError(
            f"an ensemble of {e} agents is needed but only {len(pool)} are available"
            + (f" ({', '.join(pool)})" if pool else "")
            + (f"; excluded as failed: {', '.join(excluded)}" if excluded else "")
            + (f"; regions not used: {skipped}" if skipped else ""),
            hint="start or repair agents" + (", undrain a region" if policy.drained else "") + ", or lower the log's ensemble size",
            details={"needed": e, "available": pool, "excluded": excluded},
        )
    if len(grouped) < m:
        raise RefusedError(
            f"{policy.describe}: new ensembles must span m={m} regions but only {len(grouped)} region(s) have eligible agents"
            + (f" ({', '.join(f'{r}: {c}' for r, c in sorted(caps.items()))})" if grouped else "")
            + (f"; regions not used: {skipped}" if skipped else ""),
            hint=f"bring agents back in {m - len(grouped)} more region(s), undrain or add a region to write, or lower m",
            details={"constraint": "regions >= m", "eligible_regions": caps, "not_used": why_not},
        )
    order = sorted(grouped)
    rng.shuffle(order)  # which regions get the extra members: random, so load spreads
    counts = _waterfill(caps, e, order)
    worst = _top(counts.values(), m - 1)
    spread = ", ".join(f"{r}={c}" for r, c in sorted(counts.items()) if c)

    def refuse(reason: str, constraint: str) -> RefusedError:
        need_a = -(-w * worst // e) + 1 if e > w else worst + 1
        return RefusedError(
            f"{policy.describe}: no ensemble satisfies the invariant: {reason}"
            + (f"; regions not used: {skipped}" if skipped else ""),
            hint=f"A must be ≥ {need_a} for this topology, or bring agents back in (or undrain) more regions, or lower W or m",
            details={"constraint": constraint, "most_even_spread": dict(sorted(counts.items())), "not_used": why_not},
        )

    if e == w:
        labels: list[str] = []
        if worst >= a:
            raise refuse(
                f"the most even spread of W={w} replicas over the eligible agents is {spread}: {worst} of them sit in "
                f"{m - 1} region(s), so an ack quorum of A={a} could span fewer than m={m} regions",
                "largest m-1 region counts < A",
            )
        # Interleave regions (irrelevant to the invariant when E = W; keeps reads spread).
        labels = _arrange(counts, counts, order, e, w, e + 1, 1, e + 1) or []  # type: ignore[assignment]
    elif m == 1:
        labels = _arrange(counts, counts, order, e, w, e + 1, 1, e + 1) or []  # type: ignore[assignment]
    else:
        # Every set of m − 1 regions holds, on average over the E windows, W/E of its members.
        if w * worst > (a - 1) * e:
            raise refuse(
                f"the most even spread of E={e} members is {spread}; striped W={w} at a time, some write set holds at "
                f"least ⌈{w}×{worst}/{e}⌉ = {-(-w * worst // e)} replicas in {m - 1} region(s), so an ack quorum of A={a} "
                f"could span fewer than m={m} regions",
                "every write set: largest m-1 region counts < A",
            )
        found = _arrange(counts, caps, order, e, w, a, m, SEARCH_BUDGET)
        if found is False:
            raise refuse(f"no arrangement of E={e} members over {spread} found within {SEARCH_BUDGET} search steps", "search budget")
        if found is None:
            raise refuse(f"no arrangement of E={e} members over the eligible regions gives every write set of W={w} fewer than A={a} replicas in {m - 1} region(s)", "every write set: largest m-1 region counts < A")
        labels = found  # type: ignore[assignment]
    per_region: dict[str, int] = {}
    for label in labels:
        per_region[label] = per_region.get(label, 0) + 1
    picked = {r: _pick_in_region(grouped[r], c, rng) for r, c in sorted(per_region.items())}
    ensemble = tuple(picked[label].pop(0) for label in labels)
    assert not violations([region_of(nodes[n]) for n in ensemble], w, a, m), "placement broke its own invariant"
    return ensemble


def replace_member(
    ensemble: Sequence[str],
    failed: str,
    nodes: Mapping[str, dict],
    *,
    exclude: Collection[str] = (),
    seed: int | None = None,
    policy: PlacementPolicy | None = None,
    known: Mapping[str, dict] | None = None,
) -> tuple[str, ...]:
    """``ensemble`` with ``failed`` swapped for an eligible agent outside the ensemble and
    ``exclude``, such that every write set still satisfies the invariant.

    Positions are kept (write sets of the other members do not move). ``known`` gives records of
    members that are not available now (their region still counts); a member found in neither
    counts as being in the worst region. The failed member's region is preferred (it keeps the
    spread), then the regions least used by the ensemble, then any; inside the region, the rack
    least used by the ensemble. Raises ``RefusedError`` naming the constraint when none fits."""
    if failed not in ensemble:
        raise ValueError(f"agent {failed!r} is not a member of ensemble {list(ensemble)}")
    policy = _policy_for(policy, None) if policy is not None else PlacementPolicy(len(ensemble), len(ensemble), 1, 1)
    if len(ensemble) != policy.ensemble_size:
        raise ValueError(f"ensemble of {len(ensemble)} members, but the policy's E={policy.ensemble_size}")
    w, a, m = policy.write_quorum, policy.ack_quorum, policy.min_regions
    rng = random.Random(seed)
    records = dict(known or {})
    records.update(nodes)
    position = list(ensemble).index(failed)
    grouped, why_not = _eligible(_group(nodes, set(exclude) | set(ensemble)), policy)
    if not grouped:
        raise RefusedError(
            f"no agent can replace {failed!r}: every available agent is already in ensemble {', '.join(ensemble)}, excluded, or in a region not used"
            + (f" ({'; '.join(f'{r}: {y}' for r, y in sorted(why_not.items()))})" if why_not else ""),
            hint="start or repair an agent, then retry",
            details={"ensemble": list(ensemble), "failed": failed},
        )
    labels: list[str | None] = [region_of(records[n]) if n in records else None for n in ensemble]
    home = labels[position]
    in_ensemble = {r: sum(1 for i, x in enumerate(labels) if x == r and i != position) for r in grouped}
    ranked = sorted(grouped, key=lambda r: (r != home, in_ensemble[r], rng.random()))
    tried = []
    for region in ranked:
        labels[position] = region
        broken = violations(labels, w, a, m)
        if not broken:
            racks = grouped[region]
            rack_use = {rack: sum(1 for n in ensemble if n in records and n != failed and region_of(records[n]) == region and (records[n].get("rack") or NO_RACK) == rack) for rack in racks}
            rack = min(sorted(racks, key=str), key=lambda r: (rack_use[r], rng.random()))
            replacement = rng.choice(sorted(racks[rack]))
            return tuple(replacement if member == failed else member for member in ensemble)
        tried.append(f"{region}: {violation_text(broken[0], a, m)}")
    raise RefusedError(
        f"no agent can replace {failed!r} in ensemble {', '.join(ensemble)} without breaking the invariant ({policy.describe}): "
        + "; ".join(tried),
        hint=f"bring back or add agents in a region with fewer members of this ensemble than {', '.join(sorted(grouped))}, or re-place the whole segment",
        details={"ensemble": list(ensemble), "failed": failed, "constraint": "every write set: largest m-1 region counts < A", "tried": tried},
    )
