"""Reading (and, with the writer, appending) records of a log for the command line."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import struct
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from typing import Any, BinaryIO

from ..log import format as fmt
from ..log.dlsn import DLSN
from ..log.pool import AgentPool
from ..log.reader import LogReader, ReadRecord
from ..log.timeindex import iso
from ..errors import DlctlError, PartialFailure, UsageError
from ..cold.history import read_with_history
from ..plan import Plan, Step
from .backup import cold_store_of
from .threaded_input import records_from_thread
from ..session import ClusterSession

log = logging.getLogger(__name__)


def record_view(record: ReadRecord) -> dict[str, Any]:
    """A record as plain data: payload as text when it is UTF-8, else base64 (``payload_b64``)."""
    out: dict[str, Any] = {"dlsn": str(record.dlsn), "txid": record.txid, "time": iso(record.append_ms)}
    if record.key:
        out["key"] = record.key.decode(errors="replace")
    try:
        out["payload"] = record.payload.decode()
    except UnicodeDecodeError:
        out["payload_b64"] = base64.b64encode(record.payload).decode()
    if record.headers:
        out["headers"] = {k: v.decode(errors="replace") for k, v in record.headers.items() if not k.startswith("dl.")}
    return out


async def read_records(
    session: ClusterSession,
    name: str,
    *,
    start_dlsn: DLSN | None = None,
    start_txid: int | None = None,
    start_time: float | None = None,
    limit: int | None = None,
    idle_timeout: float | None = 1.0,
    region: str | None = None,
    from_cold: bool = False,
) -> AsyncIterator[ReadRecord]:
    """Yield records from the start position; stop after ``limit`` records or, when
    ``idle_timeout`` is set, once no record arrived for that long (caught up). ``None`` follows
    the tail forever. ``from_cold``: begin with the history the cold store holds from before the
    truncation point (``dlctl.cold.history``), then go on in the hot log from that point."""
    count = 0
    pool = await session.pool()
    if from_cold:
        if start_dlsn is not None or start_txid is not None or start_time is not None:
            raise UsageError("reading from the cold store starts at the oldest copy: it takes no start position")
        records = read_with_history(session.meta, pool, name, cold_store_of(session), idle_timeout=idle_timeout, region=region)
    else:
        records = _read_hot(session.meta, pool, name, start_dlsn, start_txid, start_time, idle_timeout, region)
    async with contextlib.aclosing(records):  # (a limit reached closes the reader at once)
        async for record in records:
            count += 1
            yield record
            if limit is not None and count >= limit:
                return


async def _read_hot(meta: Any, pool: AgentPool, name: str, start_dlsn: DLSN | None, start_txid: int | None, start_time: float | None, idle_timeout: float | None, region: str | None) -> AsyncIterator[ReadRecord]:
    async with LogReader(meta, pool, name, start_dlsn=start_dlsn, start_txid=start_txid, start_time=start_time, region=region) as reader:
        while (record := await reader.read_next(idle_timeout)) is not None:
            yield record


def append_plan(session: ClusterSession, name: str, *, framing: str, via: str, run: Callable[[], dict[str, Any]]) -> Plan:
    """`log append`'s plan: ``run`` appends. Fails at once (exit 1) when the log does not exist."""
    log = session.meta.get_log(name).value
    return Plan.of("log append", [Step("append", f"{session.cluster.name}/{name}", f"append {framing} records from stdin to log {name} (log id {log.log_id}) through {via}", run=run)])


def iter_stdin_records(stream: BinaryIO, length_delimited: bool) -> Iterator[bytes]:
    """Records from a byte stream: one per line (newline stripped), or u32-length-prefixed."""
    if not length_delimited:
        for line in stream:
            yield line[:-1] if line.endswith(b"\n") else line
        return
    offset = 0
    while True:
        header = stream.read(4)
        if not header:
            return
        if len(header) < 4:
            raise UsageError(f"standard input: truncated length prefix at byte {offset}")
        (size,) = struct.unpack(">I", header)
        if size > fmt.MAX_PAYLOAD:  # (not read: a corrupt prefix would have us allocate up to 4 GiB)
            raise UsageError(f"standard input: record at byte {offset} claims {size} bytes, more than any record holds ({fmt.MAX_PAYLOAD}): not length-delimited input?")
        body = stream.read(size)
        if len(body) < size:
            raise UsageError(f"standard input: record at byte {offset} claims {size} bytes, only {len(body)} follow")
        offset += 4 + size
        yield body


async def append_records(
    session: ClusterSession,
    name: str,
    records: Iterable[bytes],
    *,
    direct: bool = False,
    owner_id: str | None = None,
    region: str | None = None,
    idempotent: bool = True,
    on_progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Append every record, pipelined and batched, and wait until all are acknowledged.

    By default through the write proxies (the agent owning the log, DESIGN.md §5), so this may
    run while other producers write, exactly once unless ``idempotent`` is false (then a request
    whose acknowledgement was lost may be stored twice); ``direct`` opens the library writer
    instead, which takes ownership of the log (fencing whoever owned it) and releases it at the
    end."""
    pool = await session.pool()
    started = time.monotonic()
    async with contextlib.aclosing(records_from_thread(records)) as arriving:  # read off the loop: see threaded_input
        if direct:
            result = await _append_direct(session, pool, name, arriving, owner_id, on_progress)
        else:
            result = await _append_via_proxy(session, pool, name, arriving, region, idempotent, on_progress)
    elapsed = time.monotonic() - started
    count = result["records"]
    return {
        "log": name,
        **result,
        "seconds": round(elapsed, 3),
        "records_per_second": round(count / elapsed) if elapsed > 0 else None,
    }


async def _feed(sink: Any, records: AsyncIterable[bytes], on_progress: Callable[[int], None] | None) -> tuple[int, int, DLSN | None, DLSN | None]:
    """Submit every record to ``sink`` (a LogWriter or LogProducer) with back-pressure; raise
    the first failure of any record (a flush only sees the records still unsettled). A failure
    after some records were acknowledged raises ``AppendIncomplete`` (exit 3) saying how many:
    those are in the log, and appending the whole input again would store them twice."""
    count = size = acked = 0
    first_future = None
    first_acked: DLSN | None = None  # the lowest position acknowledged (acknowledgements may come out of order)
    failures: list[BaseException] = []

    def note(future: Any) -> None:
        nonlocal acked, first_acked
        if future.cancelled():
            return
        if future.exception() is None:
            acked += 1
            first_acked = future.result() if first_acked is None else min(first_acked, future.result())
        elif not failures:
            failures.append(future.exception())

    arriving = aiter(records)
    try:
        while True:
            try:
                payload = await anext(arriving)
            except StopAsyncIteration:
                break
            except UsageError as exc:  # the input breaks off here (a truncated record): stop reading
                await sink.flush()  # the records before it are settled first: they may be in the log
                raise RecordRejected(count + 1, exc.message) from None
            await sink.wait_writable()
            try:
                future = sink.submit(payload)
            except ValueError as exc:  # this record can never be appended (too large): stop reading here
                await sink.flush()  # the records before it are settled first: the count below is final
                raise RecordRejected(count + 1, str(exc)) from None
            future.add_done_callback(note)
            if first_future is None:
                first_future = future
            count += 1
            size += len(payload)
            if on_progress is not None and count % 1000 == 0:
                on_progress(count)
        last = await sink.flush()
        if failures:
            raise failures[0]
    except asyncio.CancelledError:  # interrupted (Ctrl-C): say what is in the log before "interrupted"
        if count:
            log.warning("log append interrupted: %d of the %d record(s) read were acknowledged so far (more may be, once in flight); "
                        "look with `dlctl log tail` before appending them again", acked, count)
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised as it is unless records are already in the log
        if not acked:
            if isinstance(exc, RecordRejected):
                raise UsageError(f"{exc}; nothing was appended") from None
            raise
        raise AppendIncomplete(exc, count, acked, first_acked) from exc
    first = await first_future if first_future is not None else None
    return count, size, first, last


class RecordRejected(Exception):
    """Record ``number`` (1-based, in input order) cannot be appended at all."""

    def __init__(self, number: int, why: str) -> None:
        super().__init__(f"record {number} of standard input cannot be appended: {why}")
        self.number = number


class AppendIncomplete(PartialFailure):
    """An append failed after some of its records were acknowledged: they are in the log."""

    def __init__(self, cause: BaseException, submitted: int, acked: int, first: DLSN | None) -> None:
        where = f" from DLSN {first}" if first is not None else ""
        if isinstance(cause, RecordRejected):
            # The records before it were all settled: acknowledged, or failed with a reason of their own.
            done = f"the {acked} record(s) before it were appended{where}" if acked == submitted else f"{acked} of the {submitted} record(s) before it were appended{where}"
            super().__init__(
                f"{cause}; {done}; nothing after it was read",
                hint=f"do not append the same input again: continue from record {cause.number} (one record per line: tail -n +{cause.number})",
            )
        else:
            why = cause.message if isinstance(cause, DlctlError) else f"{type(cause).__name__}: {cause}"
            # The failure's own hint says what to do about it (where to write instead, ...).
            first_hint = f"{cause.hint}; " if isinstance(cause, DlctlError) and cause.hint else ""
            super().__init__(
                f"{acked} of the {submitted} record(s) read were appended{where} before the append failed: {why}",
                hint=f"{first_hint}the others may or may not be in the log: look with `dlctl log tail` before appending them again",
            )


async def _append_via_proxy(session: ClusterSession, pool: AgentPool, name: str, records: AsyncIterable[bytes], region: str | None, idempotent: bool, on_progress: Any) -> dict[str, Any]:
    from ..log.producer import LogProducer, ProducerOptions

    producer = LogProducer(session.meta, pool, name, region=region, options=ProducerOptions(idempotent=idempotent))
    try:
        count, size, first, last = await _feed(producer, records, on_progress)
    finally:
        await producer.close()
    return {
        "records": count,
        "bytes": size,
        "first_dlsn": str(first) if first else None,
        "last_dlsn": str(last) if last and count else None,
        "via": producer.confirmed_owner,
        "idempotent": idempotent,
        "resent_requests": producer.stats["resent_requests"],
    }


async def _append_direct(session: ClusterSession, pool: AgentPool, name: str, records: AsyncIterable[bytes], owner_id: str | None, on_progress: Any) -> dict[str, Any]:
    from ..log.writer import LogWriter

    writer = await LogWriter.open(session.meta, pool, name, owner_id=owner_id)
    try:
        count, size, first, last = await _feed(writer, records, on_progress)
    finally:
        await writer.close()  # (after the previous owner's segments are recovered, if they were not yet)
    recovered = [r.to_dict() for r in writer.recovered]
    return {
        "records": count,
        "bytes": size,
        "first_dlsn": str(first) if first else None,
        "last_dlsn": str(last) if last and count else None,
        "via": "library writer",
        "recovered_previous_owner": recovered,
    }
