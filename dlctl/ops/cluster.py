"""``cluster init`` and ``cluster status``."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from typing import Any

from kazoo.exceptions import NodeExistsError
from kazoo.security import ACL, ANYONE_ID_UNSAFE, Permissions

from ..errors import ConfigError
from ..inventory import Cluster, Node
from ..log.pool import AgentPool
from ..meta import paths
from ..meta.zk import acl_for
from ..plan import Plan, Step
from ..secrets import write_secret_file
from .session import ClusterSession

# Several clusters may share one ensemble, each with its own credentials: everyone may create
# (and remove, when empty) a cluster root under /dlctl, nobody but its owner may touch inside it.
ROOT_ACL = [ACL(Permissions.READ | Permissions.CREATE | Permissions.DELETE, ANYONE_ID_UNSAFE)]


def ensure_secrets(cluster: Cluster) -> dict[str, str]:
    """Create the cluster secret and ZooKeeper credentials files (0600) when they do not exist."""
    done = {}
    if cluster.secret_file is None:
        raise ConfigError(f"cluster {cluster.name!r} has no secret_file in the inventory")
    if not cluster.secret_file.exists():
        write_secret_file(cluster.secret_file, secrets.token_hex(32).encode())
        done["secret_file"] = "created"
    else:
        done["secret_file"] = "kept"
    if cluster.zk_auth_file is not None:
        if not cluster.zk_auth_file.exists():
            write_secret_file(cluster.zk_auth_file, f"dlctl-{cluster.name}:{secrets.token_urlsafe(24)}".encode())
            done["zk_auth_file"] = "created"
        else:
            done["zk_auth_file"] = "kept"
    return done


def _create_layout(session: ClusterSession) -> dict[str, Any]:
    client, name = session.meta.client, session.cluster.name
    try:
        client.create(paths.ROOT, b"", acl=ROOT_ACL)
    except NodeExistsError:
        pass
    acl = acl_for(session.zk_auth)
    created = []
    root = paths.cluster_root(name)
    config = {"cluster": name, "cluster_id": str(uuid.uuid4()), "created": time.time()}
    for path, data in [(root, b""), (paths.config(name), json.dumps(config).encode())] + [(f"{root}/{c}", b"") for c in paths.CLUSTER_CHILDREN]:
        try:
            client.create(path, data, acl=acl)
            created.append(path)
        except NodeExistsError:
            pass
    data, _ = client.get(paths.config(name))
    return {"created": created, "cluster_id": json.loads(data)["cluster_id"]}


def _node_record(node: Node) -> bytes:
    return json.dumps({"region": node.region, "rack": node.rack, "host": node.host, "address": node.listen}, sort_keys=True).encode()


def _register_nodes(session: ClusterSession) -> dict[str, str]:
    client, acl = session.meta.client, acl_for(session.zk_auth)
    out = {}
    for node in session.cluster.nodes:
        path = paths.node(session.cluster.name, node.id)
        record = _node_record(node)
        try:
            client.create(path, record, acl=acl)
            out[node.id] = "registered"
        except NodeExistsError:
            current, stat = client.get(path)
            if current == record:
                out[node.id] = "unchanged"
            else:
                client.set(path, record, version=stat.version)  # a lost race raises BadVersion
                out[node.id] = "updated"
    return out


def init_plan(session: ClusterSession) -> Plan:
    cluster = session.cluster
    return Plan.of(
        "cluster init",
        [
            Step("ensure-secrets", cluster.name, "create the cluster secret and ZooKeeper credentials (0600) if missing", run=lambda: ensure_secrets(cluster)),
            Step("create-layout", paths.cluster_root(cluster.name), f"create {paths.cluster_root(cluster.name)} and its layout with the cluster ACL", run=lambda: _create_layout(session)),
            Step("register-nodes", paths.nodes(cluster.name), f"register {len(cluster.nodes)} node(s) with region, rack and address", run=lambda: _register_nodes(session)),
        ],
    )


async def _stats(pool: AgentPool, node_ids: list[str], timeout: float) -> dict[str, dict | str]:
    async def one(node_id: str) -> dict | str:
        try:
            client = await pool.client(node_id)
            return await asyncio.wait_for(client.stat(), timeout)
        except Exception as exc:  # noqa: BLE001 - reported per node
            return f"{type(exc).__name__}: {exc}"

    results = await asyncio.gather(*(one(n) for n in node_ids))
    return dict(zip(node_ids, results))


def status(session: ClusterSession, timeout: float = 3.0) -> list[dict[str, Any]]:
    """One row per inventory node (plus live agents the inventory does not know)."""
    available = session.meta.available_nodes()

    async def gather() -> dict[str, dict | str]:
        pool = AgentPool(session.meta, session.secret, request_timeout=timeout)
        try:
            await pool.refresh()
            return await _stats(pool, sorted(available), timeout)
        finally:
            await pool.close()

    stats = asyncio.run(gather()) if available else {}
    rows = []
    known = {n.id for n in session.cluster.nodes}
    nodes = list(session.cluster.nodes) + [
        Node(i, session.cluster.name, a.get("region", "?"), a.get("rack", "?"), "?", a["address"], None, 22, None, "?", "?") for i, a in available.items() if i not in known
    ]
    for node in nodes:
        info = available.get(node.id)
        stat = stats.get(node.id)
        row: dict[str, Any] = {
            "region": node.region,
            "rack": node.rack,
            "node": node.id,
            "address": info["address"] if info else node.listen,
            # Registered but silent: crashed or hung, its ZooKeeper session not yet expired.
            "state": "down" if info is None else ("up" if isinstance(stat, dict) else "unreachable"),
            "version": info.get("version") if info else None,
        }
        if isinstance(stat, dict):
            row.update(segments=stat.get("segments"), data_bytes=stat.get("bytes"), disk_free_bytes=stat.get("disk_free_bytes"), limbo=stat.get("limbo"))
            # Space given back by deleting replicas (truncation GC, orphans), over the data dir's life.
            row.update(reclaimed_bytes=stat.get("reclaimed_bytes"), reclaimed_replicas=stat.get("reclaimed_replicas"))
        else:
            row.update(segments=None, data_bytes=None, disk_free_bytes=None, limbo=None, reclaimed_bytes=None, reclaimed_replicas=None)
            if info is not None:
                row["error"] = stat
        rows.append(row)
    rows.sort(key=lambda r: (r["region"], r["rack"], r["node"]))
    return rows
