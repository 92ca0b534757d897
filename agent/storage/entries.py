"""The store's checks of entries, coming in and going out. Pure: no I/O, no store state.

Coming in (an add): the header is parsed and checked — magic, format version, flags, ids, the
length against the bytes given — and the CRC-32C the writer computed is verified, before
anything is queued; a batch also holds to its own rules (one segment, ids increasing), and a
refused batch stored nothing, so its errors say which entry and that nothing was stored.

Going out (a read, a scrub): the bytes read back must carry the header the index expects and a
matching CRC; what does not is damage, which the caller puts in limbo.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

from dlctl.log.errors import BadRequestError
from dlctl.log.format import FORMAT_VERSION, HEADER_SIZE, KNOWN_FLAGS, MAGIC, MAX_PAYLOAD, CorruptEntry, crc32c, decode_header

from .layout import Key
from .recovery import HEADER_STRUCT

CRC_COVERED = HEADER_SIZE - 4  # the CRC covers the header up to itself, then the payload
DIGEST_ITEM = struct.Struct(">qI")  # (entry id, CRC-32C) as digested: big-endian i64 + u32
NOTHING_STORED = "nothing of the batch stored"

# A parsed entry: (encoded, total size, log id, segment seq, entry id, LAC, payload length, CRC).
ParsedEntry = tuple


def segment_name(key: Key) -> str:
    return f"segment {key[1]} of log {key[0]}"


def digest_of(pairs: Iterable[tuple[int, int]]) -> str:
    """The digest of ordered (entry id, CRC-32C) pairs: SHA-256 over each pair packed as
    big-endian i64 + u32 (12 bytes), hex. Anyone holding the entries can recompute it."""
    h = hashlib.sha256()
    pack = DIGEST_ITEM.pack
    for entry_id, crc in pairs:
        h.update(pack(entry_id, crc))
    return h.hexdigest()


def parse_entry(encoded: bytes, keep_views: bool = False) -> ParsedEntry:
    """The header fields of an entry to add, checked (all but the CRC). ``keep_views``: a
    read-only memoryview is kept, not copied (a batch's entries, views of its body)."""
    if type(encoded) is not bytes and not (keep_views and type(encoded) is memoryview and encoded.readonly):
        if not isinstance(encoded, (bytearray, memoryview)):
            raise BadRequestError(f"entry must be bytes, not {type(encoded).__name__}")
        encoded = bytes(encoded)
    n = len(encoded)
    if n < HEADER_SIZE:
        raise BadRequestError(f"entry of {n} bytes is shorter than the {HEADER_SIZE}-byte header")
    magic, version, flags, reserved, log_id, seq, entry_id, lac, length, crc = HEADER_STRUCT.unpack_from(encoded)
    if (
        magic != MAGIC or version != FORMAT_VERSION or flags & ~KNOWN_FLAGS or reserved
        or length != n - HEADER_SIZE or length > MAX_PAYLOAD
        or not log_id or not seq or entry_id < 0 or not -1 <= lac < entry_id
    ):
        raise BadRequestError(_header_problem(encoded, n))
    return encoded, n, log_id, seq, entry_id, lac, length, crc


def parse_batch(entries: Sequence[bytes | memoryview]) -> list[ParsedEntry]:
    """``parse_entry`` of each entry of a batch, and the batch's own rules: one segment, ids
    strictly increasing. An error names the entry by its place in the batch (and its id)."""
    count = len(entries)
    if not count:
        raise BadRequestError("an empty batch of entries")
    out: list[ParsedEntry] = []
    for k, encoded in enumerate(entries):
        try:
            item = parse_entry(encoded, keep_views=True)
        except BadRequestError as exc:
            raise BadRequestError(f"{in_batch(k, count)}: {exc.message}; {NOTHING_STORED}") from None
        if out:
            first, prev = out[0], out[-1]
            if (item[2], item[3]) != (first[2], first[3]):
                raise BadRequestError(
                    f"{in_batch(k, count, item[4])} is of {segment_name((item[2], item[3]))}, the batch's first of "
                    f"{segment_name((first[2], first[3]))}: a batch holds one segment's entries; {NOTHING_STORED}"
                )
            if item[4] <= prev[4]:
                raise BadRequestError(
                    f"{in_batch(k, count, item[4])} follows entry {prev[4]}: a batch's entry ids must increase; {NOTHING_STORED}"
                )
        out.append(item)
    return out


def crc_matches(entry: bytes | memoryview, crc: int) -> bool:
    view = memoryview(entry)
    return crc32c(view[HEADER_SIZE:], crc32c(view[:CRC_COVERED])) == crc


def check_crc(encoded: bytes, log_id: int, seq: int, entry_id: int, crc: int) -> None:
    if not crc_matches(encoded, crc):
        raise BadRequestError(f"CRC-32C mismatch in entry {entry_id} of {segment_name((log_id, seq))}: refused, nothing stored")


def check_batch_crcs(parsed: list[ParsedEntry]) -> None:
    count = len(parsed)
    for k, (encoded, _n, log_id, seq, entry_id, _lac, _length, crc) in enumerate(parsed):
        if not crc_matches(encoded, crc):
            raise BadRequestError(f"{in_batch(k, count, entry_id)}: CRC-32C mismatch in entry {entry_id} of {segment_name((log_id, seq))}; {NOTHING_STORED}")


def in_batch(k: int, count: int, entry_id: int | None = None) -> str:
    """Where an entry is in a batch, for errors: its place (1-based) and, once known, its id."""
    return f"batch entry {k + 1} of {count}" + (f" (entry {entry_id})" if entry_id is not None else "")


def _header_problem(encoded: bytes, n: int) -> str:
    try:
        header = decode_header(encoded)
    except CorruptEntry as exc:
        return f"bad entry header: {exc.reason}"
    if header.total_size != n:
        return f"entry is {n} bytes but its header says {header.total_size} ({HEADER_SIZE} + payload {header.length})"
    return "bad entry header"


def verify_entry(buf: bytes, n: int, key: Key, entry_id: int, crc: int) -> str | None:
    """What is wrong with entry ``entry_id`` of replica ``key`` as read back (``n`` bytes were
    asked for, the index says ``crc``), or None when nothing is."""
    if len(buf) != n:
        return f"entry {entry_id}: short read ({len(buf)} of {n} bytes)"
    magic, _v, _f, _r, h_log, h_seq, h_entry, _lac, length, h_crc = HEADER_STRUCT.unpack_from(buf)
    if magic != MAGIC or (h_log, h_seq, h_entry) != (key[0], key[1], entry_id) or h_crc != crc or length != n - HEADER_SIZE:
        return f"entry {entry_id}: stored header does not match the index"
    if not crc_matches(buf, crc):
        return f"entry {entry_id}: CRC-32C mismatch on read"
    return None
