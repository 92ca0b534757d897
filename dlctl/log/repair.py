"""Replica health of completed segments, and repair in place (issue 18, DESIGN.md §5 "durability
invariants").

A completed segment's record names, per span of entries, the members that hold them. A member
whose agent is up but whose replica is missing, in limbo (corruption found at start-up or by the
scrubber, or a replica forgotten with a replaced disk: dlagent.disk), or short of the entries the
record says it holds, leaves the segment *under-replicated*: fewer than W verified copies of some
entries. Nothing tells the writer (it is long gone) and readers fail over silently, so unless
someone looks, redundancy erodes. This module looks, and refills the replica where it is.

Why in place, not on another agent: the member is alive and the placement chose it; refilling
keeps the placement and changes no metadata. Safe because a completed segment's end is decided
— no recovery ever asks its members what they lack — and readers stop at its last entry and
fail over on "no such entry". An in-progress segment is its writer's (or the next owner's
recovery) to settle, and is left alone.

Repair, per replica: (1) every entry it should hold must be readable from another member, else
nothing is touched (a limbo copy may be the last one somebody needs to look at); (2) a limbo
replica is deleted (limbo refuses adds), and so is a *divergent* one — whole, but its digest
differs from what a strict majority of its peers hold (a deep survey compares them; without a
majority the conflict is reported, never settled by a guess); (3) the entries are copied from healthy members with
recovery adds — idempotent for identical bytes, so a short replica keeps what it has and an
interrupted repair is simply redone — and (4) the target's digest of the range must equal the
digest of what was read (``rereplication_copy.copy_replica``).

The top of the module is pure (tests/unit/test_repair_plan.py); the survey and repair below it do
the I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from ..errors import ConflictError, CorruptMetadata, NotFoundError
from ..meta.records import SegmentRecord, SegmentState, Versioned
from ..meta.store import MetaStore
from ..ratelimit import TokenBucket
from .errors import AgentError, NoSuchSegmentError
from .protocol import SegmentInfo
from .quorum import write_set_of
from .rereplication import entries_on, lost_ranges, members, spans
from .rereplication_copy import CopyProgress, CopyResult, StuckError, copy_replica
from .pool import ReplicaPool

log = logging.getLogger(__name__)

# -- pure ------------------------------------------------------------------------------------------


class Cause(str, Enum):
    AGENT_DOWN = "agent-down"  # its agent is not available: the gone-agent path (auditor grace) handles it
    UNREACHABLE = "unreachable"  # available in ZooKeeper but did not answer the listing
    MISSING = "missing"  # the agent has no replica of the segment
    LIMBO = "limbo"  # the replica is in limbo (corrupt, cut, or forgotten with a replaced disk)
    SHORT = "short"  # the replica lacks entries the record says it holds
    RECORDED = "recorded-short"  # the record says it lacks entries (a writer dropped it, a recovery could not ask it)
    DIVERGENT = "divergent"  # holds every entry, but its digest disagrees with the majority of its peers'
    CONFLICT = "conflict"  # members' digests disagree and no majority says which is right: for an operator


REPAIRABLE = frozenset({Cause.MISSING, Cause.LIMBO, Cause.SHORT, Cause.RECORDED, Cause.DIVERGENT})
# Replaced before refilling: limbo refuses adds, and a divergent replica would refuse the right
# bytes for an entry id it holds with other ones.
REPLACED = frozenset({Cause.LIMBO, Cause.DIVERGENT})
AUDITED_STATES = frozenset({SegmentState.COMPLETED, SegmentState.PARTIALLY_TRUNCATED})


@dataclass(frozen=True)
class ReplicaProblem:
    """One member of a completed segment that does not hold what the record says it holds."""

    log: str
    log_id: int
    segment: int
    node: str
    cause: Cause
    expected_entries: int  # entries the member should hold
    held_entries: int  # entries its replica holds (-1: unknown)
    detail: str = ""
    avoid: tuple[str, ...] = ()  # members not to copy from (their copies disagree with the majority)

    def to_dict(self) -> dict[str, Any]:
        return {
            "log": self.log, "segment": self.segment, "node": self.node, "cause": self.cause.value,
            "expected_entries": self.expected_entries, "held_entries": self.held_entries, "detail": self.detail,
        }


def expected_ids(segment: SegmentRecord, node: str) -> list[int]:
    """The active entries ``node`` holds as a member (truncated ones need no copy)."""
    return [i for i in entries_on(segment, node) if i >= segment.min_active_entry]


def replica_cause(expected: list[int], info: SegmentInfo | None, recorded: int | None = None) -> tuple[Cause | None, int]:
    """(what is wrong with a live member's replica, entries it holds) from its listing and
    what the segment's record says it holds (``recorded``: its ``short`` entry, if any).

    ``info.entries`` counts every entry in the file, including truncated ones below the
    expected range; a replica is short when its last entry is below the last one it should
    hold, or when it holds fewer entries than it should at all. One that looks whole while its
    record says otherwise is checked by a refill (idempotent) that then clears the record."""
    if info is None:
        return (Cause.MISSING if expected else None), 0
    if info.limbo:
        return Cause.LIMBO, info.entries
    if expected and (info.last_entry_id < expected[-1] or info.entries < len(expected)):
        return Cause.SHORT, info.entries
    if expected and recorded is not None and recorded < expected[-1]:
        return Cause.RECORDED, info.entries
    return None, info.entries


def segment_problems(
    name: str,
    log_id: int,
    segment: SegmentRecord,
    listings: Mapping[str, Mapping[tuple[int, int], SegmentInfo]],
    unreachable: Mapping[str, str],
) -> list[ReplicaProblem]:
    """Every member of ``segment`` that does not hold what the record says. ``listings``: the
    replicas of each agent that answered; ``unreachable``: agents that are known but did not
    (node -> why); members in neither are down."""
    if segment.state not in AUDITED_STATES:
        return []
    out = []
    for node in sorted(members(segment)):
        expected = expected_ids(segment, node)
        if not expected:
            continue
        recorded = segment.short.get(node)
        note = f"its record: holds entries up to {recorded}" if recorded is not None else ""
        if node in listings:
            cause, held = replica_cause(expected, listings[node].get((log_id, segment.seq)), recorded)
            if cause is not None:
                out.append(ReplicaProblem(name, log_id, segment.seq, node, cause, len(expected), held, note))
        elif node in unreachable:
            out.append(ReplicaProblem(name, log_id, segment.seq, node, Cause.UNREACHABLE, len(expected), -1, "; ".join(filter(None, (unreachable[node], note)))))
        else:
            out.append(ReplicaProblem(name, log_id, segment.seq, node, Cause.AGENT_DOWN, len(expected), -1, note))
    return out


def digest_verdicts(answers: Mapping[str, tuple[int, str]]) -> tuple[dict[str, str], bool]:
    """Members whose (entries, digest) of the same range differs from the others': (node ->
    why, whether a strict majority agrees). Only for members that hold the same entry ids
    (E = W). Without a majority nobody can tell the right copy; every member is named."""
    groups: dict[tuple[int, str], list[str]] = {}
    for node, answer in answers.items():
        groups.setdefault(answer, []).append(node)
    if len(groups) <= 1:
        return {}, True
    best, members_ = max(groups.items(), key=lambda kv: len(kv[1]))
    if len(members_) * 2 <= len(answers):
        return {n: f"{a[0]} entries, digest {a[1][:12]}…; no majority among {len(answers)} members" for n, a in answers.items()}, False
    return {n: f"digest {a[1][:12]}… over {a[0]} entries; {len(members_)} of {len(answers)} members agree on {best[1][:12]}…" for n, a in answers.items() if a != best}, True


def fewest_copies(segment: SegmentRecord, unhealthy: Collection[str]) -> int:
    """The fewest healthy replicas any active entry of ``segment`` has when the members in
    ``unhealthy`` hold nothing usable (W when all are healthy; 0: some entry has none)."""
    fewest = segment.write_quorum
    for span in spans(segment):
        if span.last < segment.min_active_entry:
            continue
        for entry_id in range(span.first, span.first + min(len(span.nodes), span.last - span.first + 1)):
            write_set = write_set_of(span.nodes, segment.write_quorum, entry_id)
            fewest = min(fewest, sum(n not in unhealthy for n in write_set))
    return fewest


# -- the survey ------------------------------------------------------------------------------------


@dataclass
class Survey:
    """Replica health across the cluster (or some logs) at one moment."""

    problems: list[ReplicaProblem] = field(default_factory=list)
    segments_checked: int = 0
    agents: dict[str, str] = field(default_factory=dict)  # node -> "up" or why not
    segments: dict[tuple[str, int], SegmentRecord] = field(default_factory=dict)  # the under-replicated ones
    unreadable: dict[str, str] = field(default_factory=dict)  # log -> why its metadata cannot be read (its replicas unchecked)

    def fewest_copies(self) -> dict[tuple[str, int], int]:
        """Per under-replicated segment, the fewest healthy copies any of its entries has."""
        return {key: fewest_copies(self.segments[key], {p.node for p in found}) for key, found in self.under_replicated().items()}

    def under_replicated(self) -> dict[tuple[str, int], list[ReplicaProblem]]:
        out: dict[tuple[str, int], list[ReplicaProblem]] = {}
        for p in self.problems:
            out.setdefault((p.log, p.segment), []).append(p)
        return out

    def to_dict(self) -> dict[str, Any]:
        copies = self.fewest_copies()
        return {
            "segments_checked": self.segments_checked,
            "under_replicated_segments": len(self.under_replicated()),
            "problems": [p.to_dict() | {"healthy_copies": copies[(p.log, p.segment)]} for p in self.problems],
            "agents": dict(sorted(self.agents.items())),
            "unreadable_logs": dict(sorted(self.unreadable.items())),
        }


async def _zk(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def list_replicas(pool: ReplicaPool, nodes: Iterable[str]) -> tuple[dict[str, dict[tuple[int, int], SegmentInfo]], dict[str, str]]:
    """Every replica each agent holds (one LIST_SEGMENTS each, concurrently), and the agents
    that did not answer (node -> why)."""

    async def one(node: str) -> tuple[str, Any]:
        try:
            client = await pool.client(node)
            return node, {(i.log_id, i.segment_seq): i for i in await client.list_segments()}
        except AgentError as exc:
            return node, f"{type(exc).__name__}: {exc.message}"

    listings: dict[str, dict[tuple[int, int], SegmentInfo]] = {}
    unreachable: dict[str, str] = {}
    for node, answer in await asyncio.gather(*(one(n) for n in sorted(nodes))):
        if isinstance(answer, str):
            unreachable[node] = answer
        else:
            listings[node] = answer
    return listings, unreachable


async def compare_digests(pool: ReplicaPool, name: str, log_id: int, segment: SegmentRecord, healthy: Collection[str]) -> list[ReplicaProblem]:
    """Deep check of one completed E = W segment: every healthy member's digest of the active
    entries, compared (``digest_verdicts``). Members that do not answer are left to the next
    survey."""
    first, last = segment.min_active_entry, segment.last_entry_id
    if last < first or segment.write_quorum != segment.ensemble_size or len(segment.ensembles) != 1:
        return []

    async def one(node: str) -> tuple[str, tuple[int, str] | None]:
        try:
            d = await (await pool.client(node)).digest(log_id, segment.seq, first, last)
            return node, (d.entries, d.digest)
        except AgentError:
            return node, None

    answers = {n: a for n, a in await asyncio.gather(*(one(n) for n in sorted(healthy))) if a is not None}
    odd, majority = digest_verdicts(answers)
    expected = last - first + 1
    cause = Cause.DIVERGENT if majority else Cause.CONFLICT
    return [
        ReplicaProblem(name, log_id, segment.seq, node, cause, expected, answers[node][0], why, tuple(sorted(odd)))
        for node, why in sorted(odd.items())
    ]


async def survey(meta: MetaStore, pool: ReplicaPool, logs: Collection[str] | None = None, *, deep: bool = False) -> Survey:
    """Check every completed segment of ``logs`` (all logs by default) against the replicas the
    available agents hold. The agents are listed before the metadata is read, so a segment
    created meanwhile is not reported against a listing that predates it. ``deep``: also
    compare the members' digests (one DIGEST request per member and segment)."""
    available = await _zk(meta.available_nodes)
    listings, unreachable = await list_replicas(pool, available)
    result = Survey(agents={n: "up" for n in listings} | unreachable)
    names = sorted(logs) if logs is not None else await _zk(meta.list_logs)
    for name in names:
        try:
            log_id = (await _zk(meta.get_log, name)).value.log_id
            segments = await _zk(meta.segments, name)
        except NotFoundError:
            if logs is not None:
                raise
            continue  # deleted meanwhile
        except CorruptMetadata as exc:
            if logs is not None:
                raise
            result.unreadable[name] = exc.message  # named, never a reason to stop checking the other logs
            continue
        for seg in segments:
            if seg.value.state in AUDITED_STATES:
                result.segments_checked += 1
                found = segment_problems(name, log_id, seg.value, listings, unreachable)
                if deep:
                    healthy = members(seg.value) - {p.node for p in found} - set(unreachable)
                    found += await compare_digests(pool, name, log_id, seg.value, [n for n in healthy if n in listings])
                if found:
                    result.problems.extend(found)
                    result.segments[(name, seg.value.seq)] = seg.value
    for problem in result.problems:
        if problem.cause is Cause.AGENT_DOWN:
            result.agents.setdefault(problem.node, "down")
    return result


# -- repair ----------------------------------------------------------------------------------------


async def repair_replica(
    meta: MetaStore,
    pool: ReplicaPool,
    problem: ReplicaProblem,
    *,
    dead: Collection[str] = (),
    progress: CopyProgress | None = None,
    throttle: TokenBucket | None = None,
    holder: str = "dlctl",
) -> CopyResult:
    """Refill ``problem.node``'s replica in place from the segment's other members (module doc),
    under a claim (``MetaStore.claim_repair``) so that no two sessions refill the same replica.
    ``dead``: agents not to read from (down or unreachable); ``throttle`` paces the copy.
    Raises StuckError naming why not."""
    where = f"segment {problem.segment} of log {problem.log!r} on {problem.node}"
    if not await _zk(meta.claim_repair, problem.log, problem.segment, problem.node, holder):
        raise StuckError(f"{where}: another auditor or operator is refilling it now", hint="wait for it; the next survey shows the outcome")
    try:
        return await _refill(meta, pool, problem, where, dead, progress, throttle)
    finally:
        await _zk(meta.release_repair, problem.log, problem.segment, problem.node)


async def _refill(
    meta: MetaStore, pool: ReplicaPool, problem: ReplicaProblem, where: str, dead: Collection[str], progress: CopyProgress | None, throttle: TokenBucket | None
) -> CopyResult:
    current: Versioned[SegmentRecord] = await _zk(meta.get_segment, problem.log, problem.segment)
    seg = current.value
    if seg.state not in AUDITED_STATES:
        raise StuckError(f"{where}: the segment is {seg.state.value}, not completed", hint="an in-progress segment is left to its writer")
    if problem.node not in members(seg):
        raise StuckError(f"{where}: {problem.node} is no longer a member (re-replicated meanwhile)")
    sources_dead = set(dead) | {problem.node} | set(problem.avoid)
    uncovered = [r for r in lost_ranges(seg, sources_dead) if r.last >= seg.min_active_entry]
    if uncovered:
        raise StuckError(
            f"{where}: no other member can serve " + "; ".join(r.describe() for r in uncovered),
            hint="bring the segment's other members back; the replica is left as it is meanwhile",
            details={"uncovered": [r.to_dict() for r in uncovered]},
        )
    client = await pool.client(problem.node)
    if problem.cause in REPLACED:
        try:
            await client.delete_segment(problem.log_id, problem.segment)
        except NoSuchSegmentError:
            pass
        log.warning("%s: deleted the %s replica to refill it from its peers", where, problem.cause.value)
    result = await copy_replica(pool, problem.log_id, seg, problem.node, problem.node, sources_dead, progress=progress, throttle=throttle)
    await _clear_recorded_shortfall(meta, problem, current)
    log.warning("%s: refilled %d entries (%d bytes) from its peers (%s)", where, result.entries, result.bytes, problem.cause.value)
    return result


async def _clear_recorded_shortfall(meta: MetaStore, problem: ReplicaProblem, current: Versioned[SegmentRecord], attempts: int = 10) -> None:
    """The member now holds its entries (verified): drop it from the record's ``short`` (CAS;
    a lost race re-reads)."""
    for _ in range(attempts):
        if problem.node not in current.value.short:
            return
        short = {n: last for n, last in current.value.short.items() if n != problem.node}
        try:
            await _zk(meta.update_segment, problem.log, current, replace(current.value, short=short))
            return
        except ConflictError:
            current = await _zk(meta.get_segment, problem.log, problem.segment)
    raise StuckError(f"segment {problem.segment} of log {problem.log!r}: its record kept changing while {problem.node}'s refill was recorded", hint="re-run")


@dataclass
class RepairReport:
    repaired: list[dict[str, Any]] = field(default_factory=list)
    stuck: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # not repairable here (agent down, unreachable)

    def to_dict(self) -> dict[str, Any]:
        return {"repaired": self.repaired, "stuck": self.stuck, "skipped": self.skipped}


async def repair(
    meta: MetaStore,
    pool: ReplicaPool,
    found: Survey,
    *,
    parallel: int = 4,
    progress: CopyProgress | None = None,
    max_bytes_per_second: float = 0,
    holder: str = "dlctl",
) -> RepairReport:
    """Repair every repairable problem of ``found``, ``parallel`` replicas at a time, copying at
    most ``max_bytes_per_second`` in all (0: no limit)."""
    throttle = TokenBucket(max_bytes_per_second) if max_bytes_per_second > 0 else None
    report = RepairReport()
    dead = {n for n, state in found.agents.items() if state != "up"}
    sem = asyncio.Semaphore(max(1, parallel))

    async def one(problem: ReplicaProblem) -> None:
        async with sem:
            try:
                result = await repair_replica(meta, pool, problem, dead=dead, progress=progress, throttle=throttle, holder=holder)
                report.repaired.append(problem.to_dict() | {"entries": result.entries, "bytes": result.bytes})
            except (StuckError, AgentError, NotFoundError) as exc:
                report.stuck.append(problem.to_dict() | {"error": str(exc)})

    todo = [p for p in found.problems if p.cause in REPAIRABLE]
    report.skipped = [p.to_dict() for p in found.problems if p.cause not in REPAIRABLE]
    await asyncio.gather(*(one(p) for p in todo))
    return report
