"""``dr recover`` from a peer's cold store (issue 25 item 4; ``dlctl.ops.dr.truncated``).

When a peer P no longer holds the beginning of a log (it truncated it before T) and location X
lost what lay there, P's cold store may still hold it: the copies P's housekeeper made before
collecting the truncated segments, or `dlctl log backup`. When P's copies (its cluster's
``[cold_storage]`` in the inventory) cover the whole range before T — from segment 1, without a
gap, each with the clock of its records — the gap is covered: X gets those records back from
the copies before P's stream goes on from T, and ``dr recover`` names the store as their source.

The records are replayed as P's stream would have delivered them (``replay``): stamped with P's
clock (the copies' clocks: P's local records get the counters P's readers always derived; a
relayed record keeps its own), admitted by the unfiltered causality filter from what X holds (so
X's kept records and a replay cut short and re-run are skipped), and appended with the origin
headers a stream gives them, through the appender a stream into X uses. Only then does P's
stream start, at T, with P's clock there and a filter from what X holds.

Copies that start after segment 1, stop short of T or lack their clock do not cover the gap: it
is reported as before, with why the store could not help.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ...cold.history import cold_records, copies_before
from ...cold.manifest import SegmentManifest
from ...cold.segobject import CorruptObject
from ...cold.store import ColdStore, ColdStoreError, open_store
from ...errors import DlctlError
from ...log.dlsn import DLSN
from ...log.pool import AgentPool
from ...meta.access import replication_role
from ...replication import dr
from ...replication.causal import CausalityFilter, SourceClock, merge
from ...replication.origin import Origin, applied_headers
from ...replication.records import StreamConfig
from ...replication.worker import open_appender
from ...session import ClusterSession


@dataclass(frozen=True)
class ColdCover:
    """P's copies of a log holding every record before ``first``, with their clocks."""

    store: ColdStore
    copies: list[SegmentManifest]

    def describe(self) -> str:
        return f"{self.store.describe()} (segments {self.copies[0].segment.seq}..{self.copies[-1].segment.seq})"


def cover(source: ClusterSession, name: str, first: DLSN) -> tuple[ColdCover | None, str]:
    """P's (``source``'s) cold copies of ``name`` covering everything before ``first``, or None
    and why they do not."""
    config = source.cluster.cold_storage
    if config is None:
        return None, f"the inventory gives {source.cluster.name} no cold store"
    store = open_store(config)
    try:
        log_id = source.meta.get_log(name).value.log_id
        copies = copies_before(store, name, log_id, first)
    except (DlctlError, CorruptObject) as exc:  # unreachable, short of the point, malformed
        return None, f"{store.describe()}: {getattr(exc, 'message', exc)}"
    if not copies:
        return None, f"{store.describe()} holds no copy of {name} before {first}"
    if copies[0].segment.seq != 1:
        return None, f"{store.describe()}: its copies of {name} start at segment {copies[0].segment.seq}, not at the log's beginning"
    unclocked = [m.segment.seq for m in copies if m.clock is None or m.clock.location != source.cluster.name]
    if unclocked:
        return None, f"{store.describe()}: the copies of segment(s) {', '.join(map(str, unclocked))} of {name} record no clock of {source.cluster.name}"
    return ColdCover(store, copies), ""


def covered_note(peer: str, name: str, first: DLSN, target: str, found: ColdCover) -> str:
    return f"COLD {peer}/{name}: {peer} no longer holds {name} before {first}; {target} gets it back from {peer}'s cold store, {found.describe()}"


async def replay(target: ClusterSession, pool: AgentPool, source: str, config: StreamConfig, name: str, found: ColdCover, first: DLSN) -> dict[str, Any]:
    """Append to X's log ``name`` the records of ``found``'s copies before ``first`` that X does
    not hold, as stream ``config`` from ``source`` would have (see the module doc)."""
    x = target.cluster.name
    causal = CausalityFilter(x, await dr.held_vv(target.meta, pool, name, x), unfiltered=True)
    clock = SourceClock(source)  # (each copy's ``before`` is merged below, the first's too)
    appender = await open_appender(
        target.meta, pool, name, owner_id=f"dr-cold-{config.stream_id}", region=None, ownership_wait=30.0,
        shared=config.bidirectional, role=replication_role(config.stream_id),
    )
    loop = asyncio.get_running_loop()
    applied = skipped = 0
    origin_name = source.encode()
    try:
        for manifest in found.copies:
            if manifest.clock is not None:  # (always: ``cover`` checked) P's clock before this segment
                clock.vv = merge(clock.vv, manifest.clock.before)
            # Each copy checked whole (SHA-256, then entry by entry) before any of its records goes.
            records = await loop.run_in_executor(None, lambda m=manifest: list(cold_records(found.store, [m], first)))
            for record in records:
                origin = Origin.from_headers(record.headers)
                vt = clock.stamp(origin, record.dlsn)
                if not causal.admit(origin.cluster if origin is not None else source, vt):
                    skipped += 1  # X holds it (kept, or replayed by a run cut short)
                    continue
                appender.submit(record.payload, key=record.key, headers=applied_headers(record.headers, origin, origin_name, str(record.dlsn).encode(), vt))
                applied += 1
                if applied & 255 == 0:
                    await appender.wait_writable()
        await appender.flush()
    except (ColdStoreError, CorruptObject) as exc:
        raise DlctlError(f"replaying {source}'s cold copies of {name} into {x}: {getattr(exc, 'message', exc)}", hint="re-running `dlctl dr recover` continues where this stopped") from None
    finally:
        await appender.close()
    return {"from": found.describe(), "applied": applied, "held_already": skipped, "source_vv_at_first": clock.vv}


__all__ = ["ColdCover", "cover", "covered_note", "replay"]
