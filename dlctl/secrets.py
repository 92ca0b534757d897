"""Secrets live in 0600 files (or arrive on stdin); never in argv, environment dumps or logs."""

from __future__ import annotations

import os
import secrets as _random
import stat
from pathlib import Path

from .errors import ConfigError, RefusedError

_TEMP_ATTEMPTS = 16


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


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{_random.token_hex(8)}")


def write_secret_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with a 0600 file holding ``data`` (``write_private_file``)."""
    write_private_file(path, data)


def write_private_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with a 0600 file holding ``data``, atomically: readers (and a crash)
    see the old content or the new one, never part of one, and never a wider mode (secrets;
    also cold store copies of a log's data, dlctl.cold.store).

    The bytes go into a new file beside ``path``, opened ``O_CREAT|O_EXCL|O_NOFOLLOW`` with mode
    0600 (private from its first byte; a file or symlink planted under the temp name is never
    written through: another name is drawn), fsynced, then renamed over ``path`` and the
    directory fsynced. A symlink at ``path`` is refused: writing through it would put the
    secret wherever it points. rename(2) never follows one either, so even a link swapped in
    after the check is replaced, its target untouched."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_symlink():
        raise RefusedError(
            f"refusing to write a secret to {path}: it is a symbolic link (to {os.readlink(path)})",
            hint=f"remove the link (rm {path}) or point the configuration at the real file",
        )
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TEMP_ATTEMPTS):
        tmp = _temp_name(path)
        try:
            fd = os.open(tmp, flags, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise ConfigError(f"cannot create a temporary file beside {path}: {_TEMP_ATTEMPTS} random names were all taken", hint=f"look for stray .{path.name}.tmp-* files in {path.parent}")
    try:
        try:
            os.fchmod(fd, 0o600)  # the umask can only have narrowed it; make it exactly 0600
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
