"""The one renderer: turns result data into a rich table, JSON or YAML on stdout.

Results are plain data — dicts, lists of dicts, dataclasses, or a ``Table`` when the column
order and title matter. Nothing below the CLI prints; the CLI hands results here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from pathlib import PurePath
from typing import Any, TextIO

import yaml
from rich.console import Console
from rich.table import Table as RichTable

FORMATS = ("table", "json", "yaml")


@dataclasses.dataclass(frozen=True)
class Table:
    """Rows with an explicit column order; JSON/YAML render it as the list of rows."""

    rows: Sequence[Mapping[str, Any]]
    columns: Sequence[str] | None = None
    title: str | None = None
    caption: str | None = None


def to_plain(value: Any) -> Any:
    """Convert result data into JSON-compatible plain values (dicts, lists, str, numbers)."""
    if isinstance(value, Table):
        return [to_plain(r) for r in value.rows]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if hasattr(value, "to_dict"):
            return to_plain(value.to_dict())
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return to_plain(value.to_dict())
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def human_bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)  # pragma: no cover


def _cell(value: Any, column: str = "") -> str:
    if column.endswith("bytes") and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return human_bytes(value)  # tables are for people; JSON keeps the exact count
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def rich_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None, title: str | None, caption: str | None = None) -> RichTable:
    if columns is None:
        seen: dict[str, None] = {}
        for row in rows:
            for key in row:
                seen.setdefault(key, None)
        columns = list(seen)
    table = RichTable(title=title, caption=caption, show_lines=False, header_style="bold", caption_justify="left")
    for col in columns:
        # Fold rather than truncate: a cell cut to "127.…" hides exactly what the operator needs.
        table.add_column(col.replace("_", " "), overflow="fold")
    for row in rows:
        table.add_row(*(_cell(row.get(col), col) for col in columns))
    return table


def render(data: Any, fmt: str, console: Console | None = None, stream: TextIO | None = None) -> None:
    """Write ``data`` to stdout (or ``stream``) in ``fmt``: table, json or yaml."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")
    out = stream or sys.stdout
    if fmt == "json":
        out.write(json.dumps(to_plain(data), indent=2) + "\n")
        return
    if fmt == "yaml":
        out.write(yaml.safe_dump(to_plain(data), sort_keys=False, default_flow_style=False))
        return
    console = console or Console(file=out)
    if hasattr(data, "to_table") and callable(data.to_table):
        data = data.to_table()
    if isinstance(data, Table):
        if not data.rows:
            console.print("\n".join(t for t in (data.title, data.caption) if t), markup=False, highlight=False)
            return
        console.print(rich_table([to_plain(r) for r in data.rows], data.columns, data.title, data.caption))
        return
    plain = to_plain(data)
    if isinstance(plain, list) and all(isinstance(r, dict) for r in plain):
        if plain:
            console.print(rich_table(plain, None, None))
        return
    if isinstance(plain, dict):
        # Scalars as "key value" lines; lists of records (a log's segments, a plan's steps) as
        # their own tables below, titled by their key.
        nested = {k: v for k, v in plain.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)}
        table = RichTable(show_header=False, box=None, pad_edge=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for key, value in plain.items():
            if key in nested:
                continue
            if isinstance(value, dict) and all(not isinstance(v, (dict, list)) for v in value.values()):
                value = ", ".join(f"{k}={_cell(v, k)}" for k, v in value.items())
            table.add_row(key.replace("_", " "), _cell(value, key))
        console.print(table)
        for key, rows in nested.items():
            console.print(rich_table(rows, None, key.replace("_", " ")))
        return
    console.print(_cell(plain), markup=False, highlight=False)


def render_item(item: Any, fmt: str, stream: TextIO | None = None, columns: Sequence[str] = ()) -> None:
    """Write one item of a stream (records being read or tailed): a tab-separated line (table),
    one JSON object per line (json), or one YAML document (yaml). Not flushed: see
    ``FlushWhenIdle``, which makes each item visible as soon as the producer of items waits."""
    out = stream or sys.stdout
    plain = to_plain(item)
    if fmt == "json":
        out.write(json.dumps(plain, separators=(",", ":")) + "\n")
    elif fmt == "yaml":
        out.write("---\n" + yaml.safe_dump(plain, sort_keys=False, default_flow_style=False))
    elif isinstance(plain, dict):
        keys = columns or list(plain)
        out.write("\t".join(_cell(plain.get(k)) for k in keys) + "\n")
    else:
        out.write(_cell(plain) + "\n")


class FlushWhenIdle:
    """Flushes a stream of items written from a coroutine when the event loop next runs, not
    after every item. A reader with a whole entry of records at hand goes on without suspending,
    so its records leave in large writes (a flush per record was one system call each); a
    reader that waits for the next record suspends, and what it wrote is flushed before it
    waits, so `log tail` shows each record at once. Made in the task that writes: a failed
    flush (the reader of a pipe went away) cancels it, and ``raise_failure`` then raises the
    flush's error in place of the cancellation."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._task = asyncio.current_task()
        self._scheduled = False
        self._error: OSError | None = None

    def wrote(self) -> None:
        self.raise_failure()
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self._error is None:
            try:
                self.stream.flush()
            except OSError as exc:
                self.fail(exc)

    def fail(self, exc: OSError) -> None:
        """The output is gone (a flush failed, or a watcher saw the reader of the pipe go): stop
        the writing task, which ``raise_failure`` then reports. On the writer's loop."""
        if self._error is None:
            self._error = exc
            if self._task is not None:
                self._task.cancel()  # a tail would otherwise wait for its next record first

    def raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Flush what is left, or raise what a flush met."""
        self.raise_failure()
        self.stream.flush()
