"""``dlctl cluster check`` and ``dlctl recover under-replicated``: replica health as a monitoring
verdict, and repair on request (dlctl.log.repair does the work; the auditor does the same
unattended)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..log import repair
from ..plan import Plan, Step
from ..session import ClusterSession

OK, DEGRADED, CRITICAL = 0, 1, 2
VERDICTS = ("OK", "DEGRADED", "CRITICAL")


def verdict(found: repair.Survey) -> tuple[int, list[str]]:
    """(0 healthy, 1 degraded, 2 critical; the problems in words). Critical: some entry of a
    completed segment has fewer healthy copies than its ack quorum (one more fault may lose
    acknowledged records) or none at all; degraded: any other under-replicated segment, or an
    agent down or not answering."""
    code, problems = OK, []
    copies = found.fewest_copies()
    for (log, seq), members in sorted(found.under_replicated().items()):
        seg = found.segments[(log, seq)]
        fewest = copies[(log, seq)]
        level = CRITICAL if fewest < seg.ack_quorum else DEGRADED
        code = max(code, level)
        causes = ", ".join(f"{p.node}: {p.cause.value}" + (f" ({p.held_entries}/{p.expected_entries} entries)" if p.cause is repair.Cause.SHORT else "") for p in members)
        problems.append(f"segment {seq} of log {log!r}: {fewest} of {seg.write_quorum} healthy copies of some entries (ack quorum {seg.ack_quorum}); {causes}")
    for log, why in sorted(found.unreadable.items()):
        code = max(code, DEGRADED)
        problems.append(f"log {log!r}: replicas not checked, its metadata cannot be read: {why}")
    for node, state in sorted(found.agents.items()):
        if state != "up":
            code = max(code, DEGRADED)
            problems.append(f"agent {node}: {state}")
    return code, problems


def survey(session: ClusterSession, logs: Collection[str] | None = None, *, deep: bool = False) -> repair.Survey:
    return session.with_pool(lambda pool: repair.survey(session.meta, pool, logs, deep=deep))


def check(session: ClusterSession, logs: Collection[str] | None = None, *, deep: bool = False) -> dict[str, Any]:
    found = survey(session, logs, deep=deep)
    code, findings = verdict(found)
    # "findings": the verdict in words (the table shows them); "problems": the survey's replicas, structured.
    return {"cluster": session.cluster.name, "status": VERDICTS[code], "code": code, "findings": findings} | found.to_dict()


def repair_plan(session: ClusterSession, found: repair.Survey) -> Plan:
    """One step per replica to refill; replicas on agents that are down or not answering are
    noted (``dlctl recover node`` or the auditor's grace handles those)."""
    dead = {n for n, state in found.agents.items() if state != "up"}
    steps = [
        Step(
            "refill",
            f"{session.cluster.name}/{p.log}/{p.segment}@{p.node}",
            f"refill {p.node}'s {p.cause.value} replica of segment {p.segment} of log {p.log!r} from its peers ({p.expected_entries} entries)",
            params=p.to_dict(),
            run=lambda p=p: session.with_pool(lambda pool: repair.repair_replica(session.meta, pool, p, dead=dead)).to_dict(),
        )
        for p in found.problems
        if p.cause in repair.REPAIRABLE
    ]
    notes = [
        f"{p.node} ({p.cause.value}): segment {p.segment} of log {p.log!r} waits for its agent (or `dlctl recover node {p.node}`)"
        for p in found.problems
        if p.cause not in repair.REPAIRABLE
    ]
    if not found.problems:
        notes.append(f"{found.segments_checked} completed segment(s) checked: every replica holds what its record names")
    return Plan.of("recover under-replicated", steps, notes=notes)
