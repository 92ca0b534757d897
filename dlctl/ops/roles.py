"""``cluster roles`` and ``cluster auditor enable|disable``: who holds the elected roles, and the
operator's cluster-wide switch for re-replication."""

from __future__ import annotations

from typing import Any

from ..meta import roles
from ..plan import Plan, Step
from ..session import ClusterSession


def status(session: ClusterSession) -> list[dict[str, Any]]:
    """One row per role: its holder, the agents standing behind it, and whether it is on."""
    client, cluster = session.meta.client, session.cluster.name
    enabled, problem = roles.read_auditor_switch(client, cluster)
    rows = []
    for role in roles.ROLES:
        held = roles.holders(client, cluster, role)
        row: dict[str, Any] = {**held.to_dict(), "enabled": True, "problem": None}
        if role == "auditor":
            row.update(enabled=enabled, problem=problem)
        rows.append(row)
    return rows


def auditor_switch_plan(session: ClusterSession, enabled: bool) -> Plan:
    """Turn re-replication by the auditor on or off for the whole cluster. A switch already in
    the wanted position gives an empty plan (nothing to do); an unreadable switch counts as off,
    so enabling it rewrites it."""
    client, cluster = session.meta.client, session.cluster.name
    current, problem = roles.read_auditor_switch(client, cluster)
    verb = "enable" if enabled else "disable"
    if current == enabled and problem is None:
        return Plan.of(f"cluster auditor {verb}", [], notes=[f"auditing is already {'on' if enabled else 'off'} in {cluster}"])
    notes = [problem] if problem else []
    if not enabled:
        notes.append("while off, no lost agent is re-replicated; the grace period starts again when it is back on")

    def apply() -> dict[str, Any]:
        roles.write_auditor_switch(client, cluster, enabled, session.zk_auth)
        return {"auditing": "on" if enabled else "off", "path": roles.auditor_switch_path(cluster)}

    what = "re-replicate agents gone for longer than the grace period" if enabled else "stop re-replicating lost agents"
    step = Step(f"auditor-{verb}", roles.auditor_switch_path(cluster), f"{verb} auditing cluster-wide: {what}", {"enabled": enabled}, run=apply)
    return Plan.of(f"cluster auditor {verb}", [step], notes=notes)
