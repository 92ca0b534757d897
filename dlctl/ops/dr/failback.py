"""``failback``: A returns after a failover to B. Freeze A, find the records A holds that B never
received (the divergence), re-append them at B (``reconcile``) or drop them (``discard``), then
B -> A: incremental where A's log is a prefix of B's, else A's log is rebuilt from B.

The divergence shown in the plan is read before A is frozen; every step decides again on what
it finds after the freeze (a dead owner's last entries become visible only when its segment is
recovered), and refuses rather than drop a record that was not part of the operator's choice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ...errors import ConflictError, RefusedError
from ...log.dlsn import DLSN
from ...meta.access import AccessMode, AccessStore
from ...meta.pins import PinStore
from ...plan import Plan, Step, apply
from ...replication import dr
from ...replication.clock import ClockStore
from ...replication.records import StreamConfig, StreamState, default_stream_id
from ...replication.store import StreamStore
from ...session import ClusterSession
from .. import replication as repl
from .decide import (
    check_choice,
    divergence_notes,
    failback_start,
    has_failed_over_from,
    needs_rebuild,
    reappended_headers,
    rebuilt_report,
    recorded_start,
    refuse_copy_needed,
    refuse_unchosen_loss,
    reverse_exists,
    stream_into,
)
from .facts import is_empty, read_divergences, read_status, read_streams, read_tail
from .fencing import depose_owner, freeze_logs


def failback_plan(primary: ClusterSession, returning: ClusterSession, *, choice: str | None = None, wait_workers: float = 30.0) -> tuple[Plan, dict[str, dr.Divergence]]:
    """``choice``: None (refuse when anything diverged), "reconcile" or "discard"."""
    check_choice(choice)
    unreadable: dict[str, str] = {}  # stream records that cannot be read: named if no stream is found
    stream = stream_into(primary.cluster.name, read_streams(primary, unreadable), returning.cluster.name, (StreamState.FAILED_OVER,), unreadable)
    config, at_risk = stream.config, stream.status.details.get("at_risk") or {}
    a, b = returning.cluster.name, primary.cluster.name
    divergences = _divergences(primary, returning, config, at_risk)
    names, where_a = list(config.logs), f"{a}/{','.join(config.logs)}"
    stream_back = default_stream_id(b, a)
    steps = [Step("freeze-returning", where_a, f"make {a}'s logs read-only and take them from their writers (recovering what a dead owner left), so nothing more diverges", run=lambda: _freeze(returning, names, b), piecewise=True)]
    if choice == "reconcile":
        count = sum(d.count for d in divergences.values())
        steps.append(Step("reconcile", f"{b}/{','.join(names)}", f"re-append at {b} the record(s) only {a} holds ({count} seen now), keeping their origin ({a}, DLSN)", run=lambda: _reconcile(primary, returning, config, at_risk)))
    verb = "dropping its divergent records" if choice == "discard" else "refuse if anything diverged" if choice is None else "after the reconcile"
    steps += [
        Step("rebuild", where_a, f"where {a}'s log is not a prefix of {b}'s, recreate it empty ({verb}); {b} -> {a} refills it from the start", run=lambda: _rebuild_logs(primary, returning, config, at_risk, choice), piecewise=True),
        Step("reverse", f"{a}/{stream_back}", f"start {b} -> {a}: incremental where {a}'s log is a prefix of {b}'s, from the start where rebuilt", run=lambda: _reverse(primary, returning, config, at_risk)),
        Step("retire", f"{b}/{config.stream_id}", f"delete the failed-over stream {config.stream_id} and its pins at {a}", run=lambda: _retire(primary, returning, config)),
    ]
    return Plan.of(f"failback {b} -> {a}", steps, divergence_notes(divergences, a, b)), divergences


def failed_over_from(session: ClusterSession, returning: str) -> bool:
    """Does ``session``'s cluster hold a failed-over stream from ``returning`` (is it the current
    primary a failback returns to)?"""
    return has_failed_over_from(read_streams(session), returning)


def _divergences(primary: ClusterSession, returning: ClusterSession, config: StreamConfig, at_risk: Mapping[str, Any]) -> dict[str, dr.Divergence]:
    return read_divergences(primary, returning, config.logs, {name: _tail_start(primary, config, at_risk, name) for name in config.logs})


def _tail_start(primary: ClusterSession, config: StreamConfig, at_risk: Mapping[str, Any], name: str) -> DLSN:
    """Where the primary's copy of ``name`` stopped: as the failover settled it, else its checkpoint."""
    return recorded_start(at_risk.get(name)) or StreamStore(primary.meta).get_checkpoint(config.stream_id, name).value.next


def _freeze(returning: ClusterSession, names: list[str], primary: str) -> dict[str, Any]:
    present = [n for n in names if n in returning.meta.list_logs()]
    return freeze_logs(returning, present, mode=AccessMode.READ_ONLY, reason=f"failback from {primary}")


def _reconcile(primary: ClusterSession, returning: ClusterSession, config: StreamConfig, at_risk: Mapping[str, Any]) -> dict[str, Any]:
    # Read again now that A is frozen and recovered; a re-run skips what B already holds.
    fresh = _divergences(primary, returning, config, at_risk)
    return {n: _reappend(primary, returning, n, d) for n, d in fresh.items() if d.count}


def _rebuild_logs(primary: ClusterSession, returning: ClusterSession, config: StreamConfig, at_risk: Mapping[str, Any], choice: str | None) -> dict[str, Any]:
    a, b = returning.cluster.name, primary.cluster.name
    lost = refuse_unchosen_loss(_divergences(primary, returning, config, at_risk), choice, a, b)
    out: dict[str, Any] = {}
    for name in config.logs:
        tail = read_tail(returning, name, _tail_start(primary, config, at_risk, name)) if name in returning.meta.list_logs() else None
        if needs_rebuild(tail):
            out[name] = rebuilt_report(_recreate(returning, primary, name), name, tail, lost, choice, b)
        else:
            out[name] = {"prefix": True}
    return out


def _reverse(primary: ClusterSession, returning: ClusterSession, config: StreamConfig, at_risk: Mapping[str, Any]) -> dict[str, Any]:
    a, b = returning.cluster.name, primary.cluster.name
    stream_back = default_stream_id(b, a)
    if reverse_exists(read_status(returning, stream_back)):
        return {"stream": stream_back, "existed": True}
    starts: dict[str, tuple[DLSN, dict[str, int]]] = {}
    needs_copy = []
    for name in config.logs:
        # A rebuilt log is empty too: the step before recreated it.
        emptied = is_empty(returning, name)
        held = repl.records_held(primary, name) if emptied else None
        position = failback_start(at_risk.get(name), emptied, primary_truncated=held is not None and held[1] is not None)
        if position is None:
            needs_copy.append(name)
        elif emptied:
            starts[name] = (position, {})
        else:
            starts[name] = (position, primary.with_pool(lambda pool, name=name, position=position: dr.vv_before(primary.meta, pool, name, b, position)))
    refuse_copy_needed(needs_copy, a, b)
    apply(Plan.of("reverse", repl.register_at_steps(primary, returning, starts, pin_max_age=config.pin_max_age_seconds, compression=config.compression, why=f"failback after failover from {a}")))
    return {"stream": stream_back, "starts": {n: str(p) for n, (p, _) in starts.items()}}


def _retire(primary: ClusterSession, returning: ClusterSession, config: StreamConfig) -> dict[str, Any]:
    PinStore(returning.meta).delete(config.stream_id)
    StreamStore(primary.meta).delete(config.stream_id)
    return {"deleted": config.stream_id}


def _reappend(primary: ClusterSession, returning: ClusterSession, name: str, div: dr.Divergence) -> int:
    """Append the divergent records at the primary with their identity (origin headers), in
    their order, through the log's owner."""
    if not div.records:
        return 0
    wanted = {r.dlsn for r in div.records}
    location = returning.cluster.name

    async def go() -> int:
        from ...log.producer import LogProducer

        stamped, _ = await dr.stamped(returning.meta, await returning.pool(), name, location, end=dr.after(div.records[-1].dlsn))
        producer = LogProducer(primary.meta, await primary.pool(), name)
        try:
            futures = []
            for record, vt in stamped:
                if record.dlsn not in wanted:
                    continue
                await producer.wait_writable()
                futures.append(producer.submit(record.payload, key=record.key, headers=reappended_headers(record.headers, location, record.dlsn, vt)))
            await producer.flush()
            return len(futures)
        finally:
            await producer.close()

    return primary.run(go())


def _recreate(returning: ClusterSession, primary: ClusterSession, name: str) -> dict[str, Any]:
    """Delete the returning cluster's copy of the log and create it empty (same configuration);
    the reverse stream then fills it from the primary."""
    meta = returning.meta
    if name in meta.list_logs():
        config = meta.get_log(name).value.config
        if meta.owner_of(name) is not None:
            depose_owner(returning, name)
        for attempt in range(20):  # a refused writer holds the owner znode for a moment
            AccessStore(meta).set(name, AccessMode.READ_ONLY, reason=f"rebuilding from {primary.cluster.name}")
            AccessStore(meta).clear(name)
            ClockStore(meta).clear(name)
            try:
                meta.delete_log(name)
                break
            except (RefusedError, ConflictError):
                if attempt == 19:
                    raise
                time.sleep(0.25)
    else:
        config = primary.meta.get_log(name).value.config
    meta.create_log(name, config)
    # Not writable in between: the reverse stream's replica mode replaces this.
    AccessStore(meta).set(name, AccessMode.READ_ONLY, reason=f"rebuilt from {primary.cluster.name}")
    return {"recreated": name}


__all__ = ["failback_plan", "failed_over_from"]
