"""The store's read path: entries served from memory or read back from the replica file.

Every entry read from disk is verified (entries.verify_entry): a mismatch puts the replica in
limbo, as a media error does. A read that fails for want of descriptors or memory raises the
retryable AgentResourceError and leaves the replica alone (oserrors.py): it says nothing about
the data. Runs on the event loop (one pread per entry, or per run of entries lying back to back).

An entry accepted but not yet durable is served from memory, as BookKeeper does: readers stop at
LAC anyway, and recovery re-writes whatever it reads to a quorum.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from dlctl.log.errors import AgentError, AgentIOError, AgentResourceError, LimboError, NoSuchEntryError
from dlctl.log.format import HEADER_SIZE
from dlctl.logthrottle import LogThrottle

from . import oserrors
from .entries import segment_name, verify_entry
from .layout import check_entry_id
from .segment import FdCache, Segment


class ReplicaReader:
    """Reads of the store's replicas. ``to_limbo(seg, offset, reason)``: the store puts a
    damaged replica in limbo (durably, in the background)."""

    def __init__(self, fds: FdCache, to_limbo: Callable[[Segment, int, str], None], throttle: LogThrottle) -> None:
        self._fds = fds
        self._to_limbo = to_limbo
        self._throttle = throttle  # read failures can come in floods (descriptors exhausted)
        self.resource_errors = 0  # reads failed for want of a resource (never limbo)
        self.entries = 0  # entries served by read and read_range (plain ints: the read path stays cheap)
        self.bytes = 0

    def read(self, seg: Segment, entry_id: int) -> bytes:
        """Encoded entry ``entry_id`` of ``seg``, CRC re-verified."""
        check_entry_id(entry_id)
        loc = seg.index.get(entry_id)
        if loc is None:
            raise NoSuchEntryError(f"entry {entry_id} of {segment_name(seg.key)} is not on this agent")
        off, length, crc = loc
        n = HEADER_SIZE + length
        buf = seg.mem.get(off)
        if buf is not None:
            self.entries += 1
            self.bytes += n
            return buf if type(buf) is bytes else bytes(buf)  # a batch's entry: a view of its request
        fd = self._fd_to_read(seg, off, f"entry {entry_id}")
        try:
            buf = os.pread(fd, n, off)
        except OSError as exc:
            raise self._read_failed(seg, off, f"read of entry {entry_id}", exc) from exc
        problem = verify_entry(buf, n, seg.key, entry_id, crc)
        if problem is not None:
            self._to_limbo(seg, off, problem)
            raise LimboError(f"replica of {segment_name(seg.key)} is corrupt at offset {off} of {seg.path}: {problem}")
        self.entries += 1
        self.bytes += n
        return buf

    def read_range(self, seg: Segment, first: int, last: int, max_bytes: int) -> bytes:
        """Encoded entries ``first``, ``first + 1``, ... of ``seg`` back to back, each CRC
        re-verified as ``read`` does: up to ``last``, up to the first entry this replica lacks,
        and no more than ``max_bytes`` (but always ``first``, or NoSuchEntryError). Entries that
        lie back to back in the file (the usual case) are read with one ``pread`` per run."""
        check_entry_id(first)
        index, mem = seg.index, seg.mem
        locs: list[tuple[int, int, int, int]] = []  # (entry id, offset, size, crc)
        total = 0
        entry_id = first
        while entry_id <= last:
            loc = index.get(entry_id)
            if loc is None:
                if entry_id == first:
                    raise NoSuchEntryError(f"entry {entry_id} of {segment_name(seg.key)} is not on this agent")
                break
            off, length, crc = loc
            n = HEADER_SIZE + length
            if locs and total + n > max_bytes:
                break
            locs.append((entry_id, off, n, crc))
            total += n
            entry_id += 1
        parts: list[bytes | memoryview] = []
        i = 0
        while i < len(locs):
            entry_id, off, n, crc = locs[i]
            buf = mem.get(off)
            if buf is not None:  # accepted, not yet durable: served from memory, as read() does
                parts.append(buf)
                i += 1
                continue
            j, end = i + 1, off + n  # the run of entries lying back to back on disk
            while j < len(locs) and locs[j][1] == end and mem.get(end) is None:
                end += locs[j][2]
                j += 1
            fd = self._fd_to_read(seg, off, f"entries {entry_id}..{locs[j - 1][0]}")
            try:
                run = os.pread(fd, end - off, off)
            except OSError as exc:
                raise self._read_failed(seg, off, f"read of entries {entry_id}..{locs[j - 1][0]}", exc) from exc
            view = memoryview(run)
            pos = 0
            for k in range(i, j):
                e_id, e_off, e_n, e_crc = locs[k]
                problem = verify_entry(view[pos : pos + e_n], e_n, seg.key, e_id, e_crc)
                if problem is not None:
                    self._to_limbo(seg, e_off, problem)
                    raise LimboError(f"replica of {segment_name(seg.key)} is corrupt at offset {e_off} of {seg.path}: {problem}")
                pos += e_n
            parts.append(run)
            i = j
        self.entries += len(locs)
        self.bytes += total
        if len(parts) == 1 and type(parts[0]) is bytes:
            return parts[0]
        return b"".join(parts)

    def _fd_to_read(self, seg: Segment, offset: int, what: str) -> int:
        try:
            return self._fds.get(seg)
        except OSError as exc:
            raise self._read_failed(seg, offset, f"opening the file to read {what}", exc, opening=True) from exc

    def _read_failed(self, seg: Segment, offset: int, what: str, exc: OSError, *, opening: bool = False) -> AgentError:
        """The error to fail a read with (see oserrors.py): want of a resource is retryable and
        never limbo; damage (a media error, the file gone) puts the replica in limbo; anything
        else fails this read only."""
        where = f"{what} of {segment_name(seg.key)} ({seg.path}, offset {offset})"
        if oserrors.is_resource(exc):
            self.resource_errors += 1
            self._throttle.warning(
                "reads failed for want of a resource", "%s failed for want of a resource (%s): not damage, the read can be retried", where, exc.strerror or exc
            )
            return AgentResourceError(f"{where} failed: the agent is short of a resource ({exc.strerror or exc}); try again or another replica")
        if oserrors.is_damage(exc, opening=opening):
            self._to_limbo(seg, offset, f"{what} failed: {exc}")
            return LimboError(f"replica of {segment_name(seg.key)} is unreadable at offset {offset} of {seg.path}: {exc}")
        self._throttle.warning("reads failed", "%s failed (%s): not taken as damage", where, exc)
        return AgentIOError(f"{where} failed: {exc}")
