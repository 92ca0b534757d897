"""``dlctl truncate LOG`` and ``dlctl gc`` (DESIGN.md §9)."""

from __future__ import annotations

import os
import time
from typing import Any

import click

from ..errors import PartialFailure
from ..log.dlsn import DLSN
from ..ops import gc as gc_ops
from ..ops.truncate import truncate_plan
from ..units import parse_duration, parse_size, parse_time
from ..plan import Plan
from .complete import complete_log
from .context import AppContext, mutating, output_option, pass_app, yes_option


class DurationType(click.ParamType):
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class SizeType(click.ParamType):
    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class TimeType(click.ParamType):
    """A point in time, as seconds since the epoch (``parse_time``)."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_time(str(value), time.time())
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = DurationType()
SIZE = SizeType()
TIME = TimeType()


@click.command("truncate")
@click.argument("log", shell_complete=complete_log)
@click.option("--to", "to", metavar="SEG/ENTRY/SLOT", help="Truncate everything before this DLSN (it becomes the min-active DLSN).")
@click.option("--before-txid", type=int, metavar="TXID", help="Truncate every record with a txid below TXID.")
@click.option("--older-than", type=DURATION, metavar="DURATION", help="Truncate the completed segments whose last record was appended more than DURATION ago (e.g. 7d, 12h).")
@click.option("--before", "before_time", type=TIME, metavar="TIME", help="Truncate every record appended before TIME: ISO 8601 (2026-11-26T10:00Z; no zone: UTC) or a duration ago (15m).")
@click.option("--force", is_flag=True, help="Truncate past replication pins; the streams holding them are marked as needing a bootstrap. Never cuts into an in-progress segment.")
@mutating(confirm=True)
def truncate_command(app: AppContext, log: str, to: str | None, before_txid: int | None, older_than: float | None, before_time: float | None, force: bool) -> Plan:
    """Truncate LOG before a point: whole segments before it are marked truncated, the segment
    it falls in partially truncated with a min-active DLSN; readers positioned before the point
    start at it (and say so). The truncation point only moves forward; re-running is a no-op.

    Refused (exit 4) when the point would cut into an in-progress segment, pass the end of the
    log, or pass a replication stream's retention pin (named; --force overrides pins). The
    space comes back once `dlctl gc` or the agents' housekeeping has collected the segments.
    """
    if sum(x is not None for x in (to, before_txid, older_than, before_time)) != 1:
        raise click.UsageError("give exactly one of --to DLSN, --before-txid TXID, --older-than DURATION, --before TIME")
    point = None
    if to is not None:
        try:
            point = DLSN.parse(to)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--to") from None
    return truncate_plan(app.session(), log, to=point, before_txid=before_txid, older_than=older_than, before_time=before_time, force=force)


@click.command("gc")
@click.option("--force", is_flag=True, help="Also delete orphan files (replicas that no metadata explains).")
@click.option("--no-retention", is_flag=True, help="Do not apply the logs' retention policies; only collect what is truncated already.")
@click.option("--rate", type=click.FloatRange(min=0), default=gc_ops.DEFAULT_RATE, show_default=True, help="Replica deletions per second per agent (0: no limit); deleting competes with appends for the disk.")
@click.option("--nice", "niceness", type=click.IntRange(0, 19), default=10, show_default=True, help="Lower this process's CPU priority by this much (GC is background work).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help="Per-agent timeout for listing its replicas.")
@click.option("--dry-run", is_flag=True, help="Print the plan (and the orphans found) and change nothing.")
@yes_option
@output_option
@pass_app
def gc_command(app: AppContext, force: bool, no_retention: bool, rate: float, niceness: int, timeout: float, dry_run: bool) -> None:
    """Apply retention, collect truncated segments and reclaim their disk space: records leave
    the metadata first, then every live agent deletes its replicas (agents that are down delete
    theirs when they start). Orphan files (no metadata explains them) are listed; --force
    deletes them. Exit 3 when a live agent failed to delete what it should.

    GC is background work: this process lowers its own CPU priority (--nice) so that reading
    thousands of segment records does not take the CPU from appends on the same machine, and
    the agents delete at most --rate replicas per second each."""
    if niceness:
        try:
            os.nice(niceness)
        except OSError:  # not permitted here: run at normal priority
            pass
    built, plan = gc_ops.gc_plan(app.session(), force=force, retention=not no_retention, rate=rate or None, timeout=timeout)
    if dry_run:
        app.render({**plan.to_dict(), "orphans": gc_ops.orphan_rows(built)})
        return
    if force and any(n.orphans for n in built.nodes):
        app.confirm(plan)
    result = app.run_plan(plan)
    report = gc_ops.report(built, result.outcomes)
    app.render(report)
    failed = [n for n in report["nodes"] if n["errors"]]
    if failed:
        raise PartialFailure(
            "gc: " + "; ".join(f"{n['node']}: {len(n['errors'])} deletion(s) failed ({n['errors'][0]})" for n in failed),
            hint="the metadata is collected; the agents retry by themselves (housekeeping), or re-run `dlctl gc`",
        )
