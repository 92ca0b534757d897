"""Source-side filtering of a causal stream (issue 21): what the sink holds never crosses the WAN.

In a mesh every record reaches a location by every path; the sink's causality filter drops the
copies it holds already, but only after they crossed the network. A worker that reads a source
for a causal stream therefore sends the sink's location and version vector with its reads
(``FLAG_SKIP_SEEN`` on READ_ENTRY and LONG_POLL), and the source agent answers each replicated
record whose vector timestamp that vector dominates (or that originated at the sink) as a
*stub*: its headers stay (origin, vector time, producer mark: the worker still stamps the
source's clock, counts the record and keeps request groups whole), its key and payload do not,
and it carries ``dl.seen``. The entry is re-encoded with a CRC of its own, so the reader's
checks hold.

The same stubs answer a status probe (``FLAG_SUMMARY``: every data record, for a stream's lag or a
log's end, which need records' slots and an entry's totals, not their payloads).

Safe because the vector sent is a snapshot of the worker's filter, which only grows: by the
time the worker handles a stub, its filter skips the record anyway — and a stub that would be
admitted is an error, never an append. Records written at the source itself carry no vector
time (it is derived while reading) and always come whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..log import format as fmt
from ..log.records import Record, decode_records, encode_records
from .causal import dominated
from .origin import ORIGIN_CLUSTER, VECTOR_TIME, decode_vt

SEEN_MARK = "dl.seen"  # a stub: the sink holds this record (reserved ``dl.`` prefix: never relayed)


def in_sink_past(headers: Mapping[str, bytes], here: str, vv: Mapping[str, int]) -> bool:
    """A replicated record the sink ``here`` holds (it originated there, or ``vv`` dominates its
    vector time, ``here``'s own component aside: as ``CausalityFilter.admit``)."""
    origin, raw = headers.get(ORIGIN_CLUSTER), headers.get(VECTOR_TIME)
    if origin is None or raw is None:
        return False
    try:
        return origin.decode() == here or dominated(decode_vt(raw), vv, here)
    except (ValueError, UnicodeDecodeError):
        return False  # malformed: the sink's own checks report it


def stub_seen(entry: bytes | memoryview, here: str, vv: Mapping[str, int]) -> bytes | memoryview:
    """``entry`` (encoded, CRC-checked by the caller's store) with the records sink ``here``
    holds turned into stubs; the same bytes when there are none (or for a control entry)."""
    return _stub(entry, lambda r: in_sink_past(r.headers, here, vv))


def summary_only(entry: bytes | memoryview) -> bytes | memoryview:
    """``entry`` with every data record as a stub (FLAG_SUMMARY): what a status probe needs (the
    records' slots, the totals control record) without the payloads crossing the WAN."""
    return _stub(entry, lambda r: not r.control)


def _stub(entry: bytes | memoryview, chosen: Callable[[Record], bool]) -> bytes | memoryview:
    header = fmt.decode_header(entry)
    if header.flags & fmt.FLAG_CONTROL or header.length == 0:
        return entry
    records = list(decode_records(memoryview(entry)[fmt.HEADER_SIZE : header.total_size]))
    if not any(chosen(r) for r in records):
        return entry
    out = [Record(r.txid, b"", b"", {**r.headers, SEEN_MARK: b"1"}, r.control) if chosen(r) else r for r in records]
    return fmt.encode(fmt.Entry(header.log_id, header.segment_seq, header.entry_id, header.lac, encode_records(out), header.flags))
