"""The cluster's placement policy in ZooKeeper: one JSON znode ``/dlctl/<cluster>/placement``.

Layout (absent znode = the defaults below)::

    {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2,      # defaults for new logs
     "min_regions_for_durability": 1, "regions": [], "drained": [],
     "logs": {"<log>": {"min_regions_for_durability": 2, "regions": ["us-east", "eu"]}}}

Per-log overrides (m and regions to write) live in the same znode under ``logs`` so that one
versioned compare-and-set covers a drain and the overrides it must be checked against. A log's
E, W and A are its own ``LogConfig``. Drains are cluster-wide. Every write names the version it
read; a lost race raises ``ConflictError`` naming the znode; the create passes the cluster ACL
(ZooKeeper ACLs are not inherited).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from ..errors import ConflictError
from ..names import validate_name
from ..placement import PlacementPolicy
from . import cas, paths
from .records import LogConfig, Versioned
from .zk import ZkAuth, acl_for

ABSENT = -1  # version of a policy znode that does not exist yet


def placement_path(cluster: str) -> str:
    return f"{paths.cluster_root(cluster)}/placement"


@dataclass(frozen=True)
class LogOverride:
    min_regions: int | None = None
    regions: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.min_regions is not None:
            out["min_regions_for_durability"] = self.min_regions
        if self.regions is not None:
            out["regions"] = list(self.regions)
        return out


@dataclass(frozen=True)
class ClusterPolicy:
    default: PlacementPolicy = field(default_factory=PlacementPolicy)
    logs: dict[str, LogOverride] = field(default_factory=dict)

    def for_log(self, name: str | None, config: LogConfig | None = None) -> PlacementPolicy:
        """The effective policy of a log: its own E/W/A, its overrides of m and regions."""
        base = self.default
        if config is not None:
            base = replace(base, ensemble_size=config.ensemble_size, write_quorum=config.write_quorum, ack_quorum=config.ack_quorum)
        override = self.logs.get(name) if name else None
        if override is not None:
            if override.min_regions is not None:
                base = replace(base, min_regions=override.min_regions)
            if override.regions is not None:
                base = replace(base, regions=override.regions)
        return base

    def to_dict(self) -> dict[str, Any]:
        out = self.default.to_dict()
        out["logs"] = {name: o.to_dict() for name, o in sorted(self.logs.items())}
        return out

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> ClusterPolicy:
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: placement policy is not a JSON object")
        try:
            default = PlacementPolicy(
                int(raw.get("ensemble_size", 3)),
                int(raw.get("write_quorum", 3)),
                int(raw.get("ack_quorum", 2)),
                int(raw.get("min_regions_for_durability", 1)),
                tuple(raw.get("regions", ())),
                frozenset(raw.get("drained", ())),
            )
            logs = {}
            for name, body in (raw.get("logs") or {}).items():
                m = body.get("min_regions_for_durability")
                regions = body.get("regions")
                logs[validate_name("log", name)] = LogOverride(int(m) if m is not None else None, tuple(regions) if regions is not None else None)
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{where}: invalid placement policy: {exc}") from None
        return cls(default, logs)


def load(client: KazooClient, cluster: str) -> Versioned[ClusterPolicy]:
    path = placement_path(cluster)
    try:
        data, stat = client.get(path)
    except NoNodeError:
        return Versioned(ClusterPolicy(), ABSENT)
    return Versioned(ClusterPolicy.from_dict(json.loads(data or b"{}"), path), stat.version)


def save(client: KazooClient, cluster: str, policy: ClusterPolicy, version: int, auth: ZkAuth | None) -> Versioned[ClusterPolicy]:
    """Write ``policy`` if the znode is still at ``version`` (``ABSENT``: create it)."""
    path = placement_path(cluster)
    data = json.dumps(policy.to_dict(), sort_keys=True).encode()
    if version == ABSENT:
        client.ensure_path(paths.cluster_root(cluster), acl=acl_for(auth))
    written = cas.put(
        client, path, data, version, acl=acl_for(auth),
        conflict=lambda: ConflictError(
            f"aborted: {path} changed concurrently (expected {'no znode' if version == ABSENT else f'version {version}'})",
            hint="nothing was overwritten; read it again (dlctl placement show) and retry",
        ),
        missing=lambda: ConflictError(f"aborted: {path} changed concurrently (it was deleted)", hint="nothing was overwritten; retry"),
    )
    return Versioned(policy, written)
