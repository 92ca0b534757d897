"""`dlctl log backup LOG`: copy a live log's completed segments to the cluster's cold store
(issue 25 item 5), incrementally: a segment whose manifest is there already is skipped.

Per segment: read its entries from the replicas (CRC-checked), write them as one object, read
the object back and check its SHA-256, and only then write the manifest (``dlctl.cold``). An
interrupted run leaves at most an object without a manifest, which the next run writes again:
never a manifest for an incomplete copy, never a duplicate. Nothing in the cluster changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..cold.clock import CopyClock, stamp_segment, vector_before
from ..cold.manifest import SegmentManifest, log_prefix, manifest_key
from ..cold.copies import checked_entries
from ..cold.segobject import encode_segment
from ..cold.store import ColdStore, open_store
from ..errors import ConfigError
from ..log import format as fmt
from ..log.speculative import ReplicaReader
from ..meta.records import SegmentRecord, SegmentState
from ..meta.store import MetaStore
from ..meta.truncation import TruncationStore
from ..replication.clock import ClockStore
from ..plan import Plan, Step
from ..ratelimit import TokenBucket
from .session import ClusterSession

READ_CONCURRENCY = 32


def cold_store_of(session: ClusterSession) -> ColdStore:
    config = session.cluster.cold_storage
    if config is None:
        raise ConfigError(
            f"cluster {session.cluster.name!r} has no cold store",
            hint=f"add a [clusters.{session.cluster.name}.cold_storage] table to the inventory (see README: Cold storage)",
        )
    return open_store(config)


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


def _eligible(seg: SegmentRecord) -> str | None:
    """Why ``seg`` is not backed up now, or None when it is."""
    if seg.state is SegmentState.INPROGRESS:
        return "in progress (backed up once completed)"
    if seg.state is not SegmentState.COMPLETED:
        return f"{seg.state.value}: its entries are (partly) gone"
    return None


def backup_plan(session: ClusterSession, name: str, *, verify: bool = False, on_progress: Callable[[int, int], None] | None = None) -> Plan:
    """One step per completed segment the cold store does not hold yet (``verify``: re-check
    the objects of those it holds too)."""
    log = session.meta.get_log(name).value
    store = cold_store_of(session)
    segments = [s.value for s in session.meta.segments(name)]
    held = set(store.list(log_prefix(name, log.log_id)))
    steps, notes = [], []
    for seg in segments:
        why = _eligible(seg)
        if why is not None:
            notes.append(f"segment {seg.seq}: {why}")
            continue
        present = manifest_key(name, log.log_id, seg.seq) in held
        if present and not verify:
            continue
        action = "verify the copy of" if present else "copy"
        size = f"{seg.bytes} bytes, {seg.last_entry_id + 1} entries"
        steps.append(
            Step(
                "backup-segment",
                f"{session.cluster.name}/{name}/{seg.seq}",
                f"{action} segment {seg.seq} ({size}) to {store.describe()}",
                params={"segment": seg.seq, "verify_only": present},
                run=lambda seg=seg, present=present: _run_one(session, store, name, log.log_id, seg, present, on_progress),
            )
        )
    if not steps:
        notes.append(f"{store.describe()} holds every completed segment of {name}")
    return Plan.of("log backup", steps, notes=notes)


def _run_one(session: ClusterSession, store: ColdStore, name: str, log_id: int, seg: SegmentRecord, present: bool, on_progress: Any) -> dict[str, Any]:
    if present:
        return verify_copy(store, name, log_id, seg).to_dict()
    return session.with_pool(lambda pool: copy_segment(session.meta, store, pool, name, log_id, seg, on_progress)).to_dict()


async def read_segment(pool: Any, log_id: int, seg: SegmentRecord, on_progress: Callable[[int, int], None] | None = None, throttle: TokenBucket | None = None) -> list[fmt.Entry]:
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
    steps, derived = clocks.steps(name), clocks.derived_steps(name)
    previous = None
    if seg.seq > 1 and store.exists(manifest_key(name, log_id, seg.seq - 1)):
        previous = load_manifest(store, name, log_id, seg.seq - 1).clock
    truncation = TruncationStore(meta).get(name)
    before = vector_before(
        seg, segments=[v.value for v in meta.segments(name)], steps=steps, derived=derived, previous=previous,
        truncation_point=truncation.value.point if truncation is not None else None,
    )
    if before is None:
        return None
    after = stamp_segment(meta.cluster, seg.seq, before, steps, ((e.entry_id, e.payload) for e in entries))
    return CopyClock(meta.cluster, before, after)


async def copy_segment(
    meta: MetaStore, store: ColdStore, pool: Any, name: str, log_id: int, seg: SegmentRecord, on_progress: Any = None, throttle: TokenBucket | None = None
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
