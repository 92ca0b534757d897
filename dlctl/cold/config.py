"""``[clusters.<c>.cold_storage]`` in the inventory: where the cluster's cold store is.

    [clusters.east.cold_storage]
    kind = "filesystem"                 # a mounted NFS or backup volume
    path = "/mnt/backup/dlctl-east"

    [clusters.east.cold_storage]
    kind = "s3"                         # any S3-compatible service
    bucket = "dl-cold"
    prefix = "east"                     # optional: keys start with it
    endpoint = "https://s3.example:9000"  # optional: the service's default endpoint otherwise
    region = "us-east-1"                # optional
    credentials_file = "secrets/east.s3"  # 0600, TOML: access_key_id = "…", secret_access_key = "…"

Off when the table is absent. Relative paths are relative to the inventory file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..secrets import read_secret_file

_KEYS = {
    "filesystem": {"kind", "path"},
    "s3": {"kind", "bucket", "prefix", "endpoint", "region", "credentials_file"},
}


@dataclass(frozen=True)
class ColdStorageConfig:
    kind: str  # "filesystem" | "s3"
    path: Path | None = None
    bucket: str = ""
    prefix: str = ""
    endpoint: str | None = None
    region: str | None = None
    credentials_file: Path | None = None

    def describe(self) -> str:
        if self.kind == "filesystem":
            return f"filesystem {self.path}"
        where = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return f"{where} at {self.endpoint}" if self.endpoint else where

    def to_dict(self) -> dict[str, Any]:
        """For `config show` and `cluster status`: where, never the credentials themselves."""
        out: dict[str, Any] = {"kind": self.kind, "location": self.describe()}
        if self.credentials_file is not None:
            out["credentials_file"] = str(self.credentials_file)
        return out

    def credentials(self) -> tuple[str, str] | None:
        """The access key id and secret, from the 0600 credentials file (None: the client's
        default chain, e.g. an instance role)."""
        if self.credentials_file is None:
            return None
        where = str(self.credentials_file)
        try:
            raw = tomllib.loads(read_secret_file(self.credentials_file).decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: not valid TOML: {exc}") from None
        key, secret = raw.get("access_key_id"), raw.get("secret_access_key")
        if not isinstance(key, str) or not isinstance(secret, str) or not key or not secret:
            raise ConfigError(f"{where}: needs access_key_id and secret_access_key (strings)")
        return key, secret


def parse(body: Any, where: str, base: Path) -> ColdStorageConfig:
    """The table at ``where`` (for messages); relative paths against ``base``."""
    if not isinstance(body, dict):
        raise ConfigError(f"{where} must be a table")
    kind = body.get("kind")
    if kind not in _KEYS:
        raise ConfigError(f"{where}.kind must be \"filesystem\" or \"s3\", got {kind!r}")
    unknown = set(body) - _KEYS[kind]
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) for kind {kind!r}: {', '.join(sorted(unknown))}", hint=f"allowed: {', '.join(sorted(_KEYS[kind]))}")
    for key in _KEYS[kind] - {"kind"}:
        if key in body and not isinstance(body[key], str):
            raise ConfigError(f"{where}.{key} must be a string, got {body[key]!r}")
    if kind == "filesystem":
        if not body.get("path"):
            raise ConfigError(f"{where}.path is required for a filesystem cold store")
        return ColdStorageConfig("filesystem", path=_resolve(body["path"], base))
    if not body.get("bucket"):
        raise ConfigError(f"{where}.bucket is required for an s3 cold store")
    prefix = body.get("prefix", "").strip("/")
    if ".." in prefix.split("/"):
        raise ConfigError(f"{where}.prefix must not contain '..' components")
    credentials = _resolve(body["credentials_file"], base) if body.get("credentials_file") else None
    return ColdStorageConfig("s3", bucket=body["bucket"], prefix=prefix, endpoint=body.get("endpoint"), region=body.get("region"), credentials_file=credentials)


def _resolve(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path
