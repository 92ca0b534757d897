"""What a log the write proxy owns holds already, so each replicated event and each idempotent
request is written once (DESIGN.md §5 "Producers are exactly-once", §7).

Replicated records: a worker's record carries its origin location and vector time, and per
origin the events are numbered (the origin's own component) and reach every log in order. So
the owner needs, per origin, only the highest number the log holds: a record at or below it is
a worker's resend or the same event brought by a second stream in a mesh, answered with the
DLSN of the copy already there instead of written again.

Idempotent producers: the first written record of a request carries the producer's mark (id,
epoch, sequence, records written), so an owner finds the producers' last requests in the log.

Both are read back when a log is claimed (``read_back``): every stream's checkpoint says what it
appended up to a moment, the log's last entries what came since. Until then the proxy holds the
requests that need them (``needs_tail``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from dlctl.errors import NotFoundError
from dlctl.log.dlsn import DLSN
from dlctl.log.idempotence import PRODUCER_HEADER, ProducerMark, ProducerTable, producer_mark
from dlctl.log.records import Record
from dlctl.log.tail import records_in_tail
from dlctl.log.writer import LogWriter
from dlctl.meta.store import MetaStore
from dlctl.replication.origin import origin_event
from dlctl.replication.positions import origin_events_of
from dlctl.replication.store import StreamStore

if TYPE_CHECKING:
    from .proxy import ProxyOptions

log = logging.getLogger("dlagent.proxy")  # the proxy's logger, as before the split

# Per origin location: the highest of its event numbers the log holds, and the future of that
# copy's DLSN (what a duplicate is answered with).
Applied = dict[str, tuple[int, asyncio.Future[DLSN]]]


def done_future(loop: asyncio.AbstractEventLoop, value: DLSN) -> asyncio.Future[DLSN]:
    fut: asyncio.Future[DLSN] = loop.create_future()
    fut.set_result(value)
    return fut


def replicated(record: Record) -> bool:
    """Whether ``record`` is an event brought by a replication stream (it carries its origin)."""
    return bool(record.headers) and origin_event(record.headers) is not None


def needs_tail(records: list[Record], mark: tuple[int, int, int] | None) -> bool:
    """Whether a request can only be written knowing what the log's tail holds: an idempotent
    producer's (``mark``: a resend is answered from there) or one carrying replicated events
    (those the log holds already are dropped)."""
    return mark is not None or any(replicated(r) for r in records)


def restore_producers(table: ProducerTable, tail: list[tuple[DLSN, Record]], loop: asyncio.AbstractEventLoop, now: float) -> int:
    """Put the idempotent requests found in ``tail`` (records in log order) into ``table``: a
    marked record and the records after it that its mark counts (a request's records are
    consecutive). Records before the first mark belong to a request that started earlier than
    the tail: left out. Returns how many requests were restored."""
    restored = 0
    for i, (_, record) in enumerate(tail):
        try:
            mark = producer_mark(record.headers) if record.headers else None
        except ValueError as exc:
            log.warning("ignoring a malformed producer mark in the log tail: %s", exc)
            continue
        if mark is None or i + mark.count > len(tail):
            continue
        table.restore(mark, [done_future(loop, dlsn) for dlsn, _ in tail[i : i + mark.count]], now)
        restored += 1
    return restored


async def read_back(
    meta: MetaStore, pool: Any, name: str, options: ProxyOptions, *, recovered: bool, through: int
) -> tuple[Applied, ProducerTable, int]:
    """How far each origin location's events are in log ``name`` already (see ``submit_once``),
    the idempotent producers' last requests, and how many of those were found: every stream's
    checkpoint says what it appended (its sink version vector) up to a moment; the log's last
    entries add what was appended since — after a dead owner (``recovered``), a longer look,
    since a request whose acknowledgement was lost sits among its last entries. ``through``:
    the last segment of the previous owners (ours, after it, holds only requests that needed
    none of this)."""
    loop = asyncio.get_running_loop()
    vectors = await loop.run_in_executor(None, checkpointed_vectors, meta, name)
    scan = options.tail_scan_entries if recovered or vectors else options.handoff_scan_entries
    tail = await records_in_tail(meta, pool, name, max_entries=scan, through_seq=through)
    producers = ProducerTable(options.producer_id_ttl, options.max_producers_per_log)
    restored = restore_producers(producers, tail, loop, time.monotonic())
    found, newest = origin_events_of(tail), (tail[-1][0] if tail else None)
    anchor = newest or DLSN(1, 0, 0)  # a checkpoint-known event's copy: somewhere before the tail's end
    out: Applied = {}
    for vector in vectors:
        for origin, counter in vector.items():
            if counter > out.get(origin, (0, None))[0]:
                out[origin] = (counter, done_future(loop, anchor))
    for origin, (counter, sink) in found.items():
        if counter >= out.get(origin, (0, None))[0]:
            out[origin] = (counter, done_future(loop, sink))
    return out, producers, restored


def checkpointed_vectors(meta: MetaStore, name: str) -> list[dict[str, int]]:
    """The sink version vector of every stream's checkpoint of log ``name`` (blocking)."""
    streams = StreamStore(meta)
    vectors = []
    for stream_id in streams.list_streams():
        try:
            vectors.append(dict(streams.get_checkpoint(stream_id, name).value.sink_vv))
        except NotFoundError:
            continue
    return vectors


def submit_once(
    applied: Applied, writer: LogWriter, records: list[Record], mark: tuple[int, int, int] | None = None
) -> tuple[list[asyncio.Future[DLSN]], int]:
    """Submit ``records`` minus the replicated ones this log already holds; the future of each
    record's DLSN, and how many were dropped as held already.

    A replicated record is an event of its origin location, numbered by the origin's own
    component of its vector time, and a location's events reach every log in their order
    (each log is a linear extension of the causal order). So a record whose number is at
    or below the highest this log holds for its origin is here already: resent by a worker
    (at least once through a proxy) or brought a second time by another stream (a mesh of
    locations). It is answered with the DLSN of the highest copy instead of written again
    (a worker only uses that as where to resume looking).

    ``mark``: the request is idempotent; its first written record carries ``dl.p`` (the
    producer, epoch, sequence and how many records were written), so a new owner finds it."""
    highest = {origin: counter for origin, (counter, _) in applied.items()}
    keep: list[Record] = []
    slots: list[tuple[bool, Any]] = []  # (new?, its event | the origin of the duplicate)
    for record in records:
        event = origin_event(record.headers) if record.headers else None
        if event is not None:
            origin, counter = event
            if counter <= highest.get(origin, 0):
                slots.append((False, origin))
                continue
            highest[origin] = counter
        if record.headers and PRODUCER_HEADER in record.headers:  # owner-assigned: never taken from a client
            record = Record(record.txid, record.payload, record.key, {k: v for k, v in record.headers.items() if k != PRODUCER_HEADER})
        keep.append(record)
        slots.append((True, event))
    if mark is not None and keep:
        first = keep[0]
        keep[0] = Record(first.txid, first.payload, first.key, {**first.headers, PRODUCER_HEADER: ProducerMark(*mark, len(keep)).encode()})
    new = iter(writer.submit_group(keep) if keep else [])
    results: list[asyncio.Future[DLSN]] = []
    for is_new, info in slots:
        if is_new:
            fut = next(new)
            if info is not None:
                applied[info[0]] = (info[1], fut)
            results.append(fut)
        else:
            results.append(applied[info][1])
    return results, len(records) - len(keep)
