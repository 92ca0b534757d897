"""A writer's bounds: the highest txid and append time a log's writer may write (issue 24
item 1), ``logs/<name>/bounds`` in the log's cluster.

A writer never dispatches an entry holding a txid or an append time above the bounds it has
*confirmed* here, and it raises them ahead of need by compare-and-set (``dlctl.log.takeover``).
A new owner claims the record by compare-and-set too; from then on the old writer (a zombie
that has not noticed yet) cannot raise them any more. So whatever the old writer left in its
in-progress segment is at or below the bounds the new owner took over, and the new owner can
start above them *before* that segment is recovered: a fast takeover. What the bounds cost is
a gap in the txids after a crashed owner (at most one reservation block) and append times that
may start up to one horizon ahead of the clock.

The znode holds JSON ``{"txid", "time_ms", "writer", "session"}``: the owner id that reserved
them and its ZooKeeper session, so a new owner only trusts bounds reserved by the writer of the segment it is
about to recover (a writer that predates bounds reserved nothing).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from kazoo.exceptions import NoNodeError

from ..errors import CorruptMetadata, NotFoundError
from . import cas, paths
from .records import NO_TXID, Versioned
from .store import MetaStore


@dataclass(frozen=True)
class WriterBounds:
    txid: int = NO_TXID  # no entry holds a greater txid
    time_ms: int = 0  # no entry holds a later append time (ms since the epoch)
    writer: str = ""  # the owner id that reserved them
    session: int = 0  # ... through this ZooKeeper session (owner ids may be reused; sessions are not)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> WriterBounds:
        try:
            raw = json.loads(data)
            bounds = cls(int(raw["txid"]), int(raw["time_ms"]), str(raw["writer"]), int(raw.get("session", 0)))
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
            raise CorruptMetadata(f"{where}: malformed writer bounds: {exc}") from None
        if bounds.txid < NO_TXID or bounds.time_ms < 0:
            raise CorruptMetadata(f"{where}: malformed writer bounds: negative txid or time ({bounds})")
        return bounds


class BoundsStore:
    """Writer bounds of one cluster's logs. ``get`` answers version -1 when the log has none."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self.client = meta.client
        self.cluster = meta.cluster

    def get(self, name: str) -> Versioned[WriterBounds]:
        path = paths.log_bounds(self.cluster, name)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return Versioned(WriterBounds(), -1)
        return Versioned(WriterBounds.from_json(data, path), stat.version)

    def put(self, name: str, new: WriterBounds, current: Versioned[WriterBounds]) -> Versioned[WriterBounds]:
        """Replace ``current`` with ``new`` by compare-and-set (create when ``current`` is absent)."""
        path = paths.log_bounds(self.cluster, name)
        version = cas.put(self.client, path, new.to_json(), current.version, acl=self.meta.acl, missing=lambda: NotFoundError(f"log {name!r} does not exist in cluster {self.cluster!r}"))
        return Versioned(new, version)
