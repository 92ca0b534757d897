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


def metrics_endpoints(cluster: str) -> str:
    """Where each agent last served its metrics: persistent, so a dead agent stays a scrape
    target (and Prometheus sees it down) instead of vanishing with its availability record."""
    return f"{cluster_root(cluster)}/metrics"


def metrics_endpoint(cluster: str, node_id: str) -> str:
    return f"{metrics_endpoints(cluster)}/{validate_name('node', node_id)}"


def disks(cluster: str) -> str:
    return f"{cluster_root(cluster)}/disks"


def disk(cluster: str, node_id: str) -> str:
    """The id of the data directory ``node_id`` last served from (dlagent.disk)."""
    return f"{disks(cluster)}/{validate_name('node', node_id)}"


def repair_claim(cluster: str, log_name: str, seq: int, node_id: str) -> str:
    """The ephemeral claim on refilling one replica (dlctl.log.repair); ':' is in no name."""
    if not isinstance(seq, int) or not 0 < seq < 2**63:
        raise ValueError(f"invalid segment sequence number {seq!r}")
    return f"{cluster_root(cluster)}/repairs/{validate_name('log', log_name)}:{seq}:{validate_name('node', node_id)}"


def counters(cluster: str) -> str:
    return f"{cluster_root(cluster)}/counters"


def log_id_counter(cluster: str) -> str:
    return f"{counters(cluster)}/log_id"


def logs(cluster: str) -> str:
    return f"{cluster_root(cluster)}/logs"


def log(cluster: str, name: str) -> str:
    return f"{logs(cluster)}/{validate_name('log', name)}"


def deleted_logs(cluster: str) -> str:
    """Tombstones of deleted logs: a log absent *with* one was deleted; absent without one, the
    metadata may have been lost (a wiped or restored ZooKeeper), which is not a deletion."""
    return f"{cluster_root(cluster)}/deleted"


def deleted_log(cluster: str, name: str) -> str:
    return f"{deleted_logs(cluster)}/{validate_name('log', name)}"


def log_owner(cluster: str, name: str) -> str:
    return f"{log(cluster, name)}/owner"


def log_segments(cluster: str, name: str) -> str:
    return f"{log(cluster, name)}/segments"


def segment(cluster: str, name: str, seq: int) -> str:
    if not isinstance(seq, int) or not 0 < seq < 2**63:
        raise ValueError(f"invalid segment sequence number {seq!r}")
    # Zero-padded so that ZooKeeper's lexical child order is the numeric order.
    return f"{log_segments(cluster, name)}/{seq:019d}"


def log_truncation(cluster: str, name: str) -> str:
    return f"{log(cluster, name)}/truncation"


CLUSTER_CHILDREN = ("nodes", "available", "disks", "logs", "counters", "streams", "pins", "ops", "network")


# -- replication streams (sink side; DESIGN.md §3, §7) -----------------------------------------


def streams(cluster: str) -> str:
    return f"{cluster_root(cluster)}/streams"


def stream(cluster: str, stream_id: str) -> str:
    return f"{streams(cluster)}/{validate_name('stream', stream_id)}"


def stream_config(cluster: str, stream_id: str) -> str:
    return f"{stream(cluster, stream_id)}/config"


def stream_state(cluster: str, stream_id: str) -> str:
    return f"{stream(cluster, stream_id)}/state"


def stream_drift(cluster: str, stream_id: str) -> str:
    """What the stream's upkeep found differing between source and sink (``dlctl.replication.upkeep``)."""
    return f"{stream(cluster, stream_id)}/drift"


def stream_checkpoints(cluster: str, stream_id: str) -> str:
    return f"{stream(cluster, stream_id)}/checkpoints"


def stream_checkpoint(cluster: str, stream_id: str, log_name: str) -> str:
    return f"{stream_checkpoints(cluster, stream_id)}/{validate_name('log', log_name)}"


def stream_workers(cluster: str, stream_id: str) -> str:
    return f"{stream(cluster, stream_id)}/workers"


def stream_worker(cluster: str, stream_id: str, log_name: str) -> str:
    return f"{stream_workers(cluster, stream_id)}/{validate_name('log', log_name)}"


def network_events(cluster: str) -> str:
    """The replication network's history as this location recorded it (issue 21)."""
    return f"{cluster_root(cluster)}/network/events"


def network_event(cluster: str, name: str) -> str:
    return f"{network_events(cluster)}/{validate_name('network event', name)}"


# -- disaster recovery (DESIGN.md §7; issue 11) -------------------------------------------------


def log_access(cluster: str, name: str) -> str:
    """Who may write the log: read-write (default when absent), replica of a stream, read-only."""
    return f"{log(cluster, name)}/access"


def log_clock(cluster: str, name: str) -> str:
    """The minimum version vector the log's records start from (raised by `dlctl dr recover`)."""
    return f"{log(cluster, name)}/clock"


def log_bounds(cluster: str, name: str) -> str:
    """What the log's current writer may write at most: txids and append times (issue 24
    item 1, ``dlctl.meta.bounds``)."""
    return f"{log(cluster, name)}/bounds"


def cold_storage(cluster: str) -> str:
    """The cluster's cold store, when one is required before truncated segments are collected
    (``dlctl.meta.coldpolicy``)."""
    return f"{cluster_root(cluster)}/cold_storage"
