"""``dlctl log …``: create, list, show and delete logs."""

from __future__ import annotations

import click

from ..meta.records import LogConfig
from ..ops import logs
from ..plan import Plan
from .context import AppContext, command_options, mutating, pass_app


@click.group("log")
def log_group() -> None:
    """Create, inspect and delete logs."""


@log_group.command("create")
@click.argument("name")
@click.option("-e", "--ensemble-size", type=click.IntRange(1), default=3, show_default=True, help="E: agents a segment is striped over.")
@click.option("-w", "--write-quorum", type=click.IntRange(1), default=3, show_default=True, help="W: agents each entry is written to.")
@click.option("-a", "--ack-quorum", type=click.IntRange(1), default=2, show_default=True, help="A: acknowledgements before an entry counts.")
@click.option("--roll-bytes", type=click.IntRange(1), default=256 * 1024 * 1024, show_default=True, help="Roll to a new segment after this many bytes.")
@click.option("--roll-seconds", type=click.FloatRange(min=0.001), default=3600.0, show_default=True, help="Roll to a new segment after this long.")
@mutating(confirm=False)
def log_create(app: AppContext, name: str, ensemble_size: int, write_quorum: int, ack_quorum: int, roll_bytes: int, roll_seconds: float) -> Plan:
    """Create log NAME with its quorums (E >= W >= A) and rolling policy."""
    try:
        config = LogConfig(ensemble_size, write_quorum, ack_quorum, roll_bytes, roll_seconds)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return logs.create_log_plan(app.session(), name, config)


@log_group.command("list")
@command_options
@pass_app
def log_list(app: AppContext) -> None:
    """List logs with their size and owner."""
    app.render(logs.list_logs(app.session()))


@log_group.command("show")
@click.argument("name")
@command_options
@pass_app
def log_show(app: AppContext, name: str) -> None:
    """Show a log's configuration, owner and segments."""
    app.render(logs.show_log(app.session(), name))


@log_group.command("delete")
@click.argument("name")
@mutating(confirm=True)
def log_delete(app: AppContext, name: str) -> Plan:
    """Delete log NAME (refused while a writer owns it)."""
    return logs.delete_log_plan(app.session(), name)
