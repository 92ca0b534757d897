"""``dlctl agent install|start|stop|restart|status|logs`` over SSH (or locally for the sandbox)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..ops import agents
from ..output import Table
from ..plan import Plan
from .complete import complete_node
from .context import AppContext, command_options, mutating, pass_app


def fleet_options(region_serial_default: bool = False, concurrency_default: int = 16) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(
            [
                click.option("--node", "node_ids", multiple=True, metavar="ID", shell_complete=complete_node, help="Only these nodes (repeatable; default: all)."),
                click.option("--region", metavar="REGION", help="Only the nodes of this region."),
                click.option("--max-concurrency", type=click.IntRange(1, 512), default=concurrency_default, show_default=True, help="Nodes worked on at once."),
                click.option("--region-serial/--all-regions", default=region_serial_default, show_default=True, help="Finish one region before starting the next."),
                click.option("--timeout", type=click.FloatRange(min=1), default=agents.VERB_TIMEOUT, show_default=True, help="Seconds allowed per node."),
                click.option("--ssh-accept-new", is_flag=True, help="Trust and record host keys never seen before (a changed key is still refused)."),
            ]
        ):
            func = option(func)
        return func

    return decorate


def fleet_from(app: AppContext, ssh_accept_new: bool, max_concurrency: int, region_serial: bool, timeout: float) -> agents.Fleet:
    fleet = agents.Fleet(app.session().cluster, agents.FleetOptions(ssh_accept_new, max_concurrency, region_serial, timeout))
    click.get_current_context().call_on_close(fleet.close)
    return fleet


def fleet_progress(app: AppContext, total: int):
    """A progress callback for fan-outs, drawing on stderr for the life of the command."""
    ctx = click.get_current_context()
    bar = ctx.with_resource(app.progress())
    task = bar.add_task("nodes", total=total)

    def on_event(event) -> None:
        if event.kind == "finished":
            bar.update(task, completed=event.done, description=f"{event.host}: {event.result.status.value if event.result else ''}")

    return on_event


@click.group("agent")
def agent_group() -> None:
    """Install and run the agent on the cluster's nodes."""


def _lifecycle(action: str, doc: str, *, serial: bool = False, concurrency: int = 16, confirm: bool = False) -> None:
    def build(app: AppContext, node_ids, region, max_concurrency, region_serial, timeout, ssh_accept_new) -> Plan:
        nodes = agents.select_nodes(app.session().cluster, node_ids, region)
        fleet = fleet_from(app, ssh_accept_new, max_concurrency, region_serial, timeout)
        return agents.lifecycle_plan(fleet, nodes, action, fleet_progress(app, len(nodes)))

    build.__doc__ = doc
    agent_group.command(action)(fleet_options(serial, concurrency)(mutating(confirm=confirm)(build)))


_lifecycle("start", "Start the agent on each node (a no-op that says so where it runs).")
_lifecycle("stop", "Stop the agent on each node: SIGTERM, wait for a clean exit, then SIGKILL.", confirm=True)
_lifecycle("restart", "Rolling restart: stop then start each node before the next; one node at a time, region by region by default.", serial=True, concurrency=1, confirm=True)


@agent_group.command("install")
@fleet_options()
@click.option("--wheel-dir", type=click.Path(file_okay=False, path_type=Path), help="Use these prebuilt wheels instead of building them here.")
@mutating(confirm=True)
def agent_install(app: AppContext, node_ids, region, max_concurrency, region_serial, timeout, ssh_accept_new, wheel_dir: Path | None) -> Plan:
    """Install the agent on each node: wheels built here and uploaded (SFTP), a venv under the
    node's home, installed offline; then agent.toml and the secrets (0600). Nodes with
    `python` set in the inventory already have dlctl: only config and secrets are written.
    Where the node runs systemd and the SSH user is root, a hardened unit dlagent-NODE.service
    (enabled; User= the inventory's agent_user) supervises the agent; elsewhere it runs as a
    detached process."""
    nodes = agents.select_nodes(app.session().cluster, node_ids, region)
    fleet = fleet_from(app, ssh_accept_new, max_concurrency, region_serial, timeout)
    return agents.install_plan(fleet, nodes, wheel_dir, fleet_progress(app, len(nodes)))


@agent_group.command("status")
@fleet_options()
@command_options
@pass_app
def agent_status(app: AppContext, node_ids, region, max_concurrency, region_serial, timeout, ssh_accept_new) -> None:
    """Whether the agent runs on each node, its pid, version and disk use (exit 3 if some nodes
    could not be asked)."""
    nodes = agents.select_nodes(app.session().cluster, node_ids, region)
    rows, error = agents.status(fleet_from(app, ssh_accept_new, max_concurrency, region_serial, timeout), nodes)
    app.render(Table(rows, ["region", "rack", "node", "host", "running", "pid", "version", "address", "supervisor", "data_bytes", "disk_free_bytes", "error"]))
    if error is not None:
        raise error  # after the rows: exit 3 (some nodes), 1 (all), 4 (all refused for safety)


@agent_group.command("logs")
@click.argument("node_id", shell_complete=complete_node)
@click.option("-n", "--lines", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option("--ssh-accept-new", is_flag=True, help="Trust and record a host key never seen before.")
@pass_app
def agent_logs(app: AppContext, node_id: str, lines: int, ssh_accept_new: bool) -> None:
    """Print the last lines of the agent's log on NODE_ID, newest last: its systemd unit's
    journal where systemd runs it, else its rotated log files in the data dir."""
    cluster = app.session().cluster
    fleet = fleet_from(app, ssh_accept_new, 1, False, agents.VERB_TIMEOUT)
    app.stdout.file.write(agents.logs(fleet, cluster.node(node_id), lines))
