"""`dlctl log backup LOG`: copy a live log's completed segments to the cluster's cold store
(issue 25 item 5), incrementally: a segment whose manifest is there already is skipped.

Per segment: ``dlctl.cold.copy`` (object, read back and checked, then its manifest; an
interrupted run leaves at most an object without a manifest, which the next run writes again).
Nothing in the cluster changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..cold.copy import copy_segment, verify_copy
from ..cold.manifest import log_prefix, manifest_key
from ..cold.store import ColdStore, open_store
from ..errors import ConfigError
from ..meta.records import SegmentRecord, SegmentState
from ..plan import Plan, Step
from ..session import ClusterSession


def cold_store_of(session: ClusterSession) -> ColdStore:
    config = session.cluster.cold_storage
    if config is None:
        raise ConfigError(
            f"cluster {session.cluster.name!r} has no cold store",
            hint=f"add a [clusters.{session.cluster.name}.cold_storage] table to the inventory (see README: Cold storage)",
        )
    return open_store(config)


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


