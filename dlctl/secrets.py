"""Secrets live in 0600 files (or arrive on stdin); never in argv, environment dumps or logs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import ConfigError


def read_secret_file(path: Path) -> bytes:
    """Read a secret, refusing files that group or others can read (as ssh does with keys)."""
    try:
        st = path.stat()
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"secret file {path} does not exist") from None
    except PermissionError:
        raise ConfigError(f"secret file {path} is not readable by this user") from None
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(
            f"secret file {path} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o})",
            hint=f"chmod 600 {path}",
        )
    if not data.strip():
        raise ConfigError(f"secret file {path} is empty")
    return data.strip()


def write_secret_file(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 from the start (no window where it is world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
