"""Reading one source segment's encoded entries in order, for a copy (the bootstrap).

Used by the relay copy (``dlctl.spark.task``: an executor reads, re-encodes and adds to the sink
agents) and by the pulled copy (``dlctl.spark.segment_pull``: a sink agent reads the source
itself). Whole ranges of entries per request (READ_RANGE) when every replica holds every entry,
one entry per request otherwise; either way each read goes to any replica of the write set,
nearest first, speculative after an adaptive timeout, CRC-checked by the client, a failing
replica handing over to the next. ``segment`` is anything with ``log`` (its name, for messages),
``source_log_id`` and ``source`` (the ``SegmentRecord``): a ``SegmentTask`` or a ``PullRequest``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import DlctlError
from ..log.errors import BadRequestError
from ..log.readpolicy import AdaptiveTimeout
from ..log.speculative import EntryReadError, ReplicaReader
from ..meta.records import SegmentRecord


class CopyFailed(DlctlError):
    """A segment could not be copied; the message names it and why."""



class EncodedReader(ReplicaReader):
    """Speculative reads that hand back the encoded entry (CRC-checked by the client, not
    decoded: the copy splices its bytes)."""

    async def _read_one(self, node: str, log_id: int, segment_seq: int, entry_id: int) -> bytes:  # type: ignore[override]
        client = await self.pool.client(node)
        return await client.read(log_id, segment_seq, entry_id)


class RangeReader(ReplicaReader):
    """Speculative reads of *ranges* of consecutive entries (READ_RANGE): the same choice of
    replicas, adaptive timeout, suspects and hand-over on failure as ``ReplicaReader.read``,
    for a range that starts at the entry id passed to ``read``; the answer is ``(buffer,
    spans)``, each span an entry CRC-checked by the client. ``ends`` maps a range's first entry
    id to its last. An agent that does not know READ_RANGE (older) serves the first entry by
    READ_ENTRY instead."""

    max_bytes = 4 * 1024 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ends: dict[int, int] = {}

    async def _read_one(self, node: str, log_id: int, segment_seq: int, entry_id: int) -> Any:  # type: ignore[override]
        client = await self.pool.client(node)
        try:
            # in place: the copy only reads the answer (re-encoding copies out of it), nothing keeps it
            return await client.read_range(log_id, segment_seq, entry_id, self.ends[entry_id], self.max_bytes, in_place=True)
        except BadRequestError as exc:
            if "unknown opcode" not in exc.message:
                raise
        data = await client.read(log_id, segment_seq, entry_id)
        return data, [(0, len(data))]


def _whole_ensembles(seg: SegmentRecord) -> bool:
    """Whether every replica of the segment holds every entry (E = W): then any replica can
    serve any range. Striped ensembles (E > W) are read entry by entry."""
    return all(len(change.nodes) == seg.write_quorum for change in seg.ensembles)


def _ranges(seg: SegmentRecord, first: int, last: int, target_bytes: int) -> list[tuple[int, int]]:
    """``first..last`` cut into ranges of about ``target_bytes`` (from the segment's average
    entry size), never across an ensemble change (a range is served by one write set)."""
    entries = max(1, last - first + 1)
    per = max(1, min(4096, target_bytes // max(1, seg.bytes // entries)))
    cuts = sorted({c.first_entry_id for c in seg.ensembles if first < c.first_entry_id <= last})
    out = []
    start = first
    for stop in [*cuts, last + 1]:
        while start < stop:
            end = min(stop, start + per) - 1
            out.append((start, end))
            start = end + 1
    return out


Chunk = tuple[bytes, int, int]  # a buffer and where one encoded entry lies in it


async def read_entries(task: Any, pool: Any, window: int, stats: dict[str, int], range_bytes: int = 2 * 1024 * 1024):
    """Yield the segment's encoded entries in entry-id order as ``(buffer, start, end)``: whole
    ranges of entries per request when every replica holds every entry, with ``window`` entries
    read ahead; else one entry per request."""
    seg = task.source
    first, last = max(seg.min_active_entry, 0), seg.last_entry_id
    if last < first:
        return
    if _whole_ensembles(seg):
        async for chunk in _read_ranges(task, pool, window, stats, first, last, range_bytes):
            yield chunk
        return
    reader = EncodedReader(pool, timeout=AdaptiveTimeout(floor=0.05, ceiling=2.0))  # type: ignore[arg-type]
    pending: dict[int, asyncio.Task] = {}
    next_id = first

    async def one(entry_id: int) -> bytes:
        return await reader.read(task.source_log_id, seg, entry_id)  # type: ignore[return-value]

    try:
        for entry_id in range(first, last + 1):
            while next_id <= last and next_id < entry_id + window:
                pending[next_id] = asyncio.ensure_future(one(next_id))
                next_id += 1
            try:
                entry = await pending.pop(entry_id)
            except EntryReadError as exc:
                raise CopyFailed(f"segment {seg.seq} of log {task.log!r} (source): {exc.message}", hint=exc.hint) from None
            stats["replica_failures"] = reader.stats.replica_failures
            yield entry, 0, len(entry)
    finally:
        for fut in pending.values():
            fut.cancel()
        await asyncio.gather(*pending.values(), return_exceptions=True)


async def _read_ranges(task: Any, pool: Any, window: int, stats: dict[str, int], first: int, last: int, range_bytes: int):
    seg = task.source
    reader = RangeReader(pool, timeout=AdaptiveTimeout(floor=0.05, ceiling=2.0))  # type: ignore[arg-type]
    ranges = _ranges(seg, first, last, range_bytes)
    per_range = max(1, (ranges[0][1] - ranges[0][0] + 1))
    ahead = max(2, window // per_range)  # ranges in flight: about ``window`` entries
    pending: list[tuple[int, int, asyncio.Future]] = []
    todo = iter(ranges)

    def launch(a: int, b: int) -> asyncio.Future:
        reader.ends[a] = b
        return asyncio.ensure_future(reader.read(task.source_log_id, seg, a))

    def fill() -> None:
        while len(pending) < ahead:
            r = next(todo, None)
            if r is None:
                return
            pending.append((r[0], r[1], launch(*r)))

    try:
        fill()
        while pending:
            a, b, fut = pending.pop(0)
            fill()
            while True:
                try:
                    data, spans = await fut
                except EntryReadError as exc:
                    raise CopyFailed(f"segment {seg.seq} of log {task.log!r} (source): {exc.message}", hint=exc.hint) from None
                stats["replica_failures"] = reader.stats.replica_failures
                for start, end in spans:
                    yield data, start, end
                a += len(spans)
                if a > b:
                    break
                fut = launch(a, b)  # the replica answered part of the range (its byte cap): the rest
    finally:
        for _a, _b, fut in pending:
            fut.cancel()
        await asyncio.gather(*(f for _a, _b, f in pending), return_exceptions=True)


__all__ = ["Chunk", "CopyFailed", "EncodedReader", "RangeReader", "read_entries"]
