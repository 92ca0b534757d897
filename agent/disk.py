"""A node that comes back on a new or wiped data directory knows it, and says so (DESIGN.md §5,
"durability invariants"; BookKeeper's cookie check).

Why: recovery ends a segment at the first entry that W − A + 1 replicas say they lack. An agent
that lost its disk answers "no such entry" for everything it held — not because those entries
were never acknowledged, but because it forgot them. Counted as absence, that closes segments
short and loses acknowledged records (issue 18: X wiped, Z behind, Y slow during the takeover).

The rules, applied before the agent opens its store or serves anything:

1. **Fresh directory.** A data directory with no identity record, or with one but no
   ``segments/`` under it, is *fresh*: whatever this node stored before is not there.
2. **Forget loudly.** For a fresh directory the agent lists, from ZooKeeper, every segment whose
   ensembles (any of them) name this node, and writes a durable limbo marker for each. A limbo
   replica answers LimboError to fences, reads and adds; recovery counts that as *unknown*,
   never as absent, and the auditor re-copies the replica from its peers. Only then is the
   identity record written: a crash in between leaves a directory that is still fresh, and is
   scanned again. Segments created after the scan began cannot hold anything acknowledged by
   the lost disk — its agent was already gone (one agent per data directory, and this one
   has not served yet).
3. **One disk per node.** The identity record carries a random disk id; ZooKeeper keeps the id
   of the directory the node last served from (``disks/<node>``). A directory that is not fresh
   but carries another id is some other copy of the node's data — a disk swapped back in, a
   restored backup — whose replicas may be short of what the node acknowledged since: the agent
   refuses to start on it, naming both ids and the fix (move it aside; the node then starts
   fresh under rule 2). A missing record (first start, or a rebuilt ZooKeeper) is written.

The ZooKeeper record is written before the identity record, so no crash leaves a directory that
is not fresh under an id ZooKeeper does not know.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError

from dlctl.errors import NotFoundError, RefusedError
from dlctl.meta import paths
from dlctl.meta.store import MetaStore
from dlctl.meta.zk import ZkAuth, acl_for

from .identity import Identity, ensure_identity, holds_unidentified_data, read_identity
from .storage import layout
from .storage.recovery import write_limbo_markers
from .storage.types import LimboRecord

log = logging.getLogger("dlagent.disk")

LOST_WITH_DISK = "lost with the node's previous data directory: entries it lacks are unknown, not absent"

Key = tuple[int, int]


@dataclass(frozen=True)
class DiskCheck:
    """What the start-up check found and did."""

    identity: Identity
    fresh: bool
    forgotten: tuple[Key, ...]  # replicas marked limbo because the directory is fresh
    previous_disk: str | None  # the disk id ZooKeeper had before (None: no record)

    def to_dict(self) -> dict[str, Any]:
        return {
            "disk_id": self.identity.disk_id,
            "fresh": self.fresh,
            "forgotten": [list(k) for k in self.forgotten],
            "previous_disk": self.previous_disk,
        }


def is_fresh(data_dir: Path) -> bool:
    """Rule 1: no identity record, or no ``segments/`` beneath it."""
    return read_identity(data_dir) is None or not layout.segments_root(data_dir).is_dir()


def memberships(meta: MetaStore, node_id: str) -> list[Key]:
    """(log id, segment seq) of every segment whose ensembles name ``node_id``."""
    keys: list[Key] = []
    for name in meta.list_logs():
        try:
            log_id = meta.get_log(name).value.log_id
            segments = meta.segments(name)
        except NotFoundError:
            continue  # deleted meanwhile: nothing of it to forget
        keys.extend(
            (log_id, seg.value.seq) for seg in segments if any(node_id in change.nodes for change in seg.value.ensembles)
        )
    return sorted(keys)


def _read_disk_record(client: Any, path: str) -> tuple[str | None, int | None]:
    try:
        data, stat = client.get(path)
    except NoNodeError:
        return None, None
    try:
        return str(json.loads(data)["disk_id"]), stat.version
    except (ValueError, KeyError, TypeError):
        return "", stat.version  # unreadable: replaced like any other id, when fresh


def _write_disk_record(client: Any, path: str, disk_id: str, version: int | None, auth: ZkAuth | None) -> None:
    data = json.dumps({"disk_id": disk_id, "since": time.time()}, sort_keys=True).encode()
    if version is None:
        try:
            client.create(path, data, acl=acl_for(auth), makepath=True)
            return
        except NodeExistsError:
            raise RefusedError(f"{path} appeared while this agent was starting", hint="another agent with this node id is starting; stop it") from None
    client.set(path, data, version=version)


def prepare_data_dir(client: Any, cluster: str, node_id: str, data_dir: Path, auth: ZkAuth | None = None) -> DiskCheck:
    """Apply rules 1–3 to ``data_dir`` (blocking: ZooKeeper and fsync). Raises RefusedError for a
    directory that must not be served from."""
    layout.secure_data_dir(data_dir)  # 0700, an existing wider one narrowed (and logged)
    if holds_unidentified_data(data_dir):
        ensure_identity(data_dir, cluster, node_id)  # raises, naming the problem
    record_path = paths.disk(cluster, node_id)
    recorded, version = _read_disk_record(client, record_path)
    if not is_fresh(data_dir):
        identity = ensure_identity(data_dir, cluster, node_id)
        if recorded is None:
            _write_disk_record(client, record_path, identity.disk_id, None, auth)
        elif recorded != identity.disk_id:
            raise RefusedError(
                f"data dir {data_dir} is disk {identity.disk_id}, but node {node_id!r} last served from disk "
                f"{recorded or '(unreadable record)'} ({record_path}): its replicas may be short of what the node acknowledged since",
                hint=f"move {data_dir} aside and start the agent on an empty directory: it starts fresh, its replicas are "
                "marked limbo and re-copied from their peers",
            )
        return DiskCheck(identity, False, (), recorded)
    forgotten = memberships(MetaStore(client, cluster, auth), node_id)
    if forgotten:
        write_limbo_markers(
            data_dir, [LimboRecord(log_id, seq, str(layout.segment_path(data_dir, (log_id, seq))), -1, LOST_WITH_DISK) for log_id, seq in forgotten]
        )
        log.warning(
            "data dir %s is fresh but node %s is a member of %d segment(s): they are in limbo until re-replicated",
            data_dir, node_id, len(forgotten),
        )
    disk_id = uuid.uuid4().hex
    _write_disk_record(client, record_path, disk_id, version, auth)
    identity = ensure_identity(data_dir, cluster, node_id, disk_id=disk_id)
    layout.segments_root(data_dir).mkdir(mode=layout.DIR_MODE, exist_ok=True)
    layout.fsync_path(data_dir)
    return DiskCheck(identity, True, tuple(forgotten), recorded)
