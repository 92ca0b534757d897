"""Reading cold store copies the way a test's oracle should: with the wire format only
(``dlctl.log.format`` and the record encoding), never through the code that wrote them."""

from __future__ import annotations

from collections.abc import Iterable

from dlctl.log import format as fmt
from dlctl.log.records import decode_records


def segment_payloads(objects: Iterable[bytes]) -> list[bytes]:
    """The data records' payloads of segment objects (each: encoded entries back to back), in
    the order given."""
    out = []
    for data in objects:
        offset = 0
        while offset < len(data):
            header = fmt.decode_header(data[offset : offset + fmt.HEADER_SIZE])
            entry = fmt.decode(data[offset : offset + header.total_size])
            out += [r.payload for r in decode_records(entry.payload) if not r.control]
            offset += header.total_size
    return out
