"""``dlctl gc``: retention, collection of truncated segments, and reclaiming their replicas' disk
space (DESIGN.md §9) as a plan — one step per log to collect, a sweep of expired cold copies,
and the deletion of stale replicas on every agent. The decisions and their application are
``dlctl.retention`` (the agents' housekeeper runs the same)."""

from __future__ import annotations

from typing import Any

from ..cold.store import ColdStore
from ..log.pool import AgentPool
from ..meta.store import MetaStore
from ..plan import Plan, Step
from ..retention import offload
from ..retention.collect import DEFAULT_RATE, GcPlan, apply_log, plan_gc, reclaim
from ..session import ClusterSession

__all__ = ["DEFAULT_RATE", "GcPlan", "as_plan", "gc_plan", "orphan_rows", "plan_gc", "report"]  # (the command line needs the first two too)


def gc_plan(session: ClusterSession, *, force: bool, retention: bool, rate: float | None, timeout: float) -> tuple[GcPlan, Plan]:
    """What `dlctl gc` finds (every live agent's replicas listed, within ``timeout`` each) and
    the plan that applies it; the cold store the cluster requires is reached with the
    inventory's credentials (this operator's)."""

    async def build() -> GcPlan:
        # A pool of its own: its requests give up after ``timeout``, not the session pool's 10 s.
        pool = AgentPool(session.meta, session.credentials, request_timeout=timeout)
        try:
            return await plan_gc(session.meta, pool, force=force, retention=retention, timeout=timeout)
        finally:
            await pool.close()

    built = session.run(build())
    inventory_cold = session.cluster.cold_storage
    cold = offload.required_store(session.meta, inventory_cold.credentials_file if inventory_cold else None)
    return built, as_plan(session.meta, session.credentials, session.cluster.name, built, rate=rate, cold=cold)


def as_plan(meta: MetaStore, secret: bytes, cluster: str, gc: GcPlan, *, rate: float | None = DEFAULT_RATE, cold: tuple[ColdStore, float | None] | None = None) -> Plan:
    """``cold``: the cold store the cluster requires (``offload.required_store``) and its
    retention: truncated segments are copied there before they are collected."""
    steps = []
    store = cold[0] if cold else None
    for d in gc.decisions:
        if d.empty:
            continue
        steps.append(Step("collect-log", f"{cluster}/{d.name}", d.describe(), params=d.to_dict(),
                          run=lambda name=d.name: apply_log(meta, name, by="dlctl gc", state=gc.states.get(name), secret=secret, cold_store=store)))
    per_log = offload.cold_retentions(meta) if cold is not None else {}
    if cold is not None and (cold[1] is not None or per_log):
        default = f"{cold[1]:g} s" if cold[1] is not None else "for ever"
        steps.append(Step("sweep-cold-copies", store.describe(), f"delete cold copies past their log's cold retention ({len(per_log)} log(s) set one; default {default})",  # type: ignore[union-attr]
                          run=lambda: offload.sweep_expired(cold[0], cold[1], per_log=per_log)))
    work = {n.node: n.stale + (n.orphans if gc.force else []) for n in gc.nodes if n.up}
    work = {node: todo for node, todo in work.items() if todo}
    if work:
        stale = [r for n in gc.nodes if n.node in work for r in n.stale]
        what = f"delete {len(stale)} stale replica(s) ({sum(r.bytes for r in stale)} bytes)"
        orphans = [r for n in gc.nodes if n.node in work for r in n.orphans] if gc.force else []
        if orphans:
            what += f" and {len(orphans)} orphan file(s) ({sum(r.bytes for r in orphans)} bytes)"
        pace = f"at most {rate:g} per second per agent" if rate else "as fast as the agents go"
        params = {
            n.node: {"stale": len(n.stale), "orphans": len(n.orphans) if gc.force else 0, "bytes": sum(r.bytes for r in work[n.node])}
            for n in gc.nodes if n.node in work
        }
        steps.append(Step("delete-replicas", ",".join(sorted(work)), f"{what} on {', '.join(sorted(work))} ({pace})", params={"nodes": params, "rate": rate},
                          run=lambda: reclaim(meta, secret, work, gc.force, rate=rate)))
    return Plan.of("gc", steps, notes=gc.notes)


def orphan_rows(gc: GcPlan) -> list[dict[str, Any]]:
    return [o.to_dict() for n in gc.nodes for o in n.orphans]


def report(gc: GcPlan, outcomes: list[Any]) -> dict[str, Any]:
    """What a gc run did, from its steps' results."""
    logs, nodes = [], []
    for outcome in outcomes:
        result = outcome.result if isinstance(outcome.result, dict) else {}
        if outcome.step.action == "collect-log":
            logs.append({"log": result.get("log", outcome.step.target), "truncation_point": result.get("truncation_point"),
                         "segments_collected": len(result.get("segments_collected", [])), "bytes_collected": result.get("bytes_collected", 0),
                         "kept": len(result.get("kept", {})), "status": outcome.status.value})
        else:
            for one in result.get("nodes", []):
                nodes.append({"node": one["node"], "deleted": one["deleted"], "bytes_reclaimed": one["bytes_reclaimed"],
                              "skipped": len(one["skipped"]), "errors": one["errors"], "status": outcome.status.value})
    return {
        "logs": logs,
        "nodes": nodes,
        "bytes_reclaimed": sum(n["bytes_reclaimed"] for n in nodes),
        "deferred": [{"node": k, "replicas": v} for k, v in sorted(gc.deferred.items())],
        "orphans": [] if gc.force else orphan_rows(gc),
        "unreadable_logs": dict(sorted(gc.unreadable.items())),  # left alone: name -> why
    }
