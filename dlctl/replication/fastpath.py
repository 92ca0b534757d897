"""A stream worker's loop over whole source entries, in C: catch-up without Python per record.

A one-way stream applies most records unchanged but for three headers: a record written at the
source itself (no headers of its own) is appended at the sink with ``dl.origin.cluster`` (the
source), ``dl.origin.dlsn`` (where it was read) and ``dl.vt`` (its vector time: the source's
clock, its own counter one up), in that order, under the sink writer's next txid — exactly what
the worker's per-record path builds with ``origin.applied_headers``. For an entry of such
records, ``_speedups.stream_local`` writes the sink's records in one go and the sink writer
takes them as one piece (``LogWriter.submit_encoded``); the reader hands the entry over whole
(``LogReader.take_entry``) without decoding it.

Anything else goes the per-record way, from the first record where it differs: records with
headers (relayed records, a producer's requests, application headers), a clock step or settled
components in the entry's range, a causal stream or a filter (the worker does not offer it
then), or no C extension. ``tests/unit/test_stream_fastpath.py`` holds the two paths to the
same bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..log.dlsn import DLSN
from ..log.reader import WholeEntry
from ..log.records import CorruptRecords
from .causal import SourceClock
from .origin import ORIGIN_CLUSTER, ORIGIN_DLSN, VECTOR_TIME

try:
    from .. import _speedups
except ImportError:  # no compiler at install time: the per-record path does all the work
    _speedups = None  # type: ignore[assignment]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def available() -> bool:
    return _speedups is not None and hasattr(_speedups, "stream_local")


@dataclass(frozen=True, slots=True)
class Piece:
    """Sink records built from part of a source entry."""

    encoded: bytes  # ``count`` records, dlctl.log.records' layout
    count: int
    first_txid: int
    payload_bytes: int
    next_pos: int  # where the entry's records go on (byte offset in its payload; its length: done)
    next_slot: int
    last: DLSN | None  # the last data record's position at the source (None: only control records)


class LocalEntries:
    """Builds the sink records of a stream from ``source`` out of whole source entries, at most
    ``limit`` bytes of them per piece (one sink entry's worth)."""

    def __init__(self, source: str, limit: int) -> None:
        if not available():
            raise RuntimeError("dlctl._speedups.stream_local is not built")
        cluster, dlsn, vt = (name.encode() for name in (ORIGIN_CLUSTER, ORIGIN_DLSN, VECTOR_TIME))
        value = source.encode()
        # The fixed parts of the three headers (u16 name length, name, u32 value length, value):
        # the cluster header whole, then the names the C loop writes the values after.
        self._head = _U16.pack(len(cluster)) + cluster + _U32.pack(len(value)) + value + _U16.pack(len(dlsn)) + dlsn
        self._vt_name = _U16.pack(len(vt)) + vt
        self.limit = limit

    def piece(self, entry: WholeEntry, pos: int, slot: int, clock: SourceClock, first_txid: int) -> Piece | None:
        """The next piece of ``entry`` from byte ``pos`` (record ``slot``), the clock advanced
        past it; None: the rest of the entry takes the per-record path."""
        template = clock.local_template(DLSN(entry.seq, entry.entry_id + 1, 0))
        if template is None:
            return None
        head, tail = template
        seq_prefix = b"%d/%d/" % (entry.seq, entry.entry_id)
        try:
            built = _speedups.stream_local(
                entry.payload, pos, len(entry.payload), slot, seq_prefix, self._head, self._vt_name, head, tail, clock.local_counter, first_txid, self.limit,
            )
        except ValueError as exc:
            raise CorruptRecords(f"entry {entry.entry_id} of segment {entry.seq}: {exc}") from None
        if built is None:
            return None
        encoded, count, counter, next_pos, next_slot, last_slot, payload_bytes = built
        clock.advance_local(counter)
        last = DLSN(entry.seq, entry.entry_id, last_slot) if count else None
        return Piece(encoded, count, first_txid, payload_bytes, next_pos, next_slot, last)
