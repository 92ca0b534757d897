"""``dlctl fence LOG``, ``dlctl recover log LOG``, ``recover under-replicated`` and the re-replication of lost agents."""

from __future__ import annotations

import click

from ..ops import recover as recover_ops
from ..plan import Plan
from ..errors import NotFoundError
from ..names import validate_name
from .complete import complete_log, complete_node
from .context import AppContext, mutating, output_option, pass_app, yes_option

force_option = click.option("--force", is_flag=True, help="Proceed even though a live writer owns the log (it is deposed).")
timeout_option = click.option("--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True, help="Give up when replicas do not answer within this many seconds.")


@click.command("fence")
@click.argument("log", shell_complete=complete_log)
@force_option
@timeout_option
@mutating(confirm=True)
def fence_command(app: AppContext, log: str, force: bool, timeout: float) -> Plan:
    """Fence LOG's in-progress segment: its current writer can never again reach its ack
    quorum. The segment is closed later by the next owner or `dlctl recover log`."""
    return recover_ops.fence_plan(app.session(), log, force=force, timeout=timeout)


@click.group("recover")
def recover_group() -> None:
    """Recover logs (fence, find the last entry, close), and lost agents or regions (re-replicate)."""


@recover_group.command("log")
@click.argument("log", shell_complete=complete_log)
@force_option
@timeout_option
@click.option("--accept-data-loss", is_flag=True, help="Unclean recovery: take replicas that cannot answer as lost for good, close at the last entry still readable, report the entries at risk. Needs --confirm LOG.")
@click.option("--confirm", "confirm", metavar="LOG", default=None, help="With --accept-data-loss: the log's name, typed to confirm.")
@mutating(confirm=True)
def recover_log_command(app: AppContext, log: str, force: bool, timeout: float, accept_data_loss: bool, confirm: str | None) -> Plan:
    """Fence and recover LOG's in-progress segment and close it; report what was recovered
    (LAC, entries found past it and re-replicated, the last entry, unreachable replicas).
    When too many replicas are gone for good to decide the end, recovery refuses; with
    --accept-data-loss --confirm LOG it closes the segment at the last entry that can still be
    read and reports in `at_risk` exactly which entries may have been acknowledged and lost."""
    return recover_ops.recover_plan(app.session(), log, force=force, timeout=timeout, accept_data_loss=accept_data_loss, confirm=confirm)


@recover_group.command("under-replicated")
@click.option("--log", "logs", multiple=True, shell_complete=complete_log, help="Repair only this log's segments (repeatable); default: every log.")
@click.option("--deep", is_flag=True, help="Also compare members' digests and refill the ones that disagree with the majority.")
@mutating(confirm=True)
def recover_under_replicated_command(app: AppContext, logs: tuple[str, ...], deep: bool) -> Plan:
    """Refill now, in place, every replica of a completed segment that a live agent is missing
    or holds in limbo or short (what `dlctl cluster check` lists): entries are copied from the
    segment's healthy members and the copy is verified by digest. The elected auditor does the
    same unattended at every check; replicas on agents that are down are left to `recover node`."""
    from ..ops import health as health_ops

    session = app.session()
    return health_ops.repair_plan(session, health_ops.survey(session, logs or None, deep=deep))


# -- re-replication: `recover node ID…` and `recover region NAME` ----------------------------------

parallel_option = click.option("--parallel", type=click.IntRange(1, 64), default=4, show_default=True, help="Segments copied at the same time.")
window_option = click.option("--window", type=click.IntRange(1, 4096), default=128, show_default=True, help="Entries in flight per copy (pipelined reads and adds).")


def _rereplicate(app: AppContext, lost: list[str], regions: dict[str, str | None], what: str, dry_run: bool, parallel: int, window: int) -> None:
    from ..errors import PartialFailure
    from ..ops import rereplicate as rr

    session = app.session()
    built = rr.plan_for(session, lost, lost_regions=regions)
    plan = rr.as_plan(session, built, what, parallel=parallel, window=window)
    if dry_run or not built.repairable and not built.work:
        app.render(plan)
        return
    app.confirm(plan)
    with app.progress(transient=True) as bar:
        total = max(1, sum(w.bytes for w in built.repairable))
        copy_task = bar.add_task("copying", total=total)
        seg_task = bar.add_task("segments", total=len(built.work))

        def on_progress(p: rr.Progress) -> None:
            current = ", ".join(sorted(p.current)[:3]) + (" …" if len(p.current) > 3 else "")
            bar.update(copy_task, completed=min(p.copied.bytes, total), description=f"copying {current}" if current else "copying")
            bar.update(seg_task, completed=p.finished)

        report = rr.run(session, built, parallel=parallel, window=window, on_progress=on_progress)
    app.render(report)
    if report["stuck"] or report["data_lost"]:
        problems = [f"stuck on segment {o['segment']} of {o['log']}: {o['error']}" for o in report["stuck"]]
        problems += [o["error"] for o in report["data_lost"]]
        raise PartialFailure(
            f"{what}: {report['committed']} of {report['segments']} segment(s) re-replicated; " + "; ".join(problems),
            hint=f"fix what is named and re-run the same command: operation {report['operation']} continues where it stopped",
            details=report,
        )


def _rereplication_options(func):
    for option in (window_option, parallel_option, click.option("--dry-run", is_flag=True, help="Print the plan (segments, sources, targets, bytes) and change nothing.")):
        func = option(func)
    return func


@recover_group.command("node")
@click.argument("node_ids", nargs=-1, required=True, shell_complete=complete_node)
@_rereplication_options
@yes_option
@output_option
@pass_app
def recover_node_command(app: AppContext, node_ids: tuple[str, ...], dry_run: bool, parallel: int, window: int) -> None:
    """Re-replicate every segment replica held by the lost agents NODE_IDS: copy the entries
    from surviving replicas to replacements, verify, then update the segment metadata by CAS.
    In-progress segments without a live writer are fenced and recovered first. Resumable:
    re-running continues the operation recorded in ZooKeeper. Segments whose every replica
    is lost are reported (exit 3), never hidden."""
    regions = {}
    for node in node_ids:
        validate_name("node", node)  # a typo with a '/' is a usage error, not "nothing to do"
        try:
            regions[node] = app.session().cluster.node(node).region
        except NotFoundError:
            regions[node] = None  # not in the inventory: the agent's id in the metadata is enough
    _rereplicate(app, list(node_ids), regions, f"recover node {' '.join(node_ids)}", dry_run, parallel, window)


@recover_group.command("region")
@click.argument("region")
@_rereplication_options
@yes_option
@output_option
@pass_app
def recover_region_command(app: AppContext, region: str, dry_run: bool, parallel: int, window: int) -> None:
    """Re-replicate every segment replica held by the agents of REGION (from the inventory and
    the availability records), as `recover node` does for each of them."""
    session = app.session()
    from ..ops import rereplicate as rr

    lost = rr.agents_in_region(session, region)
    if not lost:
        raise NotFoundError(f"no agent of cluster {session.cluster.name!r} is in region {region!r}", hint="list regions with `dlctl config show`")
    _rereplicate(app, sorted(lost), lost, f"recover region {region}", dry_run, parallel, window)
