"""One segment replica's in-memory state, and the cache of open file descriptors.

All fields are owned by the event-loop thread; the sync thread only receives (fd, buffers,
offset) snapshots and never touches a Segment.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path

from dlctl.log.format import HEADER_SIZE

from .index import EntryIndex
from .layout import Key
from .types import LimboRecord, SegmentInfo

log = logging.getLogger("dlagent.storage")


class Segment:
    __slots__ = (
        "key", "log_id", "seq", "path", "index", "lac", "size", "durable", "mem",
        "fenced", "fence_durable", "fencing", "limbo", "fd", "alloc_end", "acked",
        "indexed", "rest_mark",
    )

    def __init__(self, key: Key, path: Path, index: EntryIndex | None = None, size: int = 0, lac: int = -1) -> None:
        self.key = key
        self.log_id, self.seq = key
        self.path = path
        self.index = index if index is not None else EntryIndex()
        self.lac = lac
        # ``size`` counts every accepted entry (the next entry's offset); ``durable`` is how much
        # of it the sync thread has written (and, in "always" mode, fdatasync'ed).
        self.size = size
        self.durable = size
        # Accepted but not yet written entries, by offset: reads and idempotent re-adds are
        # served from here until the sync thread has written them.
        self.mem: dict[int, bytes] = {}
        self.fenced = False
        self.fence_durable = False
        self.fencing = None  # asyncio.Future of a fence being made durable
        self.limbo: LimboRecord | None = None
        self.fd: int | None = None
        # The file's length: ``size`` plus space preallocated ahead of the data (zeros).
        self.alloc_end = size
        # The durable length last recorded in the replica's .acked file (0: none yet).
        self.acked = 0
        # The file length its index checkpoint (.idx) covers (0: none), and its durable length
        # when the store last looked: unchanged over a trim interval, it has rested.
        self.indexed = 0
        self.rest_mark = -1

    @property
    def pinned(self) -> bool:
        """Its fd may be in use by the sync thread, so it must not be closed."""
        return self.durable != self.size

    def durable_entries(self, first: int, max_bytes: int, max_entries: int) -> tuple[list[tuple[int, int, int, int]], int] | None:
        """Its entries from id ``first`` on that are durable now, for a scrub to check: ([(entry
        id, offset, bytes, crc)] in id order, the id to go on from). At most ``max_entries``
        looked at and ``max_bytes`` taken, but at least one entry; entries not yet durable are
        passed over (left to a later pass). None when it has no entries from ``first`` on."""
        index, durable = self.index, self.durable
        if first > index.last_id:
            return None
        locs: list[tuple[int, int, int, int]] = []
        total = looked = 0
        last = first - 1
        for entry_id, off, length, crc in index.items(first):
            n = HEADER_SIZE + length
            if off + n <= durable:
                if locs and total + n > max_bytes:
                    break
                locs.append((entry_id, off, n, crc))
                total += n
            last = entry_id
            looked += 1
            if looked >= max_entries:
                break
        return locs, last + 1

    def info(self) -> SegmentInfo:
        return SegmentInfo(
            log_id=self.log_id,
            segment_seq=self.seq,
            entries=self.index.count,
            last_entry_id=self.index.last_id,
            lac=self.lac,
            fenced=self.fenced,
            limbo=self.limbo is not None,
            size_bytes=self.size,
        )


class FdCache:
    """Keeps at most ``capacity`` replica files open (an agent can hold many thousands).

    Segments with unwritten data are never evicted, so the cache may exceed its capacity
    while many segments are being written at once.
    """

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = max(1, capacity)
        self._open: OrderedDict[Segment, None] = OrderedDict()
        self._sizes: dict[Segment, int] = {}  # preallocated segments' sizes at the last trim_idle

    def get(self, seg: Segment) -> int:
        fd = seg.fd
        if fd is not None:
            self._open.move_to_end(seg)
            return fd
        fd = os.open(seg.path, os.O_RDWR | os.O_CLOEXEC)
        seg.fd = fd
        self._open[seg] = None
        if len(self._open) > self.capacity:
            self._evict(keep=seg)
        return fd

    def _evict(self, keep: Segment) -> None:
        excess = len(self._open) - self.capacity
        for victim in list(self._open):
            if excess <= 0:
                break
            if victim.pinned or victim is keep:
                continue
            self.close(victim)
            excess -= 1

    def close(self, seg: Segment) -> None:
        self._open.pop(seg, None)
        if seg.fd is not None:
            fd, seg.fd = seg.fd, None
            try:
                trim_preallocation(seg, fd)
            finally:
                os.close(fd)

    def close_all(self) -> None:
        for seg in list(self._open):
            self.close(seg)

    def trim_idle(self) -> None:
        """Trim the preallocated space of open segments that took no data since the last call:
        a writer that rolled to its next segment leaves the last one idle but open."""
        before, self._sizes = self._sizes, {}
        for seg in self._open:
            if seg.alloc_end > seg.size and seg.fd is not None and not seg.pinned:
                if before.get(seg) == seg.size:
                    trim_preallocation(seg, seg.fd)
                else:
                    self._sizes[seg] = seg.size


def trim_preallocation(seg: Segment, fd: int) -> None:
    """Give back the zeros preallocated behind ``seg``'s data when its file is closed. Not
    synced: if a crash brings them back, startup recovery trims them again. Only for a segment
    without unwritten data (the FdCache never closes a pinned one, nor the store before a flush)."""
    if seg.alloc_end <= seg.size or seg.pinned:
        return
    try:
        os.ftruncate(fd, seg.size)
    except OSError as exc:
        log.warning("%s: cannot trim %d preallocated bytes: %s", seg.path, seg.alloc_end - seg.size, exc)
        return
    seg.alloc_end = seg.size
