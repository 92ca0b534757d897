"""Retention, collection of truncated segments, and reclaiming their replicas' disk space
(DESIGN.md §9): what the agents' housekeeping and ``dlctl gc`` (``dlctl.ops.gc``, its plan) run.

Per log (``decide`` / ``apply_log``): retention by age (completion time) and size cap moves the
truncation point (never past a live pin, never into an in-progress segment — unless the
disk-space override says pins no longer count), the segments before the point are marked, and
then truncated segments **leave the metadata first**: their records are deleted (by version)
unless a live pin still protects them. One record stays: when the log's highest segment is
itself truncated, its record is what the next writer continues its txids from, so it is kept
(state ``truncated``, never read) until a newer segment exists; its files may go.

Per replica (``verdict``), from what an agent holds and the metadata read *after* listing it:

- **stale**: the segment was truncated and its record collected (no record, sequence number
  below the log's truncation point), or it is the kept last record above: delete.
- **orphan**: nothing in the metadata explains it — no log has its id (a deleted log), the log
  has no such segment and it is not below the truncation point, or the agent is not a member
  of the segment (a copy left by an interrupted re-replication). Reported; deleted only with
  ``--force``. Copies that a running re-replication names are never orphans.
- otherwise **keep**; so is every replica of a log whose records cannot be read (damaged) and,
  while some log's own record cannot be read (its id unknown), every replica of no readable log:
  that log and its replicas are left alone and named, the others are judged as ever.

Why listing first and the metadata after is safe: a replica's file is only ever created for a
segment whose record already exists (the writer creates the record, then writes), so a file
seen in the listing had its record before the metadata read began; if the record is missing at
that read, it was deleted — by collection (then the sequence number is below the truncation
point, which only moves forward) or with its log.

Every agent applies the stale rule to its own files (``dlagent.housekeeping``: at start and
periodically), so an agent that was down during a collection deletes its stale replicas when
it comes back; ``dlctl gc`` additionally asks every live agent to delete them at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kazoo.exceptions import NoAuthError, NoNodeError

from ..cold.store import ColdStore
from ..errors import NotFoundError
from ..log.dlsn import DLSN
from ..log.errors import AgentError
from ..log.pool import AgentPool
from ..log.rereplication import members
from ..meta import coldpolicy, paths
from ..meta.pins import PinRecord, PinStore, mark_pins
from ..meta.records import (
    LogRecord,
    SegmentRecord,
    SegmentState,
    Versioned,
    log_from_json,
)
from ..meta.store import MetaStore
from ..meta.zk import UNREADABLE
from ..meta.truncation import (
    Collectable,
    RetentionDecision,
    SegmentMark,
    TruncationRecord,
    TruncationStore,
    apply_marks,
    clamp_to_pins,
    collectable,
    delete_segment_records,
    marks_for,
    overrun_pins,
    read_segments,
    refresh,
    retention_point,
    segment_seqs,
    truncated_txid,
)
from ..replication import truncation_base
from . import offload

log = logging.getLogger(__name__)

KEEP, STALE, ORPHAN = "keep", "stale", "orphan"


# -- per log: retention and collection ---------------------------------------------------------------


@dataclass(frozen=True)
class LogState:
    """One log's metadata as read at one moment."""

    name: str
    log: Versioned[LogRecord]
    truncation: Versioned[TruncationRecord] | None
    segments: list[Versioned[SegmentRecord]]
    pins: list[Versioned[PinRecord]]
    cold_required: bool = False  # truncated segments leave only with a cold copy (dlctl.retention.offload)

    @property
    def point(self) -> DLSN | None:
        return self.truncation.value.point if self.truncation else None


def read_log_state(meta: MetaStore, name: str, cold_required: bool | None = None) -> LogState:
    """``cold_required``: whether the cluster requires cold copies, when the caller read it
    already (once per round rather than once per log); None: read it here."""
    record = meta.get_log(name)
    truncation = TruncationStore(meta).get(name)
    segments = read_segments(meta, name)
    if cold_required is None:
        cold_required = coldpolicy.load(meta) is not None
    return LogState(name, record, truncation, segments, PinStore(meta).pins_of_log(name), cold_required)


@dataclass
class LogDecision:
    name: str
    log_id: int
    current: DLSN | None  # truncation point in place
    retention: RetentionDecision | None  # a new point from the retention policy
    clamped_by: list[str]  # holders whose live pins stopped retention short
    point: DLSN | None  # the point after this round
    marks: list[SegmentMark]
    pins_to_mark: list[str]  # holders whose pins the point passes: they need a bootstrap
    collect: list[SegmentRecord]
    kept: dict[int, str]
    tombstone: int | None
    offload: list[int] = field(default_factory=list)  # truncated segments to copy to the cold store first

    @property
    def empty(self) -> bool:
        return self.retention is None and not self.marks and not self.collect and not self.pins_to_mark and not self.offload

    def describe(self) -> str:
        parts = []
        if self.retention is not None:
            parts.append(f"truncate to {self.retention.point} ({self.retention.reason})")
        elif self.marks:
            parts.append(f"finish marking {len(self.marks)} segment(s) before {self.point} truncated")
        if self.pins_to_mark:
            parts.append("mark pin(s) of " + ", ".join(self.pins_to_mark) + " as needing a bootstrap")
        if self.offload:
            parts.append(f"copy {len(self.offload)} truncated segment(s) to the cold store (each is removed only once its copy is verified)")
        if self.collect:
            seqs = [s.seq for s in self.collect]
            span = f"{seqs[0]}" if len(seqs) == 1 else f"{seqs[0]}..{seqs[-1]}"
            parts.append(f"remove {len(seqs)} truncated segment record(s) ({span}, {sum(s.bytes for s in self.collect)} bytes) from the metadata")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "log": self.name,
            "truncation_point": str(self.point) if self.point else None,
            "retention": {"point": str(self.retention.point), "reason": self.retention.reason, "segments": len(self.retention.segments)} if self.retention else None,
            "clamped_by_pins": self.clamped_by,
            "segments_marked": len(self.marks),
            "pins_marked_for_bootstrap": self.pins_to_mark,
            "segments_collected": [s.seq for s in self.collect],
            "segments_to_offload": self.offload,
            "bytes_collected": sum(s.bytes for s in self.collect),
            "kept": {str(k): v for k, v in self.kept.items()},
        }


def decide(state: LogState, now: float, *, retention: bool = True, override: str | None = None) -> LogDecision:
    """What one round does to one log (pure: the metadata snapshot in, the decision out).

    ``override`` (a reason, e.g. the disk-space override) lets retention pass live pins."""
    current = state.point
    plain = [s.value for s in state.segments]
    pins = [p.value for p in state.pins]
    config = state.log.value.config
    decision: RetentionDecision | None = None
    clamped_by: list[str] = []
    if retention and (config.retention_seconds is not None or config.retention_bytes is not None):
        wanted = retention_point(plain, now, ttl=config.retention_seconds, max_bytes=config.retention_bytes)
        if wanted is not None:
            point = wanted.point
            if override is None:
                point, clamped_by = clamp_to_pins(point, pins, now)
            if (current is None or point > current) and marks_for(plain, point):
                if point != wanted.point:
                    wanted = RetentionDecision(
                        point,
                        tuple(s for s in wanted.segments if s < point.segment_seq),
                        truncated_txid(plain, point),
                        wanted.reason + f" (stopped at {point} by the pin(s) of {', '.join(clamped_by)})",
                    )
                elif override is not None:
                    wanted = replace(wanted, reason=f"{wanted.reason} ({override})")
                decision = wanted
    point_after = max((p for p in (current, decision.point if decision else None) if p is not None), default=None)
    marks = marks_for(plain, point_after) if point_after is not None else []
    by_seq = {m.seq: m for m in marks}
    simulated = [by_seq[s.seq].apply(s) if s.seq in by_seq else s for s in plain]
    passed = overrun_pins(pins, point_after) if point_after is not None else []
    if override is None:
        # Without the override only expired pins, or pins set below a point already in place,
        # can be passed (clamping keeps retention short of the others).
        passed = [p for p in passed if p.expired(now) or (current is not None and p.position < current)]
    holders = {p.holder for p in passed}
    after_pins = [replace(p, needs_bootstrap=True) if p.holder in holders else p for p in pins]
    # (Planned as if the cold copies succeed; apply_log collects only the segments that have one.)
    collected: Collectable = collectable(simulated, after_pins, now)
    offload = [s.seq for s in simulated if s.state is SegmentState.TRUNCATED and s.cold is None] if state.cold_required else []
    return LogDecision(
        state.name,
        state.log.value.log_id,
        current,
        decision,
        clamped_by,
        point_after,
        marks,
        sorted(holders),
        list(collected.collect),
        dict(collected.kept),
        collected.tombstone,
        offload,
    )


def apply_log(
    meta: MetaStore,
    name: str,
    *,
    now: float | None = None,
    by: str,
    retention: bool = True,
    override: str | None = None,
    state: LogState | None = None,
    secret: bytes | None = None,
    cold_store: ColdStore | None = None,
    cold_required: bool | None = None,
    cold_rate: float = 0.0,
) -> dict[str, Any]:
    """Decide and apply: mark passed pins, move the point (retention), mark segments, copy
    truncated segments to the cold store when the cluster requires it (``cold_store``, read
    with ``secret`` at ``cold_rate`` bytes per second at most, 0: no limit), then delete truncated segments' records — each by CAS on the version read.

    ``secret`` lets retention read the agents: a replicated log's clock base at the new point is
    recorded (``dlctl.replication.truncation_base``) before the point moves. Without it, moving a
    replicated log's point past its recorded base is refused.

    ``state``: a snapshot read earlier (the plan's); it is brought up to date where decisions
    depend on it (new and in-progress segments, the point, the pins) and every write is a CAS on
    the versions read, so a change since is never overwritten (it is looked at next round)."""
    now = time.time() if now is None else now
    if state is None:
        state = read_log_state(meta, name, cold_required)
    else:
        state = replace(state, segments=refresh(meta, name, state.segments), truncation=TruncationStore(meta).get(name), pins=PinStore(meta).pins_of_log(name))
    d = decide(state, now, retention=retention, override=override)
    out: dict[str, Any] = {"log": name, "truncation_point": str(d.point) if d.point else None}
    pin_store = PinStore(meta)
    if d.pins_to_mark and d.point is not None:
        chosen = [p for p in state.pins if p.value.holder in d.pins_to_mark]
        out["pins_marked_for_bootstrap"] = mark_pins(pin_store, chosen, d.point, now, override)
    if d.retention is not None:
        clock: Any = None
        if secret is not None:
            snapshot = [v.value for v in state.segments]

            def clock(point: DLSN, previous: DLSN | None) -> None:
                out["clock_base"] = truncation_base.prepare(meta, name, point, secret=secret, segments=snapshot, previous=previous)

        record, moved = TruncationStore(meta).advance(name, d.retention.point, truncated_txid=d.retention.truncated_txid, reason=d.retention.reason, by=by, clock=clock)
        out.update(truncation_point=str(record.value.point), retention=d.retention.reason, moved=moved)
        point = record.value.point
    else:
        point = d.point
    current = {v.value.seq: v for v in state.segments}
    if point is not None and marks_for((s.value for s in state.segments), point):
        marked = apply_marks(meta, name, point, state.segments)
        current.update(marked.versions)  # what was written, at its new version: no re-read
        out["marks"] = marked.to_dict()
    if state.cold_required:
        out.update(_offload(meta, name, state.log.value.log_id, current, cold_store, secret, cold_rate))
    # Pins are read again: marking may have changed them, and a live one keeps its segments.
    pins = [p.value for p in pin_store.pins_of_log(name)]
    chosen = collectable([v.value for v in current.values()], pins, now, require_cold=state.cold_required)
    deleted, changed = delete_segment_records(meta, name, [current[s.seq] for s in chosen.collect])
    gone = set(deleted)
    out.update(
        segments_collected=deleted,
        bytes_collected=sum(current[s].value.bytes for s in gone),
        changed_meanwhile=changed,
        kept={str(k): v for k, v in chosen.kept.items()},
    )
    return out


def _offload(meta: MetaStore, name: str, log_id: int, current: dict[int, Versioned[SegmentRecord]], store: ColdStore | None, secret: Any, rate: float) -> dict[str, Any]:
    """Copy the truncated segments without a cold copy; ``current`` gets the marked records."""
    todo = offload.pending(sorted(current.values(), key=lambda v: v.value.seq))
    if not todo:
        return {}
    if store is None or secret is None:
        return {"offload_waiting": {str(v.value.seq): "this collector cannot reach the cold store" for v in todo}}
    marked, failed = offload.offload_segments(meta, name, log_id, todo, store, secret, rate)
    current.update(marked)
    out: dict[str, Any] = {"offloaded": sorted(marked)}
    if failed:
        out["offload_waiting"] = {str(k): v for k, v in failed.items()}
    return out


# -- per replica -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogView:
    """What a replica's verdict needs to know about its log."""

    name: str
    log_id: int
    point: DLSN | None  # truncation point
    seqs: frozenset[int]  # segment records that exist
    records: Mapping[int, SegmentRecord]  # those read (all of them, or only some)
    tombstone: int | None  # truncated last record whose files may go
    unreadable: str = ""  # why some of its records cannot be read: none of its replicas is judged

    @classmethod
    def of_unreadable(cls, name: str, log_id: int, why: str) -> LogView:
        return cls(name, log_id, None, frozenset(), {}, None, why)


@dataclass
class LogViews:
    """The views by log id, and the logs whose own record cannot be read (name -> why): a replica
    of no readable log may be one of theirs, so it is kept rather than called an orphan (which
    ``gc --force`` would delete). A damaged record stops the judgement of its log's replicas
    only, not of every log's."""

    by_id: dict[int, LogView] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)

    def get(self, log_id: int) -> LogView | None:
        return self.by_id.get(log_id)

    def verdict(self, log_id: int, seq: int, node: str, busy: Collection[tuple[str, int]] = ()) -> tuple[str, str]:
        view = self.by_id.get(log_id)
        if view is None and self.unreadable:
            return KEEP, f"no readable log has id {log_id}; it may be one of log(s) {', '.join(sorted(self.unreadable))}, whose record cannot be read"
        return verdict(view, seq, node, busy)

    def damaged(self) -> dict[str, str]:
        """Every log whose metadata could not be read: name -> why."""
        return {**self.unreadable, **{v.name: v.unreadable for v in self.by_id.values() if v.unreadable}}


def verdict(view: LogView | None, seq: int, node: str, busy: Collection[tuple[str, int]] = ()) -> tuple[str, str]:
    """KEEP, STALE or ORPHAN for ``node``'s replica of segment ``seq`` (see the module doc)."""
    if view is None:
        return ORPHAN, "no log has this id (its log was deleted?)"
    if view.unreadable:
        return KEEP, f"the metadata of log {view.name} cannot be read ({view.unreadable}): not judged"
    if seq not in view.seqs:
        if view.point is not None and seq < view.point.segment_seq:
            return STALE, f"segment {seq} of {view.name} was truncated (before {view.point}) and its record collected"
        return ORPHAN, f"log {view.name} has no segment {seq} and it is not below the truncation point"
    if seq == view.tombstone:
        return STALE, f"segment {seq} of {view.name} is truncated (its record stays only for the log's last txid)"
    record = view.records.get(seq)
    if record is None:
        return KEEP, "record not read"
    if node not in members(record) and (view.name, seq) not in busy:
        return ORPHAN, f"{node} is not a member of segment {seq} of {view.name} (a copy left by re-replication?)"
    return KEEP, ""


def _tombstone(segments: Mapping[int, SegmentRecord], seqs: Iterable[int], pins: Iterable[PinRecord], now: float, require_cold: bool = False) -> int | None:
    seqs = list(seqs)
    if not seqs:
        return None
    top = segments.get(max(seqs))
    if top is None or top.state is not SegmentState.TRUNCATED:
        return None
    return collectable([top], pins, now, require_cold=require_cold).tombstone


def load_views(meta: MetaStore, log_ids: Collection[int] | None = None, *, full: bool = True, now: float | None = None) -> LogViews:
    """Views of the logs with the given ids (all logs: None). ``full`` reads every segment record
    (for membership checks); otherwise only the highest one (enough for the stale rule). A log
    whose records cannot be read is in the result as such (``LogViews``)."""
    now = time.time() if now is None else now
    names = meta.list_logs()
    pending = [(n, meta.client.get_async(paths.log(meta.cluster, n))) for n in names]
    by_id: dict[int, str] = {}
    unreadable: dict[str, str] = {}
    for name, result in pending:
        # Only a record that is gone makes its replicas orphans; any other failure to read it
        # (ZooKeeper unreachable) must not: `gc --force` deletes orphans.
        try:
            data, _ = result.get()
        except NoNodeError:
            continue  # deleted between the listing and the read
        except NoAuthError:
            unreadable[name] = refused_to_us(paths.log(meta.cluster, name))
            continue
        try:
            by_id[log_from_json(data, paths.log(meta.cluster, name)).log_id] = name
        except ValueError as exc:
            unreadable[name] = str(exc)
    views: dict[int, LogView] = {}
    pin_store = PinStore(meta)
    truncations = TruncationStore(meta)
    require_cold = coldpolicy.load(meta) is not None
    for log_id, name in by_id.items():
        if log_ids is not None and log_id not in log_ids:
            continue
        try:
            truncation = truncations.get(name)
            seqs = segment_seqs(meta, name)
            read = read_segments(meta, name, seqs if full else seqs[-1:])
            pins = [p.value for p in pin_store.pins_of_log(name)]
        except NotFoundError:
            continue  # deleted meanwhile: its replicas are orphans
        except UNREADABLE as exc:
            views[log_id] = LogView.of_unreadable(name, log_id, str(exc) or refused_to_us(f"a record of log {name!r}"))
            continue
        records = {v.value.seq: v.value for v in read}
        views[log_id] = LogView(
            name,
            log_id,
            truncation.value.point if truncation else None,
            frozenset(records) if full else frozenset(seqs),
            records,
            _tombstone(records, seqs, pins, now, require_cold),
        )
    return LogViews(views, unreadable)


def busy_segments(meta: MetaStore) -> set[tuple[str, int]]:
    """(log, seq) of every segment a re-replication that has not finished may be copying."""
    out: set[tuple[str, int]] = set()
    for op_id in meta.list_ops():
        try:
            record = meta.get_op(op_id).value
        except (NotFoundError, ValueError):
            continue
        if record.get("kind") == "rereplicate" and record.get("state") != "done":
            for item in record.get("items", []):
                if isinstance(item, dict) and isinstance(item.get("segment"), int):
                    out.add((str(item.get("log")), item["segment"]))
    return out


@dataclass(frozen=True)
class Replica:
    node: str
    log_id: int
    seq: int
    bytes: int
    log: str | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "log": self.log, "log_id": self.log_id, "segment": self.seq, "bytes": self.bytes, "why": self.why}


def classify(node: str, infos: Iterable[Any], views: LogViews, busy: Collection[tuple[str, int]] = ()) -> tuple[list[Replica], list[Replica]]:
    """A node's stale replicas and orphans, from its LIST_SEGMENTS answer."""
    stale, orphans = [], []
    for info in infos:
        view = views.get(info.log_id)
        kind, why = views.verdict(info.log_id, info.segment_seq, node, busy)
        replica = Replica(node, info.log_id, info.segment_seq, info.size_bytes, view.name if view else None, why)
        if kind == STALE:
            stale.append(replica)
        elif kind == ORPHAN:
            orphans.append(replica)
    return stale, orphans


def _note_unreadable(meta: MetaStore, name: str, why: str, views: LogViews) -> None:
    """Record log ``name``, whose state could not be read for ``why``, in ``views``: by its id
    when its own record is readable (only its replicas are then kept unjudged), else by name."""
    try:
        log_id = meta.get_log(name).value.log_id
    except NotFoundError:
        return  # deleted meanwhile: its replicas are orphans
    except UNREADABLE:
        views.unreadable[name] = why
        return
    views.by_id[log_id] = LogView.of_unreadable(name, log_id, why)


def refused_to_us(what: str) -> str:
    return f"ZooKeeper refuses {what} to these credentials (its ACL is not the cluster's)"


def simulated_views(decisions: Iterable[LogDecision], states: Mapping[str, LogState], now: float, unreadable: LogViews | None = None) -> LogViews:
    """The views as they will be once each log's decision is applied (for the dry run), with
    the ``unreadable`` logs' as they are."""
    out = dict(unreadable.by_id) if unreadable else {}
    for d in decisions:
        state = states[d.name]
        by_seq = {m.seq: m for m in d.marks}
        gone = {s.seq for s in d.collect}
        records = {s.value.seq: (by_seq[s.value.seq].apply(s.value) if s.value.seq in by_seq else s.value) for s in state.segments if s.value.seq not in gone}
        out[d.log_id] = LogView(d.name, d.log_id, d.point, frozenset(records), records, d.tombstone)
    return LogViews(out, dict(unreadable.unreadable) if unreadable else {})


# -- the `dlctl gc` plan -----------------------------------------------------------------------------


@dataclass
class NodeWork:
    node: str
    up: bool
    error: str | None = None
    stale: list[Replica] = field(default_factory=list)
    orphans: list[Replica] = field(default_factory=list)


@dataclass
class GcPlan:
    decisions: list[LogDecision]
    nodes: list[NodeWork]
    force: bool
    deferred: dict[str, int]  # down agent -> replicas of collected segments it will delete itself
    notes: list[str] = field(default_factory=list)
    states: dict[str, LogState] = field(default_factory=dict)  # the snapshot the decisions were taken on
    unreadable: dict[str, str] = field(default_factory=dict)  # logs left alone: their metadata cannot be read (name -> why)


async def plan_gc(meta: MetaStore, pool: AgentPool, *, force: bool = False, retention: bool = True, now: float | None = None, timeout: float = 10.0) -> GcPlan:
    now = time.time() if now is None else now
    loop = asyncio.get_running_loop()
    available = await pool.refresh()

    async def listing(node: str) -> tuple[str, list[Any] | str]:
        try:
            client = await pool.client(node)
            return node, await asyncio.wait_for(client.list_segments(), timeout)
        except (AgentError, TimeoutError, OSError) as exc:
            return node, f"{type(exc).__name__}: {exc}"

    # Listings first, metadata after (see the module doc).
    listings = dict(await asyncio.gather(*(listing(n) for n in sorted(available))))
    names = await loop.run_in_executor(None, meta.list_logs)
    cold_required = await loop.run_in_executor(None, lambda: coldpolicy.load(meta) is not None)
    states: dict[str, LogState] = {}
    damaged = LogViews()
    for name in names:
        try:
            states[name] = await loop.run_in_executor(None, read_log_state, meta, name, cold_required)
        except NotFoundError:
            continue
        except UNREADABLE as exc:  # this log only is left alone
            await loop.run_in_executor(None, _note_unreadable, meta, name, str(exc) or refused_to_us(f"a record of log {name!r}"), damaged)
    decisions = [decide(s, now, retention=retention) for s in states.values()]
    views = simulated_views(decisions, states, now, damaged)
    busy = await loop.run_in_executor(None, busy_segments, meta)
    nodes = []
    for node in sorted(listings):
        answer = listings[node]
        if isinstance(answer, str):
            nodes.append(NodeWork(node, up=False, error=answer))
            continue
        stale, orphans = classify(node, answer, views, busy)
        nodes.append(NodeWork(node, up=True, stale=stale, orphans=orphans))
    deferred: dict[str, int] = {}
    reachable = {n.node for n in nodes if n.up}
    for d in decisions:
        for seg in d.collect:
            for member in members(seg) - reachable:
                deferred[member] = deferred.get(member, 0) + 1
    notes = []
    for node, count in sorted(deferred.items()):
        notes.append(f"{node} is not reachable: it deletes its {count} replica(s) of collected segments itself when it is back (housekeeping on start)")
    for name, why in sorted(damaged.damaged().items()):
        notes.append(f"log {name} is left alone (no retention, none of its replicas deleted): its metadata cannot be read: {why}")
    orphans = [o for n in nodes for o in n.orphans]
    if orphans and not force:
        notes.append(f"{len(orphans)} orphan file(s) ({sum(o.bytes for o in orphans)} bytes) have no metadata explaining them: listed in the output; `dlctl gc --force` deletes them")
    for n in nodes:
        if not n.up:
            notes.append(f"{n.node} did not answer ({n.error}); its files were not checked")
    return GcPlan(decisions, nodes, force, deferred, notes, states, damaged.damaged())


class Pace:
    """At most ``rate`` starts per second (None or 0: no limit). Deleting replicas competes with
    appends for the agent's disk (an unlink journals like a write) and its event loop, so a
    collection is spread out rather than run flat out."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self._next = 0.0

    async def wait(self) -> None:
        if not self.interval:
            return
        now = asyncio.get_running_loop().time()
        at = max(now, self._next)
        self._next = at + self.interval
        if at > now:
            await asyncio.sleep(at - now)


DEFAULT_RATE = 50.0  # replica deletions per second per agent (see tests/benchmarks/bench_truncation.py)


async def _delete_on(pool: AgentPool, node: str, planned: list[Replica], force: bool, views: LogViews, busy: Collection[tuple[str, int]], window: int, rate: float | None) -> dict[str, Any]:
    deleted, skipped, errors, reclaimed = 0, [], [], 0
    gate = asyncio.Semaphore(window)
    pace = Pace(rate)
    try:
        client = await pool.client(node)

        async def one(r: Replica) -> None:
            nonlocal reclaimed, deleted
            kind, why = views.verdict(r.log_id, r.seq, node, busy)
            if not (kind == STALE or (kind == ORPHAN and force)):
                skipped.append({"log_id": r.log_id, "segment": r.seq, "now": kind, "why": why})
                return
            async with gate:
                await pace.wait()
                try:
                    if await client.delete_segment(r.log_id, r.seq):
                        deleted += 1
                        reclaimed += r.bytes
                except AgentError as exc:
                    errors.append(f"log id {r.log_id} segment {r.seq}: {exc}")

        await asyncio.gather(*(one(r) for r in planned))
    except AgentError as exc:
        errors.append(str(exc))
    return {"node": node, "deleted": deleted, "bytes_reclaimed": reclaimed, "skipped": skipped, "errors": errors}


def reclaim(meta: MetaStore, secret: bytes, work: Mapping[str, list[Replica]], force: bool, window: int = 8, rate: float | None = DEFAULT_RATE) -> dict[str, Any]:
    """Delete the planned replicas that are still stale (or, with ``force``, still orphans) by
    the metadata as it is now; every agent at once, each paced at ``rate`` per second."""

    async def go() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        ids = {r.log_id for replicas in work.values() for r in replicas}
        # Membership is only needed to judge orphans (deleted with --force): without it, the
        # stale rule needs no segment record but the highest (one read per log, not thousands).
        views = await loop.run_in_executor(None, lambda: load_views(meta, ids, full=force))
        busy = await loop.run_in_executor(None, busy_segments, meta) if force else set()
        pool = AgentPool(meta, secret)
        try:
            results = await asyncio.gather(*(_delete_on(pool, node, replicas, force, views, busy, window, rate) for node, replicas in sorted(work.items())))
        finally:
            await pool.close()
        return {"nodes": list(results)}

    return asyncio.run(go())


__all__ = [
    "DEFAULT_RATE",
    "KEEP",
    "ORPHAN",
    "STALE",
    "GcPlan",
    "LogDecision",
    "LogState",
    "LogView",
    "LogViews",
    "Pace",
    "Replica",
    "apply_log",
    "busy_segments",
    "classify",
    "decide",
    "load_views",
    "plan_gc",
    "read_log_state",
    "reclaim",
    "verdict",
]
