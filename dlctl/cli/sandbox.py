"""``dlctl sandbox up|down|status``: a local multi-region cluster for trying dlctl."""

from __future__ import annotations

from pathlib import Path

import click

from .. import inventory
from ..config import ConfigLocation
from ..ops import cluster as cluster_ops
from ..session import ClusterSession
from ..plan import Plan, apply
from ..sandbox import sandbox
from .context import AppContext, command_options, mutating, pass_app

dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the sandbox lives (default: $DLCTL_SANDBOX_DIR or ~/.local/share/dlctl/sandbox).",
)


@click.group("sandbox")
def sandbox_group() -> None:
    """Run a local multi-region cluster: ZooKeeper plus agents on loopback addresses."""


def _init_cluster(inventory_path: Path, name: str) -> dict:
    cluster = inventory.load(ConfigLocation(inventory_path, "sandbox")).cluster(name)
    with ClusterSession(cluster) as session:
        return apply(cluster_ops.init_plan(session)).to_dict()


@sandbox_group.command("up")
@dir_option
@click.option("--clusters", type=click.IntRange(1, 9), default=1, show_default=True, help="Independent clusters (for replication between them).")
@click.option("--regions", type=click.IntRange(1, 9), default=3, show_default=True, help="Regions per cluster (one loopback range each).")
@click.option("--nodes-per-region", type=click.IntRange(1, 50), default=3, show_default=True, help="Agents per region.")
@mutating(confirm=False)
def sandbox_up(app: AppContext, directory: Path | None, clusters: int, regions: int, nodes_per_region: int) -> Plan:
    """Start ZooKeeper and the agents, write an inventory (<dir>/config.toml) and make it the
    current context: later commands use it without --config or DLCTL_CONFIG, until `sandbox
    down`. A second `up` says it is already up. Two `up`s at once on one machine take turns
    (each picks free ports)."""
    click.get_current_context().call_on_close(sandbox.lock_ports())
    return sandbox.up_plan(directory or sandbox.default_dir(), sandbox.Layout(clusters, regions, nodes_per_region), _init_cluster)


@sandbox_group.command("down")
@dir_option
@click.option("--purge", is_flag=True, help="Also remove the sandbox's data, secrets and inventory.")
@mutating(confirm=False)
def sandbox_down(app: AppContext, directory: Path | None, purge: bool) -> Plan:
    """Stop every process the sandbox started (by pid); keep the data unless --purge. Clears
    the current context if it names this sandbox."""
    return sandbox.down_plan(directory or sandbox.default_dir(), purge)


@sandbox_group.command("status")
@dir_option
@command_options
@pass_app
def sandbox_status(app: AppContext, directory: Path | None) -> None:
    """Whether ZooKeeper and each agent of the sandbox run."""
    app.render(sandbox.status(directory or sandbox.default_dir()))
