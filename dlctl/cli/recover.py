"""``dlctl fence LOG`` and ``dlctl recover log LOG``."""

from __future__ import annotations

import click

from ..ops import recover as recover_ops
from ..plan import Plan
from .context import AppContext, mutating

force_option = click.option("--force", is_flag=True, help="Proceed even though a live writer owns the log (it is deposed).")
timeout_option = click.option("--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True, help="Give up when replicas do not answer within this many seconds.")


@click.command("fence")
@click.argument("log")
@force_option
@timeout_option
@mutating(confirm=True)
def fence_command(app: AppContext, log: str, force: bool, timeout: float) -> Plan:
    """Fence LOG's in-progress segment: its current writer can never again reach its ack
    quorum. The segment is closed later by the next owner or `dlctl recover log`."""
    return recover_ops.fence_plan(app.session(), log, force=force, timeout=timeout)


@click.group("recover")
def recover_group() -> None:
    """Recover logs (fence, find the last entry, close) — and, later, nodes and regions."""


@recover_group.command("log")
@click.argument("log")
@force_option
@timeout_option
@mutating(confirm=True)
def recover_log_command(app: AppContext, log: str, force: bool, timeout: float) -> Plan:
    """Fence and recover LOG's in-progress segment and close it; report what was recovered
    (LAC, entries found past it and re-replicated, the last entry, unreachable replicas)."""
    return recover_ops.recover_plan(app.session(), log, force=force, timeout=timeout)
