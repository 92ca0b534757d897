"""In-memory index of one replica: entry id -> (file offset, payload length, CRC).

Derived data, rebuilt from the log file on open: from the file's start, or from a checkpoint
of the index the store wrote beside the file (``dump``/``load``; ``dlagent.storage.checkpoint``
says when it is trusted) and the bytes after it. It must stay small (a GiB of 1 KiB entries is a million entries), so
entries live in flat arrays indexed by ``entry_id - base`` (16 bytes an entry) instead of a
dict of tuples (~150 bytes an entry). Replicas see mostly dense ids (striping leaves regular
holes, pipelining reorders a little); ids that would blow the arrays up with holes — a far
jump, or a hostile writer — go to a small dict instead, so memory stays O(entries) whatever
arrives.
"""

from __future__ import annotations

import struct
import sys
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

    # -- checkpoints ----------------------------------------------------------------------------

    def snapshot(self) -> EntryIndex:
        """A copy (the arrays copied whole, no per-entry work): to dump on another thread while
        this one keeps taking entries."""
        out = EntryIndex()
        out._base, out._holes, out.count, out.last_id, out.first_id = self._base, self._holes, self.count, self.last_id, self.first_id
        out._off, out._len, out._crc = array("q", self._off), array("I", self._len), array("I", self._crc)
        out._sparse = dict(self._sparse)
        return out

    _HEAD = struct.Struct("<qQQQqq")  # base, dense slots, holes, sparse count, last id, first id
    _SPARSE = struct.Struct("<qqII")  # entry id, offset, length, crc

    def dump(self, below: int | None = None) -> bytes:
        """The index as bytes (little-endian), for ``load``; ``below``: only entries that end
        before that file offset (what is durable) — later ones become holes."""
        off, lens, crcs = array("q", self._off), array("I", self._len), array("I", self._crc)
        sparse = dict(self._sparse)
        holes, count = self._holes, self.count
        if below is not None:
            for slot, o in enumerate(off):
                if o != _HOLE and o + lens[slot] > below:
                    off[slot], lens[slot], crcs[slot] = _HOLE, 0, 0
                    holes += 1
                    count -= 1
            for entry_id, (o, length, _crc) in list(sparse.items()):
                if o + length > below:
                    del sparse[entry_id]
                    count -= 1
        if sys.byteorder != "little":
            for a in (off, lens, crcs):
                a.byteswap()
        kept = [eid for eid in range(self._base, self._base + len(off)) if off[eid - self._base] != _HOLE] + list(sparse)
        last, first = (max(kept), min(kept)) if kept else (-1, -1)
        head = self._HEAD.pack(self._base, len(off), holes, len(sparse), last, first)
        body = b"".join(self._SPARSE.pack(k, *v) for k, v in sorted(sparse.items()))
        return head + off.tobytes() + lens.tobytes() + crcs.tobytes() + body

    @classmethod
    def load(cls, data: bytes | memoryview) -> EntryIndex:
        """An index from ``dump``'s bytes; ValueError when they do not hold one."""
        view = memoryview(data)
        head = cls._HEAD.size
        if len(view) < head:
            raise ValueError("index checkpoint too short")
        base, n, holes, n_sparse, last, first = cls._HEAD.unpack_from(view)
        if n > len(view) or n_sparse > len(view) or len(view) != head + n * 16 + n_sparse * cls._SPARSE.size:
            raise ValueError("index checkpoint of the wrong size")
        out = cls()
        out._base, out._holes, out.last_id, out.first_id = base, holes, last, first
        pos = head
        for name, typecode, width in (("_off", "q", 8), ("_len", "I", 4), ("_crc", "I", 4)):
            a = array(typecode)
            a.frombytes(bytes(view[pos : pos + n * width]))
            if sys.byteorder != "little":
                a.byteswap()
            setattr(out, name, a)
            pos += n * width
        for _ in range(n_sparse):
            entry_id, offset, length, crc = cls._SPARSE.unpack_from(view, pos)
            out._sparse[entry_id] = (offset, length, crc)
            pos += cls._SPARSE.size
        out.count = n - holes + n_sparse
        if out.count < 0 or holes < 0:
            raise ValueError("index checkpoint counts do not add up")
        return out
