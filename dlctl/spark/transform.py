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

The **content digest** of a segment is SHA-256 over each data record's canonical encoding with
every reserved ``dl.*`` header left out (txid, key, application headers, payload; control
records excluded). ``content_digest`` computes it from any entry payloads — the copy computes it
once over the source entries as read and once over the sink entries as written, and the two
must be equal.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..log import format as fmt
from ..log.records import FLAG_CONTROL, CorruptRecords
from ..replication.causal import merge
from ..replication.origin import ORIGIN_CLUSTER, ORIGIN_DLSN, RESERVED_PREFIX, SOURCE_POSITION, VECTOR_TIME, encode_vt

_FIXED = struct.Struct(">IBqH")  # size, flags, txid, key length (records.py's layout)
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_TOTALS = struct.Struct(">QQ")
_RESERVED = RESERVED_PREFIX.encode()
_ORIGIN_CLUSTER = ORIGIN_CLUSTER.encode()
_ORIGIN_DLSN = ORIGIN_DLSN.encode()
_VECTOR_TIME = VECTOR_TIME.encode()
_SOURCE_POSITION = SOURCE_POSITION.encode()


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


def parse(view: memoryview) -> list[_Rec]:
    """Every record of an entry payload, or ``CorruptRecords`` naming the byte where it breaks."""
    out = []
    pos, end = 0, len(view)
    unpack_fixed, unpack16, unpack32 = _FIXED.unpack_from, _U16.unpack_from, _U32.unpack_from
    while pos < end:
        if end - pos < _FIXED.size + 2:
            raise CorruptRecords(f"truncated record header at byte {pos}")
        size, flags, txid, key_len = unpack_fixed(view, pos)
        stop = pos + 4 + size
        key_end = pos + _FIXED.size + key_len
        if stop > end or key_end + 2 > stop:
            raise CorruptRecords(f"record at byte {pos} claims {size} bytes, {end - pos - 4} remain")
        (count,) = unpack16(view, key_end)
        cur = key_end + 2
        headers = []
        for _ in range(count):
            if cur + 2 > stop:
                raise CorruptRecords(f"record at byte {pos}: header overruns the record")
            (name_len,) = unpack16(view, cur)
            if cur + 2 + name_len + 4 > stop:
                raise CorruptRecords(f"record at byte {pos}: header overruns the record")
            name = bytes(view[cur + 2 : cur + 2 + name_len])
            (value_len,) = unpack32(view, cur + 2 + name_len)
            h_end = cur + 6 + name_len + value_len
            if h_end > stop:
                raise CorruptRecords(f"record at byte {pos}: header value overruns the record")
            headers.append((name, cur, h_end))
            cur = h_end
        out.append(_Rec(pos, stop, flags, txid, key_end, tuple(headers), cur))
        pos = stop
    return out


def _canonical_into(h: hashlib._Hash, view: memoryview, rec: _Rec) -> None:  # type: ignore[name-defined]
    """Feed the record's canonical form (no ``dl.*`` headers) to ``h``."""
    if not rec.headers:
        h.update(view[rec.start : rec.stop])  # nothing to leave out: the bytes are the canonical form
        return
    user = [(s, e) for name, s, e in rec.headers if not name.startswith(_RESERVED)]
    size = (_FIXED.size - 4) + (rec.key_end - rec.start - _FIXED.size) + 2 + sum(e - s for s, e in user) + (rec.stop - rec.payload_start)
    h.update(_FIXED.pack(size, rec.flags, rec.txid, rec.key_end - rec.start - _FIXED.size))
    h.update(view[rec.start + _FIXED.size : rec.key_end])
    h.update(_U16.pack(len(user)))
    for s, e in user:
        h.update(view[s:e])
    h.update(view[rec.payload_start : rec.stop])


class ContentDigest:
    """The running content digest of a segment (see the module docstring) and its record count."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.records = 0

    def add_payload(self, payload: bytes | memoryview) -> None:
        view = memoryview(payload)
        for rec in parse(view):
            if not rec.flags & FLAG_CONTROL:
                _canonical_into(self._h, view, rec)
                self.records += 1

    def add_entry(self, encoded: bytes) -> None:
        self.add_payload(memoryview(encoded)[fmt.HEADER_SIZE :])

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def content_digest(payloads: Iterable[bytes | memoryview]) -> str:
    d = ContentDigest()
    for payload in payloads:
        d.add_payload(payload)
    return d.hexdigest()


# -- vector time, as SourceClock keeps it, with the common case (only the source's own counter) cheap --


class Clock:
    """``dlctl.replication.causal.SourceClock`` with the encoded timestamp of a local record
    built without a dict copy per record. ``vv`` is the source log's version vector before the
    next record."""

    def __init__(self, location: str, vv: Mapping[str, int] | None = None) -> None:
        self.location = location
        self.vv: dict[str, int] = dict(vv or {})
        self._others_dirty = True
        self._before = b""
        self._after = b""

    def _split(self) -> None:
        # The encoded form is sorted by location: the own counter sits between two fixed parts.
        others = {k: v for k, v in self.vv.items() if k != self.location and v > 0}
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

    def __init__(self, *, source_cluster: str, source_seq: int, sink_log_id: int, sink_seq: int, clock: Clock) -> None:
        self.source_seq = source_seq
        self.sink_log_id = sink_log_id
        self.sink_seq = sink_seq
        self.clock = clock
        self.stats = CopyStats()
        self._cluster_header = _header(_ORIGIN_CLUSTER, source_cluster.encode())
        self._dlsn_name = _U16.pack(len(_ORIGIN_DLSN)) + _ORIGIN_DLSN
        self._vt_name = _U16.pack(len(_VECTOR_TIME)) + _VECTOR_TIME
        self._src_name = _U16.pack(len(_SOURCE_POSITION)) + _SOURCE_POSITION
        self._src_prefix = f"{source_cluster}@".encode()

    def copy(self, encoded: bytes) -> bytes:
        """The sink entry for one source entry (already CRC-verified by the reader)."""
        header = fmt.decode_header(encoded)
        if header.segment_seq != self.source_seq:
            raise ValueError(f"entry of segment {header.segment_seq} given to the copier of segment {self.source_seq}")
        view = memoryview(encoded)[fmt.HEADER_SIZE : fmt.HEADER_SIZE + header.length]
        records = parse(view)
        stats = self.stats
        entry_id = header.entry_id
        parts: list[bytes | memoryview] = []
        totals_at = len(records) - 1 if records and _is_totals(records[-1]) else -1
        seq_prefix = b"%d/%d/" % (self.source_seq, entry_id)
        pack_fixed, pack16, pack32 = _FIXED.pack, _U16.pack, _U32.pack
        for slot, rec in enumerate(records):
            if rec.flags & FLAG_CONTROL:
                if slot == totals_at:
                    continue  # rewritten below, with the sink's totals
                parts.append(view[rec.start : rec.stop])
                continue
            key_len = rec.key_end - rec.start - _FIXED.size
            dlsn = seq_prefix + b"%d" % slot
            kept: list[memoryview] = []
            replicated = False
            for name, s, e in rec.headers:
                if name == _SOURCE_POSITION:
                    continue  # the position in *our* source replaces a relay's
                if name == _ORIGIN_CLUSTER:
                    replicated = True
                kept.append(view[s:e])
            if replicated:
                vt = _vt_of(view, rec)
                self.clock.stamp_replicated(vt)
                stats.vts = merge(stats.vts, vt)
                added = []
            else:
                stamp = self.clock.stamp_local()
                added = [self._cluster_header, self._dlsn_name + pack32(len(dlsn)) + dlsn, self._vt_name + pack32(len(stamp)) + stamp]
                stats.local_records += 1
            src = self._src_prefix + dlsn
            added.append(self._src_name + pack32(len(src)) + src)
            body = sum(len(k) for k in kept) + sum(len(a) for a in added)
            size = (_FIXED.size - 4) + key_len + 2 + body + (rec.stop - rec.payload_start)
            parts.append(pack_fixed(size, rec.flags, rec.txid, key_len))
            parts.append(view[rec.start + _FIXED.size : rec.key_end])
            parts.append(pack16(len(kept) + len(added)))
            parts.extend(kept)
            parts.extend(added)
            parts.append(view[rec.payload_start : rec.stop])
            stats.records += 1
            if stats.first_txid is None:
                stats.first_txid = rec.txid
            stats.last_txid = rec.txid
            stats.last_data_slot = (entry_id, slot)
        if totals_at >= 0:
            body_len = sum(len(p) for p in parts)
            size = fmt.HEADER_SIZE + body_len + len(_totals_bytes(0, 0, 0))
            totals = records[totals_at]
            parts.append(_totals_bytes(totals.txid, stats.records, stats.sink_bytes + size))
        payload = b"".join(parts)
        out = fmt.encode(fmt.Entry(self.sink_log_id, self.sink_seq, entry_id, header.lac, payload, header.flags))
        stats.entries += 1
        stats.sink_bytes += len(out)
        return out


def _is_totals(rec: _Rec) -> bool:
    return bool(rec.flags & FLAG_CONTROL) and rec.stop - rec.payload_start == _TOTALS.size and not rec.headers


def _totals_bytes(txid: int, records: int, nbytes: int) -> bytes:
    payload = _TOTALS.pack(records, nbytes)
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

    def add_entry(self, encoded: bytes) -> None:
        view = memoryview(encoded)[fmt.HEADER_SIZE :]
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
