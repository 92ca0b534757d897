"""Re-replicating what lost agents held: planning and the engine behind ``dlctl recover node|region``
(``dlctl.ops.rereplicate``) and the agents' auditor.

Planning reads the metadata (pure decisions are in ``dlctl.log.rereplication``); applying runs
the copy engine over every affected segment — in-progress segments without a live writer are
fenced and recovered first — and records its progress in ZooKeeper at
``/dlctl/<cluster>/ops/<op-id>``, so that re-running the same command continues the unfinished
operation (committed segments are skipped, an interrupted copy is redone idempotently, the
targets chosen before are kept when they still qualify).

The ops record is progress bookkeeping, never the source of truth: every decision is re-taken
from the segment metadata, so a record that lags behind (a run killed between the metadata CAS
and the record update) only costs a re-check.
"""

from __future__ import annotations

import asyncio
import logging
import secrets as _secrets
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConflictError, CorruptMetadata, NotFoundError
from .errors import AgentError
from .recovery import recover_log
from .rereplication import LostRange, choose_target, entries_on, lost_ranges, members
from .rereplication_copy import CopyProgress, StuckError, commit_replacements, copy_replica, drop_orphan
from ..meta.operations import OperationRecord
from ..meta.records import SegmentRecord, SegmentState
from ..meta import policy as placement_store
from ..meta.store import MetaStore
from ..placement import PlacementPolicy
from ..ratelimit import TokenBucket
from .pool import ReplicaPool

log = logging.getLogger(__name__)

OP_KIND = "rereplicate"
PENDING, COPIED, COMMITTED, STUCK, DATA_LOST = "pending", "copied", "committed", "stuck", "data-lost"


@dataclass
class SegmentWork:
    """What one segment needs: each lost member, its target, how much to copy and from where."""

    log: str
    log_id: int
    seq: int
    state: str
    targets: dict[str, str | None]  # lost member -> replacement (None: no agent can take it)
    entries: dict[str, int]
    bytes: int  # estimate (segment bytes pro rata of the entries to copy)
    sources: list[str]
    data_lost: list[LostRange] = field(default_factory=list)
    blocked: str | None = None  # why it cannot be repaired now
    recover_first: bool = False

    @property
    def key(self) -> str:
        return f"{self.log}/{self.seq}"

    def describe(self) -> str:
        copies = "; ".join(
            f"{lost} -> {target or 'NO TARGET'} ({self.entries.get(lost, 0)} entries)" for lost, target in self.targets.items()
        )
        first = "fence and recover, then " if self.recover_first else ""
        return f"{first}copy segment {self.seq} of {self.log} (~{human_size(self.bytes)}): {copies}; from {','.join(self.sources) or 'nothing'}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "log": self.log,
            "segment": self.seq,
            "state": self.state,
            "targets": dict(self.targets),
            "entries": dict(self.entries),
            "bytes": self.bytes,
            "sources": list(self.sources),
            "recover_first": self.recover_first,
            "blocked": self.blocked,
            "data_lost": [r.to_dict() for r in self.data_lost],
        }


@dataclass
class RereplicationPlan:
    lost: list[str]
    work: list[SegmentWork]
    op_id: str | None  # an unfinished operation on the same agents, continued by apply
    notes: list[str]

    @property
    def repairable(self) -> list[SegmentWork]:
        return [w for w in self.work if not w.blocked and not w.data_lost]

    @property
    def data_lost(self) -> list[SegmentWork]:
        return [w for w in self.work if w.data_lost]


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def data_lost_message(work: SegmentWork) -> str:
    ranges = "; ".join(r.describe() for r in work.data_lost)
    return f"data lost: segment {work.seq} of log {work.log}, {ranges}: every replica is on a lost agent"


# -- the ops record ----------------------------------------------------------------------------------


def find_op(meta: MetaStore, lost: Collection[str]) -> tuple[str, dict] | None:
    """The unfinished re-replication of exactly these lost agents, if one is recorded."""
    want = sorted(set(lost))
    for op_id in reversed(meta.list_ops()):  # newest first: ids start with a timestamp
        try:
            record = meta.get_op(op_id).value
        except (NotFoundError, ValueError):
            continue
        if record.get("kind") == OP_KIND and sorted(record.get("lost", [])) == want and record.get("state") != "done":
            return op_id, record
    return None


def new_op_id() -> str:
    return f"{OP_KIND}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{_secrets.token_hex(3)}"


# -- planning -----------------------------------------------------------------------------------------


def plan(
    meta: MetaStore,
    lost: Collection[str],
    *,
    lost_regions: Mapping[str, str | None] | None = None,
    available: Mapping[str, Mapping[str, Any]] | None = None,
    logs: Collection[str] | None = None,
) -> RereplicationPlan:
    """Every segment with a replica on ``lost``, with targets, sources and sizes (blocking ZK reads)."""
    lost_set = set(lost)
    lost_regions = dict(lost_regions or {})
    available = dict(meta.available_nodes() if available is None else available)
    notes: list[str] = []
    still_up = sorted(lost_set & set(available))
    if still_up:
        notes.append(f"agent(s) {', '.join(still_up)} are still registered as available: they are treated as lost (never read from, never targets)")
    for node in lost_set:
        lost_regions.setdefault(node, (available.get(node) or {}).get("region"))
    candidates = {n: info for n, info in available.items() if n not in lost_set}
    found = find_op(meta, lost_set)
    previous: dict[tuple[str, int, str], str] = {}
    if found is not None:
        op_id, record = found
        notes.append(f"continuing unfinished operation {op_id} (started {record.get('created_at', '?')})")
        for item in record.get("items", []):
            if item.get("target"):
                previous[(item["log"], int(item["segment"]), item["lost"])] = item["target"]
    # Replacements keep the region invariant of each log's policy (its m, regions and drains).
    policies = placement_store.load(meta.client, meta.cluster).value
    work: list[SegmentWork] = []
    for name in sorted(logs) if logs is not None else meta.list_logs():
        try:
            log_record = meta.get_log(name).value
            segments = meta.segments(name)
        except NotFoundError:
            continue  # deleted since the listing
        except CorruptMetadata as exc:
            if logs is not None:
                raise
            # One record dlctl did not write must not stop the re-replication of every other log.
            notes.append(f"log {name!r} is skipped: its metadata cannot be read ({exc.message}); its segments on the lost agents stay under-replicated until it is repaired")
            continue
        owner = meta.owner_of(name)
        for versioned in segments:
            seg = versioned.value
            hit = sorted(members(seg) & lost_set)
            if not hit or seg.state is SegmentState.TRUNCATED:
                continue
            work.append(_segment_work(name, log_record.log_id, seg, hit, lost_set, candidates, lost_regions, previous, owner is not None, policies.for_log(name, log_record.config)))
    # In-progress segments first: they are the ones a further failure could still cost data.
    work.sort(key=lambda w: (w.state != SegmentState.INPROGRESS.value, w.log, w.seq))
    for w in work:
        if w.data_lost:
            notes.append(data_lost_message(w))
        elif w.blocked:
            notes.append(f"segment {w.seq} of log {w.log} cannot be repaired now: {w.blocked}")
    return RereplicationPlan(sorted(lost_set), work, found[0] if found else None, notes)


def _segment_work(
    name: str,
    log_id: int,
    seg: SegmentRecord,
    hit: list[str],
    lost: set[str],
    candidates: Mapping[str, Mapping[str, Any]],
    lost_regions: Mapping[str, str | None],
    previous: Mapping[tuple[str, int, str], str],
    has_owner: bool,
    policy: PlacementPolicy | None = None,
) -> SegmentWork:
    targets: dict[str, str | None] = {}
    chosen: set[str] = set()
    for node in hit:
        target = previous.get((name, seg.seq, node))
        if target is None or target not in candidates or target in members(seg) or target in chosen:
            target = choose_target(seg, node, candidates, exclude=lost | chosen, lost_region=lost_regions.get(node), seed=(name, seg.seq, node), policy=policy)
        targets[node] = target
        if target is not None:
            chosen.add(target)
    entries = {node: len(entries_on(seg, node)) for node in hit}
    total = seg.last_entry_id + 1 - seg.min_active_entry
    nbytes = sum(int(seg.bytes * n / total) for n in entries.values()) if total > 0 else 0
    sources = sorted(members(seg) - lost)
    work = SegmentWork(name, log_id, seg.seq, seg.state.value, targets, entries, nbytes, sources)
    if seg.state is SegmentState.INPROGRESS:
        if has_owner:
            work.blocked = "in progress with a live writer, which rolls away from failed agents by itself; re-run once it has rolled"
        else:
            work.recover_first = True
    else:
        work.data_lost = lost_ranges(seg, lost)
    missing = [n for n, t in targets.items() if t is None]
    if missing and not work.blocked:
        work.blocked = f"no available agent outside the segment's ensemble can replace {', '.join(missing)}"
    return work


# -- applying -----------------------------------------------------------------------------------------


@dataclass
class Progress:
    """What the CLI shows: bytes copied of the estimate, segments finished, the current ones."""

    total_bytes: int
    total_segments: int
    copied: CopyProgress = field(default_factory=CopyProgress)
    finished: int = 0
    current: set[str] = field(default_factory=set)
    on_change: Callable[[Progress], None] | None = None

    def changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)


class _OpRecord:
    """The operation's record (``dlctl.meta.operations``): one item per (segment, lost agent).
    Writes run off the event loop (kazoo blocks); the record serialises concurrent ones."""

    def __init__(self, record: OperationRecord) -> None:
        self.record = record

    @property
    def op_id(self) -> str:
        return self.record.op_id

    @property
    def items(self) -> list[dict]:
        return self.record.value.get("items", [])

    @classmethod
    async def open(cls, meta: MetaStore, plan_: RereplicationPlan) -> _OpRecord:
        items = {
            (w.log, w.seq, lost): {"log": w.log, "segment": w.seq, "lost": lost, "target": target, "state": PENDING}
            for w in plan_.work
            for lost, target in w.targets.items()
        }

        def resume(record: dict) -> dict:
            merged = dict(items)
            for item in record.get("items", []):
                key = (item["log"], int(item["segment"]), item["lost"])
                if item.get("state") == COMMITTED:
                    merged[key] = item  # finished earlier: keep the history
                elif key not in merged:
                    # The metadata (which the plan was made from) no longer names the lost agent
                    # in this segment: a run died between its CAS and this record's update, or
                    # the segment is gone. Nothing is left to do for it.
                    merged[key] = dict(item, state=COMMITTED, note="the segment no longer names the lost agent")
            return dict(record, items=list(merged.values()))

        op_id = plan_.op_id if plan_.op_id is not None else new_op_id()
        fresh = {"kind": OP_KIND, "lost": plan_.lost, "items": list(items.values())}
        started = await asyncio.get_running_loop().run_in_executor(None, lambda: OperationRecord.start(meta, op_id, fresh, resume=resume))
        return cls(started)

    async def update(self, log_name: str, seq: int, lost: str, **changes: Any) -> None:
        def change(record: dict) -> dict:
            items = [dict(i) for i in record.get("items", [])]
            for item in items:
                if item["log"] == log_name and int(item["segment"]) == seq and item["lost"] == lost:
                    item.update(changes)
                    break
            else:
                items.append({"log": log_name, "segment": seq, "lost": lost, **changes})
            return dict(record, items=items)

        try:
            await asyncio.get_running_loop().run_in_executor(None, self.record.update, change)
        except ConflictError:
            # The segment's own state (its metadata) is what a re-run goes by; the record only
            # lets it skip work: losing this note costs a re-check, not data.
            log.warning("operation %s: could not record %s/%s %s after repeated conflicts", self.op_id, log_name, seq, changes)

    async def finish(self, state: str, summary: dict) -> None:
        await asyncio.get_running_loop().run_in_executor(None, lambda: self.record.set(state=state, summary=summary))


async def execute(
    meta: MetaStore,
    pool: ReplicaPool,
    plan_: RereplicationPlan,
    *,
    parallel: int = 4,
    window: int = 128,
    only: Collection[str] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    throttle: TokenBucket | None = None,
) -> dict[str, Any]:
    """Apply the plan: recover, copy, verify, commit each segment; record progress in the op.

    Never raises for a single segment: each one ends committed, stuck (with why) or data-lost,
    and the report lists them all. ``only``: keys ("log/seq") to restrict to; ``throttle``: the
    bytes copied, all segments together.
    """
    await pool.refresh()
    work = [w for w in plan_.work if only is None or w.key in only]
    progress = Progress(sum(w.bytes for w in work if not w.data_lost and not w.blocked), len(work), on_change=on_progress)
    progress.copied.on_change = lambda _c: progress.changed()
    op = await _OpRecord.open(meta, plan_)
    started = time.monotonic()
    outcomes: dict[str, dict[str, Any]] = {}
    sem = asyncio.Semaphore(max(1, parallel))
    lost = set(plan_.lost)
    recovered_logs: dict[str, asyncio.Task] = {}

    async def recover_once(name: str) -> None:
        # One recovery per log, shared by its in-progress segments.
        if name not in recovered_logs:
            recovered_logs[name] = asyncio.ensure_future(recover_log(meta, pool, name))
        await recovered_logs[name]

    async def one(w: SegmentWork) -> None:
        async with sem:
            progress.current.add(w.key)
            progress.changed()
            try:
                outcomes[w.key] = await _repair(meta, pool, op, w, lost, window, progress, recover_once, throttle)
            except (StuckError, AgentError) as exc:
                outcomes[w.key] = {"log": w.log, "segment": w.seq, "state": STUCK, "error": exc.message}
                for node in w.targets:
                    await op.update(w.log, w.seq, node, state=STUCK, error=exc.message)
            except Exception as exc:  # noqa: BLE001 - one segment's failure must not hide the others'
                log.exception("re-replication of %s failed", w.key)
                outcomes[w.key] = {"log": w.log, "segment": w.seq, "state": STUCK, "error": f"{type(exc).__name__}: {exc}"}
            finally:
                progress.current.discard(w.key)
                progress.finished += 1
                progress.changed()

    await asyncio.gather(*(one(w) for w in work))
    seconds = time.monotonic() - started
    ordered = [outcomes[w.key] for w in work]
    stuck = [o for o in ordered if o["state"] == STUCK]
    lost_data = [o for o in ordered if o["state"] == DATA_LOST]
    report = {
        "operation": op.op_id,
        "lost": plan_.lost,
        "segments": len(ordered),
        "committed": sum(1 for o in ordered if o["state"] == COMMITTED),
        "stuck": stuck,
        "data_lost": lost_data,
        "bytes": progress.copied.bytes,
        "entries": progress.copied.entries,
        "seconds": round(seconds, 3),
        "bytes_per_second": int(progress.copied.bytes / seconds) if seconds > 0 else 0,
        "results": ordered,
    }
    summary = {k: report[k] for k in ("segments", "committed", "bytes", "entries", "seconds")}
    summary.update(stuck=len(stuck), data_lost=len(lost_data))
    # Done only when every item ever recorded is committed (a run restricted with ``only``
    # leaves the others pending: the operation stays open for the next run).
    items = op.items
    await op.finish("done" if all(i.get("state") == COMMITTED for i in items) else "incomplete", summary)
    return report


async def _repair(
    meta: MetaStore,
    pool: ReplicaPool,
    op: _OpRecord,
    w: SegmentWork,
    lost: set[str],
    window: int,
    progress: Progress,
    recover_once: Callable[[str], Any],
    throttle: TokenBucket | None = None,
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    base = {"log": w.log, "segment": w.seq}
    if w.blocked and not w.recover_first:
        raise StuckError(f"segment {w.seq} of log {w.log}: {w.blocked}")
    if w.recover_first:
        await recover_once(w.log)
    # The metadata decides, not the plan: it may have changed since (a recovery closed the
    # segment, an earlier run committed, another operator repaired it).
    current = await loop.run_in_executor(None, meta.get_segment, w.log, w.seq)
    seg = current.value
    if seg.state is SegmentState.INPROGRESS:
        raise StuckError(f"segment {w.seq} of log {w.log} is still in progress (a writer owns it)", hint="re-run once the writer has rolled it")
    still = sorted(members(seg) & lost)
    if not still:
        for node in w.targets:
            await op.update(w.log, w.seq, node, state=COMMITTED)
        return dict(base, state=COMMITTED, note="already re-replicated")
    dead_ranges = lost_ranges(seg, lost)
    if dead_ranges:
        message = data_lost_message(_with_ranges(w, dead_ranges))
        for node in still:
            await op.update(w.log, w.seq, node, state=DATA_LOST, error=message)
        return dict(base, state=DATA_LOST, error=message, ranges=[r.to_dict() for r in dead_ranges])
    # Targets: keep the planned ones unless the segment or the cluster changed under them.
    available = pool.nodes
    targets: dict[str, str] = {}
    for node in still:
        target = w.targets.get(node)
        if target is None or target not in available or target in members(seg) or target in targets.values():
            candidates = {n: i for n, i in available.items() if n not in lost}
            policy = (await loop.run_in_executor(None, placement_store.load, meta.client, meta.cluster)).value.for_log(w.log, (await loop.run_in_executor(None, meta.get_log, w.log)).value.config)
            target = choose_target(seg, node, candidates, exclude=lost | set(targets.values()), seed=(w.log, w.seq, node), policy=policy)
            if target is None:
                raise StuckError(f"segment {w.seq} of log {w.log}: no available agent outside its ensemble can replace {node}", hint="start an agent, then re-run")
        targets[node] = target
    results = []
    for node, target in targets.items():
        await op.update(w.log, w.seq, node, target=target, state=PENDING)
        try:
            result = await copy_replica(pool, w.log_id, seg, node, target, lost, window=window, progress=progress.copied, throttle=throttle)
        except StuckError as exc:
            raise StuckError(f"segment {w.seq} of log {w.log}, replica of {node} -> {target}: {exc.message}", hint=exc.hint, details=exc.details) from None
        await op.update(w.log, w.seq, node, state=COPIED, entries=result.entries, bytes=result.bytes)
        results.append(result.to_dict())
    _, outcome = await commit_replacements(meta, w.log, w.seq, targets, seg.last_entry_id)
    for node, what in outcome.items():
        await op.update(w.log, w.seq, node, state=COMMITTED, note=what)
        if what != "committed":
            await drop_orphan(meta, pool, w.log, w.log_id, w.seq, targets[node])
    return dict(base, state=COMMITTED, copies=results, outcome=outcome)


def _with_ranges(w: SegmentWork, ranges: list[LostRange]) -> SegmentWork:
    w.data_lost = ranges
    return w
