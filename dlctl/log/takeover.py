"""Fast takeover (issue 24 item 1): the writer's bounds, and where a new owner may start.

DistributedLog lets a new owner open its own segment while the previous owner's in-progress
segment is still being fenced, recovered and closed, so appends resume before that recovery
ends. What the new owner must know first is what to start *above*: txids increase along the
log and append times never go back, but the old segment's last txid and time are only known
once it is recovered. So every writer keeps *bounds* in ZooKeeper (``dlctl.meta.bounds``): it
reserves txids and append time ahead of need and never dispatches an entry above what it has
reserved. A new owner claims the bounds record (compare-and-set: the old writer cannot reserve
more from then on), and when the bounds were reserved by the writer of the segment to recover,
starts just above them.

The costs, chosen to stay small: after a crashed owner, txids skip what it had reserved but not
used (at most one block, ``MIN_BLOCK`` to ``MAX_BLOCK``, sized to the writer's rate) and append
times start at most ``HORIZON`` seconds ahead of the clock (they then stay put until the clock
catches up); while entries flow, one ZooKeeper write every ``HORIZON / 2`` seconds per log; and
a writer idle for more than ``ACTIVE_FOR`` seconds waits for one ZooKeeper write before its
next entry.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ConflictError
from ..meta.bounds import BoundsStore, WriterBounds
from ..meta.records import Versioned

HORIZON = 5.0  # seconds of append time reserved ahead of the clock
MIN_BLOCK = 1024  # txids reserved at once, at least ...
MAX_BLOCK = 1 << 20  # ... and at most
ACTIVE_FOR = 60.0  # reserve time ahead this long after the last entry


def takeover_floor(previous: WriterBounds, inprogress_writer: str | None) -> WriterBounds | None:
    """What a new owner may start above without waiting for the recovery of the log's last
    in-progress segment (written by ``inprogress_writer``): the bounds it took over, when
    that writer reserved them. None: wait for the recovery (nothing in progress, or bounds
    reserved by someone else — a writer that predates bounds reserved nothing)."""
    if inprogress_writer is None or not previous.writer or previous.writer != inprogress_writer:
        return None
    return previous


class BoundsLost(ConflictError):
    """Another writer claimed the bounds: this one was deposed."""


class BoundsKeeper:
    """One writer's side of the bounds record: claim it at open, then reserve ahead of need.

    ``zk`` runs a blocking ZooKeeper call off the event loop; ``clock`` is the writer's wall
    clock (seconds)."""

    def __init__(self, store: BoundsStore, name: str, owner_id: str, session: int, zk: Callable[..., Awaitable[Any]], clock: Callable[[], float]) -> None:
        self.store = store
        self.name = name
        self.owner_id = owner_id
        self.session = session
        self._zk = zk
        self._clock = clock
        self._current: Versioned[WriterBounds] | None = None
        self._block = MIN_BLOCK
        self._reserved_at = 0.0  # monotonic time of the last txid reservation

    @property
    def confirmed(self) -> WriterBounds:
        """The bounds this writer holds (nothing above them may be dispatched)."""
        if self._current is None:
            return WriterBounds(writer=self.owner_id, session=self.session)
        return self._current.value

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _wanted(self, current: WriterBounds, txid: int, time_ms: int) -> WriterBounds:
        return WriterBounds(
            txid=max(current.txid, txid) + self._block,
            time_ms=max(current.time_ms, time_ms, self._now_ms()) + int(HORIZON * 1000),
            writer=self.owner_id,
            session=self.session,
        )

    async def claim(self, txid: int, time_ms: int) -> WriterBounds:
        """Take the record over (whoever holds it), reserving above ``txid`` and ``time_ms``;
        returns the bounds as they were when taken over."""
        while True:
            current = await self._zk(self.store.get, self.name)
            try:
                self._current = await self._zk(self.store.put, self.name, self._wanted(current.value, txid, time_ms), current)
            except ConflictError:
                continue  # the old writer reserved more meanwhile: take that over
            self._reserved_at = time.monotonic()
            return current.value

    def covers(self, txid: int, time_ms: int) -> bool:
        bounds = self.confirmed
        return txid <= bounds.txid and time_ms <= bounds.time_ms

    def running_low(self, txid: int, time_ms: int) -> bool:
        """Time to reserve more before an entry has to wait for it."""
        bounds = self.confirmed
        return bounds.txid - txid < self._block // 2 or bounds.time_ms - time_ms < HORIZON * 500

    async def extend(self, txid: int, time_ms: int) -> None:
        """Reserve past ``txid`` and ``time_ms``. Raises ``BoundsLost`` when another writer
        claimed the record (this one was deposed)."""
        now = time.monotonic()
        if txid + self._block // 2 > self.confirmed.txid:  # txids ran low: size blocks to the rate
            if now - self._reserved_at < HORIZON / 2:
                self._block = min(self._block * 2, MAX_BLOCK)
            elif now - self._reserved_at > 4 * HORIZON:
                self._block = max(self._block // 2, MIN_BLOCK)
            self._reserved_at = now
        while True:
            current = self._current
            assert current is not None, "extend() before claim()"
            try:
                self._current = await self._zk(self.store.put, self.name, self._wanted(current.value, txid, time_ms), current)
                return
            except ConflictError:
                pass
            # Changed under us: our own write whose answer was lost, or another writer's claim.
            fresh = await self._zk(self.store.get, self.name)
            if (fresh.value.writer, fresh.value.session) != (self.owner_id, self.session):
                raise BoundsLost(f"the bounds of log {self.name!r} were claimed by writer {fresh.value.writer or '(unknown)'}")
            self._current = fresh
            if self.covers(txid, time_ms) and not self.running_low(txid, time_ms):
                return
