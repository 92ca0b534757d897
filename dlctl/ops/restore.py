"""`dlctl log restore LOG --to-log NEW`: rebuild a log from its copies in the cluster's cold
store (issue 25 item 4), into a new log.

What a record *is* survives: its txid, key and headers (so replicated records keep their
origin events), in the original order, and the timestamps readers derive for local records: the
new log gets clock steps (``dlctl.replication.clock``) from the copies' clocks
(``dlctl.cold.clock``) so that its readers count exactly as the original log's did — at its start
(the vector before the first restored record) and wherever the original's clock was raised in
between (a new segment there) — and a replication stream reading the restored log stays exactly
once. Where a record lands is new: the new log's own segments and DLSNs, and the time of the
restore as append time.

Every copy is checked before anything is written: each object against its manifest's SHA-256,
then entry by entry (CRC-32C, ids); a damaged or missing copy, or a segment missing between two
copies, refuses the whole restore with nothing written. The new log must not hold records yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..cold.catalog import check_contiguous, incarnations, manifests
from ..cold.copies import copy_records
from ..cold.manifest import SegmentManifest
from ..cold.segobject import CorruptObject
from ..cold.store import ColdStore
from ..errors import ConflictError, NotFoundError, RefusedError
from ..log.dlsn import DLSN, INITIAL
from ..log.records import Record
from ..meta.records import LogConfig
from ..names import validate_name
from ..plan import Plan, Step
from ..replication.causal import SourceClock, merge
from ..replication.clock import ClockStore
from ..replication.origin import Origin, OriginHeaderError
from .backup import cold_store_of
from ..session import ClusterSession


def in_range(copies: list[SegmentManifest], from_txid: int | None, to_txid: int | None) -> list[SegmentManifest]:
    """The copies holding records with txids in ``from_txid``..``to_txid`` (inclusive; None:
    open), by their segment records' txid ranges."""
    if from_txid is None and to_txid is None:
        return copies
    low, high = _txid_bounds(from_txid, to_txid)
    return [m for m in copies if m.segment.records and m.segment.first_txid <= high and m.segment.last_txid >= low]


def read_copy(store: ColdStore, manifest: SegmentManifest) -> list[Record]:
    """The data records of one copy, after checking it whole (``CorruptObject`` otherwise)."""
    records = [record for _, record, _ in copy_records(store, manifest)]
    if len(records) != manifest.segment.records:
        raise CorruptObject(f"{store.describe()}: {manifest.object}: {len(records)} records, its segment record says {manifest.segment.records}")
    return records


def restore_plan(
    session: ClusterSession,
    name: str,
    *,
    to_log: str,
    log_id: int | None = None,
    from_txid: int | None = None,
    to_txid: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> Plan:
    """``from_txid``/``to_txid``: only the records with txids in that range (inclusive)."""
    validate_name("log", to_log)
    if from_txid is not None and to_txid is not None and from_txid > to_txid:
        raise RefusedError(f"empty txid range {from_txid}..{to_txid}")
    store = cold_store_of(session)
    if log_id is None:
        held = incarnations(store, name)
        if not held:
            raise NotFoundError(f"{store.describe()} holds no copy of log {name!r}", hint="`dlctl log backup LOG` makes them")
        log_id = held[-1]
    copies = in_range(manifests(store, name, log_id), from_txid, to_txid)
    if not copies:
        wanted = f"txid >= {from_txid}" if to_txid is None else f"txid <= {to_txid}" if from_txid is None else f"txid in {from_txid}..{to_txid}"
        raise NotFoundError(f"{store.describe()} holds no record of log {name!r} (log id {log_id}) with {wanted}")
    check_contiguous(store, name, log_id, copies)
    keep = _txid_filter(from_txid, to_txid)
    total = sum(m.segment.records for m in copies)  # at most, with a range
    exists = to_log in session.meta.list_logs()
    if exists and any(s.value.records for s in session.meta.segments(to_log)):
        raise ConflictError(f"log {to_log!r} already holds records", hint="restore into a new log (it is created) or an empty one")
    span = f"segments {copies[0].segment.seq}..{copies[-1].segment.seq}"
    steps = [  # checked first: a damaged copy leaves nothing behind, not even the new log
        Step(
            "verify-copies", f"{store.describe()}/{name}", f"check the {len(copies)} copies of {name} (log id {log_id}, {span}) against their manifests",
            run=lambda: {"segments": len(copies), "records": sum(sum(map(keep, read_copy(store, m))) for m in copies)},
        )
    ]
    if not exists:
        steps.append(Step("create-log", f"{session.cluster.name}/{to_log}", f"create log {to_log} (default placement)", run=lambda: {"log_id": session.meta.create_log(to_log, LogConfig()).log_id}))
    steps.append(
        Step(
            "restore-records", f"{session.cluster.name}/{to_log}", f"append their {'' if keep is _all else 'chosen '}records to {to_log}, each with its txid, key and headers",
            params={"records_at_most": total, "from_txid": from_txid, "to_txid": to_txid},
            run=lambda: session.with_pool(lambda pool: _append(session, pool, store, copies, to_log, total, keep, on_progress)),
        )
    )
    notes = [f"from {store.describe()}: log {name} (log id {log_id}), {span}, {total} records"]
    if copies[0].clock is None:
        notes.append(f"the copy of segment {copies[0].segment.seq} records no clock: the restored log's readers count its local records from zero")
    return Plan.of("log restore", steps, notes=notes)


def _all(record: Record) -> bool:
    return True


def _txid_bounds(from_txid: int | None, to_txid: int | None) -> tuple[int, int]:
    return (from_txid if from_txid is not None else -1, to_txid if to_txid is not None else 2**63)


def _txid_filter(from_txid: int | None, to_txid: int | None) -> Callable[[Record], bool]:
    if from_txid is None and to_txid is None:
        return _all
    low, high = _txid_bounds(from_txid, to_txid)
    return lambda record: low <= record.txid <= high


class _Clocks:
    """The original log's clock and the new log's, side by side while records are restored: the
    new log needs a clock step wherever they would differ before a restored record."""

    def __init__(self, location: str, first: SegmentManifest) -> None:
        self.known = first.clock is not None and first.clock.location == location
        self.original = SourceClock(location)  # (``enter`` merges each copy's ``before``, the first's too)
        self.restored = SourceClock(location)
        self.written = 0  # clock steps written

    def enter(self, manifest: SegmentManifest) -> None:
        """At a copy's start: the original's clock was raised there if its ``before`` says so."""
        if self.known and manifest.clock is not None:
            self.original.vv = merge(self.original.vv, manifest.clock.before)

    def stamp(self, manifest: SegmentManifest, record: Record, kept: bool) -> None:
        try:
            origin = Origin.from_headers(record.headers)
        except OriginHeaderError as exc:
            raise CorruptObject(f"{manifest.object}: record txid {record.txid}: {exc}") from None
        self.original.stamp(origin)
        if kept:
            self.restored.stamp(origin)

    def step_needed(self) -> dict[str, int] | None:
        """Before a kept record: the vector the new log must count from, when it differs."""
        if not self.known or self.restored.vv == self.original.vv:
            return None
        return dict(self.original.vv)

    def stepped(self, vv: dict[str, int]) -> None:
        self.restored.vv = merge(self.restored.vv, vv)
        self.written += 1


async def _append(
    session: ClusterSession, pool: Any, store: ColdStore, copies: list[SegmentManifest], to_log: str, total: int, keep: Callable[[Record], bool], on_progress: Any
) -> dict[str, Any]:
    from ..log.writer import LogWriter

    clocks, steps = _Clocks(session.meta.cluster, copies[0]), ClockStore(session.meta)
    reason = f"restored from cold copies of {copies[0].log} (log id {copies[0].log_id})"
    writer = await LogWriter.open(session.meta, pool, to_log)
    done, last = 0, None
    try:
        loop = asyncio.get_running_loop()
        for manifest in copies:
            clocks.enter(manifest)
            # Checked again: the store may have changed since the plan's check.
            for record in await loop.run_in_executor(None, read_copy, store, manifest):
                kept = keep(record)
                vv = clocks.step_needed() if kept else None
                if vv is not None:
                    # The step must take effect exactly before this record: at the new log's
                    # start, or at a segment of its own (the records before it are flushed and
                    # their segment closed; the next writer's segment starts after them).
                    at = INITIAL
                    if done:
                        await writer.close()
                        last = writer.last_dlsn or last
                        at = DLSN(last.segment_seq + 1, 0, 0) if last else INITIAL
                    await loop.run_in_executor(None, lambda: steps.raise_to(to_log, vv, at, reason=reason))
                    clocks.stepped(vv)
                    if done:
                        writer = await LogWriter.open(session.meta, pool, to_log)
                clocks.stamp(manifest, record, kept)
                if not kept:
                    continue
                await writer.wait_writable()  # (at once unless too much is unacknowledged)
                writer.submit(record)
                done += 1
            await writer.flush()
            if on_progress is not None:
                on_progress(done, total)
    finally:
        await writer.close()
    last = writer.last_dlsn or last
    clock = f"kept: {clocks.written} clock step(s) written" if clocks.known else "unknown: the copies record no clock of this location"
    return {"records": done, "last_dlsn": str(last) if last else None, "clock": clock}
