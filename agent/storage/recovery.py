"""Reading a replica file back: which entries are valid, and what an invalid region means.

Pure reading (the file is opened read-only), shared by the store's startup recovery, which then
acts on the verdict, and by ``dlagent fsck``, which only reports it.

The verdict after the first invalid record at offset ``o``:

- **torn tail**: no valid entry of this log/segment starts anywhere after ``o``. Whatever is
  there (a short header, a truncated payload, garbage) was being written when the
  agent or machine died and was never acknowledged (acks follow fdatasync of everything
  before them), so cutting it loses nothing.
- **preallocated space**: nothing but zero bytes from ``o`` to the end of the file. The store
  grows files ahead of the data (SyncPolicy.prealloc_bytes), and a crash leaves those zeros;
  an entry never starts with a zero byte, so nothing was lost. Trimmed quietly, not reported.
- **mid-file corruption** (limbo): some later offset holds a complete entry of this
  log/segment with a valid CRC. Entries are only ever appended, so valid data after the
  invalid record means the invalid record was once complete — the disk or someone else
  damaged acknowledged data. Cutting would throw away acknowledged entries and silently
  "repair" a replica that can no longer vouch for what it stores, so it is left untouched.

- **unsynced gap**: like mid-file corruption, but the invalid record is zeros where an entry
  header should be, past the length the replica recorded as durable (``.acked``). A power loss
  can keep later pages of a file and lose earlier ones; since an acknowledgement follows an
  fdatasync of everything before it, nothing from the gap on was acknowledged here: cut.

When in doubt the verdict is limbo, the safe side: a limbo replica is re-replicated from its
peers, a wrong cut loses acknowledged entries.

Files are read with pread, not mmap: a bad sector under a mapping is a SIGBUS that kills the
agent, under pread it is an EIO this module reports.
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from dlctl.log.format import FORMAT_VERSION, HEADER, HEADER_SIZE, KNOWN_FLAGS, MAGIC, MAX_PAYLOAD, crc32c

from . import checkpoint, layout
from .checkpoint import Checkpoint
from .index import EntryIndex
from .layout import LOG_SUFFIX
from .types import LimboRecord

HEADER_STRUCT = HEADER  # the header's fields, CRC included (dlctl.log.format)
_HDR = HEADER_STRUCT
_CRC_COVERED = HEADER_SIZE - 4  # header bytes the CRC covers (all but the CRC field)


def check_header(
    log_id: int, seq: int, magic: bytes, version: int, flags: int, reserved: int,
    h_log: int, h_seq: int, entry_id: int, lac: int, length: int,
) -> str | None:
    """Why a header can not start an entry of (log_id, seq); None if it can."""
    if magic != MAGIC:
        return f"bad magic {bytes(magic)!r}"
    if version != FORMAT_VERSION:
        return f"unsupported format version {version}"
    if flags & ~KNOWN_FLAGS or reserved:
        return f"unknown flags {flags:#x} or reserved bits {reserved:#x}"
    if length > MAX_PAYLOAD:
        return f"payload length {length} exceeds maximum {MAX_PAYLOAD}"
    if h_log != log_id or h_seq != seq:
        return f"entry of log {h_log} segment {h_seq} in the file of log {log_id} segment {seq}"
    if not 0 <= entry_id < 2**63:
        return f"entry id {entry_id} out of range"
    if not -1 <= lac < entry_id:
        return f"LAC {lac} not in -1..entry id-1 ({entry_id - 1})"
    return None


@dataclass
class ScanResult:
    path: Path
    log_id: int
    seq: int
    file_size: int
    index: EntryIndex = field(default_factory=EntryIndex)
    lac: int = -1
    valid_end: int = 0  # end of the last valid entry before any problem
    bytes: int = 0  # bytes of valid entries
    zero_tail: int = 0  # zero bytes from valid_end to file_size: preallocated space, trim it
    # At most one of these is set when the file has a problem.
    torn_reason: str | None = None  # invalid tail from valid_end to file_size: cut it
    corrupt_reason: str | None = None  # invalid record at valid_end, valid data later: limbo
    next_valid_offset: int = -1
    # With corrupt_reason: the header at valid_end is all zeros — see SegmentCheck.unsynced_gap.
    zero_header: bool = False
    scanned_from: int = 0  # where reading began: a trusted index checkpoint's end, else 0

    @property
    def clean(self) -> bool:
        return self.torn_reason is None and self.corrupt_reason is None


class _Reader:
    """Big sequential preads, handing out views of the current chunk."""

    def __init__(self, fd: int, size: int, chunk: int = 4 << 20) -> None:
        self.fd = fd
        self.size = size
        self.chunk = chunk
        self.start = 0
        self.view = memoryview(b"")

    def get(self, off: int, n: int) -> memoryview:
        """Bytes [off, off+n) (shorter only at end of file)."""
        rel = off - self.start
        if rel < 0 or rel + n > len(self.view):
            self.view = memoryview(os.pread(self.fd, min(max(self.chunk, n), max(self.size - off, 0)), off))
            self.start = off
            rel = 0
        return self.view[rel : rel + n]


def _entry_ok(reader: _Reader, pos: int, log_id: int, seq: int) -> bool:
    if reader.size - pos < HEADER_SIZE:
        return False
    fields = _HDR.unpack_from(reader.get(pos, HEADER_SIZE))
    if check_header(log_id, seq, *fields[:9]) is not None:
        return False
    length, crc = fields[8], fields[9]
    if pos + HEADER_SIZE + length > reader.size:
        return False
    data = reader.get(pos, HEADER_SIZE + length)
    return crc32c(data[HEADER_SIZE:], crc32c(data[:_CRC_COVERED])) == crc


def find_next_valid(fd: int, size: int, start: int, log_id: int, seq: int) -> int:
    """Offset of the first complete, CRC-valid entry of (log_id, seq) at or after ``start``; -1 if none."""
    chunk = 4 << 20
    probe = _Reader(fd, size, chunk=64 << 10)
    pos = start
    while pos < size:
        buf = os.pread(fd, min(chunk, size - pos), pos)
        if not buf:
            break
        hit = buf.find(MAGIC)
        while hit != -1:
            if _entry_ok(probe, pos + hit, log_id, seq):
                return pos + hit
            hit = buf.find(MAGIC, hit + 1)
        if len(buf) < len(MAGIC):
            break
        # Overlap so a magic straddling two chunks is still seen.
        pos += len(buf) - (len(MAGIC) - 1)
    return -1


def _all_zeros(fd: int, start: int, end: int) -> bool:
    pos = start
    while pos < end:
        buf = os.pread(fd, min(1 << 20, end - pos), pos)
        if not buf or buf.count(0) != len(buf):
            return False
        pos += len(buf)
    return True


def scan_file(path: Path, log_id: int, seq: int, start: Checkpoint | None = None) -> ScanResult:
    """Read a replica file (opened read-only, never modified) and index its valid entries;
    from ``start`` (an index checkpoint, ``checkpoint.py``) when given and the file holds what
    it covers (else from the beginning).

    Raises OSError when the file can not be read (the caller decides what that means).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if start is not None and start.covered <= size:
            result = ScanResult(path, log_id, seq, size, index=start.index, scanned_from=start.covered)
            _scan(fd, result, start.covered, start.lac, start.covered)
        else:
            result = ScanResult(path, log_id, seq, size)
            if size:
                _scan(fd, result)
        return result
    finally:
        os.close(fd)


def _scan(fd: int, r: ScanResult, pos: int = 0, lac: int = -1, nbytes: int = 0) -> None:
    size, log_id, seq, index = r.file_size, r.log_id, r.seq, r.index
    unpack = _HDR.unpack_from
    reader = _Reader(fd, size)
    reason: str | None = None
    try:
        while pos < size:
            if size - pos < HEADER_SIZE:
                reason = f"truncated header ({size - pos} of {HEADER_SIZE} bytes)"
                break
            magic, version, flags, reserved, h_log, h_seq, entry_id, e_lac, length, crc = unpack(
                reader.get(pos, HEADER_SIZE)
            )
            reason = check_header(log_id, seq, magic, version, flags, reserved, h_log, h_seq, entry_id, e_lac, length)
            if reason is not None:
                break
            end = pos + HEADER_SIZE + length
            if end > size:
                reason = f"truncated payload ({size - pos - HEADER_SIZE} of {length} bytes) of entry {entry_id}"
                break
            data = reader.get(pos, HEADER_SIZE + length)
            if crc32c(data[HEADER_SIZE:], crc32c(data[:_CRC_COVERED])) != crc:
                reason = f"CRC-32C mismatch in entry {entry_id}"
                break
            known = index.get(entry_id)
            if known is not None:
                if known[1] == length and known[2] == crc:
                    pos = end  # an identical second copy is harmless; the first one is served
                    continue
                # Two different versions of one entry: not something a torn write produces.
                r.corrupt_reason = f"entry {entry_id} stored twice with different contents (offsets {known[0]} and {pos})"
                r.next_valid_offset = pos
                return
            index.add(entry_id, pos, length, crc)
            if e_lac > lac:
                lac = e_lac
            nbytes += end - pos
            pos = end
    finally:
        r.lac, r.bytes, r.valid_end = lac, nbytes, pos
    if reason is None:
        return
    if _all_zeros(fd, pos, size):
        r.zero_tail = size - pos
        return
    nxt = find_next_valid(fd, size, pos + 1, log_id, seq)
    if nxt == -1:
        r.torn_reason = reason
    else:
        r.corrupt_reason = reason
        r.next_valid_offset = nxt
        r.zero_header = _all_zeros(fd, pos, min(pos + HEADER_SIZE, nxt))


def read_limbo_marker(path: Path) -> LimboRecord:
    """The record in a .limbo marker; an unreadable marker still means limbo."""
    log_id, seq = int(path.parent.name, 16), int(path.name.split(".")[0], 16)
    log_path = str(path.with_suffix(LOG_SUFFIX))
    try:
        doc = json.loads(path.read_text())
        return LimboRecord(
            log_id, seq, log_path, int(doc.get("offset", -1)), str(doc.get("reason", "unknown")),
            int(doc.get("next_valid_offset", -1)),
        )
    except (OSError, ValueError, TypeError, AttributeError):
        return LimboRecord(log_id, seq, log_path, -1, "limbo marker present but unreadable")


# The acknowledged length of a replica file, kept beside it (``<seq>.acked``): how many bytes of
# the .log were durable when it was last recorded (the store records it about once a second
# while a segment takes data, and when the store closes). A file found shorter at start-up was
# cut while nobody watched: it is put in limbo, never trusted to say what it lacks.
ACKED = struct.Struct(">QI")  # durable length, CRC-32C of its 8 bytes
_LENGTH = struct.Struct(">Q")


def encode_acked(length: int) -> bytes:
    head = _LENGTH.pack(length)
    return ACKED.pack(length, crc32c(head))


def read_acked(path: Path) -> int | None:
    """The length recorded in an .acked file; None when it is missing, torn or unreadable (then
    nothing is claimed: the check is an extra safeguard, not a source of truth)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) != ACKED.size:
        return None
    length, crc = ACKED.unpack(raw)
    return length if crc32c(raw[:8]) == crc else None


def write_limbo_markers(data_dir: Path, records: list[LimboRecord], fsync=os.fsync) -> None:
    """Durably mark replicas limbo in a data directory no store has open (the store writes its
    own markers while running). Each marker is fsynced, then each directory that gained one."""
    dirs: set[Path] = set()
    for record in records:
        path = layout.segment_path(data_dir, (record.log_id, record.segment_seq), layout.LIMBO_SUFFIX)
        for parent in (path.parent.parent, path.parent):
            if not parent.is_dir():
                parent.mkdir(mode=layout.DIR_MODE)
                dirs.add(parent.parent)
        doc = record.to_dict() | {"detected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, layout.FILE_MODE)
        try:
            view = memoryview((json.dumps(doc, sort_keys=True) + "\n").encode())
            while view:
                view = view[os.write(fd, view) :]
            fsync(fd)
        finally:
            os.close(fd)
        dirs.add(path.parent)
    for directory in sorted(dirs, key=lambda d: len(d.parts), reverse=True):  # children before parents
        layout.fsync_path(directory, fsync)


@dataclass
class SegmentCheck:
    """What is on disk for one segment, read-only: shared by startup recovery and fsck."""

    key: tuple[int, int]
    path: Path
    has_log: bool
    fenced: bool
    marker: LimboRecord | None  # a .limbo marker from an earlier run
    scan: ScanResult | None = None
    read_error: str | None = None
    acked: int | None = None  # the length its .acked file records as durable, if any
    checkpoint_error: str | None = None  # why its index checkpoint was not used (read in full)

    @property
    def unsynced_gap(self) -> bool:
        """Zeros where an entry should start, valid entries later, and all of it past the length
        this replica is known to have made durable: a power loss that kept some later pages and
        not the earlier ones (devices persist unsynced pages in any order). Not damage: an entry
        is acknowledged only after an fdatasync that also made every earlier byte durable, so
        nothing from the gap on was acknowledged by this replica; the gap is cut as a torn tail.
        Zeros below the known durable length are damage (limbo)."""
        scan = self.scan
        return (
            scan is not None and scan.corrupt_reason is not None and scan.zero_header
            and (self.acked is None or scan.valid_end >= self.acked)
        )

    @property
    def corruption(self) -> LimboRecord | None:
        """Newly found corruption before valid data, or data missing that was acknowledged
        (needs limbo), if any."""
        if self.read_error is not None:
            return LimboRecord(*self.key, str(self.path), -1, f"unreadable: {self.read_error}")
        scan = self.scan
        if scan is not None and scan.corrupt_reason is not None and not self.unsynced_gap:
            return LimboRecord(*self.key, str(self.path), scan.valid_end, scan.corrupt_reason, scan.next_valid_offset)
        if self.acked:
            if not self.has_log:
                return LimboRecord(*self.key, str(self.path), 0, f"replica file missing; {self.acked} bytes of it were acknowledged")
            if scan is not None and scan.valid_end < self.acked:
                return LimboRecord(
                    *self.key, str(self.path), scan.valid_end,
                    f"file holds {scan.valid_end} valid bytes but {self.acked} were acknowledged (cut while the agent was down?)",
                )
        return None

    @property
    def limbo(self) -> LimboRecord | None:
        return self.marker or self.corruption

    @property
    def torn_tail(self) -> tuple[int, int, str] | None:
        """(offset, bytes, reason) of a tail to cut; never for a replica in limbo."""
        scan = self.scan
        if self.limbo is not None or scan is None:
            return None
        if self.unsynced_gap:
            return scan.valid_end, scan.file_size - scan.valid_end, (
                f"{scan.corrupt_reason}: zeros where an entry should start (never synced); later entries "
                f"from offset {scan.next_valid_offset} were not acknowledged by this replica"
            )
        if scan.torn_reason is None:
            return None
        return scan.valid_end, scan.file_size - scan.valid_end, scan.torn_reason


def inspect_segment(data_dir: Path, key: tuple[int, int], files: set[str], *, use_checkpoint: bool = False) -> SegmentCheck:
    """What a replica's files say. ``use_checkpoint``: start from its index checkpoint when one
    can be trusted (the store at start-up; ``fsck`` reads everything)."""
    path = layout.segment_path(data_dir, key, LOG_SUFFIX)
    marker = None
    if layout.LIMBO_SUFFIX in files:
        marker = read_limbo_marker(layout.segment_path(data_dir, key, layout.LIMBO_SUFFIX))
    check = SegmentCheck(key, path, LOG_SUFFIX in files, layout.FENCED_SUFFIX in files, marker)
    if layout.ACKED_SUFFIX in files:
        check.acked = read_acked(layout.segment_path(data_dir, key, layout.ACKED_SUFFIX))
    start = None
    if use_checkpoint and layout.IDX_SUFFIX in files and marker is None:
        try:
            start = checkpoint.read(layout.segment_path(data_dir, key, layout.IDX_SUFFIX))
        except (OSError, ValueError) as exc:
            check.checkpoint_error = str(exc)
    if check.has_log:
        try:
            check.scan = scan_file(path, *key, start=start)
        except OSError as exc:
            check.read_error = str(exc)
    return check
