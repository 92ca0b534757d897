"""``dlctl placement show|set|check|drain-region|undrain-region`` (DESIGN.md §6)."""

from __future__ import annotations

import click

from ..errors import RefusedError
from ..ops import placement as ops
from ..placement import PlacementPolicy
from ..placement_check import hypothetical_nodes
from ..plan import Plan
from .complete import complete_log
from .context import AppContext, command_options, mutating, pass_app


def _regions(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(r for r in (x.strip() for x in value.split(",")) if r)


@click.group("placement")
def placement_group() -> None:
    """Region-aware placement: the policy, drained regions, and what survives region loss."""


@placement_group.command("show")
@click.option("--log", "log_name", metavar="LOG", shell_complete=complete_log, help="Also show this log's effective policy.")
@command_options
@pass_app
def placement_show(app: AppContext, log_name: str | None) -> None:
    """Show the cluster's placement policy, per-log overrides and regions."""
    app.render(ops.show(app.session(), log_name))


@placement_group.command("set")
@click.option("--log", "log_name", metavar="LOG", shell_complete=complete_log, help="Override m and regions for this log only.")
@click.option("-e", "--ensemble-size", type=click.IntRange(1), help="E: default for new logs.")
@click.option("-w", "--write-quorum", type=click.IntRange(1), help="W: default for new logs.")
@click.option("-a", "--ack-quorum", type=click.IntRange(1), help="A: default for new logs.")
@click.option("-m", "--min-regions", type=click.IntRange(1), help="m: min_regions_for_durability.")
@click.option("--write-regions", metavar="R1,R2", help="Regions new ensembles may use (empty string: all).")
@mutating(confirm=False)
def placement_set(app: AppContext, log_name, ensemble_size, write_quorum, ack_quorum, min_regions, write_regions) -> Plan:
    """Change the placement policy (validated: A >= m and A > W - floor(W/m))."""
    return ops.set_plan(
        app.session(),
        log=log_name,
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        min_regions=min_regions,
        regions=_regions(write_regions),
    )


@placement_group.command("drain-region")
@click.argument("region")
@click.option("--force", is_flag=True, help="Drain even if new segments could then not be placed.")
@mutating(confirm=True)
def placement_drain(app: AppContext, region: str, force: bool) -> Plan:
    """Stop placing new ensembles in REGION (existing segments stay)."""
    return ops.drain_plan(app.session(), region, drain=True, force=force)


@placement_group.command("undrain-region")
@click.argument("region")
@mutating(confirm=False)
def placement_undrain(app: AppContext, region: str) -> Plan:
    """Allow new ensembles in REGION again."""
    return ops.drain_plan(app.session(), region, drain=False)


@placement_group.command("check")
@click.option("--log", "log_name", metavar="LOG", shell_complete=complete_log, help="Check this log's effective policy (live cluster only).")
@click.option("-e", "--ensemble-size", type=click.IntRange(1), help="E (default: the cluster's, or 3).")
@click.option("-w", "--write-quorum", type=click.IntRange(1), help="W (default: the cluster's, or 3).")
@click.option("-a", "--ack-quorum", type=click.IntRange(1), help="A (default: the cluster's, or 2).")
@click.option("-m", "--min-regions", type=click.IntRange(1), help="m: min_regions_for_durability.")
@click.option("--regions", "n_regions", type=click.IntRange(1, 64), help="Hypothetical topology: this many regions (no cluster needed).")
@click.option("--nodes-per-region", type=click.IntRange(1, 10_000), help="Hypothetical topology: agents per region.")
@click.option("--racks-per-region", type=click.IntRange(1, 1000), default=1, show_default=True, help="Hypothetical topology: racks per region.")
@command_options
@pass_app
def placement_check(app: AppContext, log_name, ensemble_size, write_quorum, ack_quorum, min_regions, n_regions, nodes_per_region, racks_per_region) -> None:
    """For every combination of unavailable regions: can new segments be placed, can writes to
    existing segments continue, can reads? Exit 0 when the policy is valid, 4 when refused."""
    if (n_regions is None) != (nodes_per_region is None):
        raise click.UsageError("give --regions and --nodes-per-region together (a hypothetical topology), or neither")
    session = None
    if n_regions is not None:
        if log_name:
            raise click.UsageError("--log needs the live cluster; it cannot be combined with a hypothetical topology")
        base = PlacementPolicy()
        nodes = hypothetical_nodes(n_regions, nodes_per_region, racks_per_region)
    else:
        session = app.session()
        base = ops.effective_policy(session, log_name)
        nodes = ops.topology(session)
    e = ensemble_size if ensemble_size is not None else base.ensemble_size
    w = write_quorum if write_quorum is not None else min(base.write_quorum, e)
    a = ack_quorum if ack_quorum is not None else min(base.ack_quorum, w)
    try:
        policy = PlacementPolicy(e, w, a, min_regions if min_regions is not None else base.min_regions, base.regions, base.drained)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    report = ops.check(session, policy, nodes)
    app.render(report)
    if not report.valid:
        raise RefusedError(f"placement policy {policy.describe} refused: {report.message}", hint=report.fix or None)
