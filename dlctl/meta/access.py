"""Who may write a log: its access mode, ``logs/<name>/access`` in the log's cluster (issue 11).

    read-write  everyone (applications and replication workers); the default when absent
    replica     only the worker of stream ``stream`` (a standby refuses application writes
                until it is promoted)
    read-only   nobody (a switchover froze the old primary; a failback fenced a returning one)

The znode holds JSON ``{"mode", "stream", "epoch", "reason", "updated"}``. Every change is a
compare-and-set and the epoch only grows, so an operator can tell one promotion from the next.
``LogWriter.open`` checks the mode after taking ownership (so a writer that raced a change of
mode either sees the new mode or is deposed by whoever changed it: the operations that make a
log non-writable also release or fence its current owner, see ``dlctl.ops.dr``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from enum import Enum

from kazoo.exceptions import NoNodeError

from ..errors import CorruptMetadata, NotFoundError, RefusedError
from . import cas, paths
from .records import Versioned
from .store import MetaStore

APPLICATION = "application"
REPLICATION_PREFIX = "replication:"


def replication_role(stream_id: str) -> str:
    """The role a stream's worker opens its sink writer with."""
    return f"{REPLICATION_PREFIX}{stream_id}"


class AccessMode(str, Enum):
    READ_WRITE = "read-write"
    REPLICA = "replica"
    READ_ONLY = "read-only"


class LogReadOnlyError(RefusedError):
    """The log's access mode does not admit this writer (a replica or a read-only log)."""


@dataclass(frozen=True)
class LogAccess:
    mode: AccessMode = AccessMode.READ_WRITE
    stream: str = ""  # replica: the stream whose worker may write
    epoch: int = 0
    reason: str = ""
    updated: float = 0.0

    def admits(self, role: str) -> bool:
        if self.mode is AccessMode.READ_WRITE:
            return True
        if self.mode is AccessMode.REPLICA:
            return role == replication_role(self.stream)
        return False

    def describe(self) -> str:
        what = f"replica of stream {self.stream}" if self.mode is AccessMode.REPLICA else self.mode.value
        return f"{what} (epoch {self.epoch}{', ' + self.reason if self.reason else ''})"

    def to_json(self) -> bytes:
        raw = asdict(self)
        raw["mode"] = self.mode.value
        return json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> LogAccess:
        try:
            raw = json.loads(data)
            return cls(AccessMode(raw["mode"]), str(raw.get("stream", "")), int(raw.get("epoch", 0)), str(raw.get("reason", "")), float(raw.get("updated", 0.0)))
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
            raise CorruptMetadata(f"{where}: malformed access record: {exc}") from None


class AccessStore:
    """Access modes of one cluster's logs. ``get`` answers version -1 for a log without a
    record (read-write)."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self.client = meta.client
        self.cluster = meta.cluster

    def get(self, name: str) -> Versioned[LogAccess]:
        path = paths.log_access(self.cluster, name)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return Versioned(LogAccess(), -1)
        return Versioned(LogAccess.from_json(data, path), stat.version)

    def set(self, name: str, mode: AccessMode, *, stream: str = "", reason: str = "", current: Versioned[LogAccess] | None = None) -> Versioned[LogAccess]:
        """Set the mode by compare-and-set against ``current`` (read now when None); the epoch
        grows by one. Idempotent: a log already in this mode (same stream) is left as it is."""
        if current is None:
            current = self.get(name)
        if current.value.mode is mode and current.value.stream == stream:
            return current
        new = LogAccess(mode, stream if mode is AccessMode.REPLICA else "", current.value.epoch + 1, reason, time.time())
        path = paths.log_access(self.cluster, name)
        version = cas.put(self.client, path, new.to_json(), current.version, acl=self.meta.acl, missing=lambda: NotFoundError(f"log {name!r} does not exist in cluster {self.cluster!r}"))
        return Versioned(new, version)

    def clear(self, name: str) -> None:
        """Remove the record (before deleting the log itself)."""
        try:
            self.client.delete(paths.log_access(self.cluster, name))
        except NoNodeError:
            pass

    def check(self, name: str, role: str) -> LogAccess:
        """Raise ``LogReadOnlyError`` unless the log's mode admits ``role``."""
        access = self.get(name).value
        if not access.admits(role):
            raise LogReadOnlyError(
                f"log {name!r} in cluster {self.cluster!r} is {access.describe()}: it refuses writes from {role}",
                hint=_hint(access, self.cluster),
            )
        return access


def _hint(access: LogAccess, cluster: str) -> str:
    if access.mode is AccessMode.REPLICA:
        return f"cluster {cluster!r} is a standby; write at the primary (the source of stream {access.stream}), or promote it with `dlctl failover --to {cluster}` / `dlctl switchover --to {cluster}`"
    return "writes moved to another cluster (switchover or failback); write there"


def updated(access: LogAccess, **changes: object) -> LogAccess:
    return replace(access, **changes)  # type: ignore[arg-type]
