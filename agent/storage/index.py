"""In-memory index of one replica: entry id -> (file offset, payload length, CRC).

Derived data, rebuilt from the log file on every open and never persisted, so it can not
disagree with the file. It must stay small (a GiB of 1 KiB entries is a million entries), so
entries live in flat arrays indexed by ``entry_id - base`` (16 bytes an entry) instead of a
dict of tuples (~150 bytes an entry). Replicas see mostly dense ids (striping leaves regular
holes, pipelining reorders a little); ids that would blow the arrays up with holes — a far
jump, or a hostile writer — go to a small dict instead, so memory stays O(entries) whatever
arrives.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

_HOLE = -1
# A new replica whose first id is small starts the dense range at 0, so the usual
# "entry 1 arrived before entry 0" of pipelining never has to shift the arrays.
_ZERO_BASE_BELOW = 4096
# Holes allowed in the dense range: enough for any striping (E/W holes per entry) and
# reordering, bounded by the entry count so memory is linear in what is stored.
_HOLES_PER_ENTRY = 16
_HOLES_FREE = 1024


class EntryIndex:
    __slots__ = ("_base", "_off", "_len", "_crc", "_holes", "_sparse", "count", "last_id", "first_id")

    def __init__(self) -> None:
        self._base = 0
        self._off = array("q")
        self._len = array("I")
        self._crc = array("I")
        self._holes = 0
        self._sparse: dict[int, tuple[int, int, int]] = {}
        self.count = 0
        self.last_id = -1
        self.first_id = -1

    def __len__(self) -> int:
        return self.count

    def __contains__(self, entry_id: int) -> bool:
        return self.get(entry_id) is not None

    def get(self, entry_id: int) -> tuple[int, int, int] | None:
        """(offset, payload length, crc) of the entry, or None."""
        slot = entry_id - self._base
        if 0 <= slot < len(self._off):
            off = self._off[slot]
            if off != _HOLE:
                return off, self._len[slot], self._crc[slot]
        if self._sparse:
            return self._sparse.get(entry_id)
        return None

    def _hole_budget(self) -> int:
        return _HOLES_PER_ENTRY * (self.count + 1) + _HOLES_FREE - self._holes

    def add(self, entry_id: int, offset: int, length: int, crc: int) -> None:
        """Record a new entry; the caller has checked that the id is not present."""
        n = len(self._off)
        if n == 0 and not self._sparse:
            self._base = 0 if entry_id < _ZERO_BASE_BELOW else entry_id
        slot = entry_id - self._base
        if 0 <= slot < n:
            self._off[slot] = offset
            self._len[slot] = length
            self._crc[slot] = crc
            self._holes -= 1
        elif slot >= n and slot - n <= self._hole_budget():
            gap = slot - n
            if gap:
                self._off.extend(array("q", [_HOLE]) * gap)
                self._len.extend(array("I", [0]) * gap)
                self._crc.extend(array("I", [0]) * gap)
                self._holes += gap
            self._off.append(offset)
            self._len.append(length)
            self._crc.append(crc)
        elif slot < 0 and -slot - 1 <= self._hole_budget():
            gap = -slot
            self._off = array("q", [offset]) + array("q", [_HOLE]) * (gap - 1) + self._off
            self._len = array("I", [length]) + array("I", [0]) * (gap - 1) + self._len
            self._crc = array("I", [crc]) + array("I", [0]) * (gap - 1) + self._crc
            self._holes += gap - 1
            self._base = entry_id
        else:
            self._sparse[entry_id] = (offset, length, crc)
        self.count += 1
        if entry_id > self.last_id:
            self.last_id = entry_id
        if self.first_id < 0 or entry_id < self.first_id:
            self.first_id = entry_id

    def items(self, first: int = 0, last: int | None = None) -> Iterator[tuple[int, int, int, int]]:
        """(entry id, offset, length, crc) for ids in [first, last], ascending."""
        if last is None:
            last = self.last_id
        if last < first or self.count == 0:
            return
        sparse = sorted(k for k in self._sparse if first <= k <= last)
        si = 0
        base, off, lens, crcs = self._base, self._off, self._len, self._crc
        lo = max(first - base, 0)
        hi = min(last - base + 1, len(off))
        for slot in range(lo, hi):
            o = off[slot]
            if o == _HOLE:
                continue
            eid = base + slot
            while si < len(sparse) and sparse[si] < eid:
                k = sparse[si]
                yield (k, *self._sparse[k])
                si += 1
            yield eid, o, lens[slot], crcs[slot]
        for k in sparse[si:]:
            yield (k, *self._sparse[k])
