"""``dlctl recover node ID…`` / ``dlctl recover region NAME``: re-replicate what lost agents held,
as a plan (one step per segment) or one parallel run; the planning and the engine are
``dlctl.log.rereplicator`` (the agents' auditor runs the same)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from ..log.rereplicator import COMMITTED, Progress, RereplicationPlan, execute, human_size, plan
from ..session import ClusterSession

__all__ = ["Progress", "agents_in_region", "as_plan", "plan_for", "run"]  # (the command line plans with the engine's ``plan``)

# -- the CLI's entry points ------------------------------------------------------------------------


def plan_for(session: ClusterSession, lost: list[str], *, lost_regions: dict[str, str | None]) -> RereplicationPlan:
    """What re-replicating the replicas of the ``lost`` agents takes (``dlctl.log.rereplicator.plan``)."""
    return plan(session.meta, lost, lost_regions=lost_regions)


def agents_in_region(session: ClusterSession, region: str) -> dict[str, str]:
    """The agents of ``region`` (node -> region): the inventory's, and those whose availability
    records say so (agents the inventory does not list)."""
    lost = {n.id: n.region for n in session.cluster.nodes if n.region == region}
    lost.update({n: region for n, info in session.meta.available_nodes().items() if info.get("region") == region})
    return lost


def run(session: ClusterSession, plan_: RereplicationPlan, *, parallel: int = 4, window: int = 128, only: Collection[str] | None = None, on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """Apply ``plan_`` on the session's cluster (blocking)."""
    return session.with_pool(lambda pool: execute(session.meta, pool, plan_, parallel=parallel, window=window, only=only, on_progress=on_progress))


def as_plan(session: ClusterSession, plan_: RereplicationPlan, operation: str, *, parallel: int = 4, window: int = 128) -> Any:
    """The ``Plan`` a dry run prints: one step per segment (sources, targets, entries, bytes).

    Each step can also be applied on its own (``plan.apply``); the CLI applies them all at once
    with ``run`` so segments are copied in parallel under one progress display."""
    from ..plan import Plan, Step

    steps = []
    for w in plan_.work:
        if w.data_lost or (w.blocked and not w.recover_first):
            continue  # in the notes: nothing can be done for them now
        steps.append(
            Step(
                "recover+copy" if w.recover_first else "copy",
                f"{session.cluster.name}/{w.log}/{w.seq}",
                w.describe(),
                params=w.to_dict(),
                run=lambda key=w.key: _one(session, plan_, key, parallel, window),
            )
        )
    total = sum(w.bytes for w in plan_.repairable)
    notes = list(plan_.notes)
    if steps:
        notes.insert(0, f"lost agents: {', '.join(plan_.lost)}; {len(steps)} segment(s), ~{human_size(total)} to copy")
    elif not plan_.work:
        notes.insert(0, f"no segment has a replica on {', '.join(plan_.lost)}; nothing to re-replicate")
    return Plan.of(operation, steps, notes=notes)


def _one(session: ClusterSession, plan_: RereplicationPlan, key: str, parallel: int, window: int) -> dict[str, Any]:
    from ..errors import PartialFailure

    report = run(session, plan_, parallel=parallel, window=window, only={key})
    (result,) = report["results"]
    if result["state"] != COMMITTED:
        raise PartialFailure(result.get("error", f"segment {key} was not re-replicated"), details=result)
    return result
