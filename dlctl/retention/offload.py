"""Offload on truncation (issue 25 item 2): with a cold store required by the cluster
(``dlctl.meta.coldpolicy``), a truncated segment is copied there — object read back and checked,
manifest written (``dlctl.cold.copy``) — and its record marked with the copy's key
by compare-and-set; only a marked segment is collected (``collectable(require_cold=True)``), so
its replicas are reclaimed only after the copy is verified. A store that cannot be reached, or a
copy that fails, leaves the segment where it is (reported; tried again next round).

Copies stay their log's cold retention (``LogConfig.cold_retention_seconds``, else the
cluster's ``retention_seconds``) after they were stored, then ``sweep_expired`` deletes them:
the manifest first (a copy without one is never read), then the object.

`dlctl cluster cold-storage enable|disable` (``dlctl.ops.offload``) publishes or withdraws the
requirement. The agents' housekeeper and `dlctl gc` run this.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..cold.manifest import SegmentManifest, object_key
from ..cold.segobject import CorruptObject
from ..cold.store import ColdStore, open_store
from ..errors import DlctlError, NotFoundError
from ..log.errors import AgentError
from ..log.pool import AgentPool
from ..meta import coldpolicy
from ..meta.records import SegmentRecord, SegmentState, Versioned
from ..meta.store import MetaStore
from ..ratelimit import TokenBucket
from ..cold.copy import copy_segment


def required_store(meta: MetaStore, credentials_file: Any = None) -> tuple[ColdStore, float | None] | None:
    """The cold store the cluster requires (reached with ``credentials_file``) and its
    retention; None when none is required."""
    policy = coldpolicy.load(meta)
    if policy is None:
        return None
    config, retention = policy
    return open_store(coldpolicy.with_credentials(config, credentials_file)), retention


def pending(segments: list[Versioned[SegmentRecord]]) -> list[Versioned[SegmentRecord]]:
    """Truncated segments without a cold copy yet."""
    return [v for v in segments if v.value.state is SegmentState.TRUNCATED and v.value.cold is None]


def offload_segments(
    meta: MetaStore, name: str, log_id: int, todo: list[Versioned[SegmentRecord]], store: ColdStore, secret: Any, rate: float = 0.0
) -> tuple[dict[int, Versioned[SegmentRecord]], dict[int, str]]:
    """Copy each segment of ``todo`` and mark its record; returns the marked records (by seq,
    at their new versions) and why the others were not. ``rate``: bytes per second read from
    the replicas at most (0: no limit; the housekeeper's ``offload_bytes_per_second``). Runs
    its own event loop (callers are threads: the housekeeper's worker, or `dlctl gc`)."""
    marked: dict[int, Versioned[SegmentRecord]] = {}
    failed: dict[int, str] = {}

    async def go() -> None:
        loop = asyncio.get_running_loop()
        pool = AgentPool(meta, secret, request_timeout=10.0)
        throttle = TokenBucket(rate)
        try:
            for current in todo:
                seg = current.value
                try:
                    await copy_segment(meta, store, pool, name, log_id, seg, throttle=throttle)
                    new = replace(seg, cold=object_key(name, log_id, seg.seq))
                    marked[seg.seq] = await loop.run_in_executor(None, meta.update_segment, name, current, new)
                except (DlctlError, AgentError, CorruptObject, OSError) as exc:
                    failed[seg.seq] = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
        finally:
            await pool.close()

    asyncio.run(go())
    return marked, failed


def cold_retentions(meta: MetaStore) -> dict[tuple[str, int], float]:
    """(log, log id) -> the cold retention of each existing log that sets its own."""
    out = {}
    for name in meta.list_logs():
        try:
            record = meta.get_log(name).value
        except NotFoundError:
            continue
        if record.config.cold_retention_seconds is not None:
            out[(name, record.log_id)] = record.config.cold_retention_seconds
    return out


def sweep_expired(
    store: ColdStore,
    retention_seconds: float | None,
    now: float | None = None,
    per_log: Mapping[tuple[str, int], float] | None = None,
    seen: dict[str, SegmentManifest] | None = None,
) -> dict[str, Any]:
    """Delete the copies stored longer ago than their log's cold retention (``per_log``, by
    log name and id), else ``retention_seconds`` (None: kept for ever).

    ``seen``: manifests read by earlier sweeps (kept by the caller between rounds), so a round
    reads only new ones; one that looks expired is read again before anything is deleted."""
    per_log = per_log or {}
    if retention_seconds is None and not per_log:
        return {"deleted": 0}
    now = time.time() if now is None else now
    seen = {} if seen is None else seen
    deleted, errors = [], []
    keys = [k for k in store.list("logs") if k.endswith(".manifest.json")]
    for gone in set(seen) - set(keys):
        del seen[gone]

    def expired(manifest: SegmentManifest) -> bool:
        keep_for = per_log.get((manifest.log, manifest.log_id), retention_seconds)
        return keep_for is not None and now - manifest.stored > keep_for

    for key in keys:
        try:
            manifest = seen.get(key)
            if manifest is None or expired(manifest):  # new, or about to go: as it is now
                manifest = seen[key] = SegmentManifest.from_json(store.get(key), f"{store.describe()}: {key}")
        except (CorruptObject, NotFoundError) as exc:
            errors.append(str(exc))
            continue
        if not expired(manifest):
            continue
        store.delete(key)  # first: a copy without its manifest is never read
        store.delete(manifest.object)
        del seen[key]
        deleted.append(manifest.object)
    return {"deleted": len(deleted), "objects": deleted, "errors": errors}
