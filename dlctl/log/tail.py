"""Reading the end of a live log from its replicas: its segments, each one's last entry, and the
records of its last entries (what a new owner reads back to rebuild the state its predecessor
kept in memory: replication origins, producers' requests)."""

from __future__ import annotations

import asyncio

from ..meta.records import SegmentRecord, SegmentState
from ..meta.store import MetaStore
from .dlsn import DLSN
from .pool import AgentPool
from .records import Record, decode_records
from .speculative import ReplicaReader


async def log_segments(meta: MetaStore, log: str) -> tuple[int, list[SegmentRecord]]:
    """The log's id and its segments that still hold data (not truncated), oldest first."""
    loop = asyncio.get_running_loop()
    record = await loop.run_in_executor(None, meta.get_log, log)
    segments = await loop.run_in_executor(None, meta.segments, log)
    return record.value.log_id, [s.value for s in segments if s.value.state is not SegmentState.TRUNCATED]


async def last_entry(replicas: ReplicaReader, log_id: int, seg: SegmentRecord, *, quorum: bool = False) -> int:
    """The segment's last readable entry: its LAC while in progress (``quorum``: a quorum LAC
    read, ``ReplicaReader.read_lac``), else its recorded end."""
    if seg.state is SegmentState.INPROGRESS:
        return await replicas.read_lac(log_id, seg, quorum=quorum)
    return seg.last_entry_id


async def records_in_tail(
    meta: MetaStore,
    pool: AgentPool,
    log: str,
    *,
    max_entries: int,
    region: str | None = None,
    concurrency: int = 32,
    through_seq: int | None = None,
) -> list[tuple[DLSN, Record]]:
    """The data records (control records left out) of the last ``max_entries`` entries of log
    ``log`` (``through_seq``: of its segments up to that one), in log order, each with its
    position."""
    log_id, segments = await log_segments(meta, log)
    if through_seq is not None:
        segments = [s for s in segments if s.seq <= through_seq]
    replicas = ReplicaReader(pool, region=region)
    await pool.refresh()
    wanted: list[tuple[SegmentRecord, int]] = []
    for seg in reversed(segments):
        last = await last_entry(replicas, log_id, seg)
        for entry_id in range(last, seg.min_active_entry - 1, -1):
            wanted.append((seg, entry_id))
            if len(wanted) >= max_entries:
                break
        if len(wanted) >= max_entries:
            break
    wanted.reverse()
    gate = asyncio.Semaphore(concurrency)

    async def one(seg: SegmentRecord, entry_id: int) -> list[tuple[DLSN, Record]]:
        async with gate:
            entry = await replicas.read(log_id, seg, entry_id)
        return [(DLSN(seg.seq, entry_id, slot), r) for slot, r in enumerate(decode_records(entry.payload)) if not r.control]

    out: list[tuple[DLSN, Record]] = []
    for records in await asyncio.gather(*(one(s, e) for s, e in wanted)):
        out.extend(records)
    return out
