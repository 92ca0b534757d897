"""Names for shell completion: clusters and nodes from the inventory, logs and streams from the
live cluster's ZooKeeper.

A shell waits for completion with the terminal blocked, so the live names come from one
connection attempt of at most ``LIVE_TIMEOUT`` seconds (dlctl.meta.zk.connect_once: no retries,
no diagnosis); an ensemble that is down or slow yields no names, never a wait or an error.
"""

from __future__ import annotations

from ..inventory import Cluster, Inventory
from ..meta.store import MetaStore
from ..meta.zk import ZkAuth, connect_once
from ..replication.store import StreamStore

LIVE_TIMEOUT = 1.0


def clusters(inventory: Inventory, prefix: str) -> list[str]:
    return [name for name in inventory.clusters if name.startswith(prefix)]


def nodes(cluster: Cluster, prefix: str) -> list[str]:
    return [node.id for node in cluster.nodes if node.id.startswith(prefix)]


def logs(cluster: Cluster, prefix: str, timeout: float = LIVE_TIMEOUT) -> list[str]:
    return _live(cluster, prefix, timeout, lambda meta: meta.list_logs())


def streams(cluster: Cluster, prefix: str, timeout: float = LIVE_TIMEOUT) -> list[str]:
    return _live(cluster, prefix, timeout, lambda meta: StreamStore(meta).list_streams())


def _live(cluster: Cluster, prefix: str, timeout: float, read) -> list[str]:
    auth = ZkAuth.from_file(cluster.zk_auth_file) if cluster.zk_auth_file is not None and cluster.zk_auth_file.exists() else None
    client = connect_once(cluster.zookeeper, auth, timeout, cluster.zookeeper_tls)
    if client is None:
        return []
    try:
        return [name for name in read(MetaStore(client, cluster.name, auth)) if name.startswith(prefix)]
    finally:
        client.stop()
        client.close()

