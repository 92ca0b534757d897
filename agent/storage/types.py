"""Value types of the segment store's interface (policy in, results out)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# What the store answers is exactly what goes on the wire: one definition, in the protocol.
from dlctl.log.protocol import FenceResult, SegmentInfo  # noqa: F401 - re-exported
from dlctl.log.protocol import SegmentDigest as Digest  # noqa: F401 - re-exported

SYNC_MODES = ("always", "never")


@dataclass(frozen=True)
class SyncPolicy:
    """When an add counts as durable.

    ``mode="always"`` (the default): an add is acknowledged only after the bytes are written
    and ``fdatasync``-ed. Adds arriving close together share one fdatasync (group commit):
    a batch is flushed once no new add arrived during one event-loop turn, or once its oldest
    add has waited ``window_ms``, or once ``window_bytes`` are pending; while one fdatasync is
    in flight the next batch accumulates, and goes as soon as that fdatasync returns.

    ``mode="never"``: an add is acknowledged once the bytes are in the kernel's page cache,
    without fdatasync. This survives a crash of the agent process (SIGKILL included) but
    **not** a power loss or kernel crash: acknowledged entries can then vanish from this
    replica, or come back torn. It is only safe when the entry is also durable elsewhere
    (ack quorum spread over independent failure domains) and a replica that lost data is
    re-replicated; if every replica of an entry sits in the same power domain, an
    acknowledged entry can be lost for good. New files, directories, fence markers and limbo
    markers are still fsynced in this mode. Never the default.

    ``inline_bytes``: a batch of at most this many bytes, handed over while the sync thread is
    idle, is written and synced on the event-loop thread itself. A lone synchronous writer then
    pays no thread hand-off (two wake-ups, about 60 µs here); the loop is blocked for one small
    fdatasync meanwhile, and whatever arrives during it forms the next batch. 0: always the
    sync thread.

    ``prealloc_bytes``: segment files grow ahead of the data with ``posix_fallocate`` by as
    much as they already hold, between 64 KiB and this many bytes at a time, so that most
    fdatasyncs need not also commit a new file size (measured on ext4: an fdatasync of an
    append inside allocated space takes about two thirds of one that extends the file). The
    zeros behind the data are trimmed when the file is closed; a crash leaves them, and
    startup recovery trims them quietly (zeros to the end of the file are never a torn entry).
    0: files grow with each write.
    """

    mode: str = "always"
    window_ms: float = 2.0
    window_bytes: int = 512 * 1024
    inline_bytes: int = 64 * 1024
    prealloc_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        if self.mode not in SYNC_MODES:
            raise ValueError(f"sync mode {self.mode!r} is not one of {', '.join(SYNC_MODES)}")
        if not 0 <= self.window_ms <= 1000:
            raise ValueError(f"sync window_ms {self.window_ms} out of range (0..1000)")
        if not 0 < self.window_bytes <= 1 << 30:
            raise ValueError(f"sync window_bytes {self.window_bytes} out of range (1..1 GiB)")
        if not 0 <= self.inline_bytes <= 1 << 30:
            raise ValueError(f"sync inline_bytes {self.inline_bytes} out of range (0..1 GiB)")
        if not 0 <= self.prealloc_bytes <= 1 << 30:
            raise ValueError(f"sync prealloc_bytes {self.prealloc_bytes} out of range (0..1 GiB)")


@dataclass(frozen=True)
class TailCut:
    """An invalid tail after the last valid entry, cut (or, from fsck, that would be cut)."""

    log_id: int
    segment_seq: int
    path: str
    offset: int  # new file length: where the valid data ends
    bytes_cut: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LimboRecord:
    """Corruption followed by valid data: the replica is kept untouched and never served."""

    log_id: int
    segment_seq: int
    path: str
    offset: int  # first invalid byte; -1 when unknown (marker written by an older run)
    reason: str
    next_valid_offset: int = -1  # the later valid entry that proves this is not a torn tail

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RecoveryReport:
    segments: int
    entries: int
    tails_cut: list[TailCut] = field(default_factory=list)
    limbo: list[LimboRecord] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # files in segments/ that are not ours
    scanned_bytes: int = 0  # replica bytes read to rebuild the indexes (the rest: from checkpoints)
    from_checkpoints: int = 0  # replicas whose index started from a checkpoint

    def to_dict(self) -> dict[str, Any]:
        return {
            "segments": self.segments,
            "entries": self.entries,
            "tails_cut": [t.to_dict() for t in self.tails_cut],
            "limbo": [r.to_dict() for r in self.limbo],
            "ignored": list(self.ignored),
            "scanned_bytes": self.scanned_bytes,
            "from_checkpoints": self.from_checkpoints,
        }
