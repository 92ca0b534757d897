"""The identity record in a data dir: which cluster and node its data belongs to.

An agent refuses to start on another cluster's or another node's data: pointing a config at
the wrong disk must not mix two logs' replicas or vote with someone else's segments.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dlctl.errors import RefusedError

IDENTITY_FILE = "identity.json"


@dataclass(frozen=True)
class Identity:
    cluster: str
    node_id: str
    created: float


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_identity(data_dir: Path, cluster: str, node_id: str) -> Identity:
    """Return the data dir's identity, writing it durably on first use; refuse a mismatch."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / IDENTITY_FILE
    if path.exists():
        try:
            found = Identity(**json.loads(path.read_text()))
        except (ValueError, TypeError) as exc:
            raise RefusedError(
                f"{path} is unreadable ({exc}); refusing to guess whose data this is",
                hint="inspect the data dir; restore the identity file or point the agent at an empty dir",
            ) from None
        if (found.cluster, found.node_id) != (cluster, node_id):
            raise RefusedError(
                f"data dir {data_dir} belongs to node {found.node_id!r} of cluster {found.cluster!r}, "
                f"not node {node_id!r} of cluster {cluster!r}",
                hint="fix data_dir/node_id/cluster in the agent configuration",
            )
        return found
    if any(p.name != IDENTITY_FILE for p in data_dir.iterdir()) and (data_dir / "segments").exists():
        raise RefusedError(
            f"data dir {data_dir} holds segments but no identity record",
            hint="refusing to adopt unidentified data; move it aside or restore identity.json",
        )
    identity = Identity(cluster, node_id, time.time())
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(asdict(identity), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(data_dir)
    return identity
