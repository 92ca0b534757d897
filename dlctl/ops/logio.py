"""Reading (and, with the writer, appending) records of a log for the command line."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

from ..log.dlsn import DLSN
from ..log.pool import AgentPool
from ..log.reader import LogReader, ReadRecord
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


