"""The last step of an add on the event loop: a verified entry (entries.py) meets its replica.

The replica's rules come first — limbo refuses every add, a fence refuses all but the fencing
writer's recovery adds — then an entry the replica holds already is an idempotent re-add
(answered once its first copy is durable) if its bytes are the same, and refused if they are
not: a stored entry is never overwritten. A new entry is queued for group commit (sync.py),
indexed, and its piggybacked LAC learnt, at once; durability is the committer's to report.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from dlctl.log.errors import AgentIOError, AgentResourceError, BadRequestError, FencedError, LimboError

from . import oserrors
from .entries import NOTHING_STORED, ParsedEntry, in_batch, segment_name
from .lacwait import LacWaiters
from .segment import FdCache, Segment
from .sync import GroupCommitter

Callback = Callable[[BaseException | None], None]


class EntryQueue:
    """Accepts verified entries into their replicas, for group commit."""

    def __init__(self, committer: GroupCommitter, fds: FdCache, lac_waiters: LacWaiters) -> None:
        self._committer = committer
        self._fds = fds
        self._lac_waiters = lac_waiters

    def accept(
        self, seg: Segment, encoded: bytes, n: int, entry_id: int, lac: int, length: int, crc: int,
        recovery: bool, callback: Callback | None, uncached: bool,
    ) -> int:
        """Queue a verified entry (or find it stored already); returns the offset in ``seg`` it is
        durable at. ``callback``, if given, is told when it is."""
        key = seg.key
        if seg.limbo is not None:
            raise LimboError(f"replica of {segment_name(key)} is in limbo; adds refused until it is re-replicated")
        if seg.fenced and not recovery:
            raise FencedError(f"{segment_name(key)} is fenced: a newer writer owns the log; add of entry {entry_id} refused")
        known = seg.index.get(entry_id)
        if known is not None:
            off = known[0]
            if known[1] != length or known[2] != crc or self._stored(seg, off, n) != encoded:
                raise BadRequestError(
                    f"entry {entry_id} of {segment_name(key)} is already stored (offset {off} of {seg.path}) "
                    "with different contents; refusing to overwrite"
                )
            if callback is not None:
                self._committer.on_durable(seg, off + n, callback)
            return off + n
        if seg.fd is None:
            self._open(seg, "")
        off = self._committer.append(seg, encoded, callback, uncached=uncached)
        seg.index.add(entry_id, off, length, crc)
        if lac > seg.lac:
            self._lac_waiters.raise_lac(seg, lac)
        return off + n

    def accept_batch(self, seg: Segment, parsed: list[ParsedEntry], recovery: bool, callback: Callback | None, uncached: bool) -> int:
        """Queue a verified batch (``accept`` for each entry, every check made before the first
        is queued); returns the offset in ``seg`` up to which the batch is durable."""
        key, count = seg.key, len(parsed)
        if seg.limbo is not None:
            raise LimboError(f"replica of {segment_name(key)} is in limbo; adds refused until it is re-replicated; {NOTHING_STORED}")
        if seg.fenced and not recovery:
            raise FencedError(
                f"{segment_name(key)} is fenced: a newer writer owns the log; batch of entries {parsed[0][4]}..{parsed[-1][4]} refused, nothing stored"
            )
        index = seg.index
        end = 0
        new = []
        for k, item in enumerate(parsed):
            encoded, n, _log, _seq, entry_id, _lac, length, crc = item
            known = index.get(entry_id)
            if known is None:
                new.append(item)
                continue
            off = known[0]
            if known[1] != length or known[2] != crc or self._stored(seg, off, n) != encoded:
                raise BadRequestError(
                    f"{in_batch(k, count, entry_id)}: entry {entry_id} of {segment_name(key)} is already stored (offset {off} of "
                    f"{seg.path}) with different contents; refusing to overwrite; {NOTHING_STORED}"
                )
            end = max(end, off + n)
        if new:
            if seg.fd is None:
                self._open(seg, f"; {NOTHING_STORED}")
            append, add_to_index = self._committer.append, index.add
            top = seg.lac
            for encoded, n, _log, _seq, entry_id, lac, length, crc in new:
                off = append(seg, encoded, None, uncached=uncached)
                add_to_index(entry_id, off, length, crc)
                if lac > top:
                    top = lac
            end = max(end, off + n)
            if top > seg.lac:
                self._lac_waiters.raise_lac(seg, top)
        if callback is not None:
            self._committer.on_durable(seg, end, callback)
        return end

    def _open(self, seg: Segment, suffix: str) -> None:
        """Open the replica's file for the sync thread to write (``suffix``: added to the error)."""
        try:
            self._fds.get(seg)
        except OSError as exc:
            cls = AgentResourceError if oserrors.is_resource(exc) else AgentIOError
            raise cls(f"cannot open {seg.path}: {exc}{suffix}") from exc

    def _stored(self, seg: Segment, off: int, n: int) -> bytes:
        buf = seg.mem.get(off)
        if buf is not None:
            return buf
        try:
            return os.pread(self._fds.get(seg), n, off)
        except OSError as exc:
            cls = AgentResourceError if oserrors.is_resource(exc) else AgentIOError
            raise cls(f"cannot read {seg.path} at offset {off}: {exc}") from exc
