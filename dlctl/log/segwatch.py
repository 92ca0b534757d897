"""A log's segment list as a reader needs it: read on demand, with ZooKeeper watches that say
when to read it again.

Every read re-arms one-shot watches on the segment list (a segment created or deleted) and on
each segment read (completed, truncated); kazoo keeps one registration per path and callback,
so re-arming never piles up. A session that was lost loses its watches, so a reconnection is
reported as a change too. Callbacks arrive on kazoo's thread and are handed to the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import KazooState, WatchedEvent

from ..errors import NotFoundError
from ..meta import paths
from ..meta.records import SegmentRecord, segment_from_json
from ..meta.store import MetaStore


class SegmentWatcher:
    def __init__(self, meta: MetaStore, name: str, on_change: Callable[[], None]) -> None:
        self.meta = meta
        self.name = name
        self._on_change = on_change
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self._parent = paths.log_segments(meta.cluster, name)
        meta.client.add_listener(self._state)

    async def segments(self, from_seq: int = 0) -> list[SegmentRecord]:
        """Segments with seq >= ``from_seq`` in order, watches armed (kazoo blocks: off the loop)."""
        return await self._loop.run_in_executor(None, self._read, from_seq)

    def _read(self, from_seq: int) -> list[SegmentRecord]:
        client = self.meta.client
        # One round trip, as a rule: the listing, then — in the same batch, so ZooKeeper serves
        # them after it — the reader's segment and the next one (sequence numbers are allocated
        # one by one: at a roll that is the new one). A segment seen in the list was created
        # after its predecessor was closed, so the predecessor's data read after the listing
        # shows the close. Segments the listing shows beyond those are read in a second batch.
        listing = client.get_children_async(self._parent, watch=self._fire)
        reads = {seq: client.get_async(self._path(seq), watch=self._fire) for seq in (from_seq, from_seq + 1) if seq >= 1}
        try:
            children = listing.get()
        except NoNodeError:
            raise NotFoundError(f"log {self.name!r} does not exist in cluster {self.meta.cluster!r}") from None
        seqs = sorted(int(c) for c in children if c.isdigit() and int(c) >= from_seq)
        reads.update({seq: client.get_async(self._path(seq), watch=self._fire) for seq in seqs if seq not in reads})
        out = []
        for seq in seqs:
            try:
                data, _ = reads[seq].get()
            except NoNodeError:
                continue  # truncated and collected between the listing and the read
            out.append(segment_from_json(data, self._path(seq)))
        for seq in set(reads) - set(seqs):
            try:
                reads[seq].get()  # (a guess the listing did not bear out: not there, or gone)
            except NoNodeError:
                pass
        return out

    def _path(self, seq: int) -> str:
        return paths.segment(self.meta.cluster, self.name, seq)

    def _fire(self, event: WatchedEvent | None = None) -> None:
        if not self._closed:
            try:
                self._loop.call_soon_threadsafe(self._on_change)
            except RuntimeError:
                pass  # the loop is closed: nobody is listening any more

    def _state(self, state: KazooState) -> None:
        if state == KazooState.CONNECTED:
            self._fire()

    def close(self) -> None:
        self._closed = True
        self.meta.client.remove_listener(self._state)
