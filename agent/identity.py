"""The identity record in a data dir: which cluster and node its data belongs to, and which disk.

An agent refuses to start on another cluster's or another node's data: pointing a config at
the wrong disk must not mix two logs' replicas or vote with someone else's segments. The
``disk_id`` is random, made when the directory is: it tells this directory apart from any other
the same node ever ran on (dlagent.disk compares it with ZooKeeper's record).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dlctl.errors import RefusedError

from .storage.layout import DIR_MODE, FILE_MODE

IDENTITY_FILE = "identity.json"


@dataclass(frozen=True)
class Identity:
    cluster: str
    node_id: str
    created: float
    disk_id: str = ""  # empty in records written before disk ids existed (given one on next start)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_identity(data_dir: Path) -> Identity | None:
    """The data dir's identity record, None when it has none; RefusedError when unreadable."""
    path = data_dir / IDENTITY_FILE
    if not path.exists():
        return None
    try:
        return Identity(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise RefusedError(
            f"{path} is unreadable ({exc}); refusing to guess whose data this is",
            hint="inspect the data dir; restore the identity file or point the agent at an empty dir",
        ) from None


def holds_unidentified_data(data_dir: Path) -> bool:
    """Segment files but no identity record: data whose owner nobody can vouch for. Limbo
    markers alone hold no data (a fresh directory's start cut short leaves them: dlagent.disk)."""
    segments = data_dir / "segments"
    return (
        not (data_dir / IDENTITY_FILE).exists()
        and segments.is_dir()
        and any(p.suffix != ".limbo" for p in segments.rglob("*") if p.is_file())
    )


def _write(path: Path, identity: Identity) -> None:
    tmp = path.with_suffix(".tmp")
    # 0600 like every file of the agent; O_NOFOLLOW: a link under the temp name is refused,
    # not written through.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)  # a temp left by a crashed older agent keeps its mode otherwise
    with open(fd, "w") as f:
        json.dump(asdict(identity), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def ensure_identity(data_dir: Path, cluster: str, node_id: str, *, disk_id: str | None = None) -> Identity:
    """Return the data dir's identity, writing it durably on first use; refuse a mismatch.
    ``disk_id``: the id the directory must carry from now on (a fresh one from dlagent.disk,
    which has vetted the directory and may have put limbo markers in it already); otherwise it
    keeps its own, or gets a random one if it has none yet."""
    data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    path = data_dir / IDENTITY_FILE
    found = read_identity(data_dir)
    if found is not None:
        if (found.cluster, found.node_id) != (cluster, node_id):
            raise RefusedError(
                f"data dir {data_dir} belongs to node {found.node_id!r} of cluster {found.cluster!r}, "
                f"not node {node_id!r} of cluster {cluster!r}",
                hint="fix data_dir/node_id/cluster in the agent configuration",
            )
        wanted = disk_id or found.disk_id or uuid.uuid4().hex
        if found.disk_id != wanted:
            found = replace(found, disk_id=wanted)
            _write(path, found)
        return found
    if disk_id is None and holds_unidentified_data(data_dir):
        raise RefusedError(
            f"data dir {data_dir} holds segments but no identity record",
            hint="refusing to adopt unidentified data; move it aside or restore identity.json",
        )
    identity = Identity(cluster, node_id, time.time(), disk_id or uuid.uuid4().hex)
    _write(path, identity)
    return identity
