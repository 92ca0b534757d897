"""``dlctl top``: a live view of the cluster's agents, replication streams and logs."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from typing import Any

import click
from rich.console import Group
from rich.live import Live
from rich.text import Text

from ..ops.top import Top
from ..output import rich_table
from .context import AppContext, command_options, pass_app

AGENT_COLUMNS = ["node", "write_entries_per_s", "write_bytes_per_s", "read_entries_per_s", "add_p50_ms", "add_p99_ms", "read_p99_ms", "fsync_p99_ms", "segments", "data_bytes", "disk_free_bytes", "under_replicated", "roles"]
STREAM_COLUMNS = ["stream", "log", "worker", "lag_records", "lag_bytes", "lag_seconds", "safe_time_ago_s", "applied_per_s", "last_apply_ago_s", "compression_ratio"]
LOG_COLUMNS = ["log", "owner", "queue_bytes", "producers"]


def _screen(view: dict[str, Any], interval: float) -> Group:
    parts: list[Any] = [Text(f"cluster {view['cluster']} — every {interval:g} s — q to quit", style="bold")]
    parts.append(rich_table(view["agents"], AGENT_COLUMNS, "agents"))
    if view["streams"]:
        parts.append(rich_table(view["streams"], STREAM_COLUMNS, "replication (stream, log)"))
    if view["logs"]:
        parts.append(rich_table(view["logs"], LOG_COLUMNS, "logs (write proxy)"))
    for error in view["errors"]:
        parts.append(Text(f"{error['node']}: {error['error']}", style="yellow"))
    return Group(*parts)


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """Single key presses from the terminal, without echo (restored on exit)."""
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(fd: int, wait: float) -> bool:
    """Wait up to ``wait`` s for a key; True for q (or Q)."""
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if ready and os.read(fd, 1) in (b"q", b"Q"):
            return True
    return False


@click.command("top")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True, help="Seconds between refreshes (and between the two scrapes of --once).")
@click.option("--once", is_flag=True, help="Scrape twice, --interval apart, print one view and exit (for scripts: -o json). Implied when stdout is not a terminal.")
@command_options
@pass_app
def top_command(app: AppContext, interval: float, once: bool) -> None:
    """Watch the cluster live from its agents' metrics: per agent write and read rates, add,
    read and fsync latency (p50/p99 over the last interval), disk; per replication stream and
    log the lag, safe time, apply rate and compression ratio; per log the write proxy's queue. q quits. Agents with metrics
    off or not answering are listed below the tables."""
    top = Top(app.session())
    if once or not app.stdout.is_terminal or app.output != "table" or not sys.stdin.isatty():
        top.round()
        time.sleep(interval)  # the rates are growth over this interval: the one wait the view needs
        app.render(top.round())
        return
    with _keys() as fd, Live(_screen(top.round(), interval), console=app.stdout, auto_refresh=False, screen=False) as live:
        while not _quit_pressed(fd, interval):
            live.update(_screen(top.round(), interval), refresh=True)
