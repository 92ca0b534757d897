"""Reading one segment copy back: fetched, checked whole against its manifest (size and
SHA-256), then entry by entry (CRC-32C, ids, count). Every reader of copies goes through here:
backup's --verify, restore and reads from the cold store."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import NotFoundError
from ..log import format as fmt
from ..log.dlsn import DLSN
from ..log.records import Record, decode_records
from ..log.recovery import append_time
from .manifest import SegmentManifest
from .segobject import CorruptObject, iter_entries
from .store import ColdStore


def checked_entries(store: ColdStore, manifest: SegmentManifest) -> list[fmt.Entry]:
    """The entries of the copy ``manifest`` describes; ``CorruptObject`` naming the object when
    it is missing or does not hold exactly what the manifest says."""
    where = f"{store.describe()}: {manifest.object}"
    try:
        data = store.get(manifest.object)
    except NotFoundError:
        raise CorruptObject(f"{where} is missing (its manifest is there)") from None
    manifest.verify(data)
    seg = manifest.segment
    return list(iter_entries(data, where=where, log_id=manifest.log_id, seq=seg.seq, count=seg.last_entry_id + 1))


def copy_records(store: ColdStore, manifest: SegmentManifest) -> Iterator[tuple[DLSN, Record, int | None]]:
    """The data records of the copy ``manifest`` describes, each with its original position and
    its entry's append time (ms; None: unknown), after the copy was checked whole."""
    seq = manifest.segment.seq
    for entry in checked_entries(store, manifest):
        records = list(decode_records(entry.payload))
        when = append_time(records)
        for slot, record in enumerate(records):
            if not record.control:
                yield DLSN(seq, entry.entry_id, slot), record, when
