"""Whether the cluster requires a cold copy before a truncated segment leaves it, and where the
cold store is: ``/dlctl/<cluster>/cold_storage`` (issue 25 item 2).

Everyone who collects truncated segments reads it — the agents' elected housekeeper and
`dlctl gc` — so none of them can collect a segment the others would have copied first. It holds
where the store is and how long copies stay (``retention_seconds``, absent: for ever); never
credentials: each party uses its own (the operator's inventory, the agent's agent.toml). It is
set from the inventory's table by `dlctl cluster cold-storage enable`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from kazoo.exceptions import NoNodeError

from ..cold.config import ColdStorageConfig
from ..errors import CorruptMetadata
from . import paths
from .store import MetaStore


def to_json(config: ColdStorageConfig, retention_seconds: float | None) -> bytes:
    raw = {
        "kind": config.kind,
        "path": str(config.path) if config.path else None,
        "bucket": config.bucket,
        "prefix": config.prefix,
        "endpoint": config.endpoint,
        "region": config.region,
        "retention_seconds": retention_seconds,
    }
    return json.dumps(raw, sort_keys=True).encode()


def from_json(data: bytes, where: str) -> tuple[ColdStorageConfig, float | None]:
    try:
        raw = json.loads(data)
        kind = raw["kind"]
        if kind not in ("filesystem", "s3"):
            raise ValueError(f"unknown kind {kind!r}")
        retention = raw.get("retention_seconds")
        if retention is not None and (not isinstance(retention, (int, float)) or retention <= 0):
            raise ValueError(f"retention_seconds must be positive, got {retention!r}")
        config = ColdStorageConfig(
            kind, path=Path(raw["path"]) if raw.get("path") else None, bucket=raw.get("bucket") or "", prefix=raw.get("prefix") or "",
            endpoint=raw.get("endpoint"), region=raw.get("region"),
        )
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise CorruptMetadata(f"{where}: malformed cold storage record: {exc}") from None
    if (kind == "filesystem" and config.path is None) or (kind == "s3" and not config.bucket):
        raise CorruptMetadata(f"{where}: malformed cold storage record: no path or bucket")
    return config, (float(retention) if retention is not None else None)


def load(meta: MetaStore) -> tuple[ColdStorageConfig, float | None] | None:
    """The required cold store and its retention, or None when none is required."""
    path = paths.cold_storage(meta.cluster)
    try:
        data, _ = meta.client.get(path)
    except NoNodeError:
        return None
    return from_json(data, path)


def with_credentials(config: ColdStorageConfig, credentials_file: Path | None) -> ColdStorageConfig:
    """The published store, reached with this party's own credentials."""
    return replace(config, credentials_file=credentials_file)


def publish(meta: MetaStore, config: ColdStorageConfig, retention_seconds: float | None) -> None:
    path = paths.cold_storage(meta.cluster)
    data = to_json(config, retention_seconds)
    if meta.client.exists(path):
        meta.client.set(path, data)
    else:
        meta.client.create(path, data, acl=meta.acl, makepath=True)


def clear(meta: MetaStore) -> bool:
    try:
        meta.client.delete(paths.cold_storage(meta.cluster))
    except NoNodeError:
        return False
    return True
