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
