"""The cold store interface, and the filesystem store (a mounted NFS or backup volume).

Keys are ``/``-separated relative names built by this package (``manifest``); a store refuses
any other shape, so a name from metadata can never reach outside the store's root or prefix.
Objects are written whole or not at all: the filesystem store writes a private (0600) temporary
file, syncs it and renames it into place; S3 puts are atomic by nature.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

from ..errors import DlctlError, NotFoundError
from ..secrets import write_private_file

_KEY = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


class ColdStoreError(DlctlError):
    """The cold store could not be reached or refused a request; nothing was deleted."""


def check_key(key: str) -> str:
    """``key`` if it is a relative name of plain components (no ``..``, no absolute path)."""
    if not _KEY.match(key) or any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"invalid cold store key {key!r}")
    return key


class ColdStore(Protocol):
    def describe(self) -> str: ...

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...  # NotFoundError when absent

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]: ...  # keys under prefix/ (sorted)

    def delete(self, key: str) -> None: ...  # absent is fine


class FilesystemStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def describe(self) -> str:
        return f"filesystem {self.root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _usable_root(self) -> None:
        if not self.root.is_dir():
            raise ColdStoreError(f"cold store {self.root} is not a directory (not mounted?)", hint="mount the volume or fix [cold_storage] path")

    def put(self, key: str, data: bytes) -> None:
        self._usable_root()
        path = self._path(key)
        try:
            write_private_file(path, data)  # whole or not at all: a temporary file, synced, renamed
        except (OSError, DlctlError) as exc:
            why = exc.message if isinstance(exc, DlctlError) else (exc.strerror or str(exc))
            raise ColdStoreError(f"cold store {self.root}: writing {key}: {why}") from None

    def get(self, key: str) -> bytes:
        self._usable_root()
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"cold store {self.root} has no object {key}") from None
        except OSError as exc:
            raise ColdStoreError(f"cold store {self.root}: reading {key}: {exc.strerror or exc}") from None

    def exists(self, key: str) -> bool:
        self._usable_root()
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        self._usable_root()
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file() and not p.name.startswith("."))

    def delete(self, key: str) -> None:
        self._usable_root()
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ColdStoreError(f"cold store {self.root}: deleting {key}: {exc.strerror or exc}") from None


def open_store(config) -> ColdStore:  # config: dlctl.cold.config.ColdStorageConfig
    """The store a ``[cold_storage]`` table describes."""
    if config.kind == "filesystem":
        return FilesystemStore(config.path)
    from .s3 import S3Store  # boto3 is imported only when an S3 store is used

    return S3Store(config)
