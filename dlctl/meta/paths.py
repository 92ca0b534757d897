"""The ZooKeeper layout (DESIGN.md §3). Every znode path is built here, from validated names."""

from __future__ import annotations

from ..names import validate_name

ROOT = "/dlctl"


def cluster_root(cluster: str) -> str:
    return f"{ROOT}/{validate_name('cluster', cluster)}"


def config(cluster: str) -> str:
    return f"{cluster_root(cluster)}/config"


def nodes(cluster: str) -> str:
    return f"{cluster_root(cluster)}/nodes"


def node(cluster: str, node_id: str) -> str:
    return f"{nodes(cluster)}/{validate_name('node', node_id)}"


def available(cluster: str) -> str:
    return f"{cluster_root(cluster)}/available"


def available_node(cluster: str, node_id: str) -> str:
    return f"{available(cluster)}/{validate_name('node', node_id)}"
