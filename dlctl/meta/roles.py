"""The cluster-wide roles one agent at a time holds, as ZooKeeper shows them.

Two roles exist: the re-replication **auditor** and the **housekeeper** (retention and GC).
Agents contend for each through a kazoo ``Election`` under ``/dlctl/<cluster>/<role>-election``;
the contender with the lowest sequence number holds the role, and each contender's znode carries
its node id. The auditor also has an operator's switch, ``/dlctl/<cluster>/auditor``: no znode
(or empty data) means on, ``{"enabled": false}`` means off for every agent.

This module is the one place both sides read these znodes from: the agent (``dlagent.auditor``,
``dlagent.housekeeping``) and ``dlctl cluster roles|auditor``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from . import paths
from .zk import ZkAuth, acl_for

ROLES = ("auditor", "housekeeping")


def election_path(cluster: str, role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r} (roles: {', '.join(ROLES)})")
    # A sibling of the switch, not a child: the switch znode then exists only when an operator
    # set it, and its data is never anything but the operator's JSON.
    return f"{paths.cluster_root(cluster)}/{role}-election"


def auditor_switch_path(cluster: str) -> str:
    return f"{paths.cluster_root(cluster)}/auditor"


def read_auditor_switch(client: KazooClient, cluster: str) -> tuple[bool, str | None]:
    """(enabled, problem). No znode (or empty data) means enabled. A znode that cannot be read
    as ``{"enabled": bool}`` counts as *disabled*: an operator who wrote something there meant
    to say something, and re-replicating against their will is the costlier mistake."""
    path = auditor_switch_path(cluster)
    try:
        data, _ = client.get(path)
    except NoNodeError:
        return True, None
    if not data.strip():
        return True, None
    try:
        value = json.loads(data)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not isinstance(value.get("enabled"), bool):
        return False, f"{path} is not {{\"enabled\": true|false}} (got {data[:80]!r}); auditing stays off until it is fixed"
    return value["enabled"], None


def write_auditor_switch(client: KazooClient, cluster: str, enabled: bool, auth: ZkAuth | None = None) -> None:
    """Turn auditing on or off for every agent of ``cluster`` (created with the cluster ACL:
    ZooKeeper does not inherit ACLs)."""
    path = auditor_switch_path(cluster)
    data = json.dumps({"enabled": enabled, "updated_at": time.time()}).encode()
    client.ensure_path(paths.cluster_root(cluster), acl=acl_for(auth))
    if client.exists(path) is None:
        client.create(path, data, acl=acl_for(auth))
    else:
        client.set(path, data)


@dataclass(frozen=True)
class RoleHolders:
    role: str
    holder: str | None  # the node holding the role; None while nobody stands
    contenders: tuple[str, ...]  # every node standing, the holder first

    def to_dict(self) -> dict:
        return {"role": self.role, "holder": self.holder, "contenders": list(self.contenders)}


def holders(client: KazooClient, cluster: str, role: str) -> RoleHolders:
    """Who holds ``role`` and who stands behind it (the election's order)."""
    path = election_path(cluster, role)
    # kazoo's ``contenders()`` creates a missing election node (with an open ACL): a read
    # must not, so an absent node means nobody ever stood.
    if client.exists(path) is None:
        return RoleHolders(role, None, ())
    try:
        contenders = tuple(c for c in client.Election(path).contenders() if c)
    except NoNodeError:
        contenders = ()
    return RoleHolders(role, contenders[0] if contenders else None, contenders)
