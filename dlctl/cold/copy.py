"""Copying one completed segment to a cold store (``dlctl log backup``, offload on truncation):
its entries read from the replicas (CRC-checked), written as one object, read back and checked
against its SHA-256, and only then its manifest — with the clock around its records
(``dlctl.cold.clock``). Interrupted, it leaves at most an object without a manifest, which the
next copy writes again: never a manifest for an incomplete copy, never a duplicate."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import NotFoundError
from ..log import format as fmt
from ..log.speculative import ReplicaReader
from ..meta.records import SegmentRecord
from ..meta.store import MetaStore
from ..meta.truncation import TruncationStore
from ..ratelimit import TokenBucket
from ..replication.clock import ClockStore
from .clock import CopyClock, stamp_segment, vector_before
from .copies import checked_entries
from .manifest import SegmentManifest, manifest_key
from .segobject import encode_segment
from .store import ColdStore
from ..log.pool import ReplicaPool

READ_CONCURRENCY = 32


@dataclass(frozen=True)
class SegmentBackup:
    seq: int
    state: str  # "copied" | "present" | "skipped"
    bytes: int = 0
    entries: int = 0
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"segment": self.seq, "state": self.state, "bytes": self.bytes, "entries": self.entries}
        if self.why:
            out["why"] = self.why
        return out


async def read_segment(pool: ReplicaPool, log_id: int, seg: SegmentRecord, on_progress: Callable[[int, int], None] | None = None, throttle: TokenBucket | None = None) -> list[fmt.Entry]:
    """Every entry of completed segment ``seg`` (CRC-checked on the way); ``throttle`` paces the
    bytes read."""
    replicas = ReplicaReader(pool)
    await pool.refresh()
    gate = asyncio.Semaphore(READ_CONCURRENCY)
    count = seg.last_entry_id + 1
    done = 0

    async def one(entry_id: int) -> fmt.Entry:
        nonlocal done
        async with gate:
            entry = await replicas.read(log_id, seg, entry_id)
            if throttle is not None:
                await throttle.take(len(entry.payload))
        done += 1
        if on_progress is not None:
            on_progress(done, count)
        return entry

    return list(await asyncio.gather(*(one(e) for e in range(count))))


def copy_clock(meta: MetaStore, store: ColdStore, name: str, log_id: int, seg: SegmentRecord, entries: list[fmt.Entry]) -> CopyClock | None:
    """The clock around ``seg``'s records (``dlctl.cold.clock``), or None when not known."""
    clocks = ClockStore(meta)
    steps = clocks.steps(name)
    previous = None
    if seg.seq > 1:
        try:
            previous = load_manifest(store, name, log_id, seg.seq - 1).clock
        except NotFoundError:
            pass  # no copy of the segment before
    if previous is not None:  # the usual case (copies go in order): no more metadata to read
        before = vector_before(seg, segments=(), steps=steps, derived=(), previous=previous, truncation_point=None)
    else:
        truncation = TruncationStore(meta).get(name)
        before = vector_before(
            seg, segments=[v.value for v in meta.segments(name)], steps=steps, derived=clocks.derived_steps(name), previous=None,
            truncation_point=truncation.value.point if truncation is not None else None,
        )
    if before is None:
        return None
    after = stamp_segment(meta.cluster, seg.seq, before, steps, ((e.entry_id, e.payload) for e in entries))
    return CopyClock(meta.cluster, before, after)


async def copy_segment(
    meta: MetaStore, store: ColdStore, pool: ReplicaPool, name: str, log_id: int, seg: SegmentRecord, on_progress: Any = None, throttle: TokenBucket | None = None
) -> SegmentBackup:
    """Copy one completed segment: object, read back and check, then the manifest (with the
    clock around its records)."""
    entries = await read_segment(pool, log_id, seg, on_progress, throttle)
    data = encode_segment(fmt.encode(e) for e in entries)  # the same bytes: the encoding is canonical
    loop = asyncio.get_running_loop()
    clock = await loop.run_in_executor(None, copy_clock, meta, store, name, log_id, seg, entries)
    manifest = SegmentManifest.of(meta.cluster, name, log_id, seg, data, clock)
    await loop.run_in_executor(None, store.put, manifest.object, data)
    stored = await loop.run_in_executor(None, store.get, manifest.object)
    manifest.verify(stored)  # what the store holds now, not what we sent
    await loop.run_in_executor(None, store.put, manifest_key(name, log_id, seg.seq), manifest.to_json())
    return SegmentBackup(seg.seq, "copied", len(data), seg.last_entry_id + 1)


def load_manifest(store: ColdStore, name: str, log_id: int, seq: int) -> SegmentManifest:
    key = manifest_key(name, log_id, seq)
    return SegmentManifest.from_json(store.get(key), f"{store.describe()}: {key}")


def verify_copy(store: ColdStore, name: str, log_id: int, seg: SegmentRecord) -> SegmentBackup:
    """Re-read a held copy and check it entry by entry and against its manifest; raises
    ``CorruptObject`` naming what is wrong."""
    manifest = load_manifest(store, name, log_id, seg.seq)
    count = len(checked_entries(store, manifest))
    return SegmentBackup(seg.seq, "present", manifest.bytes, count)
