"""``dlagent fsck DATA_DIR``: check a data directory offline, changing nothing.

It reads exactly what startup recovery would read and reports what recovery would do (cut a
torn tail, put a replica in limbo) without doing it: every file is opened read-only and the
data directory's lock is taken shared, so an agent can not start (and cut tails) underneath.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from dlctl.errors import ExitCode
from dlctl.output import Table, render

from .storage import layout
from .storage.recovery import SegmentCheck, inspect_segment

COLUMNS = ("log_id", "segment_seq", "entries", "last_entry", "lac", "fenced", "limbo", "size_bytes", "problem")


def check_segment_row(check: SegmentCheck) -> dict[str, Any]:
    scan = check.scan
    problems: list[str] = []
    if check.marker is not None:
        m = check.marker
        problems.append(f"in limbo (marker): {m.reason} at offset {m.offset}")
    elif check.corruption is not None:
        c = check.corruption
        where = f"at offset {c.offset}" if c.offset >= 0 else ""
        later = f", valid entry at offset {c.next_valid_offset}" if c.next_valid_offset >= 0 else ""
        problems.append(f"corruption before valid data {where}: {c.reason}{later} (would go to limbo)")
    torn = check.torn_tail
    if torn is not None:
        offset, nbytes, reason = torn
        problems.append(f"torn tail at offset {offset} ({nbytes} bytes): {reason} (would be cut)")
    if not check.has_log and check.marker is None:
        problems.append("fenced marker without a log file (would be recreated empty)")
    if check.limbo is not None:
        short = "limbo"
    elif torn is not None:
        short = "torn tail"
    else:
        short = "missing log" if problems else None
    return {
        "log_id": check.key[0],
        "segment_seq": check.key[1],
        "entries": scan.index.count if scan else 0,
        "last_entry": scan.index.last_id if scan else -1,
        "lac": scan.lac if scan else -1,
        "fenced": check.fenced,
        "limbo": check.limbo is not None,
        "size_bytes": scan.file_size if scan else 0,
        "preallocated_bytes": scan.zero_tail if scan else 0,  # zeros behind the data: not a problem
        "problem": short,
        "problems": problems,
        "path": str(check.path),
    }


def fsck(data_dir: Path) -> dict[str, Any]:
    """Check every segment replica under ``data_dir`` (the caller holds or skips the lock)."""
    found, stray = layout.discover(data_dir)
    # Index checkpoints are shortcuts for the store's start, not replica state: fsck reads every
    # replica in full, and one left without its log is removed at the next start.
    found = [(key, files - layout.CHECKPOINT_SUFFIXES) for key, files in found]
    rows = [check_segment_row(inspect_segment(data_dir, key, files)) for key, files in found if files]
    bad = sum(1 for r in rows if r["problems"])
    return {
        "data_dir": str(data_dir),
        "clean": bad == 0,
        "segments": len(rows),
        "segments_with_problems": bad,
        "entries": sum(r["entries"] for r in rows),
        "ignored_files": stray,
        "replicas": rows,
    }


@click.command("fsck")
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def fsck_command(data_dir: Path, fmt: str) -> None:
    """Check the segment replicas in DATA_DIR without modifying anything.

    Run it with the agent stopped. Reports per replica the entries, last entry, LAC, fenced
    state and problems: a torn tail startup recovery would cut, corruption before valid data
    that puts the replica in limbo. Exit status: 0 clean, 1 problems found (or the directory
    is in use by a running agent), 2 usage.
    """
    lock = layout.DirLock(data_dir)
    if not lock.acquire_shared_readonly():
        click.echo(
            f"dlagent fsck: {data_dir} is in use by {lock.holder()}; stop the agent first "
            "(a running agent's unsynced tail would look torn)",
            err=True,
        )
        sys.exit(ExitCode.FAILED)
    try:
        result = fsck(data_dir)
    except OSError as exc:
        click.echo(f"dlagent fsck: cannot read {data_dir}: {exc}", err=True)
        sys.exit(ExitCode.FAILED)
    finally:
        lock.release()
    if fmt == "json":
        render(result, "json")
    else:
        _render_table(data_dir, result)
    sys.exit(ExitCode.OK if result["clean"] else ExitCode.FAILED)


def _render_table(data_dir: Path, result: dict[str, Any]) -> None:
    # Details go below the table as lines: they are too long for a table cell.
    rows = [{k: r[k] for k in COLUMNS} for r in result["replicas"]]
    render(Table(rows, COLUMNS, title=f"fsck {data_dir}"), "table")
    for r in result["replicas"]:
        for problem in r["problems"]:
            render(f"log {r['log_id']} segment {r['segment_seq']} ({r['path']}): {problem}", "table")
    summary = {k: result[k] for k in ("segments", "entries", "segments_with_problems", "clean")}
    if result["ignored_files"]:
        summary["ignored_files"] = result["ignored_files"]
    render(summary, "table")
