"""The agent's log file when it runs as a detached process: size-bounded and rotated.

    [log]
    max_bytes = 10485760   # rotate dlagent.log past this size (an integer, or e.g. "10MiB"); 1 KiB..1 GiB
    backups   = 5          # rotated files kept: dlagent.log.1 (newest) .. dlagent.log.5; 1..100

So at most (backups + 1) x max_bytes of log in the data dir. ``dlagent start`` (no systemd unit)
runs ``serve --log-file <data_dir>/dlagent.log``; what the process itself prints before logging
is set up (a bad agent.toml) goes to ``dlagent.out`` beside it. Under a systemd unit the agent
logs to stderr and journald keeps it, within journald's own limits (journald.conf), so ``[log]``
does not apply there.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

from dlctl.errors import ConfigError
from dlctl.units import parse_size

LOG_FILE = "dlagent.log"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_BYTES_RANGE = (1024, 1 << 30)
BACKUPS_RANGE = (1, 100)
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class LogSettings:
    max_bytes: int = 10 << 20
    backups: int = 5


def parse_log(raw: Any, path: Path) -> LogSettings:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: key 'log' must be a table ([log])")
    known = ("max_bytes", "backups")
    extra = sorted(set(raw) - set(known))
    if extra:
        raise ConfigError(f"{path}: unknown key(s) in [log]: {', '.join(extra)}", hint=f"known keys: {', '.join(known)}")
    size = raw.get("max_bytes", LogSettings.max_bytes)
    if isinstance(size, str):  # with units: "10MiB"
        try:
            size = parse_size(size)
        except ValueError:
            pass  # reported below with the value as written
    low, high = MAX_BYTES_RANGE
    # bool is an int in Python: `max_bytes = true` must not read as 1 byte.
    if isinstance(size, bool) or not isinstance(size, int) or not low <= size <= high:
        raise ConfigError(f"{path}: [log] key 'max_bytes' must be bytes in {low}..{high} (an integer, or e.g. \"10MiB\"), got {raw.get('max_bytes')!r}")
    backups = raw.get("backups", LogSettings.backups)
    low, high = BACKUPS_RANGE
    if isinstance(backups, bool) or not isinstance(backups, int) or not low <= backups <= high:
        raise ConfigError(f"{path}: [log] key 'backups' must be an integer in {low}..{high}, got {backups!r}")
    return LogSettings(max_bytes=size, backups=backups)


def use_log_file(path: Path, settings: LogSettings) -> RotatingFileHandler:
    """Send the root logger's records to ``path``, rotated, instead of to stderr."""
    handler = RotatingFileHandler(path, maxBytes=settings.max_bytes, backupCount=settings.backups, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    logging.captureWarnings(True)  # warnings.warn() would print to stderr, outside the rotation
    return handler


def log_files(directory: Path, name: str = LOG_FILE) -> list[Path]:
    """The current log and its rotated files, oldest first (dlagent.log.N .. dlagent.log.1,
    dlagent.log); numbered files beyond today's ``backups`` are older still and come first."""
    rotated = []
    for p in directory.glob(f"{name}.*"):
        suffix = p.name[len(name) + 1 :]
        if suffix.isdigit():
            rotated.append((int(suffix), p))
    current = directory / name
    return [p for _, p in sorted(rotated, reverse=True)] + ([current] if current.exists() else [])


def tail(directory: Path, lines: int, name: str = LOG_FILE) -> str:
    """The last ``lines`` lines across the log and its rotated files, newest last."""
    out: list[bytes] = []
    for path in reversed(log_files(directory, name)):
        try:
            out[:0] = _last_lines(path, lines - len(out))
        except FileNotFoundError:  # rotated away while we read: the next file holds its lines
            continue
        if len(out) >= lines:
            break
    return b"".join(out).decode("utf-8", "replace")


def _last_lines(path: Path, count: int) -> list[bytes]:
    """A file's last ``count`` lines, reading backwards from its end (files reach max_bytes)."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        data = b""
        pos = end
        while pos > 0 and data.count(b"\n") <= count:
            step = min(_CHUNK, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    found = data.splitlines(keepends=True)
    if found and not found[-1].endswith(b"\n"):
        found[-1] += b"\n"  # a line being written: end it, so the next file's text starts anew
    return found[-count:] if count > 0 else []
