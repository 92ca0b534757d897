"""The driver's decisions, as plain functions over plain data (no ZooKeeper, no Spark, no agents).

Which source segments a bootstrap copies and where the stream continues (the snapshot point),
which sink segment numbers they get, where each segment's vector clock starts, what stands in
the way at the sink, and which copies an interrupted run can keep. Tested in
``tests/unit/test_bootstrap_plan.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..log.dlsn import DLSN
from ..meta.records import NO_ENTRY, EnsembleChange, SegmentRecord, SegmentState
from ..placement import PlacementPolicy
from .transform import ClockEffect

# -- what to copy --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """The source segments of one log a bootstrap copies, and the snapshot point after them."""

    copy: tuple[SegmentRecord, ...]  # completed segments holding entries, in order
    skipped_empty: tuple[int, ...]  # completed segments without entries (nothing to copy)
    snapshot: DLSN  # the first source position the copy does not hold: the stream continues here
    first: DLSN | None  # the first source position copied (None: nothing to copy)
    reason: str  # why the range ends where it does

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.copy)

    @property
    def records(self) -> int:
        return sum(s.records for s in self.copy)


def select(segments: Sequence[SegmentRecord], max_segment_seq: int) -> Selection:
    """Every live completed segment from the first retained one up to (not including) the first
    in-progress one. Truncated segments hold nothing readable and are passed over; a partially
    truncated one is copied from its first active entry (same entry ids on the sink)."""
    live = sorted((s for s in segments if s.state is not SegmentState.TRUNCATED), key=lambda s: s.seq)
    copy: list[SegmentRecord] = []
    empty: list[int] = []
    reason = "every segment of the log is completed"
    last_seq = None
    for seg in live:
        if seg.state is SegmentState.INPROGRESS:
            reason = f"segment {seg.seq} is in progress (a writer is on it): the stream continues from its start"
            break
        last_seq = seg.seq
        if seg.last_entry_id < max(seg.min_active_entry, 0) or seg.last_entry_id == NO_ENTRY:
            empty.append(seg.seq)
        else:
            copy.append(seg)
    if last_seq is not None:
        snapshot = DLSN(last_seq + 1, 0, 0)
    elif live:
        snapshot = DLSN(live[0].seq, live[0].min_active_entry, 0)
    else:
        snapshot = DLSN(max_segment_seq + 1, 0, 0)
    first = DLSN(copy[0].seq, copy[0].min_active_entry, 0) if copy else None
    if not live:
        reason = "the log has no live segment"
    return Selection(tuple(copy), tuple(empty), snapshot, first, reason)


# -- sink numbering --------------------------------------------------------------------------------


def assign(count: int, max_segment_seq: int) -> list[int]:
    """Sink sequence numbers for ``count`` segments after the sink log's highest allocated one."""
    return list(range(max_segment_seq + 1, max_segment_seq + 1 + count))


def sink_blockers(*, owner: str | None, segments: Sequence[SegmentRecord]) -> list[str]:
    """Why the sink log cannot take a bootstrap now (empty: nothing stands in the way)."""
    out = []
    if owner is not None:
        out.append(
            f"it has an owner ({owner}): a writer or replication worker is appending to it, and the copied "
            "segments would have to go before what it writes; stop that writer (pause the stream) and re-run"
        )
    for seg in segments:
        if seg.state is SegmentState.INPROGRESS:
            out.append(
                f"its segment {seg.seq} is in progress: the copy would land after a segment that is still "
                "growing; run `dlctl recover log` on it (or let its writer close it) and re-run"
            )
    return out


# -- vector clocks -----------------------------------------------------------------------------


def local_effect(segment: SegmentRecord, skipped: int = 0) -> ClockEffect:
    """A segment holding only records written at the source: its clock advances by the records
    copied — its record count less the ``skipped`` ones before its first active entry (a
    partially truncated segment is copied from there; ``clockbase.skipped``)."""
    return ClockEffect(add=segment.records - skipped)


def start_vectors(location: str, effects: Sequence[ClockEffect], vv0: Mapping[str, int] | None = None) -> list[dict[str, int]]:
    """Each segment's starting version vector: the prefix fold of the effects before it."""
    out = []
    vv = dict(vv0 or {})
    for effect in effects:
        out.append(dict(vv))
        vv = effect.apply(location, vv)
    return out


# -- the task specification ---------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentTask:
    """Everything an executor needs to copy one source segment (pickled to the executor)."""

    log: str
    source_cluster: str
    source_log_id: int
    source: SegmentRecord
    sink_cluster: str
    sink_log_id: int
    sink_seq: int
    sink_policy: PlacementPolicy
    start_vv: dict[str, int]
    assume_local: bool  # start_vv came from metadata: fail (needs_clock) on a replicated record
    seed: int = 0
    settled: dict[str, int] = field(default_factory=dict)  # retired locations local timestamps omit (causal.settle)

    @property
    def key(self) -> str:
        return f"{self.log}/{self.source.seq}"

    @property
    def estimated_bytes(self) -> int:
        return self.source.bytes


def batches(tasks: Sequence[SegmentTask], slots: int, *, max_bytes: int = 256 * 1024 * 1024, per_slot: int = 8) -> list[list[SegmentTask]]:
    """Group consecutive segments into Spark tasks ("one task per segment or range"): about
    ``per_slot`` tasks per concurrent slot so the load stays balanced (the last task to finish
    leaves the other slots idle: smaller tasks, a shorter tail), none above ``max_bytes``
    unless one segment alone is (Spark's per-task cost is tens of ms: a task per tiny segment
    would cost more than the copy)."""
    if not tasks:
        return []
    limit = max(1, -(-len(tasks) // max(1, slots * per_slot)))
    out: list[list[SegmentTask]] = []
    current: list[SegmentTask] = []
    size = 0
    for task in tasks:
        if current and (len(current) >= limit or size + task.estimated_bytes > max_bytes or current[-1].log != task.log):
            out.append(current)
            current, size = [], 0
        current.append(task)
        size += task.estimated_bytes
    out.append(current)
    return out


# -- sink segment records --------------------------------------------------------------------------


def sink_segment(task_source: SegmentRecord, sink_seq: int, result: Mapping[str, Any], *, write_quorum: int, ack_quorum: int, writer: str, now: float | None = None) -> SegmentRecord:
    """The completed sink segment that a verified copy becomes at commit."""
    now = time.time() if now is None else now
    truncated = task_source.min_active_entry > 0
    return SegmentRecord(
        seq=sink_seq,
        state=SegmentState.PARTIALLY_TRUNCATED if truncated else SegmentState.COMPLETED,
        ensembles=(EnsembleChange(0, tuple(result["ensemble"])),),
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        created=now,
        writer=writer,
        last_entry_id=task_source.last_entry_id,
        first_txid=int(result["first_txid"]) if result.get("first_txid") is not None else -1,
        last_txid=int(result["last_txid"]),
        records=int(result["records"]),
        bytes=int(result["sink_bytes"]),
        completed=now,
        min_active_entry=task_source.min_active_entry,
    )


# -- results ---------------------------------------------------------------------------------------


def verification_problem(result: Mapping[str, Any]) -> str | None:
    """Why a task's result cannot be committed, or None when the copy is verified."""
    where = f"segment {result.get('source_seq')} of log {result.get('log')!r}"
    if result.get("error"):
        return f"{where}: {result['error']}"
    if not result.get("source_digest") or result.get("source_digest") != result.get("sink_digest"):
        at = f", first at entry {result['content_differs_at_entry']}" if result.get("content_differs_at_entry") is not None else ""
        return f"{where}: the content digest of the sink copy ({result.get('sink_digest')}) differs from the source's ({result.get('source_digest')}){at}"
    if result.get("source_records") != result.get("records"):
        return f"{where}: {result.get('records')} records written but {result.get('source_records')} read"
    check = result.get("replica_check") or {}
    bad = sorted(n for n, verdict in check.items() if verdict != "ok")
    if bad:
        return f"{where}: sink replica(s) do not hold exactly the entries written: " + "; ".join(f"{n}: {check[n]}" for n in bad)
    if not check or sorted(check) != sorted(result.get("ensemble", [])):
        return f"{where}: not every member of the sink ensemble was verified"
    return None


@dataclass
class LogProgress:
    """Resume state of one log, as kept in the job record."""

    sink_log_id: int
    reserved: tuple[int, int]  # first and last sink sequence number reserved for this job
    log_version: int  # the sink log record's version right after the reservation
    verified: dict[int, dict] = field(default_factory=dict)  # source seq -> verified task result
    abandoned: list[tuple[int, int]] = field(default_factory=list)  # earlier reservations no longer used
    committed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "sink_log_id": self.sink_log_id,
            "reserved": list(self.reserved),
            "log_version": self.log_version,
            "verified": {str(k): v for k, v in sorted(self.verified.items())},
            "abandoned": [list(r) for r in self.abandoned],
            "committed": self.committed,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LogProgress:
        return cls(
            int(raw["sink_log_id"]),
            (int(raw["reserved"][0]), int(raw["reserved"][1])),
            int(raw["log_version"]),
            {int(k): dict(v) for k, v in dict(raw.get("verified", {})).items()},
            [(int(a), int(b)) for a, b in raw.get("abandoned", [])],
            bool(raw.get("committed", False)),
        )


def reservation_still_ours(progress: LogProgress, *, sink_log_id: int, log_version: int, max_segment_seq: int, count: int, first_seq: int) -> bool:
    """An earlier run's reservation can be reused when the sink log was not touched since (same
    log id and record version, so no segment was created in between) and it fits this copy."""
    return (
        progress.sink_log_id == sink_log_id
        and progress.log_version == log_version
        and progress.reserved[1] == max_segment_seq
        and progress.reserved == (first_seq, first_seq + count - 1)
    )


def reusable(progress: LogProgress, tasks: Iterable[SegmentTask]) -> dict[int, dict]:
    """Verified copies of an earlier run that this run can keep: same source segment (same last
    entry and record count), same sink number, same starting clock."""
    out = {}
    for task in tasks:
        done = progress.verified.get(task.source.seq)
        if done is None:
            continue
        if (
            int(done.get("sink_seq", -1)) == task.sink_seq
            and int(done.get("last_entry", -2)) == task.source.last_entry_id
            and int(done.get("first_entry", -2)) == task.source.min_active_entry
            and dict(done.get("start_vv", {})) == task.start_vv
        ):
            out[task.source.seq] = done
    return out


__all__ = [
    "LogProgress",
    "SegmentTask",
    "Selection",
    "assign",
    "batches",
    "local_effect",
    "reservation_still_ours",
    "reusable",
    "select",
    "sink_blockers",
    "sink_segment",
    "start_vectors",
    "verification_problem",
]
