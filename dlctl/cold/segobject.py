"""A segment as one cold object: its entries, encoded exactly as the writer encoded them
(``dlctl.log.format``: header with CRC-32C, then payload), concatenated in entry order.

Reading one back checks everything a reader of the hot log would: each entry's CRC, that the
entries belong to the segment and follow each other from 0, and how many there are; the
manifest's SHA-256 of the whole object is checked on top (``manifest.verify``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from ..errors import DlctlError
from ..log import format as fmt


class CorruptObject(DlctlError, ValueError):
    """A cold object (or manifest) that does not hold what it claims; never served or restored.
    A ``DlctlError`` (exit 1, with what to do) wherever it ends a command, and still the
    ``ValueError`` of malformed data to the code that parses copies."""

    default_hint = (
        "a copy that does not match its manifest is never read or restored: put the object back from another copy of the store "
        "(the bucket's versioning, a copy of the volume), or read and restore without it"
    )


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_segment(encoded_entries: Iterable[bytes]) -> bytes:
    return b"".join(encoded_entries)


def iter_entries(data: bytes, *, where: str, log_id: int, seq: int, count: int) -> Iterator[fmt.Entry]:
    """The ``count`` entries of segment ``seq`` of log ``log_id`` held in ``data``, verified."""
    view = memoryview(data)
    offset = 0
    for expected in range(count):
        try:
            header = fmt.decode_header(view[offset : offset + fmt.HEADER_SIZE])
            entry = fmt.decode(view[offset : offset + header.total_size])
        except fmt.CorruptEntry as exc:
            raise CorruptObject(f"{where}: entry {expected} at byte {offset}: {exc.reason}") from None
        if (entry.log_id, entry.segment_seq, entry.entry_id) != (log_id, seq, expected):
            raise CorruptObject(
                f"{where}: byte {offset} holds entry {entry.entry_id} of segment {entry.segment_seq} of log id {entry.log_id}, "
                f"expected entry {expected} of segment {seq} of log id {log_id}"
            )
        offset += header.total_size
        yield entry
    if offset != len(data):
        raise CorruptObject(f"{where}: {len(data) - offset} bytes follow the last of its {count} entries")
