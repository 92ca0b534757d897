"""Reading a log's history from the cold store, then on into the hot log without a gap (issue
25 item 3): ``read_with_history`` for applications, and `dlctl log read LOG --from-cold`.

The hot log starts at its truncation point; what lies before it is read from the copies of the
same log incarnation (``dlctl log backup``), each checked whole (SHA-256 against its manifest)
before any of its records is given out, then entry by entry. The records keep their original
positions (DLSNs) and append times, so the two parts join exactly at the truncation point:
the copies must reach it (else the read stops with an error naming the missing segments, before
anything is printed), and a truncation that moves on while the hot part is opened is an error
too, never a silent gap. History older than the first copy was never backed up: the read starts
at the first copy, and says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

from ..errors import NotFoundError, RefusedError
from ..log.dlsn import DLSN
from ..log.pool import AgentPool
from ..log.reader import LogReader, ReadRecord
from ..meta.store import MetaStore
from ..meta.truncation import TruncationStore
from .catalog import check_contiguous, manifests
from .copies import copy_records
from .manifest import SegmentManifest
from .store import ColdStore

log = logging.getLogger(__name__)


def hot_start(meta: MetaStore, name: str) -> DLSN | None:
    """The first position the hot log still holds (its truncation point); None: never truncated."""
    record = TruncationStore(meta).get(name)
    return record.value.point if record is not None else None


def copies_before(store: ColdStore, name: str, log_id: int, start: DLSN) -> list[SegmentManifest]:
    """The copies holding what lies before ``start``, checked to reach it without a gap."""
    try:
        held = manifests(store, name, log_id)
    except NotFoundError:
        held = []
    check_contiguous(store, name, log_id, held)
    wanted = [m for m in held if m.segment.seq < start.segment_seq or (m.segment.seq == start.segment_seq and start > DLSN(start.segment_seq, 0, 0))]
    needed_last = start.segment_seq if start > DLSN(start.segment_seq, 0, 0) else start.segment_seq - 1
    have_last = wanted[-1].segment.seq if wanted else None
    if needed_last >= 1 and (have_last is None or have_last < needed_last):
        first_missing = (have_last or 0) + 1
        raise RefusedError(
            f"{store.describe()} has no copy of segment(s) {first_missing}..{needed_last} of log {name!r} "
            f"(log id {log_id}): the hot log starts at {start}, so the records before it cannot all be read",
            hint="`dlctl log backup` copies segments while they exist; nothing was printed",
        )
    if wanted and wanted[0].segment.seq > 1:
        log.warning("log %r: its cold copies start at segment %d; older records were never backed up", name, wanted[0].segment.seq)
    return wanted


def cold_records(store: ColdStore, copies: list[SegmentManifest], stop: DLSN) -> Iterator[ReadRecord]:
    """The data records of ``copies`` before ``stop``, in order, each copy checked whole first."""
    for manifest in copies:
        for dlsn, record, when in copy_records(store, manifest):
            if dlsn >= stop:
                return
            yield ReadRecord(dlsn, record.txid, record.payload, record.key, record.headers, when)


async def read_with_history(
    meta: MetaStore, pool: AgentPool, name: str, store: ColdStore, *, idle_timeout: float | None = 1.0, region: str | None = None
) -> AsyncIterator[ReadRecord]:
    """Every record of log ``name``: those before its truncation point from ``store``'s copies
    (each checked whole first), then the hot log from that point, tailing it until no record
    came for ``idle_timeout`` seconds (None: for ever). Records keep their positions and append
    times, so the two parts join exactly; a truncation that moves on while the hot part is
    opened raises ``RefusedError`` instead of leaving a silent gap."""
    start = hot_start(meta, name)
    if start is not None:
        loop = asyncio.get_running_loop()
        copies = await loop.run_in_executor(None, copies_before, store, name, meta.get_log(name).value.log_id, start)
        for manifest in copies:  # one copy in memory at a time, fetched off the event loop
            for record in await loop.run_in_executor(None, lambda m=manifest: list(cold_records(store, [m], start))):
                yield record
    async with LogReader(meta, pool, name, start_dlsn=start, region=region) as reader:
        if reader.truncation_skips:
            raise RefusedError(
                f"log {name!r} was truncated further while it was read ({reader.truncation_skips[0]}): "
                "the records in between were in neither the cold copies read nor the hot log",
                hint="back the log up (`dlctl log backup`) and read again",
            )
        while (record := await reader.read_next(idle_timeout)) is not None:
            yield record
