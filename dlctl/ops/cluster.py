"""``cluster init`` and ``cluster status``."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import hmac
import json
import secrets
import time
import uuid
from typing import Any

from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.security import ACL, ANYONE_ID_UNSAFE, Permissions

from .. import pki
from ..errors import ConfigError, RefusedError
from ..inventory import Cluster, Node
from ..log.pool import AgentPool
from ..meta import paths
from ..meta.zk import acl_for
from ..plan import Plan, Step
from ..secrets import write_secret_file
from ..session import ClusterSession

log = logging.getLogger(__name__)

# Several clusters may share one ensemble, each with its own credentials: everyone may read
# /dlctl and create a cluster root under it (a squatter is refused by the marker check below),
# nobody but the cluster that made /dlctl may delete under it or change it, and nobody but its
# owner may touch inside a cluster root.
ROOT_WORLD = ACL(Permissions.READ | Permissions.CREATE, ANYONE_ID_UNSAFE)
MARKER_CONTEXT = b"dlctl cluster marker v1"


def cluster_marker(secret: bytes, name: str, cluster_id: str) -> str:
    """Proof, stored in the cluster's config znode, that ``cluster init`` of whoever holds the
    cluster secret made this layout: HMAC-SHA256(secret, context | name | id)."""
    return hmac.new(secret, b"\0".join((MARKER_CONTEXT, name.encode(), cluster_id.encode())), hashlib.sha256).hexdigest()


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


def create_layout(session: ClusterSession, tls: bool = True) -> dict[str, Any]:
    client, name = session.meta.client, session.cluster.name
    acl = acl_for(session.zk_auth)
    root_acl = [ROOT_WORLD] + ([] if session.zk_auth is None else acl)
    try:
        client.create(paths.ROOT, b"", acl=root_acl)
    except NodeExistsError:
        _tighten_root(client, root_acl)
    root = paths.cluster_root(name)
    if client.exists(root) is not None:
        found = _adopt(session, root, acl)
        created = _create_children(client, name, acl)
        return {"created": created, "cluster_id": found, "adopted": True}
    cluster_id = str(uuid.uuid4())
    config = {"cluster": name, "cluster_id": cluster_id, "created": time.time(), "marker": cluster_marker(session.secret, name, cluster_id)}
    if session.zk_auth is None:
        config["insecure_zookeeper"] = True
    # Clients refuse to fall back to plaintext with a cluster recorded as TLS (ClusterSession.tls).
    config["tls"] = tls
    # Root and config in one transaction: no moment exists where the root is there unmarked.
    tx = client.transaction()
    tx.create(root, b"", acl=acl)
    tx.create(paths.config(name), json.dumps(config).encode(), acl=acl)
    results = tx.commit()
    if any(isinstance(r, Exception) for r in results):
        raise RefusedError(f"{root} appeared while `cluster init` was creating it ({results})", hint="re-run: the next run checks who made it")
    return {"created": [root, paths.config(name)] + _create_children(client, name, acl), "cluster_id": cluster_id}


def _tighten_root(client: Any, root_acl: list) -> None:
    """/dlctl made by someone else (an older dlctl, an attacker) may let the world change it:
    take that away when its ACL lets us (world ADMIN), else say so."""
    acls, stat = client.get_acls(paths.ROOT)
    loose = [a for a in acls if a.id.scheme == "world" and a.perms & ~(Permissions.READ | Permissions.CREATE)]
    if not loose:
        return
    try:
        client.set_acls(paths.ROOT, root_acl, version=stat.aversion)
        log.warning("%s let anyone change or delete under it: its ACL is now world read+create only", paths.ROOT)
    except NoAuthError:
        log.warning("%s lets anyone change or delete under it and cannot be tightened with these credentials", paths.ROOT)


def _create_children(client: Any, name: str, acl: list) -> list[str]:
    created = []
    for child in paths.CLUSTER_CHILDREN:
        path = f"{paths.cluster_root(name)}/{child}"
        try:
            client.create(path, b"", acl=acl)
            created.append(path)
        except NodeExistsError:
            pass
    return created


def _adopt(session: ClusterSession, root: str, acl: list) -> str:
    """The cluster id of an existing layout this cluster made (re-running `cluster init`), or
    RefusedError naming the znode: a layout made by someone else — who could have chosen the
    cluster id, planted agents, records or streams — is never adopted."""
    client, name = session.meta.client, session.cluster.name
    config_path = paths.config(name)
    fix = (
        f"if {root} is not this cluster's, find out who made it (its ctime and ACL: `zkCli.sh stat`/`getAcl`), "
        "delete it with an administrative ZooKeeper session, and re-run `dlctl cluster init`; if it is, use the cluster "
        "secret file it was initialised with"
    )
    try:
        data, _stat = client.get(config_path)
        config = json.loads(data)
        cluster_id, marker = str(config["cluster_id"]), str(config.get("marker", ""))
    except NoNodeError:
        # Agents re-register into a rebuilt ZooKeeper (makepath) before `dr recover` remakes the
        # layout: a root that, with everything under it, carries this cluster's own ACL was made
        # by holders of its credentials, and nobody else can have written into it.
        if session.zk_auth is not None and _all_ours(client, root, acl):
            cluster_id = str(uuid.uuid4())
            config = {"cluster": name, "cluster_id": cluster_id, "created": time.time(), "marker": cluster_marker(session.secret, name, cluster_id)}
            client.create(config_path, json.dumps(config).encode(), acl=acl)
            return cluster_id
        raise RefusedError(f"{root} exists without {config_path}: refusing to adopt a layout `cluster init` did not make", hint=fix) from None
    except (ValueError, KeyError, TypeError):
        raise RefusedError(f"{config_path} is not a cluster config dlctl wrote: refusing to adopt {root}", hint=fix) from None
    except NoAuthError:
        raise RefusedError(f"{config_path} is not readable with this cluster's ZooKeeper credentials: refusing to adopt {root}", hint=fix) from None
    if not hmac.compare_digest(marker, cluster_marker(session.secret, name, cluster_id)):
        if marker or not _acl_is(client, root, acl):
            raise RefusedError(
                f"{root} was not made by this cluster's `cluster init`: its marker in {config_path} does not match the cluster secret"
                + ("" if marker else " (it has none, and the root's ACL is not the cluster's)"),
                hint=fix,
            )
        # Made by an older dlctl, under this cluster's own credentials: mark it now.
        client.set(config_path, json.dumps(config | {"marker": cluster_marker(session.secret, name, cluster_id)}).encode(), version=_stat.version)
    if session.zk_auth is not None and not _acl_is(client, root, acl):
        raise RefusedError(f"{root} does not carry the cluster's ACL (world-writable?): refusing to go on with it", hint=fix)
    return cluster_id


def _all_ours(client: Any, root: str, acl: list) -> bool:
    try:
        return all(_acl_is(client, path, acl) for path in _walk(client, root))
    except NoAuthError:
        return False  # something under it is not even readable with our credentials


def _walk(client: Any, path: str) -> list[str]:
    out = [path]
    for child in client.get_children(path):
        out.extend(_walk(client, f"{path}/{child}"))
    return out


def _acl_is(client: Any, path: str, acl: list) -> bool:
    found, _ = client.get_acls(path)
    return sorted(map(str, found)) == sorted(map(str, acl))


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


def ensure_tls(session: ClusterSession) -> dict[str, Any]:
    """The cluster CA and the operator's certificate in the inventory's tls_dir (kept if there)."""
    certs = session.certdir
    if certs is None:
        raise ConfigError(f"cluster {session.cluster.name!r} has no tls_dir (nor a secret_file to put one beside)", hint="set tls_dir in the inventory, or pass --no-tls")
    done = certs.ensure()
    return {"tls_dir": done, "ca": pki.describe(certs.ca().cert_pem).fingerprint}


def init_plan(session: ClusterSession, *, insecure_zookeeper: bool = False, tls: bool = True) -> Plan:
    """``insecure_zookeeper``: the operator's explicit word that the cluster (its inventory says
    insecure_zookeeper = true) may have world-writable znodes; refused otherwise. ``tls``: make the
    cluster CA and the operator's certificate (agents get theirs at ``agent install``); False
    records a plaintext cluster, warned about by every later command."""
    cluster = session.cluster
    if cluster.insecure_zookeeper and not insecure_zookeeper:
        raise RefusedError(
            f"cluster {cluster.name!r} has insecure_zookeeper = true: its ZooKeeper layout would be world-writable "
            "(anyone who reaches the ensemble could rewrite its config, delete node records, move truncation points)",
            hint="give it a zk_auth_file instead (remove insecure_zookeeper); or pass --insecure-zookeeper to do this knowingly",
        )
    if insecure_zookeeper and not cluster.insecure_zookeeper:
        raise RefusedError(
            f"--insecure-zookeeper, but cluster {cluster.name!r} has ZooKeeper credentials ({cluster.zk_auth_file}): nothing to opt out of",
            hint="drop --insecure-zookeeper (or set insecure_zookeeper = true in the inventory and remove zk_auth_file)",
        )
    tls_steps = [Step("ensure-tls", str(cluster.tls_dir), "create the cluster CA and the operator's TLS certificate (0600) if missing", run=lambda: ensure_tls(session))] if tls else []
    return Plan.of(
        "cluster init",
        [
            Step("ensure-secrets", cluster.name, "create the cluster secret and ZooKeeper credentials (0600) if missing", run=lambda: ensure_secrets(cluster)),
            *tls_steps,
            Step("create-layout", paths.cluster_root(cluster.name), f"create {paths.cluster_root(cluster.name)} and its layout with the cluster ACL", run=lambda: create_layout(session, tls)),
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
        # A pool of its own: its requests give up after ``timeout``, not the session pool's 10 s.
        pool = AgentPool(session.meta, session.credentials, request_timeout=timeout)
        try:
            await pool.refresh()
            return await _stats(pool, sorted(available), timeout)
        finally:
            await pool.close()

    stats = session.run(gather()) if available else {}
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
            "metrics": (info.get("metrics") or "off") if info else None,
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


def metrics_targets(session: ClusterSession) -> list[dict[str, Any]]:
    """Prometheus file_sd target groups, one per agent that serves metrics: its last published
    endpoint, labelled with cluster, node, region and rack. An agent that died stays a target,
    so Prometheus reports it down; with nodes in the inventory, only those (and live agents it
    does not know: a decommissioned node's old endpoint is not scraped for ever)."""
    available = session.meta.available_nodes()
    endpoints = session.meta.metrics_endpoints()
    known = {n.id: n for n in session.cluster.nodes}
    remembered = {n: a for n, a in endpoints.items() if not known or n in known}
    groups = []
    for node_id in sorted(set(remembered) | set(available)):
        live = available.get(node_id, {})
        address = live.get("metrics") if node_id in available else remembered.get(node_id)
        if not address:
            continue  # metrics off, or never started
        node = known.get(node_id)
        labels = {"cluster": session.cluster.name, "node": node_id, "region": node.region if node else live.get("region", ""), "rack": node.rack if node else live.get("rack", "")}
        groups.append({"targets": [address], "labels": labels})
    return groups
