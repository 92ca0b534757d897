"""Which agent runs which (stream, log) worker: a pure decision each agent takes for itself.

Claims are ephemeral znodes, so at most one agent holds a log at a time whatever these rules
say; the rules only keep the load even. Each agent aims at ``ceil(work / agents)`` claims: it
claims unclaimed work while below that, releases one claim per round while above it (so an
agent that joins gets work), and claims anything left unclaimed longer than ``grace`` even when
at its target (agents that do not run workers must not strand a log).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

WorkItem = tuple[str, str]  # (stream id, log)


@dataclass(frozen=True)
class ClaimPlan:
    claim: tuple[WorkItem, ...]
    release: tuple[WorkItem, ...]


def target_load(work: int, agents: int) -> int:
    return math.ceil(work / max(1, agents))


def plan_claims(
    work: Iterable[WorkItem],
    claims: Mapping[WorkItem, str],
    me: str,
    agents: Iterable[str],
    unclaimed_for: Mapping[WorkItem, float],
    grace: float,
) -> ClaimPlan:
    """``claims``: item -> node holding it; ``unclaimed_for``: how long each unclaimed item has
    been seen unclaimed by this agent."""
    items = sorted(set(work))
    members = set(agents) | {me}
    target = target_load(len(items), len(members))
    mine = sorted(i for i in items if claims.get(i) == me)
    unclaimed = [i for i in items if i not in claims]
    to_claim: list[WorkItem] = []
    load = len(mine)
    # Spread the first claims: agents start at different items (by a stable hash of the name).
    offset = sum(me.encode()) % len(unclaimed) if unclaimed else 0
    for item in unclaimed[offset:] + unclaimed[:offset]:
        if load < target or unclaimed_for.get(item, 0.0) >= grace:
            to_claim.append(item)
            load += 1
    release: list[WorkItem] = []
    if not to_claim and len(mine) > target:
        loads = {m: 0 for m in members}
        for holder in claims.values():
            loads[holder] = loads.get(holder, 0) + 1
        # Only give work away when someone live is below the target to take it.
        if any(loads.get(m, 0) < target for m in members if m != me):
            release.append(mine[-1])
    return ClaimPlan(tuple(to_claim), tuple(release))
