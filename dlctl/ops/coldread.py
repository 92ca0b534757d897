"""Reading a log's history from the cold store, then on into the hot log without a gap (issue
25 item 3): `dlctl log read LOG --from-cold`.

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

import logging
from collections.abc import Iterator

from ..cold.manifest import SegmentManifest
from ..cold.copies import checked_entries
from ..cold.store import ColdStore
from ..errors import NotFoundError, RefusedError
from ..log.dlsn import DLSN
from ..log.reader import ReadRecord
from ..log.records import decode_records
from ..log.recovery import append_time
from ..meta.truncation import TruncationStore
from .restore import check_contiguous, manifests
from .session import ClusterSession

log = logging.getLogger(__name__)


def hot_start(session: ClusterSession, name: str) -> DLSN | None:
    """The first position the hot log still holds (its truncation point); None: never truncated."""
    record = TruncationStore(session.meta).get(name)
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
        seg = manifest.segment
        entries = checked_entries(store, manifest)
        for entry in entries:
            records = list(decode_records(entry.payload))
            when = append_time(records)
            for slot, record in enumerate(records):
                if record.control:
                    continue
                dlsn = DLSN(seg.seq, entry.entry_id, slot)
                if dlsn >= stop:
                    return
                yield ReadRecord(dlsn, record.txid, record.payload, record.key, record.headers, when)
