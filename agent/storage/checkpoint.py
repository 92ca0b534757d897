"""Index checkpoints: how an agent starts without reading every byte it holds (issue 24 item 7).

Opening the store used to read every replica file from its start, checking every entry's CRC,
to rebuild its in-memory index: start-up time grew with the data held (minutes for tens of
GiB). Now the store also keeps, beside a replica file, a checkpoint of its index
(``<seq>.idx``): the index of the file's first ``covered`` bytes, the LAC known then, and a
CRC-32C of the whole checkpoint. It writes one for a replica that has rested (its data durable
and unchanged for a trim interval: a completed segment, or an idle one) and for every replica
at a clean stop — never while entries past ``covered`` are still being written, and only where
durable data is fdatasync'ed (``SyncPolicy.mode="always"``, the default): what it covers then
survives a power loss.

At start-up a checkpoint is trusted only when it is whole (magic, version, CRC) and the file is
at least ``covered`` bytes long; the index then starts from it and only the bytes after
``covered`` are read (and checked) as before, so a tail torn by a crash, preallocated zeros or
corruption after it are handled exactly as a full scan would. Anything else — no checkpoint,
a damaged one, a file shorter than it says (cut while the agent was down: the ``.acked`` rule
then puts the replica in limbo) — means the full scan.

What start-up no longer checks is the CRC of entries inside ``covered`` (bit rot while the agent
was down): every read checks the CRC of what it serves (a mismatch puts the replica in limbo,
nothing wrong is ever served), and an agent that started from checkpoints begins a scrub pass at
once rather than an interval later (``dlagent.storage.scrub``), which finds the damage nobody
reads. ``dlagent fsck`` still reads everything.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from dlctl.log.format import crc32c

from .index import EntryIndex

MAGIC = b"DLIX"
VERSION = 1
_HEAD = struct.Struct(">4sBQq")  # magic, version, covered (file bytes indexed), LAC
_CRC = struct.Struct(">I")


@dataclass(frozen=True)
class Checkpoint:
    covered: int  # the index holds every valid entry of the file's first ``covered`` bytes
    lac: int
    index: EntryIndex


def encode(covered: int, lac: int, index: EntryIndex) -> bytes:
    body = _HEAD.pack(MAGIC, VERSION, covered, lac) + index.dump(below=covered)
    return body + _CRC.pack(crc32c(body))


def decode(data: bytes) -> Checkpoint:
    """The checkpoint in ``data``; ValueError saying why it is not one."""
    if len(data) < _HEAD.size + _CRC.size:
        raise ValueError(f"{len(data)} bytes: too short")
    body, (crc,) = memoryview(data)[: -_CRC.size], _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc32c(body) != crc:
        raise ValueError("CRC-32C mismatch")
    magic, version, covered, lac = _HEAD.unpack_from(body)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not an index checkpoint of version {VERSION} (magic {bytes(magic)!r}, version {version})")
    if lac < -1:
        raise ValueError(f"LAC {lac} out of range")
    return Checkpoint(covered, lac, EntryIndex.load(body[_HEAD.size :]))


def read(path: Path) -> Checkpoint:
    """The checkpoint at ``path``; OSError or ValueError when it cannot be used."""
    with open(path, "rb") as f:
        return decode(f.read())


def write(path: Path, data: bytes, fsync=os.fsync) -> None:
    """Replace the checkpoint at ``path`` by ``data`` atomically (a temporary file, fsync'ed,
    renamed over it): a crash leaves the old checkpoint or the new one, never half of one. The
    caller makes the rename durable (an fsync of the directory) when it matters."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
