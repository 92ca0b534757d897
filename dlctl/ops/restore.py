"""`dlctl log restore LOG --to-log NEW`: rebuild a log from its copies in the cluster's cold
store (issue 25 item 4), into a new log.

What a record *is* survives: its txid, key and headers (so replicated records keep their
origin events and a replication stream reading the restored log stays exactly once), in the
original order. Where it lands is new: the new log's own segments and DLSNs, and the time of the
restore as append time.

Every copy is checked before anything is written: each object against its manifest's SHA-256,
then entry by entry (CRC-32C, ids); a damaged or missing copy, or a segment missing between two
copies, refuses the whole restore with nothing written. The new log must not hold records yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..cold.manifest import SegmentManifest, log_prefix
from ..cold.copies import checked_entries
from ..cold.segobject import CorruptObject
from ..cold.store import ColdStore
from ..errors import ConflictError, NotFoundError, RefusedError
from ..log.records import Record, decode_records
from ..meta.records import LogConfig
from ..names import validate_name
from ..plan import Plan, Step
from .backup import cold_store_of
from .session import ClusterSession


def incarnations(store: ColdStore, name: str) -> list[int]:
    """The log ids the store holds copies of for log ``name`` (a log deleted and created
    again is another incarnation), oldest first."""
    keys = store.list(f"logs/{validate_name('log', name)}")
    return sorted({int(k.split("/")[2]) for k in keys if k.split("/")[2].isdigit()})


def manifests(store: ColdStore, name: str, log_id: int) -> list[SegmentManifest]:
    """The manifests of one incarnation, in segment order; raises when a segment is missing
    between two copies (an incomplete backup must not pass for a whole log)."""
    keys = [k for k in store.list(log_prefix(name, log_id)) if k.endswith(".manifest.json")]
    found = sorted((SegmentManifest.from_json(store.get(k), f"{store.describe()}: {k}") for k in keys), key=lambda m: m.segment.seq)
    if not found:
        raise NotFoundError(f"{store.describe()} holds no copy of log {name!r} (log id {log_id})", hint="`dlctl log backup LOG` makes them")
    seqs = [m.segment.seq for m in found]
    missing = sorted(set(range(seqs[0], seqs[-1] + 1)) - set(seqs))
    if missing:
        raise RefusedError(
            f"{store.describe()}: the copies of log {name!r} (log id {log_id}) lack segment(s) {', '.join(map(str, missing))} "
            f"between {seqs[0]} and {seqs[-1]}",
            hint="run `dlctl log backup` while those segments still exist; nothing was restored",
        )
    return found


def read_copy(store: ColdStore, manifest: SegmentManifest) -> list[Record]:
    """The data records of one copy, after checking it whole (``CorruptObject`` otherwise)."""
    records: list[Record] = []
    for entry in checked_entries(store, manifest):
        records += [r for r in decode_records(entry.payload) if not r.control]
    if len(records) != manifest.segment.records:
        raise CorruptObject(f"{store.describe()}: {manifest.object}: {len(records)} records, its segment record says {manifest.segment.records}")
    return records


def restore_plan(
    session: ClusterSession, name: str, *, to_log: str, log_id: int | None = None, on_progress: Callable[[int, int], None] | None = None
) -> Plan:
    validate_name("log", to_log)
    store = cold_store_of(session)
    if log_id is None:
        held = incarnations(store, name)
        if not held:
            raise NotFoundError(f"{store.describe()} holds no copy of log {name!r}", hint="`dlctl log backup LOG` makes them")
        log_id = held[-1]
    copies = manifests(store, name, log_id)
    total = sum(m.segment.records for m in copies)
    exists = to_log in session.meta.list_logs()
    if exists and any(s.value.records for s in session.meta.segments(to_log)):
        raise ConflictError(f"log {to_log!r} already holds records", hint="restore into a new log (it is created) or an empty one")
    span = f"segments {copies[0].segment.seq}..{copies[-1].segment.seq}"
    steps = [  # checked first: a damaged copy leaves nothing behind, not even the new log
        Step(
            "verify-copies", f"{store.describe()}/{name}", f"check the {len(copies)} copies of {name} (log id {log_id}, {span}) against their manifests",
            run=lambda: {"segments": len(copies), "records": sum(len(read_copy(store, m)) for m in copies)},
        )
    ]
    if not exists:
        steps.append(Step("create-log", f"{session.cluster.name}/{to_log}", f"create log {to_log} (default placement)", run=lambda: {"log_id": session.meta.create_log(to_log, LogConfig()).log_id}))
    steps.append(
        Step(
            "restore-records", f"{session.cluster.name}/{to_log}", f"append their {total} records to {to_log}, each with its txid, key and headers",
            params={"records": total},
            run=lambda: session.with_pool(lambda pool: _append(session, pool, store, copies, to_log, total, on_progress)),
        )
    )
    return Plan.of("log restore", steps, notes=[f"from {store.describe()}: log {name} (log id {log_id}), {span}, {total} records"])


async def _append(session: ClusterSession, pool: Any, store: ColdStore, copies: list[SegmentManifest], to_log: str, total: int, on_progress: Any) -> dict[str, Any]:
    from ..log.writer import LogWriter

    writer = await LogWriter.open(session.meta, pool, to_log)
    done = 0
    try:
        loop = asyncio.get_running_loop()
        for manifest in copies:
            # Checked again: the store may have changed since the plan's check.
            for record in await loop.run_in_executor(None, read_copy, store, manifest):
                await writer.wait_writable()  # (at once unless too much is unacknowledged)
                writer.submit(record)
                done += 1
            await writer.flush()
            if on_progress is not None:
                on_progress(done, total)
    finally:
        await writer.close()
    return {"records": done, "last_dlsn": str(writer.last_dlsn) if writer.last_dlsn else None}
