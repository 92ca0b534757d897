"""Reading (and, with the writer, appending) records of a log for the command line."""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, BinaryIO

from ..log.dlsn import DLSN
from ..log.pool import AgentPool
from ..log.reader import LogReader, ReadRecord
from ..errors import UsageError
from .session import ClusterSession


def record_view(record: ReadRecord) -> dict[str, Any]:
    """A record as plain data: payload as text when it is UTF-8, else base64 (``payload_b64``)."""
    out: dict[str, Any] = {"dlsn": str(record.dlsn), "txid": record.txid}
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
    limit: int | None = None,
    idle_timeout: float | None = 1.0,
    region: str | None = None,
) -> AsyncIterator[ReadRecord]:
    """Yield records from the start position; stop after ``limit`` records or, when
    ``idle_timeout`` is set, once no record arrived for that long (caught up). ``None`` follows
    the tail forever."""
    pool = AgentPool(session.meta, session.secret)
    try:
        async with LogReader(session.meta, pool, name, start_dlsn=start_dlsn, start_txid=start_txid, region=region) as reader:
            count = 0
            while limit is None or count < limit:
                record = await reader.read_next(idle_timeout)
                if record is None:
                    return
                count += 1
                yield record
    finally:
        await pool.close()




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
        body = stream.read(size)
        if len(body) < size:
            raise UsageError(f"standard input: record at byte {offset} claims {size} bytes, only {len(body)} follow")
        offset += 4 + size
        yield body


async def append_records(session: ClusterSession, name: str, records: Iterable[bytes], *, owner_id: str | None = None, on_progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Append every record through the library writer (pipelined, batched) and close cleanly."""
    from ..log.writer import LogWriter

    pool = AgentPool(session.meta, session.secret)
    count = size = 0
    first: DLSN | None = None
    started = time.monotonic()
    try:
        writer = await LogWriter.open(session.meta, pool, name, owner_id=owner_id)
        try:
            for payload in records:
                await writer.wait_writable()
                fut = writer.submit(payload)
                if first is None:
                    first = await fut
                count += 1
                size += len(payload)
                if on_progress is not None and count % 1000 == 0:
                    on_progress(count)
            last = await writer.flush()
            recovered = [r.to_dict() for r in writer.recovered]
        finally:
            await writer.close()
    finally:
        await pool.close()
    elapsed = time.monotonic() - started
    return {
        "log": name,
        "records": count,
        "bytes": size,
        "first_dlsn": str(first) if first else None,
        "last_dlsn": str(last) if last and count else None,
        "seconds": round(elapsed, 3),
        "records_per_second": round(count / elapsed) if elapsed > 0 else None,
        "recovered_previous_owner": recovered,
    }
