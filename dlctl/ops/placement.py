"""Placement operations: show the policy, change it, drain regions, check it (DESIGN.md §6).

Every change is a plan whose one step writes the policy znode at the version read when the plan
was built, so a concurrent change between ``--dry-run``/confirmation and apply is a conflict,
never an overwrite. Policies are validated (``PlacementPolicy.validate``) before a plan exists.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import NotFoundError, RefusedError, UsageError
from ..meta.zk import UNREADABLE, why_unreadable
from ..meta import policy as store
from ..names import validate_name
from ..placement import PlacementPolicy, choose_ensemble, region_of
from ..meta.records import LogConfig, SegmentState
from ..placement_check import CheckReport, LiveSegment, check_policy
from ..plan import Plan, Step
from ..session import ClusterSession


def topology(session: ClusterSession) -> dict[str, dict]:
    """Inventory nodes, overlaid by the records of registered (available) agents."""
    nodes: dict[str, dict] = {n.id: {"region": n.region, "rack": n.rack, "address": n.host, "available": False} for n in session.cluster.nodes}
    for node_id, record in session.meta.available_nodes().items():
        nodes[node_id] = dict(record, available=True)
    return nodes


def effective_policy(session: ClusterSession, log: str | None) -> PlacementPolicy:
    cluster_policy = store.load(session.meta.client, session.cluster.name).value
    config = session.meta.get_log(log).value.config if log else None
    return cluster_policy.for_log(log, config)


def show(session: ClusterSession, log: str | None = None) -> dict[str, Any]:
    current = store.load(session.meta.client, session.cluster.name)
    nodes = topology(session)
    drained = current.value.default.drained
    regions: dict[str, dict[str, Any]] = {}
    for record in nodes.values():
        row = regions.setdefault(region_of(record), {"region": region_of(record), "racks": set(), "agents": 0, "available": 0})
        row["racks"].add(str(record.get("rack") or "?"))
        row["agents"] += 1
        row["available"] += 1 if record.get("available") else 0
    for name in drained:
        regions.setdefault(name, {"region": name, "racks": set(), "agents": 0, "available": 0})
    out: dict[str, Any] = {
        "cluster": session.cluster.name,
        "znode": store.placement_path(session.cluster.name),
        "version": current.version if current.version != store.ABSENT else None,
        "policy": current.value.default.to_dict(),
        "log_overrides": current.value.to_dict()["logs"],
    }
    if log:
        out["log"] = log
        out["effective"] = effective_policy(session, log).to_dict()
    out["regions"] = [
        dict(row, racks=len(row["racks"]), drained=row["region"] in drained, writable=row["region"] not in drained and (not current.value.default.regions or row["region"] in current.value.default.regions))
        for _, row in sorted(regions.items())
    ]
    return out


def _save_step(session: ClusterSession, action: str, description: str, new: store.ClusterPolicy, version: int) -> Step:
    return Step(
        action,
        store.placement_path(session.cluster.name),
        description,
        params={"version": None if version == store.ABSENT else version, "policy": new.to_dict()},
        run=lambda: {"version": store.save(session.meta.client, session.cluster.name, new, version, session.zk_auth).version},
    )


def set_plan(
    session: ClusterSession,
    *,
    log: str | None = None,
    ensemble_size: int | None = None,
    write_quorum: int | None = None,
    ack_quorum: int | None = None,
    min_regions: int | None = None,
    regions: tuple[str, ...] | None = None,
) -> Plan:
    """Change the cluster defaults, or (``log``) a log's m and regions to write."""
    for region in regions or ():
        validate_name("region", region)
    current = store.load(session.meta.client, session.cluster.name)
    policy = current.value
    if log:
        if any(v is not None for v in (ensemble_size, write_quorum, ack_quorum)):
            raise UsageError("a log's E, W and A are its own configuration; --log takes only --min-regions and --write-regions")
        config = session.meta.get_log(log).value.config  # NotFoundError when it does not exist
        old = policy.logs.get(log, store.LogOverride())
        override = store.LogOverride(min_regions if min_regions is not None else old.min_regions, regions if regions is not None else old.regions)
        new = replace(policy, logs={**policy.logs, log: override})
        new.for_log(log, config).validate()
        what = f"set log {log}'s placement: {new.for_log(log, config).describe}"
    else:
        d = policy.default
        try:
            default = replace(
                d,
                ensemble_size=ensemble_size if ensemble_size is not None else d.ensemble_size,
                write_quorum=write_quorum if write_quorum is not None else d.write_quorum,
                ack_quorum=ack_quorum if ack_quorum is not None else d.ack_quorum,
                min_regions=min_regions if min_regions is not None else d.min_regions,
                regions=regions if regions is not None else d.regions,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        default.validate()
        new = replace(policy, default=default)
        # Overrides must stay valid with the new defaults (a log's own E/W/A are checked too).
        for name in sorted(new.logs):
            try:
                new.for_log(name, session.meta.get_log(name).value.config).validate()
            except NotFoundError:
                continue
        what = f"set cluster placement defaults: {default.describe}"
    if new == policy:
        return Plan.of("placement set", [])
    return Plan.of("placement set", [_save_step(session, "set-placement", what, new, current.version)])


def _log_config(session: ClusterSession, name: str) -> LogConfig | None:
    try:
        return session.meta.get_log(name).value.config
    except NotFoundError:
        return None  # an override for a log not created (yet): the defaults' E/W/A


def drain_plan(session: ClusterSession, region: str, *, drain: bool, force: bool = False) -> Plan:
    """Drain (no new ensembles there) or undrain a region. Draining below m writable regions
    would stop every log from rolling to a new segment, so it is refused unless forced."""
    validate_name("region", region)
    current = store.load(session.meta.client, session.cluster.name)
    policy = current.value
    drained = set(policy.default.drained)
    if (region in drained) == drain:
        return Plan.of(f"placement {'drain' if drain else 'undrain'}-region", [])
    nodes = topology(session)
    known = {region_of(r) for r in nodes.values()}
    if drain and region not in known:
        raise NotFoundError(f"region {region!r} has no agents in cluster {session.cluster.name!r}", hint=f"regions: {', '.join(sorted(known)) or 'none'}")
    drained = drained | {region} if drain else drained - {region}
    new = replace(policy, default=replace(policy.default, drained=frozenset(drained)))
    notes = []
    if drain:
        blocked = []
        # The defaults, and every log with its own E/W/A and overrides (a log created with a
        # wider ensemble than the defaults may be the one a drain leaves unplaceable).
        for log in [None, *sorted(set(new.logs) | set(session.meta.list_logs()))]:
            effective = new.default if log is None else new.for_log(log, _log_config(session, log))
            try:
                choose_ensemble({n: r for n, r in nodes.items()}, policy=effective, seed=0)
            except RefusedError as exc:
                blocked.append(f"{'defaults' if log is None else 'log ' + log}: {exc.message}")
        if blocked and not force:
            raise RefusedError(
                f"draining {region} would leave new segments unplaceable: {blocked[0]}",
                hint="undrain or add another region first, lower m, or pass --force to drain anyway",
                details={"blocked": blocked},
            )
        notes += [f"new segments cannot be placed ({b})" for b in blocked]
        notes.append(f"existing segments on {region} stay; re-replication moves them only when asked")
    verb = "drain" if drain else "undrain"
    return Plan.of(
        f"placement {verb}-region",
        [_save_step(session, f"{verb}-region", f"{verb} region {region}: {'no new ensembles there' if drain else 'new ensembles may use it again'}", new, current.version)],
        notes=notes,
    )


def live_segments(session: ClusterSession, unreadable: dict[str, str] | None = None) -> list[LiveSegment]:
    """Every segment that still holds data (truncated ones hold none). A log whose segment
    records cannot be read is left out and, when ``unreadable`` is given, named there (log -> why);
    else the error is raised."""
    out = []
    for name in session.meta.list_logs():
        try:
            segments = session.meta.segments(name)
        except NotFoundError:
            continue  # deleted while listing
        except UNREADABLE as exc:
            if unreadable is None:
                raise
            unreadable[name] = why_unreadable(exc)
            continue
        for versioned in segments:
            seg = versioned.value
            if seg.state is SegmentState.TRUNCATED:
                continue
            out.append(LiveSegment(name, seg.seq, seg.state is SegmentState.INPROGRESS, seg.ensembles[-1].nodes, seg.write_quorum, seg.ack_quorum))
    return out


def check(session: ClusterSession | None, policy: PlacementPolicy, nodes: dict[str, dict]) -> CheckReport:
    """With a session, existing writes and reads are judged on the cluster's real segments (a
    log whose segment records cannot be read is named in the notes and left out)."""
    if session is None:
        return check_policy(policy, nodes)
    unreadable: dict[str, str] = {}
    report = check_policy(policy, nodes, segments=live_segments(session, unreadable))
    report.notes += [f"log {name}: its segments are not judged, their metadata cannot be read: {why}" for name, why in sorted(unreadable.items())]
    return report
