"""``dlctl failover``, ``dlctl switchover``, ``dlctl failback`` and ``dlctl dr status|recover|promote``."""

from __future__ import annotations

import click

from ..errors import ConfigError, DlctlError, ExitCode, NotFoundError, UsageError
from ..ops import dr as ops
from ..session import ClusterSession
from ..output import Table
from ..plan import Plan
from .complete import complete_cluster
from .context import AppContext, output_option, pass_app, yes_option
from .replication import cluster_session

confirm_option = click.option("--confirm", "confirm_name", metavar="CLUSTER", default=None, help="The cluster's name, typed: required to promote or discard (instead of the prompt).")
dry_run_option = click.option("--dry-run", is_flag=True, help="Print the plan (and what is at risk) and change nothing.")


def _apply(app: AppContext, plan: Plan, *, typed: tuple[str, str | None, str] | None, dry_run: bool) -> None:
    if dry_run or plan.empty:
        app.render(plan)
        return
    if typed is not None:
        app.confirm_typed(plan, *typed)
    else:
        app.confirm(plan)
    app.render(app.run_plan(plan))


@click.command("failover")
@click.option("--to", "target", required=True, metavar="CLUSTER", shell_complete=complete_cluster, help="The standby to promote (the sink of the one-way stream).")
@click.option("--from", "source", metavar="CLUSTER", default=None, help="The lost primary (default: the source of the one stream into --to).")
@click.option("--wait-workers", type=click.FloatRange(min=0), default=30.0, show_default=True, help="Seconds to wait for the stream's workers to stop.")
@confirm_option
@dry_run_option
@yes_option
@output_option
@pass_app
def failover_command(app: AppContext, target: str, source: str | None, wait_workers: float, confirm_name: str | None, dry_run: bool) -> None:
    """Unplanned failover: the primary is gone; promote the standby --to.

    Marks the stream failed-over (it never runs again: a returning primary cannot write into
    the standby), reports the data at risk (the primary's records after the last one the
    standby applied, with the record count the standby last measured) and promotes the
    standby's logs to read-write. Never contacts the lost primary. Needs the standby's name
    typed (or --confirm NAME). Exit 4 when not confirmed."""
    plan = ops.failover_plan(cluster_session(app, target), source=source, wait_workers=wait_workers)
    _apply(app, plan, typed=(target, confirm_name, f"promote {target}"), dry_run=dry_run)


@click.command("switchover")
@click.option("--to", "target", required=True, metavar="CLUSTER", shell_complete=complete_cluster, help="The standby to make primary.")
@click.option("--drain-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True, help="Give up waiting for the standby to catch up after this many seconds.")
@click.option("--no-verify", is_flag=True, help="Skip the final comparison of both clusters' records.")
@confirm_option
@dry_run_option
@yes_option
@output_option
@pass_app
def switchover_command(app: AppContext, target: str, drain_timeout: float, no_verify: bool, confirm_name: str | None, dry_run: bool) -> None:
    """Planned switchover (RPO 0): make the standby --to the primary, reverse the stream.

    Freezes the primary's logs (read-only; their writers are released or fenced), waits until
    the standby has drained everything, promotes it, starts the reverse stream at the
    standby's end (no copy) and confirms that no record was lost or duplicated. Re-running
    after a failure continues. Needs the standby's name typed (or --confirm NAME)."""
    sink = cluster_session(app, target)
    config = ops.one_way_source(sink)
    source = cluster_session(app, config)
    plan = ops.switchover_plan(source, sink, drain_timeout=drain_timeout, verify=not no_verify)
    _apply(app, plan, typed=(target, confirm_name, f"promote {target}"), dry_run=dry_run)


@click.command("failback")
@click.option("--to", "returning", required=True, metavar="CLUSTER", shell_complete=complete_cluster, help="The returning old primary (it becomes a standby of the current primary).")
@click.option("--from", "primary", metavar="CLUSTER", default=None, help="The current primary (default: the cluster holding the failed-over stream from --to).")
@click.option("--reconcile", is_flag=True, help="Re-append at the primary the records only the returning cluster holds.")
@click.option("--discard-divergent", is_flag=True, help="Drop the records only the returning cluster holds (asks for its name typed).")
@confirm_option
@dry_run_option
@yes_option
@output_option
@pass_app
def failback_command(app: AppContext, returning: str, primary: str | None, reconcile: bool, discard_divergent: bool, confirm_name: str | None, dry_run: bool) -> None:
    """After a failover, when the old primary --to returns: make it a standby again.

    Freezes it, shows the records it holds that the current primary never received
    (divergence) and requires a choice before going on: --reconcile re-appends them at the
    primary (they keep their identity), --discard-divergent drops them (type the returning
    cluster's name). Then the primary -> returning stream starts: incremental when the
    returning log is a prefix of the primary's, else the returning copy is rebuilt from the
    start. Exit 4 when records diverged and no choice was given."""
    if reconcile and discard_divergent:
        raise UsageError("--reconcile and --discard-divergent exclude each other")
    choice = "reconcile" if reconcile else "discard" if discard_divergent else None
    back = cluster_session(app, returning)
    current = cluster_session(app, primary) if primary else _primary_of(app, returning)
    plan, divergences = ops.failback_plan(current, back, choice=choice)
    if dry_run:
        app.render(plan)
        return
    ops.refuse_undecided(divergences, choice, returning, current.cluster.name)
    diverged = any(d.count for d in divergences.values())
    typed = (returning, confirm_name, f"discard the divergent records of {returning}") if choice == "discard" and diverged else None
    _apply(app, plan, typed=typed, dry_run=False)


def _primary_of(app: AppContext, returning: str) -> ClusterSession:
    for name in app.inventory().clusters:
        if name == returning:
            continue
        try:
            session = cluster_session(app, name)
            if ops.failed_over_from(session, returning):
                return session
        except (DlctlError, ValueError, OSError) as exc:
            if isinstance(exc, ConfigError):
                raise
            continue
    raise NotFoundError(f"no cluster of the inventory has a failed-over stream from {returning!r}", hint="name the current primary with --from")


@click.group("dr")
def dr_group() -> None:
    """Disaster recovery between clusters: status, recover a location, promote."""


@dr_group.command("promote")
@click.option("--cluster", "cluster_name", required=True, metavar="CLUSTER", shell_complete=complete_cluster, help="The cluster whose logs become writable.")
@click.option("--logs", "patterns", multiple=True, metavar="PATTERN", help="Logs to promote (shell patterns). Default: every log.")
@confirm_option
@dry_run_option
@yes_option
@output_option
@pass_app
def promote_command(app: AppContext, cluster_name: str, patterns: tuple[str, ...], confirm_name: str | None, dry_run: bool) -> None:
    """Make a cluster's replica or read-only logs read-write (type its name to confirm)."""
    plan = ops.promote_plan(cluster_session(app, cluster_name), patterns or ("*",))
    _apply(app, plan, typed=(cluster_name, confirm_name, f"promote {cluster_name}"), dry_run=dry_run)


def _peers(app: AppContext, target: str) -> dict[str, ClusterSession]:
    out = {}
    for name in app.inventory().clusters:
        if name == target:
            continue
        try:
            session = cluster_session(app, name)
            session.connect()  # now: an unreachable peer is left out
            out[name] = session
        except (DlctlError, OSError, Exception) as exc:
            if isinstance(exc, ConfigError):
                raise
    return out


@dr_group.command("recover")
@click.option("--cluster", "cluster_name", required=True, metavar="CLUSTER", shell_complete=complete_cluster, help="The location that lost data (and possibly its ZooKeeper metadata too: then rebuilt from its peers).")
@click.option("--drain-timeout", type=click.FloatRange(min=1), default=600.0, show_default=True, help="Seconds to wait for each stream into it to bring its records back.")
@dry_run_option
@yes_option
@output_option
@pass_app
def recover_command(app: AppContext, cluster_name: str, drain_timeout: float, dry_run: bool) -> int | None:
    """Recover a location that lost all or part of its data (disks replaced, an old backup,
    rebuilt empty with the same identity) from its directly connected peers.

    Metadata first: its logs are frozen, segments no replica serves are dropped, its clock is
    raised above every counter of it its peers have seen, and the peers' progress on streams
    from it is reset to what it still has. Then events: every stream into it restarts from the
    source's beginning with the unfiltered causality filter (its own records come back,
    nothing twice), drains, and returns to normal. A failure says whether to retry;
    re-running continues where it stopped.

    A peer that deleted the beginning of a log (truncation) cannot give it back: where the
    location holds nothing of that log, what the peer retains is bootstrapped (Spark) and
    streaming continues from the snapshot point; otherwise the stream reads the peer from its
    first retained position through the causality filter. What the peer deleted and no other
    stream into the location holds is reported as a GAP (peer, log, range, estimated count):
    exit 3 then, with the result on stdout."""
    plan = ops.recover_plan(cluster_session(app, cluster_name), _peers(app, cluster_name), drain_timeout=drain_timeout)
    if dry_run or plan.empty:
        app.render(plan)
        return None
    app.confirm(plan)
    result = app.run_plan(plan)
    app.render(result)
    lost = [g for g in ops.recover_gaps(result) if not g.get("covered_by")]
    if lost:
        for gap in lost:
            count = f"about {gap['records_estimate']} record(s)" if gap.get("records_estimate") is not None else "an unknown number of records"
            app.stderr.print(f"[bold yellow]gap:[/] {gap['peer']} no longer holds {gap['log']} from {gap['from']} to {gap['to']} ({count}); what {cluster_name} did not keep of it could not be recovered", highlight=False)
        return int(ExitCode.PARTIAL)
    return None


@dr_group.command("status")
@click.option("--cluster", "cluster_name", default=None, metavar="CLUSTER", shell_complete=complete_cluster, help="Only this location (default: every cluster of the inventory).")
@output_option
@pass_app
def status_command(app: AppContext, cluster_name: str | None) -> None:
    """Per location: streams in and out with lag and the last point applied, its logs' access
    modes, and the locations it could be recovered from."""
    sessions = {cluster_name: cluster_session(app, cluster_name)} if cluster_name else {}
    sessions.update(_peers(app, cluster_name or ""))
    rows = ops.dr_status(sessions, only=cluster_name)
    if app.output != "table":
        app.render(rows)
        return
    for entry in rows:
        table = []
        for direction in ("in", "out"):
            for s in entry[direction]:
                logs = s["logs"] if isinstance(s["logs"], dict) else {"?": {"lag_records": s["logs"], "last_applied": None, "lag_seconds": None}}
                for log_name, r in logs.items():
                    table.append({"direction": direction, "stream": s["stream"], "state": s["state"], "log": log_name, "lag_records": r.get("lag_records"), "lag_seconds": r.get("lag_seconds"), "last_applied": r.get("last_applied")})
        caption = f"recoverable from: {', '.join(entry['recoverable_from']) or 'nowhere'}; logs: " + ", ".join(f"{k} {v}" for k, v in (entry.get("logs") or {}).items())
        if entry["unreadable_streams"]:
            caption += "; stream records that cannot be read (not shown): " + ", ".join(f"{k} ({v})" for k, v in entry["unreadable_streams"].items())
        app.render(Table(table, ["direction", "stream", "state", "log", "lag_records", "lag_seconds", "last_applied"], title=f"location {entry['location']}", caption=caption))


__all__ = ["dr_group", "failback_command", "failover_command", "switchover_command"]
