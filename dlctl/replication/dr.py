"""Disaster recovery between locations (issue 11): what a log holds, what is at risk, what
diverged — read from the agents, as values. ``dlctl.ops.dr`` turns them into plans.

A record's *identity* is where it was first written: its origin (cluster, DLSN) for a
replicated record, (this location, its DLSN) for a local one. Two locations hold the same
record when they hold the same identity; "identical logs" means the same identities in the
same order.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ..log.dlsn import DLSN, INITIAL
from ..log.pool import AgentPool
from ..log.reader import LogReader, ReadRecord
from ..meta.store import MetaStore
from .causal import SourceClock
from .clock import ClockStore
from .origin import ORIGIN_CLUSTER, Origin
from .positions import log_end

Identity = tuple[str, DLSN]


def identity(record: ReadRecord, location: str) -> Identity:
    origin = Origin.from_headers(record.headers) if ORIGIN_CLUSTER in record.headers else None
    return (origin.cluster, origin.dlsn) if origin is not None else (location, record.dlsn)


def after(dlsn: DLSN) -> DLSN:
    """The position just after a record."""
    return DLSN(dlsn.segment_seq, dlsn.entry_id, dlsn.slot + 1)


async def read_range(meta: MetaStore, pool: AgentPool, name: str, start: DLSN | None = None, end: DLSN | None = None, *, timeout: float = 30.0) -> list[ReadRecord]:
    """Records of log ``name`` from ``start`` (default: the beginning) up to ``end`` (default:
    where the log ends now), in order. Raises ``TimeoutError`` when the agents stop answering
    before the end is reached."""
    if end is None:
        end = (await log_end(meta, pool, name)).next
    if end is None or (start is not None and start >= end):
        return []
    out: list[ReadRecord] = []
    async with LogReader(meta, pool, name, start_dlsn=start) as reader:
        while True:
            record = await reader.read_next(timeout)
            if record is None:
                raise TimeoutError(f"log {name!r}: nothing read for {timeout:g}s before its end {end} (read {len(out)} record(s))")
            if record.dlsn >= end:
                break
            out.append(record)
            if after(record.dlsn) >= end:
                break
    return out


async def stamped(meta: MetaStore, pool: AgentPool, name: str, location: str, *, end: DLSN | None = None) -> tuple[list[tuple[ReadRecord, dict[str, int]]], dict[str, int]]:
    """Every record of ``location``'s log ``name`` up to ``end`` with its vector timestamp (as a
    stream reading the log derives it, clock base included), and the version vector after them."""
    steps = await asyncio.get_running_loop().run_in_executor(None, ClockStore(meta).steps, name)
    clock = SourceClock(location, base=steps, start=INITIAL)
    out = []
    for record in await read_range(meta, pool, name, None, end):
        origin = Origin.from_headers(record.headers) if ORIGIN_CLUSTER in record.headers else None
        out.append((record, clock.stamp(origin, record.dlsn)))
    return out, dict(clock.vv)


async def held_vv(meta: MetaStore, pool: AgentPool, name: str, location: str) -> dict[str, int]:
    """The merge of the timestamps of every record ``location``'s log ``name`` holds — what a
    causality filter at ``location`` has seen. Unlike ``vv_before`` it leaves the clock base out:
    a raised floor is a promise about new local records, not a record held (``dr recover`` of a
    location whose own old records are still to come back must not count them as seen)."""
    clock = SourceClock(location)
    for record in await read_range(meta, pool, name):
        clock.stamp(Origin.from_headers(record.headers) if ORIGIN_CLUSTER in record.headers else None, record.dlsn)
    return dict(clock.vv)


async def vv_before(meta: MetaStore, pool: AgentPool, name: str, location: str, position: DLSN | None) -> dict[str, int]:
    """The version vector of ``location``'s log before ``position`` (None: the whole log)."""
    if position is not None and position <= INITIAL:
        steps = await asyncio.get_running_loop().run_in_executor(None, ClockStore(meta).steps, name)
        return dict(SourceClock(location, base=steps, start=INITIAL).vv)
    _, vv = await stamped(meta, pool, name, location, end=position)
    return vv


@dataclass
class Divergence:
    """Records a returning location holds that the other side never received."""

    log: str
    location: str
    start: DLSN  # where the other side's copy stopped (the failover's at-risk position)
    records: list[ReadRecord] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.records)

    def to_dict(self, sample: int = 5) -> dict[str, Any]:
        return {
            "log": self.log,
            "location": self.location,
            "from": str(self.start),
            "records": self.count,
            "first": str(self.records[0].dlsn) if self.records else None,
            "last": str(self.records[-1].dlsn) if self.records else None,
            "bytes": sum(len(r.payload) for r in self.records),
            "sample": [{"dlsn": str(r.dlsn), "payload": r.payload[:40].decode("utf-8", "replace")} for r in self.records[:sample]],
        }


async def divergence(meta: MetaStore, pool: AgentPool, name: str, location: str, start: DLSN, already: set[Identity] | None = None) -> Divergence:
    """``location``'s records of log ``name`` at or after ``start`` whose identity is not in
    ``already`` (what the other side holds of them, e.g. after a partial reconcile)."""
    records = await read_range(meta, pool, name, start)
    keep = [r for r in records if not already or identity(r, location) not in already]
    return Divergence(name, location, start, keep)


def missing(expected: list[Identity], held: list[Identity]) -> tuple[list[Identity], int]:
    """(identities of ``expected`` that ``held`` lacks, duplicates in ``held``)."""
    seen = set(held)
    return [i for i in expected if i not in seen], len(held) - len(seen)


# -- a truncated source's clock -----------------------------------------------------------------


def clock_at(location: str, anchor_vv: dict[str, int], between: list[tuple[DLSN, Origin | None]], *, steps: Any = (), start: DLSN) -> dict[str, int]:
    """``location``'s own counter before ``start`` in its log, derived backwards from an anchor
    (a stream checkpoint: the version vector ``anchor_vv`` before a later position) and the
    records ``between`` the two (position, origin or None for a local record), in order.

    A source that truncated its log's beginning still counted those records: a copy or a stream
    that starts at its first retained position must stamp its local records with the counters
    they always had (a reused, lower counter makes other locations' causality filters skip
    records they never saw). Every local record between ``start`` and the anchor added one;
    a replicated record never raises the count (it cannot have seen more of ``location``'s
    records than the log held before it), but a clock step may: the result is checked forward
    with the log's clock ``steps``, and a step that hides the count raises ``ValueError``. Only
    the own component is known; the others are left out (lower bounds: a filter decides a local
    record by its own counter, its causal past being in any log that holds it)."""
    local = sum(1 for _, origin in between if origin is None)
    own = int(anchor_vv.get(location, 0)) - local
    if own < 0:
        raise ValueError(f"{location}: the anchor counts {anchor_vv.get(location, 0)} but {local} local records lie between {start} and it")

    def forward(count: int) -> int:
        # The own counter only: a replicated record never raises it (it cannot have seen more of
        # ``location``'s records than the log held before it); clock steps may.
        pending = sorted(steps, key=lambda s: s[0])
        for dlsn, origin in between:
            while pending and pending[0][0] <= dlsn:
                count = max(count, int(pending.pop(0)[1].get(location, 0)))
            if origin is None:
                count += 1
        return count

    target = int(anchor_vv.get(location, 0))
    # The count is established when it, and no lower one, leads to the anchor (a raised floor in
    # between would lead there from many starting counts: the records before it stay unknown).
    if forward(own) != target or (own > 0 and forward(own - 1) == target):
        raise ValueError(f"{location}: a clock step between {start} and the anchor hides how many records came before {start}")
    return {location: own} if own else {}


async def clock_before(meta: MetaStore, pool: AgentPool, name: str, location: str, start: DLSN, anchors: list[tuple[DLSN, dict[str, int]]]) -> tuple[dict[str, int], DLSN, int]:
    """(``clock_at`` of ``location``'s log ``name`` before ``start``, the anchor used, records
    read between), from the first usable anchor (position at or after ``start``)."""
    steps = await asyncio.get_running_loop().run_in_executor(None, ClockStore(meta).steps, name)
    problems = []
    for position, vv in sorted(anchors, key=lambda a: a[0]):
        if position < start:
            problems.append(f"anchor {position} lies before {start}")
            continue
        records = await read_range(meta, pool, name, start, position)
        between = [(r.dlsn, Origin.from_headers(r.headers) if ORIGIN_CLUSTER in r.headers else None) for r in records]
        try:
            return clock_at(location, vv, between, steps=steps, start=start), position, len(records)
        except ValueError as exc:
            problems.append(str(exc))
    raise ValueError(f"no checkpoint of a stream from {location} at or after {start} gives its clock there ({'; '.join(problems) or 'none known'})")
