"""`dlctl cluster cold-storage enable|disable`: publish or withdraw the cluster's requirement of a
cold copy before truncated segments leave it (``dlctl.meta.coldpolicy``); the offload itself is
``dlctl.retention.offload``."""

from __future__ import annotations

from ..errors import ConfigError
from ..meta import coldpolicy
from ..plan import Plan, Step
from ..session import ClusterSession


def enable_plan(session: ClusterSession, retention_seconds: float | None) -> Plan:
    """Require a copy in the inventory's cold store (``[clusters.<c>.cold_storage]``)."""
    meta, cluster, config = session.meta, session.cluster.name, session.cluster.cold_storage
    if config is None:
        raise ConfigError(f"cluster {cluster!r} has no [clusters.{cluster}.cold_storage] table in the inventory", hint="see README: Cold storage")
    keep = f"{retention_seconds:g} s" if retention_seconds else "for ever"
    return Plan.of(
        "cold-storage enable",
        [
            Step(
                "require-cold-copies", cluster,
                f"require a copy in {config.describe()} before truncated segments leave the cluster; keep copies {keep}",
                params={"store": config.to_dict(), "retention_seconds": retention_seconds},
                run=lambda: coldpolicy.publish(meta, config, retention_seconds) or {"store": config.describe()},
            )
        ],
        notes=["agents reach an S3 store with [housekeeping] cold_credentials_file in their agent.toml (else boto3's default chain)"],
    )


def disable_plan(session: ClusterSession) -> Plan:
    meta, cluster = session.meta, session.cluster.name
    if coldpolicy.load(meta) is None:
        return Plan.of("cold-storage disable", [], notes=[f"cluster {cluster!r} requires no cold copies"])
    return Plan.of(
        "cold-storage disable",
        [Step("stop-requiring-cold-copies", cluster, "truncated segments leave the cluster without a cold copy from now on", run=lambda: {"cleared": coldpolicy.clear(meta)})],
    )
