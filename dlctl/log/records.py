"""Records inside an entry: the writer batches many records into one entry's payload.

Layout of one record (big-endian), repeated until the payload ends:

    u32  size              bytes that follow this field
    u8   flags             FLAG_CONTROL: never delivered to readers (advances LAC when idle)
    i64  txid              increasing per log
    u16  key length, key bytes
    u16  header count, then per header: u16 name length, name (UTF-8), u32 value length, value
    ...  payload           the rest of ``size``

Headers carry metadata such as a replicated record's origin; names starting with ``dl.`` are
reserved for dlctl itself.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from ..errors import DlctlError

FLAG_CONTROL = 0x01
RECORD_FIXED = struct.Struct(">IBqH")  # size, flags, txid, key length
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
MAX_KEY = 0xFFFF
MAX_HEADERS = 0xFFFF


class CorruptRecords(DlctlError, ValueError):
    """An entry payload that does not parse as records; the entry CRC was fine, so this is a
    writer bug or a hostile writer, never silent data. A ``DlctlError`` (exit 1) wherever it
    ends a command, and still the ``ValueError`` of malformed data to the parsers."""


@dataclass(frozen=True, slots=True)
class Record:
    txid: int
    payload: bytes
    key: bytes = b""
    headers: Mapping[str, bytes] = field(default_factory=dict)
    control: bool = False

    @property
    def encoded_size(self) -> int:
        return 4 + _encoded_body_size(self)


def _encoded_body_size(record: Record) -> int:
    size = RECORD_FIXED.size - 4 + len(record.key) + 2 + len(record.payload)
    for name, value in record.headers.items():
        size += 2 + len(name.encode()) + 4 + len(value)
    return size


def control_record(txid: int) -> Record:
    return Record(txid=txid, payload=b"", control=True)


RECORD_PLAIN = struct.Struct(">IBqHH")  # a record without key or headers: size, flags, txid, 0, 0
# The payload of the writer's per-entry totals record (a control record, dlctl.log.recovery):
# records and bytes of the segment so far, and the entry's append time in ms (older entries:
# without the time).
TOTALS = struct.Struct(">QQQ")
TOTALS_UNTIMED = struct.Struct(">QQ")


def encode_record(payload: bytes, txid: int = 0, key: bytes = b"", headers: Mapping[str, bytes] | None = None) -> bytes:
    """One record, the common case (no key, no headers) without building a ``Record``."""
    if key or headers:
        return encode_records([Record(txid, bytes(payload), bytes(key), dict(headers or {}))])
    return RECORD_PLAIN.pack(RECORD_PLAIN.size - 4 + len(payload), 0, txid, 0, 0) + payload


def encode_records(records: list[Record] | tuple[Record, ...]) -> bytes:
    parts: list[bytes] = []
    for record in records:
        if not -(2**63) <= record.txid < 2**63:
            raise ValueError(f"txid {record.txid} out of int64 range")
        if len(record.key) > MAX_KEY or len(record.headers) > MAX_HEADERS:
            raise ValueError("record key or header count too large")
        parts.append(RECORD_FIXED.pack(_encoded_body_size(record), FLAG_CONTROL if record.control else 0, record.txid, len(record.key)))
        parts.append(record.key)
        parts.append(_U16.pack(len(record.headers)))
        for name, value in record.headers.items():
            raw = name.encode()
            if len(raw) > 0xFFFF:
                raise ValueError(f"header name too long: {name[:40]!r}...")
            parts += (_U16.pack(len(raw)), raw, _U32.pack(len(value)), value)
        parts.append(record.payload)
    return b"".join(parts)


def decode_records(payload: bytes | memoryview) -> Iterator[Record]:
    """Yield the records of an entry payload in slot order; raise CorruptRecords on bad layout."""
    view = memoryview(payload)
    pos, end = 0, len(view)
    while pos < end:
        if end - pos < RECORD_FIXED.size:
            raise CorruptRecords(f"truncated record header at byte {pos}")
        size, flags, txid, key_len = RECORD_FIXED.unpack_from(view, pos)
        stop = pos + 4 + size
        if size < RECORD_FIXED.size - 4 + 2 or stop > end:
            raise CorruptRecords(f"record at byte {pos} claims {size} bytes, {end - pos - 4} remain")
        cur = pos + RECORD_FIXED.size
        key = bytes(view[cur : cur + key_len])
        cur += key_len
        if cur + 2 > stop:
            raise CorruptRecords(f"record at byte {pos}: key overruns the record")
        (count,) = _U16.unpack_from(view, cur)
        cur += 2
        headers: dict[str, bytes] = {}
        for _ in range(count):
            if cur + 2 > stop:
                raise CorruptRecords(f"record at byte {pos}: header overruns the record")
            (name_len,) = _U16.unpack_from(view, cur)
            cur += 2
            if cur + name_len + 4 > stop:
                raise CorruptRecords(f"record at byte {pos}: header overruns the record")
            try:
                name = bytes(view[cur : cur + name_len]).decode()
            except UnicodeDecodeError:
                raise CorruptRecords(f"record at byte {pos}: header name is not UTF-8") from None
            cur += name_len
            (value_len,) = _U32.unpack_from(view, cur)
            cur += 4
            if cur + value_len > stop:
                raise CorruptRecords(f"record at byte {pos}: header value overruns the record")
            headers[name] = bytes(view[cur : cur + value_len])
            cur += value_len
        yield Record(txid=txid, payload=bytes(view[cur:stop]), key=key, headers=headers, control=bool(flags & FLAG_CONTROL))
        pos = stop
