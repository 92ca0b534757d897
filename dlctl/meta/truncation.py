"""Truncation (DESIGN.md §9): the truncation point of a log, the decisions over its segments,
and the batched ZooKeeper updates that apply them.

The **truncation point** is the first position a log still keeps; everything before it is
gone for readers. It lives in its own znode, ``logs/<name>/truncation`` (JSON), apart from the
log record the writer compare-and-sets when it creates segments, so a truncation never races
the writer on a znode. It only ever moves forward (CAS; a lower point is a no-op), which makes
truncation idempotent and two racing truncations converge on the larger point.

Applying a point marks segments: completed segments wholly before it become ``truncated``; the
segment it falls in becomes ``partially-truncated`` with ``min_active_entry`` (entries before
it are gone). In-progress segments are never touched: the writer owns them. Marks only move
forward too (a truncated segment stays truncated; ``min_active_entry`` never decreases), so a
mark computed from an older point never undoes a newer one.

The point is written first (it is the commit point readers honour), then the marks; a run cut
short between the two is finished by the next ``truncate`` or ``gc`` (``marks_for`` over the
recorded point). Collection — removing truncated segments' records, then their files — is
``dlctl.retention.collect``'s job.

Pure decisions (``marks_for``, ``retention_point``, ``check_target``, ``collectable`` …) take
plain values and are unit-tested; the I/O helpers at the end pipeline reads (kazoo's async
calls) and batch versioned writes in multi-op transactions, so that thousands of segments cost
a few round trips and commits, not thousands in series.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)

from ..errors import ConflictError, CorruptMetadata, NotFoundError, RefusedError
from ..log.dlsn import DLSN
from . import cas, paths
from .pins import PinRecord
from .records import (
    NO_TXID,
    SegmentRecord,
    SegmentState,
    Versioned,
    segment_from_json,
    to_json,
)
from .store import MetaStore

# States a truncation may change: never an in-progress segment (its writer owns it).
TRUNCATABLE = frozenset({SegmentState.COMPLETED, SegmentState.PARTIALLY_TRUNCATED})


# -- the truncation record ----------------------------------------------------------------------


@dataclass(frozen=True)
class TruncationRecord:
    point: DLSN  # first position kept
    truncated_txid: int = NO_TXID  # highest txid known to lie before the point (-1: unknown)
    updated: float = 0.0
    reason: str = ""  # what moved it last: an explicit truncate, a TTL, a size cap
    by: str = ""  # who: "dlctl", "housekeeping n1", ...

    def to_json(self) -> bytes:
        raw = asdict(self)
        raw["point"] = str(self.point)
        return json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> TruncationRecord:
        try:
            raw: Any = json.loads(data)
            if not isinstance(raw, dict):
                raise ValueError("expected a JSON object")
            return cls(**{**raw, "point": DLSN.parse(raw["point"])})
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
            raise CorruptMetadata(f"{where}: malformed truncation record: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"point": str(self.point), "truncated_txid": self.truncated_txid, "updated": self.updated, "reason": self.reason, "by": self.by}


class TruncationStore:
    """The truncation points of one cluster's logs."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self.client = meta.client

    def path(self, name: str) -> str:
        return paths.log_truncation(self.meta.cluster, name)

    def get(self, name: str) -> Versioned[TruncationRecord] | None:
        """The log's truncation point with its znode version; None when it was never truncated."""
        path = self.path(name)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return None
        return Versioned(TruncationRecord.from_json(data, path), stat.version)

    def advance(
        self,
        name: str,
        point: DLSN,
        *,
        truncated_txid: int = NO_TXID,
        reason: str = "",
        by: str = "",
        clock: Callable[[DLSN, DLSN | None], Any] | None = None,
    ) -> tuple[Versioned[TruncationRecord], bool]:
        """Move the point forward to ``point`` by CAS; never backwards. Returns the record now in
        place and whether this call moved it (False: it was already at or past ``point``).

        The clock base at ``point`` must be in place before the point moves (the records before
        it are about to go; see ``dlctl.replication.truncation_base``): ``clock(point, previous)``
        establishes it (idempotent). Without ``clock`` the base must already be recorded, unless
        the log shows no sign of replication (``clock_base_refusal``)."""
        path = self.path(name)
        moved = False

        def read() -> Versioned[TruncationRecord | None]:
            return self.get(name) or Versioned(None, cas.ABSENT)

        def change(current: TruncationRecord | None) -> TruncationRecord | None:
            if current is not None and current.point >= point:
                return None  # already there or past it (another truncation's): never backwards
            # The clock base at the point before the point moves, at every attempt: each
            # compares with the record read then (idempotent).
            if clock is not None:
                clock(point, current.point if current is not None else None)
            else:
                problem = clock_base_refusal(self.meta, name, point)
                if problem is not None:
                    raise problem
            return TruncationRecord(
                point=point,
                truncated_txid=max(truncated_txid, current.truncated_txid if current else NO_TXID),
                updated=time.time(),
                reason=reason,
                by=by,
            )

        def write(new: TruncationRecord, version: int) -> Versioned[TruncationRecord]:
            nonlocal moved
            gone = NotFoundError("gone")
            try:
                written = Versioned(new, cas.put(self.client, path, new.to_json(), version, acl=self.meta.acl, missing=lambda: gone))
            except NotFoundError:
                if not self.client.exists(paths.log(self.meta.cluster, name)):
                    raise NotFoundError(f"log {name!r} does not exist in cluster {self.meta.cluster!r}") from None
                # The record was deleted under us (the log deleted and re-created?): look again.
                raise cas.changed_concurrently(path, version) from None
            moved = True
            return written

        result = cas.update(read, change, write, what=path, attempts=32)
        assert result.value is not None  # (change(None) always derives a record)
        return Versioned(result.value, result.version), moved


def clock_base_refusal(meta: MetaStore, name: str, point: DLSN) -> RefusedError | None:
    """Why the truncation point of ``name`` may not move to ``point`` yet (None: it may): the log
    is replicated (a retention pin, or a clock znode: steps or an earlier truncation base) and its
    recorded truncation base (``dlctl.replication.clock``) does not reach ``point``."""
    try:
        data, _ = meta.client.get(paths.log_clock(meta.cluster, name))
    except NoNodeError:
        data = None
    at = None
    if data is not None:
        try:
            raw = (json.loads(data).get("truncation") or {}).get("at")
            at = DLSN.parse(raw) if raw else None
        except (ValueError, AttributeError, TypeError):
            at = None
    if at is not None and at >= point:
        return None
    if data is None and not _pinned(meta, name):
        return None
    return RefusedError(
        f"refused: the truncation point of log {name!r} may not move to {point} before its clock base there is recorded "
        "(the log is replicated: readers starting at the point must stamp its records as readers from the beginning did)",
        hint="truncate it with `dlctl truncate`, or let the agents' housekeeping apply retention: both record the base first",
        details={"log": name, "point": str(point), "clock_base_at": str(at) if at is not None else None},
    )


def _pinned(meta: MetaStore, name: str) -> bool:
    from .pins import PinStore

    return bool(PinStore(meta).pins_of_log(name))  # every holder's pin on it, expired ones too


# -- pure decisions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentMark:
    """What a truncation does to one segment."""

    seq: int
    state: SegmentState  # TRUNCATED or PARTIALLY_TRUNCATED
    min_active_entry: int = 0

    def apply(self, record: SegmentRecord) -> SegmentRecord:
        return replace(record, state=self.state, min_active_entry=max(record.min_active_entry, self.min_active_entry))


def mark_for(segment: SegmentRecord, point: DLSN) -> SegmentMark | None:
    """The mark ``point`` asks of ``segment``, or None when it asks nothing new of it."""
    if segment.state not in TRUNCATABLE:
        return None  # in progress (never touched) or already truncated
    if segment.seq < point.segment_seq or (segment.seq == point.segment_seq and point.entry_id > segment.last_entry_id):
        return SegmentMark(segment.seq, SegmentState.TRUNCATED)
    if segment.seq == point.segment_seq and point.entry_id > segment.min_active_entry:
        return SegmentMark(segment.seq, SegmentState.PARTIALLY_TRUNCATED, point.entry_id)
    return None


def marks_for(segments: Iterable[SegmentRecord], point: DLSN) -> list[SegmentMark]:
    return [m for m in (mark_for(s, point) for s in segments) if m is not None]


def normalize(segments: Sequence[SegmentRecord], point: DLSN) -> DLSN:
    """``point`` past the last entry of a closed segment means "all of it": the next segment's start."""
    for seg in segments:
        if seg.seq == point.segment_seq and seg.state is not SegmentState.INPROGRESS and point.entry_id > seg.last_entry_id:
            return DLSN(seg.seq + 1, 0, 0)
    return point


def truncated_txid(segments: Iterable[SegmentRecord], point: DLSN) -> int:
    """The highest txid the metadata proves to lie before ``point`` (whole segments only)."""
    best = NO_TXID
    for seg in segments:
        whole = seg.seq < point.segment_seq or (seg.seq == point.segment_seq and seg.state is not SegmentState.INPROGRESS and point.entry_id > seg.last_entry_id)
        if whole and seg.records > 0:
            best = max(best, seg.last_txid)
    return best


@dataclass(frozen=True)
class TargetCheck:
    """Why a truncation to a point may not go ahead (empty: it may)."""

    in_progress: SegmentRecord | None = None  # the point falls in (or past) this in-progress segment
    beyond_end: int | None = None  # the point is past the log's end: the highest allowed segment seq
    pins: tuple[PinRecord, ...] = ()  # live pins the point would pass

    @property
    def ok(self) -> bool:
        return self.in_progress is None and self.beyond_end is None and not self.pins


def live_pins(pins: Iterable[PinRecord], now: float) -> list[PinRecord]:
    return [p for p in pins if not p.needs_bootstrap and not p.expired(now)]


def check_target(segments: Sequence[SegmentRecord], point: DLSN, max_segment_seq: int, pins: Iterable[PinRecord], now: float) -> TargetCheck:
    """Refusals for an explicit truncation to ``point``.

    An in-progress segment is never truncated: the point may be at its very start (everything
    before it goes) but not inside it. The point may not pass the end of the log (the start of
    the segment the next writer will create). A live pin (not expired, not already marked for
    bootstrap) refuses any point past its position: the stream still needs what lies between."""
    in_progress = next((s for s in segments if s.state is SegmentState.INPROGRESS and point > DLSN(s.seq, 0, 0)), None)
    end = DLSN(max_segment_seq + 1, 0, 0)
    beyond = max_segment_seq + 1 if point > end and in_progress is None else None
    blocking = tuple(sorted((p for p in live_pins(pins, now) if point > p.position), key=lambda p: (p.position, p.holder)))
    return TargetCheck(in_progress, beyond, blocking)


def overrun_pins(pins: Iterable[PinRecord], point: DLSN) -> list[PinRecord]:
    """Pins (not yet marked for bootstrap) whose position ``point`` passes: their holders can no
    longer read on from where they are and need a bootstrap."""
    return sorted((p for p in pins if not p.needs_bootstrap and point > p.position), key=lambda p: p.holder)


@dataclass(frozen=True)
class RetentionDecision:
    point: DLSN
    segments: tuple[int, ...]  # the sequence numbers it truncates
    truncated_txid: int
    reason: str


def retention_point(segments: Sequence[SegmentRecord], now: float, *, ttl: float | None = None, max_bytes: int | None = None) -> RetentionDecision | None:
    """Where retention truncates: a prefix of the log's live segments.

    TTL: completed segments whose last record was appended more than ``ttl`` seconds ago (their
    completion time, for segments that do not record append times). Size cap:
    the oldest completed segments, while the live segments hold more than ``max_bytes`` (a
    partially truncated segment counts whole: its file still does). Both stop at the first
    segment that does not qualify — an in-progress one never does — because truncation only
    ever removes a prefix. None when nothing qualifies."""
    live = [s for s in sorted(segments, key=lambda s: s.seq) if s.state is not SegmentState.TRUNCATED]
    n_ttl = 0
    if ttl is not None:
        while n_ttl < len(live) and live[n_ttl].state in TRUNCATABLE and (last := live[n_ttl].last_append_ms) is not None and now * 1000 - last > ttl * 1000:
            n_ttl += 1
    n_size = 0
    if max_bytes is not None:
        total = sum(s.bytes for s in live)
        while n_size < len(live) and total > max_bytes and live[n_size].state in TRUNCATABLE:
            total -= live[n_size].bytes
            n_size += 1
    n = max(n_ttl, n_size)
    if n == 0:
        return None
    dropped = live[:n]
    point = DLSN(live[n].seq, 0, 0) if n < len(live) else DLSN(dropped[-1].seq + 1, 0, 0)
    why = []
    if n_ttl:
        why.append(f"{n_ttl} segment(s) last appended to more than {_human_seconds(ttl)} ago")  # type: ignore[arg-type]
    if n_size:
        why.append(f"{n_size} oldest segment(s) over the {max_bytes}-byte cap")
    return RetentionDecision(point, tuple(s.seq for s in dropped), truncated_txid(dropped, point), "retention: " + "; ".join(why))


def clamp_to_pins(point: DLSN, pins: Iterable[PinRecord], now: float) -> tuple[DLSN, list[str]]:
    """Retention never passes a live pin: it stops at the start of the pinned segment (the
    whole segment stays). Returns the clamped point and the holders that clamped it."""
    limit, holders = point, []
    for pin in live_pins(pins, now):
        start = DLSN(pin.position.segment_seq, 0, 0)
        if start < point:
            holders.append(pin.holder)
            limit = min(limit, start)
    return limit, sorted(set(holders))


@dataclass(frozen=True)
class Collectable:
    """Truncated segments whose records may go, and why others stay."""

    collect: tuple[SegmentRecord, ...]
    kept: dict[int, str] = field(default_factory=dict)  # seq -> why its record stays
    tombstone: int | None = None  # seq of the record kept for the next writer's txids; files may go


def collectable(segments: Sequence[SegmentRecord], pins: Iterable[PinRecord], now: float, *, require_cold: bool = False) -> Collectable:
    """Which truncated segments leave the metadata.

    Every truncated segment that no live pin protects — except the log's highest segment when
    it is itself truncated: the writer continues its txids from the last segment record it
    finds, so that record stays (state ``truncated``, never read) until a newer segment exists;
    its files may go (``tombstone``). ``require_cold``: only segments with a verified cold copy
    (``SegmentRecord.cold``) go, record or files (``dlctl.meta.coldpolicy``)."""
    ordered = sorted(segments, key=lambda s: s.seq)
    pinned = live_pins(pins, now)
    collect, kept, tombstone = [], {}, None
    for i, seg in enumerate(ordered):
        if seg.state is not SegmentState.TRUNCATED:
            continue
        holders = sorted(p.holder for p in pinned if p.protects(seg.seq, now))
        if holders:
            kept[seg.seq] = "pinned by " + ", ".join(holders)
            continue
        if require_cold and seg.cold is None:
            kept[seg.seq] = "waiting for its copy in the cold store"
            continue
        if i == len(ordered) - 1:
            kept[seg.seq] = "last segment of the log: its record keeps the last txid for the next writer (its files may go)"
            tombstone = seg.seq
            continue
        collect.append(seg)
    return Collectable(tuple(collect), kept, tombstone)


def _human_seconds(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# -- pipelined ZooKeeper I/O -----------------------------------------------------------------------

WINDOW = 512  # reads in flight at once
BATCH = 250  # versioned writes per multi-op transaction (well under ZooKeeper's 1 MiB request limit)


def segment_seqs(meta: MetaStore, name: str) -> list[int]:
    parent = paths.log_segments(meta.cluster, name)
    try:
        children = meta.client.get_children(parent)
    except NoNodeError:
        raise NotFoundError(f"log {name!r} does not exist in cluster {meta.cluster!r}") from None
    return sorted(int(c) for c in children if c.isdigit())


def read_segments(meta: MetaStore, name: str, seqs: Iterable[int] | None = None, window: int = WINDOW) -> list[Versioned[SegmentRecord]]:
    """The log's segments (or those of ``seqs`` that exist) with versions, in order, read with
    up to ``window`` requests in flight (``MetaStore.segments`` reads one at a time)."""
    wanted = sorted(set(seqs)) if seqs is not None else segment_seqs(meta, name)
    out: list[Versioned[SegmentRecord]] = []
    for start in range(0, len(wanted), window):
        chunk = wanted[start : start + window]
        pending = [(seq, meta.client.get_async(paths.segment(meta.cluster, name, seq))) for seq in chunk]
        for seq, result in pending:
            try:
                data, stat = result.get()
            except NoNodeError:
                continue  # collected between the listing and the read
            out.append(Versioned(segment_from_json(data, paths.segment(meta.cluster, name, seq)), stat.version))
    return out


@dataclass
class MarkReport:
    truncated: list[int] = field(default_factory=list)
    partial: dict[int, int] = field(default_factory=dict)  # seq -> min_active_entry
    retried: int = 0  # CAS lost to a concurrent change, re-read and re-decided
    versions: dict[int, Versioned[SegmentRecord]] = field(default_factory=dict)  # what was written, at its new version

    def to_dict(self) -> dict[str, Any]:
        return {"truncated": len(self.truncated), "partially_truncated": {str(k): v for k, v in self.partial.items()}, "cas_retries": self.retried}


def _multi(meta: MetaStore, ops: list[tuple[Any, ...]]) -> tuple[list[Any], dict[int, Exception]]:
    """Commit ``ops`` (("set", path, data, version) or ("delete", path, version)) as one
    transaction. Returns the results and, when it was refused, the ops that refused it by
    index (the others only rolled back with them)."""
    tx = meta.client.transaction()
    for op in ops:
        if op[0] == "set":
            tx.set_data(op[1], op[2], version=op[3])
        else:
            tx.delete(op[1], version=op[2])
    results = tx.commit()
    # ZooKeeper stops at the first op that fails: those before it answer "rolled back", those
    # after it "runtime inconsistency" (never checked). Only the first is the culprit.
    failed = {i: r for i, r in enumerate(results) if isinstance(r, Exception) and not isinstance(r, (RolledBackError, RuntimeInconsistency))}
    return results, failed


def _batches(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def apply_marks(meta: MetaStore, name: str, point: DLSN, segments: Sequence[Versioned[SegmentRecord]] | None = None, batch: int = BATCH, attempts: int = 16) -> MarkReport:
    """Mark every segment ``point`` asks for, each by CAS at the version read.

    Marks go in multi-op transactions of ``batch`` versioned sets (one round trip and one
    ZooKeeper commit for all of them; kazoo's per-request cost would otherwise dominate). A
    transaction refused by a changed segment (a concurrent truncation, re-replication changing
    an ensemble) is retried without it, and that segment is re-read and decided again, so
    nothing another party wrote is overwritten and marks never go backwards."""
    report = MarkReport()
    current = list(segments) if segments is not None else read_segments(meta, name)
    for _ in range(attempts):
        todo = [(v, m) for v in current for m in [mark_for(v.value, point)] if m is not None]
        if not todo:
            return report
        lost: list[int] = []
        for chunk in _batches(todo, batch):
            pending = list(chunk)
            while pending:
                new = [m.apply(v.value) for v, m in pending]
                results, failed = _multi(meta, [("set", paths.segment(meta.cluster, name, v.value.seq), to_json(r), v.version) for (v, _), r in zip(pending, new)])
                if not failed:
                    for (v, m), record, stat in zip(pending, new, results):
                        report.versions[m.seq] = Versioned(record, stat.version)
                        if m.state is SegmentState.TRUNCATED:
                            report.truncated.append(m.seq)
                        else:
                            report.partial[m.seq] = m.min_active_entry
                    break
                for i, exc in failed.items():
                    if isinstance(exc, BadVersionError):
                        lost.append(pending[i][0].value.seq)
                    elif not isinstance(exc, NoNodeError):  # NoNode: collected meanwhile, nothing to mark
                        raise exc
                pending = [p for i, p in enumerate(pending) if i not in failed]
        if not lost:
            return report
        report.retried += len(lost)
        current = read_segments(meta, name, lost)
    raise ConflictError(f"aborted: segments of log {name!r} kept changing while being marked truncated", hint="nothing was overwritten; re-run to finish")


def delete_segment_records(meta: MetaStore, name: str, segments: Sequence[Versioned[SegmentRecord]], batch: int = BATCH) -> tuple[list[int], list[int]]:
    """Delete truncated segments' records, each at the version read (multi-op transactions of
    ``batch``). Returns the sequence numbers deleted (or already gone) and those that changed
    meanwhile (kept; the next collection looks again)."""
    deleted, changed = [], []
    for v in segments:
        if v.value.state is not SegmentState.TRUNCATED:
            raise ValueError(f"segment {v.value.seq} of log {name!r} is {v.value.state.value}, not truncated")
    for chunk in _batches(list(segments), batch):
        pending = list(chunk)
        while pending:
            _, failed = _multi(meta, [("delete", paths.segment(meta.cluster, name, v.value.seq), v.version) for v in pending])
            if not failed:
                deleted += [v.value.seq for v in pending]
                break
            for i, exc in failed.items():
                if isinstance(exc, NoNodeError):
                    deleted.append(pending[i].value.seq)
                elif isinstance(exc, (BadVersionError, NotEmptyError)):
                    changed.append(pending[i].value.seq)
                else:
                    raise exc
            pending = [p for i, p in enumerate(pending) if i not in failed]
    return deleted, changed


def refresh(meta: MetaStore, name: str, known: Sequence[Versioned[SegmentRecord]]) -> list[Versioned[SegmentRecord]]:
    """``known`` (a snapshot) brought up to date where it matters for a truncation decision,
    cheaply: segments created since (listing) and those that were in progress are read again;
    collected ones drop out. Other changes are caught by the CAS on the versions read."""
    seqs = set(segment_seqs(meta, name))
    by_seq = {v.value.seq: v for v in known if v.value.seq in seqs}
    again = {s for s in seqs if s not in by_seq} | {s for s, v in by_seq.items() if v.value.state is SegmentState.INPROGRESS}
    for v in read_segments(meta, name, again):
        by_seq[v.value.seq] = v
    return [by_seq[s] for s in sorted(by_seq) if s in by_seq]


__all__ = [
    "Collectable",
    "MarkReport",
    "RetentionDecision",
    "SegmentMark",
    "TargetCheck",
    "TruncationRecord",
    "TruncationStore",
    "apply_marks",
    "check_target",
    "clamp_to_pins",
    "collectable",
    "delete_segment_records",
    "live_pins",
    "mark_for",
    "marks_for",
    "normalize",
    "overrun_pins",
    "read_segments",
    "refresh",
    "retention_point",
    "segment_seqs",
    "truncated_txid",
]
