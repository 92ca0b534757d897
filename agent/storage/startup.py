"""The store's startup recovery: every replica found on disk becomes a ``Segment``, acting on
recovery.py's verdict on its files, before anything is served.

- a torn tail is cut (ftruncate + fsync), and reported;
- preallocated zeros left by a crash are trimmed quietly (not data, not a tear);
- corruption before valid data, or a replica found shorter than it acknowledged, puts the
  replica in limbo: its .limbo marker is written and its data left untouched for
  re-replication;
- a fenced marker alone (fenced before any entry arrived, or a delete cut short after the log
  went) becomes an empty fenced replica with its file;
- index checkpoints left half-written, or left without their replica, are removed.

Runs on a thread of its own during ``SegmentStore.open``.
"""

from __future__ import annotations

import logging
import os

from dlctl.log.errors import AgentIOError

from . import layout
from .entries import segment_name
from .files import ReplicaFiles, SyncFailed
from .layout import CHECKPOINT_SUFFIXES, IDX_TMP_SUFFIX, Key
from .recovery import SegmentCheck, inspect_segment
from .segment import Segment
from .types import LimboRecord, RecoveryReport, TailCut

log = logging.getLogger("dlagent.storage")


def recover_replicas(files: ReplicaFiles) -> tuple[dict[Key, Segment], RecoveryReport]:
    """The replicas under ``files.data_dir``, recovered, and what recovery did."""
    data_dir = files.data_dir
    segments: dict[Key, Segment] = {}
    tails: list[TailCut] = []
    limbo: list[LimboRecord] = []
    entries = scanned = from_checkpoints = 0
    found, ignored = layout.discover(data_dir)
    for key, names in found:
        names = _drop_stale_checkpoints(files, key, names)
        if not names:
            continue
        try:
            seg, check = _recover_segment(files, key, names, tails, limbo)
        except SyncFailed as exc:
            raise AgentIOError(f"startup recovery of {segment_name(key)}: {exc}") from exc
        segments[key] = seg
        entries += seg.index.count
        if check.scan is not None:
            scanned += check.scan.file_size - check.scan.scanned_from
            from_checkpoints += check.scan.scanned_from > 0
    if ignored:
        log.warning("ignoring %d files in %s that are not segment replicas: %s", len(ignored), layout.segments_root(data_dir), ignored[:5])
    return segments, RecoveryReport(len(segments), entries, tails, limbo, ignored, scanned, from_checkpoints)


def _drop_stale_checkpoints(files: ReplicaFiles, key: Key, names: set[str]) -> set[str]:
    """A checkpoint being written when the agent stopped goes; so does a checkpoint whose
    replica is gone (a delete cut short: it means nothing without the log)."""
    stale = {IDX_TMP_SUFFIX} | (set(CHECKPOINT_SUFFIXES) if names <= CHECKPOINT_SUFFIXES else set())
    for suffix in stale & names:
        path = layout.segment_path(files.data_dir, key, suffix)
        try:
            os.unlink(path)
        except OSError as exc:
            log.warning("cannot remove %s: %s", path, exc)
    return names - stale


def _recover_segment(
    files: ReplicaFiles, key: Key, names: set[str], tails: list[TailCut], limbo: list[LimboRecord]
) -> tuple[Segment, SegmentCheck]:
    check = inspect_segment(files.data_dir, key, names, use_checkpoint=True)
    if check.checkpoint_error is not None:
        log.warning("%s: index checkpoint not used (%s): read in full", check.path, check.checkpoint_error)
    if not check.has_log and check.marker is None and check.corruption is None:
        # A fenced marker alone: fenced before any entry arrived (or a delete cut short
        # after the log went). Either way an empty, fenced replica; give it its file.
        files.create(key, fenced=False, exist_ok=True)
    scan = check.scan
    seg = Segment(key, check.path, scan.index if scan else None, size=scan.file_size if scan else 0, lac=scan.lac if scan else -1)
    seg.fenced = seg.fence_durable = check.fenced
    seg.acked = check.acked or 0
    seg.indexed = scan.scanned_from if scan is not None else 0
    record = check.marker
    if record is None and check.corruption is not None:
        record = check.corruption
        files.write_limbo_marker(record)
        log.error("%s in limbo: %s at offset %d (valid entry at %d)", check.path, record.reason, record.offset, record.next_valid_offset)
    if record is not None:
        seg.limbo = record
        limbo.append(record)
        return seg, check
    if scan is not None and scan.zero_tail:
        # Preallocated space left by a crash: not data, not a tear (see recovery).
        files.cut(check.path, scan.valid_end, sync=False)
        seg.size = seg.durable = seg.alloc_end = scan.valid_end
    torn = check.torn_tail
    if torn is not None:
        offset, nbytes, reason = torn
        files.cut(check.path, offset)
        seg.size = seg.durable = seg.alloc_end = offset
        tails.append(TailCut(key[0], key[1], str(check.path), offset, nbytes, reason))
        log.warning("%s: cut %d-byte torn tail at offset %d (%s)", check.path, nbytes, offset, reason)
    return seg, check
