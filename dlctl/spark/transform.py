"""Re-encoding source entries as sink entries, and the record-content digest (pure, no I/O).

A bootstrap copies a source segment entry by entry, **keeping entry ids and slots**: sink entry
*e* of sink segment *S* holds exactly the records of source entry *e* of source segment *s*, in
the same slots, so a record's origin position is where it sits (plus *s*). Each data record is
re-headed in place (bytes spliced, the payload never decoded or copied twice):

* a record written locally at the source gets ``dl.origin.cluster`` (the source cluster),
  ``dl.origin.dlsn`` (its source DLSN) and ``dl.vt`` (its vector timestamp, derived by
  ``dlctl.replication.causal.SourceClock`` exactly as a stream would);
* a record that was itself replicated into the source keeps its origin headers (its origin is
  elsewhere) and its clock advances the source's version vector;
* every record gets ``dl.src`` = ``<source cluster>@<source DLSN>``: a worker that later streams
  into the same sink log resumes after the last one (``dlctl.replication.origin``).

Per record rather than per entry because every consumer (the stream worker resuming at the
tail, causality filters of further locations) reads origins per record; the cost is a few
header bytes and a few µs of Python per record, measured by ``tests/benchmarks/bench_bootstrap.py``.

Control records are kept in their slots; the writer's per-entry totals record (the last
record of every entry: data records and bytes of the segment so far) is rewritten with the
*sink* segment's totals, so recovery tooling reading a sink segment sees true numbers.

The **content digest** of a segment is taken over each data record's canonical encoding: the
record with every reserved ``dl.*`` header left out (txid, key, application headers, payload;
control records excluded). Per entry it summarises the canonical encodings of the entry's data
records as (record count, bytes, CRC-32C), and the digest is SHA-256 over those summaries in
entry order; the copy computes it once over the source entries as read and once over the sink
entries as written (each side parsing its own bytes), and the two must be equal. CRC-32C rather
than a cryptographic hash over every byte: the bytes are already CRC-checked end to end (writer,
agents, reader); what the digest must catch is a copy that changed, lost, added or moved a
record, and a 32-bit CRC per entry misses such a change with odds of 2^-32 while costing a
twentieth of SHA-256 (both sides together were a third of a copy task's CPU).

Hot path. ``dlctl/_speedups.c`` runs the two per-record loops in C when it was built (it is
optional: a node without a compiler, or Spark executors that receive dlctl as a zip, use the
Python loops here, which are the reference the C code is tested against): the content summary
of an entry, and the copy of an entry whose data records are local and carry no headers (what
writers write), which goes over the records twice — once to check them and size the sink
payload, once to write it into one buffer with room for the entry header in front. An entry
with any data record that has headers (application headers, or an origin elsewhere) is copied
by the Python loop, where records without key or headers take a path of a handful of
operations and the rest the general path, which parses every header.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..log import format as fmt
from ..log.records import FLAG_CONTROL, RECORD_FIXED, RECORD_PLAIN, TOTALS, TOTALS_UNTIMED, CorruptRecords
from ..replication.causal import merge
from ..replication.origin import ORIGIN_CLUSTER, ORIGIN_DLSN, RESERVED_PREFIX, SOURCE_POSITION, VECTOR_TIME, encode_vt

try:  # the same loops in C (dlctl/_speedups.c); absent where nothing compiled it
    from .. import _speedups
except ImportError:  # pragma: no cover - exercised by tests that hide the module
    _speedups = None

_FIXED, _PLAIN = RECORD_FIXED, RECORD_PLAIN  # records.py's layout (local names for the hot loops)
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_TOTALS, _TOTALS_UNTIMED = TOTALS, TOTALS_UNTIMED  # the writer's totals record (records.py)
_U64 = struct.Struct(">Q")
_SUMMARY = struct.Struct(">IQI")  # per entry in the content digest: data records, canonical bytes, CRC-32C
_RESERVED = RESERVED_PREFIX.encode()
_ORIGIN_CLUSTER = ORIGIN_CLUSTER.encode()
_ORIGIN_DLSN = ORIGIN_DLSN.encode()
_VECTOR_TIME = VECTOR_TIME.encode()
_SOURCE_POSITION = SOURCE_POSITION.encode()
_MIN_RECORD = _FIXED.size + 2  # size field, flags, txid, key length, header count
_TOTALS_SIZES = (_MIN_RECORD - 4 + _TOTALS.size, _MIN_RECORD - 4 + _TOTALS_UNTIMED.size)  # a totals record's ``size`` field, less its key


def _header(name: bytes, value: bytes) -> bytes:
    return b"".join((_U16.pack(len(name)), name, _U32.pack(len(value)), value))


@dataclass(frozen=True, slots=True)
class _Rec:
    """Where the parts of one record lie in an entry payload."""

    start: int  # the size field
    stop: int  # one past the payload
    flags: int
    txid: int
    key_end: int  # one past the key (the key starts at start + 15)
    headers: tuple[tuple[bytes, int, int], ...]  # (name, start of the header, end of the header)
    payload_start: int


def _parse_one(view: memoryview | bytes, pos: int, end: int, base: int = 0) -> _Rec:
    """The record at ``pos`` (byte ``pos - base`` of the payload, as errors name it)."""
    unpack16, unpack32 = _U16.unpack_from, _U32.unpack_from
    if end - pos < _MIN_RECORD:
        raise CorruptRecords(f"truncated record header at byte {pos - base}")
    size, flags, txid, key_len = _FIXED.unpack_from(view, pos)
    stop = pos + 4 + size
    key_end = pos + _FIXED.size + key_len
    if stop > end or key_end + 2 > stop:
        raise CorruptRecords(f"record at byte {pos - base} claims {size} bytes, {end - pos - 4} remain")
    (count,) = unpack16(view, key_end)
    cur = key_end + 2
    headers = []
    for _ in range(count):
        if cur + 2 > stop:
            raise CorruptRecords(f"record at byte {pos - base}: header overruns the record")
        (name_len,) = unpack16(view, cur)
        if cur + 2 + name_len + 4 > stop:
            raise CorruptRecords(f"record at byte {pos - base}: header overruns the record")
        name = bytes(view[cur + 2 : cur + 2 + name_len])
        (value_len,) = unpack32(view, cur + 2 + name_len)
        h_end = cur + 6 + name_len + value_len
        if h_end > stop:
            raise CorruptRecords(f"record at byte {pos - base}: header value overruns the record")
        headers.append((name, cur, h_end))
        cur = h_end
    return _Rec(pos, stop, flags, txid, key_end, tuple(headers), cur)


def parse(view: memoryview) -> list[_Rec]:
    """Every record of an entry payload, or ``CorruptRecords`` naming the byte where it breaks."""
    out = []
    pos, end = 0, len(view)
    while pos < end:
        rec = _parse_one(view, pos, end)
        out.append(rec)
        pos = rec.stop
    return out


def canonical_summary(buf: bytes | bytearray, start: int = 0, end: int | None = None) -> tuple[int, int, int]:
    """(data records, bytes, CRC-32C) of the canonical encodings of the records in
    ``buf[start:end]`` (an entry payload); ``CorruptRecords`` names the byte where it breaks."""
    end = len(buf) if end is None else end
    if _speedups is None:
        return canonical_summary_py(buf, start, end)
    try:
        return _speedups.canonical_summary(buf, start, end)
    except ValueError as exc:
        raise CorruptRecords(str(exc)) from None


def canonical_summary_py(buf: bytes | bytearray, start: int = 0, end: int | None = None) -> tuple[int, int, int]:
    """``canonical_summary`` in Python: the reference the C loop is tested against.

    A record without ``dl.*`` headers is its own canonical encoding, so runs of them are fed to
    the CRC as they lie; only a record with reserved headers is fed piece by piece."""
    end = len(buf) if end is None else end
    view = memoryview(buf)
    unpack_fixed, unpack16, unpack32, crc32c, startswith = _FIXED.unpack_from, _U16.unpack_from, _U32.unpack_from, fmt.crc32c, buf.startswith
    crc = nbytes = records = 0
    run_start = run_end = pos = start
    while pos < end:
        if end - pos < _MIN_RECORD:
            raise CorruptRecords(f"truncated record header at byte {pos - start}")
        size, flags, txid, key_len = unpack_fixed(buf, pos)
        stop = pos + 4 + size
        key_end = pos + _FIXED.size + key_len
        if stop > end or key_end + 2 > stop:
            raise CorruptRecords(f"record at byte {pos - start} claims {size} bytes, {end - pos - 4} remain")
        count = buf[key_end] << 8 | buf[key_end + 1]
        if flags & FLAG_CONTROL:
            pos = stop
            continue
        records += 1
        user: list[tuple[int, int]] | None = None
        cur = key_end + 2
        if count:
            user = []
            reserved = 0
            try:
                for _ in range(count):
                    name_len = unpack16(buf, cur)[0]
                    h_end = cur + 6 + name_len + unpack32(buf, cur + 2 + name_len)[0]
                    if h_end > stop:  # (the name and the value length lie before h_end)
                        break
                    if name_len > 2 and startswith(_RESERVED, cur + 2):
                        reserved += 1
                    else:
                        user.append((cur, h_end))
                    cur = h_end
                else:
                    h_end = cur
            except struct.error:  # read past the buffer
                h_end = stop + 1
            if h_end > stop:
                raise CorruptRecords(f"record at byte {pos - start}: header overruns the record")
            if not reserved:
                user = None  # nothing reserved: the bytes are the canonical encoding
        if user is None:
            if pos != run_end:
                if run_end > run_start:
                    crc = crc32c(view[run_start:run_end], crc)
                    nbytes += run_end - run_start
                run_start = pos
            run_end = stop
        else:
            if run_end > run_start:
                crc = crc32c(view[run_start:run_end], crc)
                nbytes += run_end - run_start
            run_start = run_end = stop
            if user:
                size = (_FIXED.size - 4) + key_len + 2 + sum(e - s for s, e in user) + (stop - cur)
                crc = crc32c(_FIXED.pack(size, flags, txid, key_len), crc)
                crc = crc32c(view[pos + _FIXED.size : key_end], crc)
                crc = crc32c(_U16.pack(len(user)), crc)
                for s, e in user:
                    crc = crc32c(view[s:e], crc)
            elif key_len:
                size = (_FIXED.size - 4) + key_len + 2 + (stop - cur)
                crc = crc32c(_FIXED.pack(size, flags, txid, key_len), crc)
                crc = crc32c(view[pos + _FIXED.size : key_end], crc)
                crc = crc32c(b"\x00\x00", crc)
            else:  # only reserved headers (every record a copy wrote): one fixed part
                size = (_PLAIN.size - 4) + (stop - cur)
                crc = crc32c(_PLAIN.pack(size, flags, txid, 0, 0), crc)
            crc = crc32c(view[cur:stop], crc)
            nbytes += 4 + size
        pos = stop
    if run_end > run_start:
        crc = crc32c(view[run_start:run_end], crc)
        nbytes += run_end - run_start
    return records, nbytes, crc


class ContentDigest:
    """The running content digest of a segment (see the module docstring) and its record count."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.records = 0
        self.summaries: list[tuple[int, int, int]] = []  # per entry, to name the first that differs

    def _add(self, buf: bytes | bytearray, start: int, end: int) -> None:
        summary = canonical_summary(buf, start, end)
        self._h.update(_SUMMARY.pack(*summary))
        self.summaries.append(summary)
        self.records += summary[0]

    def add_payload(self, payload: bytes | bytearray | memoryview) -> None:
        buf = payload if isinstance(payload, (bytes, bytearray)) else bytes(payload)
        self._add(buf, 0, len(buf))

    def add_entry(self, encoded: bytes | bytearray, start: int = 0) -> None:
        """The encoded entry at ``encoded[start:]`` (its payload: the ``length`` bytes after the header)."""
        (length,) = _U32.unpack_from(encoded, start + fmt.HEADER_SIZE - 8)
        if start + fmt.HEADER_SIZE + length > len(encoded):
            raise CorruptRecords(f"entry of {len(encoded) - start} bytes announces a payload of {length}")
        self._add(encoded, start + fmt.HEADER_SIZE, start + fmt.HEADER_SIZE + length)

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def first_difference(self, other: ContentDigest) -> int | None:
        """The index of the first entry whose summary differs from ``other``'s (None: none)."""
        for i, (a, b) in enumerate(zip(self.summaries, other.summaries)):
            if a != b:
                return i
        return None if len(self.summaries) == len(other.summaries) else min(len(self.summaries), len(other.summaries))


def content_digest(payloads: Iterable[bytes | memoryview]) -> str:
    d = ContentDigest()
    for payload in payloads:
        d.add_payload(payload)
    return d.hexdigest()


# -- vector time, as SourceClock keeps it, with the common case (only the source's own counter) cheap --


class Clock:
    """``dlctl.replication.causal.SourceClock`` with the encoded timestamp of a local record
    built without a dict copy per record. ``vv`` is the source log's version vector before the
    next record; ``settled``: retired locations local timestamps omit where the vector holds
    exactly their settled last counter (``dlctl.replication.causal.settle``)."""

    def __init__(self, location: str, vv: Mapping[str, int] | None = None, *, settled: Mapping[str, int] | None = None) -> None:
        self.location = location
        self.vv: dict[str, int] = dict(vv or {})
        self.settled = {k: v for k, v in (settled or {}).items() if k != location}
        self._others_dirty = True
        self._before = b""
        self._after = b""

    def _split(self) -> None:
        # The encoded form is sorted by location: the own counter sits between two fixed parts.
        others = {k: v for k, v in self.vv.items() if k != self.location and v > 0 and self.settled.get(k) != v}
        before = encode_vt({k: v for k, v in others.items() if k < self.location})
        after = encode_vt({k: v for k, v in others.items() if k > self.location})
        self._before = before + b"," if before else b""
        self._after = b"," + after if after else b""
        self._own = self.location.encode() + b"="
        self._others_dirty = False

    def stamp_local(self) -> bytes:
        count = self.vv.get(self.location, 0) + 1
        self.vv[self.location] = count
        if self._others_dirty:
            self._split()
        return b"%s%s%d%s" % (self._before, self._own, count, self._after)

    def stamp_replicated(self, vt: Mapping[str, int]) -> None:
        self.vv = merge(self.vv, vt)
        self._others_dirty = True

    def local_template(self) -> tuple[bytes, bytes]:
        """(before, after): the timestamp ``stamp_local`` gives when the own counter becomes
        *n* is ``before + b"%d" % n + after`` (for the copier's hot loop, which keeps the
        counter itself and writes it back to ``vv``)."""
        if self._others_dirty:
            self._split()
        return self._before + self._own, self._after


@dataclass
class CopyStats:
    records: int = 0  # data records
    local_records: int = 0  # written at the source itself (their origin is the source)
    entries: int = 0
    sink_bytes: int = 0  # encoded sink entries, headers included (the segment's ``bytes``)
    first_txid: int | None = None
    last_txid: int = -1
    last_data_slot: tuple[int, int] | None = None  # (entry id, slot) of the last data record
    vts: dict[str, int] = field(default_factory=dict)  # merge of every record's timestamp


class EntryCopier:
    """Turns the entries of one source segment, in entry-id order, into sink entries."""

    def __init__(self, *, source_cluster: str, source_seq: int, sink_log_id: int, sink_seq: int, clock: Clock, speedups: bool = True) -> None:
        self.source_seq = source_seq
        self._fast = speedups and _speedups is not None
        self.sink_log_id = sink_log_id
        self.sink_seq = sink_seq
        self.clock = clock
        self.stats = CopyStats()
        self._cluster_header = _header(_ORIGIN_CLUSTER, source_cluster.encode())
        self._dlsn_name = _U16.pack(len(_ORIGIN_DLSN)) + _ORIGIN_DLSN
        self._vt_name = _U16.pack(len(_VECTOR_TIME)) + _VECTOR_TIME
        self._src_name = _U16.pack(len(_SOURCE_POSITION)) + _SOURCE_POSITION
        self._src_prefix = f"{source_cluster}@".encode()
        # What a local record's four new headers add to its size, less the three variable values.
        self._added_fixed = len(self._cluster_header) + len(self._dlsn_name) + len(self._vt_name) + len(self._src_name) + 3 * 4 + len(self._src_prefix)

    def copy(self, encoded: bytes | bytearray, start: int = 0) -> bytearray:
        """The sink entry for the source entry at ``encoded[start:]`` (already CRC-verified by
        the reader; ``start``: entries read in bulk are copied from the buffer they came in)."""
        buf = encoded
        view = memoryview(buf)
        header = fmt.decode_header(view[start : start + fmt.HEADER_SIZE])
        if header.segment_seq != self.source_seq:
            raise ValueError(f"entry of segment {header.segment_seq} given to the copier of segment {self.source_seq}")
        base = start + fmt.HEADER_SIZE
        end = base + header.length
        if end > len(encoded):
            raise CorruptRecords(f"entry of {len(encoded) - start} bytes announces a payload of {header.length}")
        entry_id = header.entry_id
        clock = self.clock
        own = clock.location
        counter = clock.vv.get(own, 0)  # the own counter, kept here while records are stamped
        before, after = clock.local_template()
        cluster_dlsn = self._cluster_header + self._dlsn_name
        vt_name, src_name, src_prefix = self._vt_name, self._src_name, self._src_prefix
        seq_prefix = b"%d/%d/" % (self.source_seq, entry_id)
        if self._fast:
            try:
                fast = _speedups.copy_local(buf, base, end, seq_prefix, cluster_dlsn, vt_name, src_name, src_prefix, before, after, counter, fmt.HEADER_SIZE)
            except ValueError as exc:
                raise CorruptRecords(str(exc)) from None
            if fast is not None:  # every data record was local and without headers
                out, records, counter, first_txid, last_txid, last_slot, totals_txid, append_ms = fast
                if counter != clock.vv.get(own, 0):
                    clock.vv[own] = counter
                self._count(records, records, first_txid, last_txid, entry_id, last_slot)
                if totals_txid is not None:
                    out += self._totals(totals_txid, len(out) + len(_totals_bytes(0, 0, 0)), append_ms)
                return self._seal(out, header)
        added_fixed = self._added_fixed
        unpack_fixed, pack_fixed, pack_plain, pack32 = _FIXED.unpack_from, _FIXED.pack, _PLAIN.pack, _U32.pack
        parts: list[bytes | memoryview] = [b""]  # [0]: the entry header, filled in at the end
        append = parts.append
        length = 0  # of the sink payload so far
        records = local = 0
        first_txid = last_txid = None
        last_slot = -1
        totals_txid = None
        append_ms = 0
        slot = 0
        pos = base
        while pos < end:
            if end - pos < _MIN_RECORD:
                raise CorruptRecords(f"truncated record header at byte {pos - base}")
            size, flags, txid, key_len = unpack_fixed(buf, pos)
            stop = pos + 4 + size
            key_end = pos + 15 + key_len
            if stop > end or key_end + 2 > stop:
                raise CorruptRecords(f"record at byte {pos - base} claims {size} bytes, {end - pos - 4} remain")
            if flags & FLAG_CONTROL:
                if stop == end and size - key_len in _TOTALS_SIZES and not (buf[key_end] or buf[key_end + 1]):
                    totals_txid = txid  # the writer's totals: rewritten below with the sink's
                    if size - key_len == _TOTALS_SIZES[0]:
                        append_ms = _U64.unpack_from(buf, stop - 8)[0]  # the source entry's append time, kept
                else:
                    append(view[pos:stop])
                    length += stop - pos
            elif buf[key_end] or buf[key_end + 1]:
                # Headers (application headers, or an origin elsewhere): the general path.
                if counter != clock.vv.get(own, 0):
                    clock.vv[own] = counter
                length += self._copy_general(_parse_one(view, pos, end, base), view, seq_prefix + b"%d" % slot, parts)
                counter = clock.vv.get(own, 0)
                before, after = clock.local_template()
                records += 1
                if first_txid is None:
                    first_txid = txid
                last_txid, last_slot = txid, slot
            else:
                # Written at the source, no headers: origin, DLSN, timestamp and position added.
                counter += 1
                dlsn = seq_prefix + b"%d" % slot
                stamp = b"%s%d%s" % (before, counter, after)
                n = len(dlsn)
                new_size = size + added_fixed + n + n + len(stamp)
                if key_len:
                    append(pack_fixed(new_size, flags, txid, key_len))
                    append(view[pos + 15 : key_end])
                    append(b"\x00\x04")
                else:
                    append(pack_plain(new_size, flags, txid, 0, 4))
                append(b"%s%s%s%s%s%s%s%s%s%s" % (cluster_dlsn, pack32(n), dlsn, vt_name, pack32(len(stamp)), stamp, src_name, pack32(n + len(src_prefix)), src_prefix, dlsn))
                append(view[key_end + 2 : stop])
                length += 4 + new_size
                records += 1
                local += 1
                if first_txid is None:
                    first_txid = txid
                last_txid, last_slot = txid, slot
            slot += 1
            pos = stop
        if counter != clock.vv.get(own, 0):
            clock.vv[own] = counter
        self._count(records, local, first_txid, last_txid, entry_id, last_slot)
        if totals_txid is not None:
            append(self._totals(totals_txid, fmt.HEADER_SIZE + length + len(_totals_bytes(0, 0, 0)), append_ms))
        parts[0] = bytes(fmt.HEADER_SIZE)
        return self._seal(bytearray().join(parts), header)  # one copy of every byte, into the buffer that is sent

    def _count(self, records: int, local: int, first_txid: int | None, last_txid: int | None, entry_id: int, last_slot: int) -> None:
        stats = self.stats
        stats.records += records
        stats.local_records += local
        if records:
            if stats.first_txid is None:
                stats.first_txid = first_txid
            stats.last_txid = last_txid  # type: ignore[assignment]
            stats.last_data_slot = (entry_id, last_slot)

    def _totals(self, txid: int, entry_size: int, append_ms: int) -> bytes:
        """The writer's per-entry totals record, with the sink segment's numbers once this
        entry (``entry_size`` bytes, the record included) is written, and the source entry's
        append time (0: unknown): a copied record keeps the time it was appended at."""
        return _totals_bytes(txid, self.stats.records, self.stats.sink_bytes + entry_size, append_ms)

    def _seal(self, out: bytearray, header: fmt.EntryHeader) -> bytearray:
        """Fill in the entry header before the sink payload in ``out`` and its CRC."""
        length = len(out) - fmt.HEADER_SIZE
        if length > fmt.MAX_PAYLOAD:
            raise ValueError(f"sink entry {header.entry_id} would hold {length} bytes, above the {fmt.MAX_PAYLOAD}-byte maximum")
        fields = fmt.HEADER_FIELDS.pack(fmt.MAGIC, fmt.FORMAT_VERSION, header.flags, 0, self.sink_log_id, self.sink_seq, header.entry_id, header.lac, length)
        out[: len(fields)] = fields
        with memoryview(out) as whole:
            crc = fmt.crc32c(whole[fmt.HEADER_SIZE :], fmt.crc32c(fields))
        out[fmt.HEADER_SIZE - 4 : fmt.HEADER_SIZE] = _U32.pack(crc)
        self.stats.entries += 1
        self.stats.sink_bytes += len(out)
        return out

    def _copy_general(self, rec: _Rec, view: memoryview, dlsn: bytes, parts: list) -> int:
        """Re-head one record that has headers; returns the bytes it adds to ``parts``."""
        stats = self.stats
        key_len = rec.key_end - rec.start - _FIXED.size
        kept: list[memoryview] = []
        replicated = False
        for name, s, e in rec.headers:
            if name == _SOURCE_POSITION:
                continue  # the position in *our* source replaces a relay's
            if name == _ORIGIN_CLUSTER:
                replicated = True
            kept.append(view[s:e])
        added: list[bytes]
        if replicated:
            vt = _vt_of(view, rec)
            self.clock.stamp_replicated(vt)
            stats.vts = merge(stats.vts, vt)
            added = []
        else:
            stamp = self.clock.stamp_local()
            added = [self._cluster_header, self._dlsn_name + _U32.pack(len(dlsn)) + dlsn, self._vt_name + _U32.pack(len(stamp)) + stamp]
            stats.local_records += 1
        src = self._src_prefix + dlsn
        added.append(self._src_name + _U32.pack(len(src)) + src)
        body = sum(len(k) for k in kept) + sum(len(a) for a in added)
        size = (_FIXED.size - 4) + key_len + 2 + body + (rec.stop - rec.payload_start)
        parts.append(_FIXED.pack(size, rec.flags, rec.txid, key_len))
        parts.append(view[rec.start + _FIXED.size : rec.key_end])
        parts.append(_U16.pack(len(kept) + len(added)))
        parts.extend(kept)
        parts.extend(added)
        parts.append(view[rec.payload_start : rec.stop])
        return 4 + size




def _totals_bytes(txid: int, records: int, nbytes: int, append_ms: int = 0) -> bytes:
    payload = _TOTALS.pack(records, nbytes, append_ms)
    return _FIXED.pack(_FIXED.size - 4 + 2 + len(payload), FLAG_CONTROL, txid, 0) + _U16.pack(0) + payload


def _vt_of(view: memoryview, rec: _Rec) -> dict[str, int]:
    from ..replication.origin import decode_vt

    for name, s, e in rec.headers:
        if name == _VECTOR_TIME:
            value_start = s + 2 + len(name) + 4
            return decode_vt(bytes(view[value_start:e]))
    return {}


# -- the clock summary of a segment (for logs that hold replicated records) --------------------------


@dataclass(frozen=True)
class ClockEffect:
    """What reading a segment does to the source's version vector ``vv``:
    ``vv[own] -> max(vv[own] + add, floor)`` and every other component ``-> max(it, others[it])``.

    Composable (``then``), so the driver turns per-segment effects into each segment's starting
    vector with a prefix fold, while the segments themselves are scanned in parallel."""

    add: int = 0
    floor: int = 0
    others: Mapping[str, int] = field(default_factory=dict)

    def then(self, later: ClockEffect) -> ClockEffect:
        return ClockEffect(self.add + later.add, max(self.floor + later.add, later.floor), merge(self.others, later.others))

    def apply(self, location: str, vv: Mapping[str, int]) -> dict[str, int]:
        out = merge(vv, {k: v for k, v in self.others.items() if k != location})
        own = max(vv.get(location, 0) + self.add, self.floor)
        if own > 0:
            out[location] = own
        return out

    def to_dict(self) -> dict:
        return {"add": self.add, "floor": self.floor, "others": dict(self.others)}

    @classmethod
    def from_dict(cls, raw: Mapping) -> ClockEffect:
        return cls(int(raw.get("add", 0)), int(raw.get("floor", 0)), {str(k): int(v) for k, v in dict(raw.get("others", {})).items()})


class ClockScanner:
    """Accumulates the ``ClockEffect`` of a segment's entries, read in order."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._add = self._floor = 0
        self._others: dict[str, int] = {}
        self.replicated = 0

    @property
    def effect(self) -> ClockEffect:
        return ClockEffect(self._add, self._floor, dict(self._others))

    def add_entry(self, encoded: bytes | bytearray, start: int = 0) -> None:
        (length,) = _U32.unpack_from(encoded, start + fmt.HEADER_SIZE - 8)
        view = memoryview(encoded)[start + fmt.HEADER_SIZE : start + fmt.HEADER_SIZE + length]
        for rec in parse(view):
            if rec.flags & FLAG_CONTROL:
                continue
            if any(name == _ORIGIN_CLUSTER for name, _s, _e in rec.headers):
                vt = _vt_of(view, rec)
                self._floor = max(self._floor, vt.get(self.location, 0))
                self._others = merge(self._others, {k: v for k, v in vt.items() if k != self.location})
                self.replicated += 1
            else:  # ClockEffect.then(ClockEffect(add=1)), without the objects
                self._add += 1
                self._floor += 1 if self._floor else 0


__all__ = ["Clock", "ClockEffect", "ClockScanner", "ContentDigest", "CopyStats", "EntryCopier", "content_digest", "parse"]
