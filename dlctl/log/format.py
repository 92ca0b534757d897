"""The on-disk and on-wire entry format.

An entry is a fixed 48-byte header followed by the payload. The CRC-32C covers the header
(with the CRC field itself excluded) and the payload; it is computed by the *writer*, verified
by the agent on add and by the reader on read, so corruption anywhere between is caught end
to end. All integers are big-endian.

    offset size field
    0      4    magic            b"DLE1"
    4      1    format version   1
    5      1    flags            FLAG_CONTROL: entry holds only control records
    6      2    reserved         0
    8      8    log id           u64, > 0, allocated in metadata when the log is created
    16     8    segment seq      u64, > 0
    24     8    entry id         i64, >= 0, +1 per entry within a segment
    32     8    LAC              i64, >= -1 (-1: nothing confirmed yet), < entry id
    40     4    payload length   u32, <= MAX_PAYLOAD
    44     4    CRC-32C          over bytes 0..43 and the payload
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c as _crc32c

MAGIC = b"DLE1"
FORMAT_VERSION = 1
FLAG_CONTROL = 0x01
KNOWN_FLAGS = FLAG_CONTROL

HEADER_FIELDS = struct.Struct(">4sBBHQQqqI")  # everything the CRC covers in the header
_CRC = struct.Struct(">I")
HEADER = struct.Struct(">4sBBHQQqqII")  # the whole header, CRC included
HEADER_SIZE = HEADER_FIELDS.size + _CRC.size  # 48
ENTRY_ID_OFFSET = 24
_ENTRY_ID = struct.Struct(">q")
MAX_PAYLOAD = 16 * 1024 * 1024
U64_MAX = 2**64 - 1
NO_ENTRY = -1  # LAC / last entry id of an empty segment


class CorruptEntry(ValueError):
    """Bytes that do not form a valid entry; ``reason`` says which check failed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def crc32c(data: bytes | memoryview, value: int = 0) -> int:
    return _crc32c.crc32c(data, value)


def stored_crc(buf: bytes | memoryview, offset: int = 0) -> int:
    """The CRC-32C recorded in the header of the encoded entry at ``offset`` (its last field;
    not verified here: copies forward entries already checked, and compare these)."""
    return _CRC.unpack_from(buf, offset + HEADER_FIELDS.size)[0]


def stored_entry_id(buf: bytes | memoryview, offset: int = 0) -> int:
    """The entry id in the header of the encoded entry at ``offset`` (not verified here)."""
    return _ENTRY_ID.unpack_from(buf, offset + ENTRY_ID_OFFSET)[0]


@dataclass(frozen=True, slots=True)
class EntryHeader:
    log_id: int
    segment_seq: int
    entry_id: int
    lac: int
    length: int
    flags: int
    crc: int

    @property
    def total_size(self) -> int:
        return HEADER_SIZE + self.length


@dataclass(frozen=True, slots=True)
class Entry:
    log_id: int
    segment_seq: int
    entry_id: int
    lac: int
    payload: bytes
    flags: int = 0

    @property
    def is_control(self) -> bool:
        return bool(self.flags & FLAG_CONTROL)


def validate_ids(log_id: int, segment_seq: int, entry_id: int | None = None, lac: int | None = None) -> None:
    """Raise ``ValueError`` naming the field when an id is out of range (used for network input)."""
    if not 0 < log_id <= U64_MAX:
        raise ValueError(f"log id {log_id} out of range (1..2^64-1)")
    if not 0 < segment_seq <= U64_MAX:
        raise ValueError(f"segment seq {segment_seq} out of range (1..2^64-1)")
    if entry_id is not None and not 0 <= entry_id < 2**63:
        raise ValueError(f"entry id {entry_id} out of range (0..2^63-1)")
    if lac is not None and entry_id is not None and not NO_ENTRY <= lac < entry_id:
        raise ValueError(f"LAC {lac} must be in -1..entry id-1 ({entry_id - 1})")


def encode(entry: Entry) -> bytes:
    """Serialize an entry with its CRC (the writer's side of the end-to-end check)."""
    validate_ids(entry.log_id, entry.segment_seq, entry.entry_id, entry.lac)
    if len(entry.payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(entry.payload)} bytes exceeds the {MAX_PAYLOAD}-byte maximum")
    if entry.flags & ~KNOWN_FLAGS:
        raise ValueError(f"unknown entry flags {entry.flags:#x}")
    fields = HEADER_FIELDS.pack(
        MAGIC, FORMAT_VERSION, entry.flags, 0, entry.log_id, entry.segment_seq, entry.entry_id, entry.lac, len(entry.payload)
    )
    crc = crc32c(entry.payload, crc32c(fields))
    return b"".join((fields, _CRC.pack(crc), entry.payload))


def decode_header(buf: bytes | memoryview) -> EntryHeader:
    """Parse and sanity-check a header (not the CRC, which needs the payload)."""
    if len(buf) < HEADER_SIZE:
        raise CorruptEntry(f"short header: {len(buf)} of {HEADER_SIZE} bytes")
    magic, version, flags, reserved, log_id, seg, entry_id, lac, length = HEADER_FIELDS.unpack_from(buf, 0)
    (crc,) = _CRC.unpack_from(buf, HEADER_FIELDS.size)
    if magic != MAGIC:
        raise CorruptEntry(f"bad magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise CorruptEntry(f"unsupported format version {version}")
    if flags & ~KNOWN_FLAGS or reserved:
        raise CorruptEntry(f"unknown flags {flags:#x} or reserved bits {reserved:#x}")
    if length > MAX_PAYLOAD:
        raise CorruptEntry(f"payload length {length} exceeds maximum {MAX_PAYLOAD}")
    try:
        validate_ids(log_id, seg, entry_id, lac)
    except ValueError as exc:
        raise CorruptEntry(str(exc)) from None
    return EntryHeader(log_id, seg, entry_id, lac, length, flags, crc)


def decode(buf: bytes | memoryview) -> Entry:
    """Parse a whole entry and verify its CRC (the reader's and the agent's side)."""
    header = decode_header(buf)
    if len(buf) != header.total_size:
        raise CorruptEntry(f"entry is {len(buf)} bytes, header says {header.total_size}")
    view = memoryview(buf)
    payload = view[HEADER_SIZE:]
    if crc32c(payload, crc32c(view[: HEADER_FIELDS.size])) != header.crc:
        raise CorruptEntry(f"CRC-32C mismatch in entry {header.segment_seq}/{header.entry_id} of log {header.log_id}")
    return Entry(header.log_id, header.segment_seq, header.entry_id, header.lac, bytes(payload), header.flags)
