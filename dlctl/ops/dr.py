"""Disaster recovery between clusters (issue 11; DESIGN.md §7): one plan per runbook.

- ``failover_plan``  (unplanned; the primary A is gone): fence the stream A -> B for good
  (state ``failed-over``: no worker ever runs it again), settle and report what is at risk (A's
  records after the last one B applied, as far as B knows), promote B's logs to read-write.
- ``switchover_plan`` (planned, RPO 0): freeze A's logs (read-only, owners released or fenced),
  drain A -> B, promote B, retire A -> B, start B -> A at B's end (no copy), verify 0 lost.
- ``failback_plan`` (A returns after a failover): freeze A, find the records A holds that B never
  received, re-append them at B (``reconcile``) or drop them (``discard``), then B -> A:
  incremental when A's log is a prefix of B's, else A's log is rebuilt from B.
- ``recover_plan`` (``dr recover``): a location that lost data gets its clock raised, its
  peers' progress reset to what it still has, and its records back from its peers.
- ``promote_plan``: make a cluster's logs writable again (typed confirmation in the CLI).

Access modes are ``dlctl.meta.access``; clock bases ``dlctl.replication.clock``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from ..errors import (
    ConflictError,
    NotFoundError,
    RefusedError,
    TimeoutExpired,
    UsageError,
)
from ..log.dlsn import DLSN, INITIAL
from ..log.errors import AgentUnavailableError
from ..log.pool import AgentPool
from ..log.recovery import recover_log
from ..meta.access import REPLICATION_PREFIX, AccessMode, AccessStore
from ..meta.pins import PinStore
from ..meta.records import SegmentState
from ..plan import Plan, Step, apply
from ..replication import dr
from ..replication.clock import ClockStore
from ..replication.origin import (
    ORIGIN_CLUSTER,
    ORIGIN_DLSN,
    SOURCE_POSITION,
    VECTOR_TIME,
    encode_vt,
)
from ..replication.positions import find_applied, log_end
from ..replication.records import (
    StreamConfig,
    StreamState,
    default_stream_id,
)
from ..replication.store import StreamStore
from . import dr_cold, dr_rebuild, dr_truncated
from . import replication as repl
from .logs import ask_owner_to_release, owner_record, remove_owner_znode
from ..session import ClusterSession


def _async(session: ClusterSession, fn: Any) -> Any:
    return session.with_pool(fn)


# -- fencing and promoting logs ------------------------------------------------------------------


def depose_owner(session: ClusterSession, name: str, *, only_prefix: str | None = None, timeout: float = 30.0, close: bool = True) -> str:
    """Take log ``name`` away from whoever writes it (an agent releases it gracefully: flush,
    complete the segment; anyone else is deposed and fenced), then close any segment left in
    progress so the log's end is fixed. ``only_prefix``: only an owner whose id starts so."""
    info = owner_record(session, name)
    what = "no owner"
    if info is not None and (only_prefix is None or str(info["owner"]).startswith(only_prefix)):
        if info.get("address"):
            try:
                ask_owner_to_release(session, name, info["address"])
                what = f"released by agent {info['address']}"
            except Exception:  # noqa: BLE001 - the agent is gone or no longer owns it: depose
                remove_owner_znode(session, name)
                what = f"deposed {info['owner']} (its agent did not answer)"
        else:
            remove_owner_znode(session, name)
            what = f"deposed {info['owner']}"
    elif info is not None:
        return f"owned by {info['owner']} (left alone)"
    if close and session.meta.owner_of(name) is None and any(s.value.state is SegmentState.INPROGRESS for s in session.meta.segments(name)):
        results = _async(session, lambda pool: recover_log(session.meta, pool, name, timeout=timeout))
        what += f"; closed {len(results)} in-progress segment(s) (fenced)"
    return what


def freeze_logs(session: ClusterSession, names: Iterable[str], *, mode: AccessMode, stream: str = "", reason: str, close: bool = True) -> dict[str, Any]:
    """Set the logs' access mode to a non-writable one and take them from their writers: after
    this, no application append can land in them."""
    access = AccessStore(session.meta)
    out = {}
    for name in names:
        state = access.set(name, mode, stream=stream, reason=reason)
        out[name] = {"access": state.value.describe(), "owner": depose_owner(session, name, close=close)}
    return out


def promote_logs(session: ClusterSession, names: Iterable[str], *, reason: str) -> dict[str, Any]:
    """Make the logs read-write (a replication worker still owning one is deposed first)."""
    access = AccessStore(session.meta)
    out = {}
    for name in names:
        owner = depose_owner(session, name, only_prefix=REPLICATION_PREFIX)
        state = access.set(name, AccessMode.READ_WRITE, reason=reason)
        out[name] = {"access": state.value.describe(), "owner": owner}
    return out


def promote_plan(session: ClusterSession, patterns: tuple[str, ...] = ("*",)) -> Plan:
    names = repl.matching_logs(session.meta.list_logs(), patterns)
    access = AccessStore(session.meta)
    names = [n for n in names if access.get(n).value.mode is not AccessMode.READ_WRITE]
    if not names:
        return Plan.of(f"dr promote {session.cluster.name}", [], notes=["every matching log is read-write already"])
    where = session.cluster.name
    return Plan.of(
        f"dr promote {where}",
        [Step("promote", f"{where}/{n}", f"make {where}/{n} read-write (was {access.get(n).value.describe()})", run=lambda n=n: promote_logs(session, [n], reason="dr promote")[n]) for n in names],
        notes=[f"applications may write to {where} afterwards: make sure no other cluster is primary for these logs"],
    )


# -- streams into a cluster ----------------------------------------------------------------------


def _stream_into(sink: ClusterSession, source: str | None, *, states: tuple[StreamState, ...]) -> tuple[StreamConfig, Any]:
    """The one-way stream into ``sink`` (from ``source`` when given) in one of ``states``."""
    streams = StreamStore(sink.meta)
    found = []
    for stream_id in streams.list_streams():
        try:
            config = streams.get_config(stream_id).value
            state = streams.get_state(stream_id)
        except (NotFoundError, ValueError):
            continue
        if (source is None or config.source_cluster == source) and state.value.state in states:
            found.append((config, state))
    one_way = [f for f in found if not f[0].bidirectional]
    if not one_way:
        kinds = "/".join(s.value for s in states)
        if found:
            raise RefusedError(
                f"the streams into {sink.cluster.name!r} ({', '.join(f[0].stream_id for f in found)}) are active-active: every location already takes writes",
                hint="failover and switchover are for a primary with a one-way standby",
            )
        raise NotFoundError(f"no one-way stream {('from ' + repr(source) + ' ') if source else ''}into {sink.cluster.name!r} is {kinds}", hint="see `dlctl dr status`")
    if len(one_way) > 1:
        raise UsageError(f"several streams flow into {sink.cluster.name!r} ({', '.join(f[0].stream_id for f in one_way)}); name the source with --from")
    return one_way[0]


# -- failover --------------------------------------------------------------------------------------


def _at_risk(sink: ClusterSession, config: StreamConfig, name: str) -> dict[str, Any]:
    """What of the source's log ``name`` the sink never applied, as far as the sink knows:
    everything from the position after the last record the sink log holds from the source
    (the checkpoint, corrected by the sink log's tail), with the source end the worker last saw."""
    cp = StreamStore(sink.meta).get_checkpoint(config.stream_id, name).value
    applied = _async(sink, lambda pool: find_applied(sink.meta, pool, name, config.source_cluster, floor=cp.sink_dlsn)) if name in sink.meta.list_logs() else None
    start, sink_last = cp.next, cp.sink_dlsn
    if applied is not None and dr.after(applied.source) > start:
        start, sink_last = dr.after(applied.source), applied.sink
    estimate = cp.unapplied_estimate()
    if estimate is not None and cp.source_end is not None and start >= cp.source_end:
        estimate = 0
    return {
        "log": name,
        "from": str(start),
        "source_end": str(cp.source_end) if cp.source_end else None,
        "records_estimate": estimate,
        "source_end_age_seconds": round(time.time() - cp.source_end_at, 1) if cp.source_end_at else None,
        "sink_last": str(sink_last) if sink_last else None,
        "checkpoint": str(cp.next),
    }


def _risk_note(config: StreamConfig, risk: dict[str, Any]) -> str:
    source, log = config.source_cluster, risk["log"]
    if risk["records_estimate"] == 0:
        return f"{source}/{log}: nothing at risk (the sink had applied up to {risk['from']}, the source end it last saw)"
    count = "an unknown number of records" if risk["records_estimate"] is None else f"about {risk['records_estimate']} record(s)"
    seen = f", source end {risk['source_end']} seen {risk['source_end_age_seconds']}s ago" if risk["source_end"] else ""
    return f"AT RISK {source}/{log}: {source}'s records from {risk['from']} on — {count}{seen} — never reached {config.sink_cluster}"


def failover_plan(sink: ClusterSession, *, source: str | None = None, wait_workers: float = 30.0) -> Plan:
    config, state = _stream_into(sink, source, states=(StreamState.RUNNING, StreamState.PAUSED))
    streams = StreamStore(sink.meta)
    stream_id, src, snk = config.stream_id, config.source_cluster, sink.cluster.name
    risks = {name: _at_risk(sink, config, name) for name in config.logs}
    started = time.monotonic()

    def stop_stream() -> dict[str, Any]:
        current = streams.get_state(stream_id)
        if current.value.state is not StreamState.FAILED_OVER:
            current = streams.set_state(stream_id, current, StreamState.FAILED_OVER, reason=f"failover to {snk} at {time.strftime('%Y-%m-%dT%H:%M:%S')}", details={"to": snk, "from": src, "at": time.time()})
        stopped = streams.wait_released(stream_id, wait_workers)
        return {"state": "failed-over", "epoch": current.value.epoch, "workers_stopped": stopped}

    def settle() -> dict[str, Any]:
        # Now that no worker runs, the sink log's tail is final: the exact at-risk positions.
        settled = {name: _at_risk(sink, config, name) for name in config.logs}
        for name, risk in settled.items():
            current = streams.get_checkpoint(stream_id, name)
            position = DLSN.parse(risk["from"])
            if current.value.next != position:
                streams.update_checkpoint(stream_id, current, replace(current.value, next=position, sink_dlsn=DLSN.parse(risk["sink_last"]) if risk["sink_last"] else None))
        current = streams.get_state(stream_id)
        details = {**current.value.details, "at_risk": settled}
        streams.set_state(stream_id, current, StreamState.FAILED_OVER, reason=current.value.reason, details=details)
        return {"at_risk": settled}

    def promote() -> dict[str, Any]:
        out = promote_logs(sink, config.logs, reason=f"failover from {src}")
        return {"promoted": out, "promoted_after_seconds": round(time.monotonic() - started, 3)}

    steps = [
        Step("fence-stream", f"{snk}/{stream_id}", f"mark stream {stream_id} failed-over: its workers stop and it never runs again (a returning {src} cannot write into {snk})", run=stop_stream),
        Step("settle", f"{snk}/{stream_id}", f"find, per log, the last record {snk} holds from {src}; record what is at risk", run=settle),
        Step("promote", f"{snk}/{','.join(config.logs)}", f"promote {snk}'s logs {', '.join(config.logs)} to read-write: applications write at {snk}", run=promote),
    ]
    notes = [_risk_note(config, r) for r in risks.values()]
    notes.append(f"after {src} returns: `dlctl failback --to {src}` shows the records it holds that {snk} never received and sets up {snk} -> {src}")
    plan = Plan.of(f"failover {src} -> {snk}", steps, notes)
    return plan


def at_risk_of(plan_result: Any) -> dict[str, Any]:
    """The settled at-risk record of an applied failover plan."""
    for outcome in plan_result.outcomes:
        if outcome.step.action == "settle":
            return outcome.result["at_risk"]
    return {}


# -- switchover ------------------------------------------------------------------------------------


def _identities(session: ClusterSession, name: str) -> list[dr.Identity]:
    records = _async(session, lambda pool: dr.read_range(session.meta, pool, name))
    return [dr.identity(r, session.cluster.name) for r in records]


def verify_copy(source: ClusterSession, sink: ClusterSession, names: Iterable[str]) -> dict[str, Any]:
    """Every record of the source's logs is in the sink's, none twice."""
    out: dict[str, Any] = {"lost": 0, "duplicates": 0, "logs": {}}
    for name in names:
        expected = _identities(source, name)
        held = _identities(sink, name)
        lost, duplicates = dr.missing(expected, held)
        out["logs"][name] = {"source_records": len(expected), "sink_records": len(held), "lost": len(lost), "duplicates": duplicates, "first_lost": [f"{c}@{d}" for c, d in lost[:5]]}
        out["lost"] += len(lost)
        out["duplicates"] += duplicates
    if out["lost"] or out["duplicates"]:
        raise RefusedError(
            f"verification failed: {out['lost']} record(s) of {source.cluster.name} missing at {sink.cluster.name}, {out['duplicates']} duplicate(s)",
            hint=f"{source.cluster.name}'s logs stay read-only: nothing is lost there; inspect with `dlctl dr status`",
            details=out,
        )
    return out


def switchover_plan(source: ClusterSession, sink: ClusterSession, *, drain_timeout: float = 300.0, wait_workers: float = 30.0, verify: bool = True) -> Plan:
    config, state = _stream_into(sink, source.cluster.name, states=(StreamState.RUNNING, StreamState.PAUSED))
    streams = StreamStore(sink.meta)
    stream_id, src, snk = config.stream_id, config.source_cluster, sink.cluster.name
    names = list(config.logs)
    started = time.monotonic()
    timings: dict[str, float] = {}

    def freeze() -> dict[str, Any]:
        return freeze_logs(source, names, mode=AccessMode.READ_ONLY, reason=f"switchover to {snk}")

    def drain() -> dict[str, Any]:
        # A paused stream must run to drain.
        current = streams.get_state(stream_id)
        if current.value.state is StreamState.PAUSED:
            streams.set_state(stream_id, current, StreamState.RUNNING, reason="switchover drain")
        return repl.wait_drain(sink, source, stream_id, timeout=drain_timeout)

    def stop() -> dict[str, Any]:
        current = streams.get_state(stream_id)
        if current.value.state is StreamState.RUNNING:
            streams.set_state(stream_id, current, StreamState.PAUSED, reason=f"switchover to {snk}")
        if not streams.wait_released(stream_id, wait_workers):
            raise TimeoutExpired(f"the workers of {stream_id} did not stop within {wait_workers:g}s", hint="re-run the switchover: it continues")
        # The drain target was read while the workers ran: check against the final ends now.
        ends = _async(source, lambda pool: _ends(source, pool, names))
        behind = {}
        for name in names:
            cp = streams.get_checkpoint(stream_id, name).value
            if ends[name] is not None and cp.next < ends[name]:
                behind[name] = f"{cp.next} < {ends[name]}"
        if behind:
            streams.set_state(stream_id, streams.get_state(stream_id), StreamState.RUNNING, reason="switchover: drain again")
            raise RefusedError(f"{snk} is still behind {src}: {behind}", hint="re-run the switchover: it drains again")
        return {"stopped": True, "source_ends": {n: str(e) if e else None for n, e in ends.items()}}

    def promote() -> dict[str, Any]:
        out = promote_logs(sink, names, reason=f"switchover from {src}")
        timings["promoted"] = time.monotonic() - started
        return {"promoted": out, "promoted_after_seconds": round(timings["promoted"], 3)}

    def reverse() -> dict[str, Any]:
        # B's log holds exactly A's records (drained, no local writes while a replica): B -> A
        # continues at B's end as of the promotion, with B's vector clock there (= A's at its end).
        starts: dict[str, tuple[DLSN, dict[str, int]]] = {}
        stream_back = default_stream_id(snk, src)
        for name in names:
            cp = streams.get_checkpoint(stream_id, name).value
            applied = _async(sink, lambda pool, name=name, cp=cp: find_applied(sink.meta, pool, name, src, floor=cp.sink_dlsn))
            position = dr.after(applied.sink) if applied is not None else INITIAL
            starts[name] = (position, dict(cp.source_vv))
        if StreamStore(source.meta).exists(stream_back) and StreamStore(source.meta).get_state(stream_back).value.state is not StreamState.SETTING_UP:
            return {"stream": stream_back, "existed": True}
        apply(Plan.of("reverse", repl.register_at_steps(sink, source, starts, pin_max_age=config.pin_max_age_seconds, compression=config.compression, why=f"switchover from {src}")))
        return {"stream": stream_back, "starts": {n: str(p) for n, (p, _) in starts.items()}}

    def retire() -> dict[str, Any]:
        apply(repl.delete_plan(sink, source, stream_id, wait_workers=wait_workers))
        return {"deleted": stream_id}

    def check() -> dict[str, Any]:
        out = verify_copy(source, sink, names)
        out["promoted_after_seconds"] = round(timings.get("promoted", 0.0), 3)
        return out

    where_src, where_snk = f"{src}/{','.join(names)}", f"{snk}/{','.join(names)}"
    steps = [
        Step("freeze-source", where_src, f"make {src}'s logs read-only and take them from their writers (agents release them; others are fenced)", run=freeze),
        Step("drain", f"{snk}/{stream_id}", f"wait until {snk} has applied everything {src} holds (timeout {drain_timeout:g}s)", run=drain),
        Step("stop-stream", f"{snk}/{stream_id}", f"pause {stream_id}, wait for its workers to stop, check nothing is left behind", run=stop),
        Step("promote", where_snk, f"promote {snk}'s logs to read-write: applications write at {snk}", run=promote),
        Step("reverse", f"{src}/{default_stream_id(snk, src)}", f"start {snk} -> {src} at {snk}'s current end (no copy); {src}'s logs become its replicas", run=reverse),
        Step("retire", f"{snk}/{stream_id}", f"delete {stream_id} (its pins at {src} and its state at {snk})", run=retire),
    ]
    if verify:
        steps.append(Step("verify", where_snk, f"compare {src}'s and {snk}'s records: 0 lost, no duplicate", run=check))
    notes = [f"RPO 0: {src} stops taking writes at the first step; producers there get a read-only error and must move to {snk}"]
    return Plan.of(f"switchover {src} -> {snk}", steps, notes)


async def _ends(session: ClusterSession, pool: AgentPool, names: Iterable[str]) -> dict[str, DLSN | None]:
    return {n: (await log_end(session.meta, pool, n)).next for n in names}


# -- failback --------------------------------------------------------------------------------------


def _failed_over(primary: ClusterSession, returning: str) -> tuple[StreamConfig, Any]:
    config, state = _stream_into(primary, returning, states=(StreamState.FAILED_OVER,))
    return config, state


def _held(session: ClusterSession, name: str) -> set[dr.Identity]:
    """Identities of every record of ``session``'s log ``name``."""
    if name not in session.meta.list_logs():
        return set()
    return set(_identities(session, name))


def _divergences(primary: ClusterSession, returning: ClusterSession, config: StreamConfig, at_risk: dict[str, Any]) -> dict[str, dr.Divergence]:
    """Per log: the returning cluster's records at or after the at-risk position that the
    primary does not hold (by identity: a re-run after a partial reconcile finds fewer)."""
    out = {}
    for name in config.logs:
        risk = at_risk.get(name) or {}
        start = DLSN.parse(risk["from"]) if risk.get("from") else StreamStore(primary.meta).get_checkpoint(config.stream_id, name).value.next
        if name not in returning.meta.list_logs():
            out[name] = dr.Divergence(name, returning.cluster.name, start)
            continue
        already = _held(primary, name)
        out[name] = _async(returning, lambda pool, name=name, start=start, already=already: dr.divergence(returning.meta, pool, name, returning.cluster.name, start, already))
    return out


def _reappend(primary: ClusterSession, returning: ClusterSession, name: str, div: dr.Divergence) -> int:
    """Append the divergent records at the primary with their identity (origin headers), in
    their order, through the log's owner."""
    if not div.records:
        return 0
    wanted = {r.dlsn for r in div.records}

    async def go() -> int:
        from ..log.producer import LogProducer

        pool_r = AgentPool(returning.meta, returning.credentials)
        try:
            stamped, _ = await dr.stamped(returning.meta, pool_r, name, returning.cluster.name, end=dr.after(div.records[-1].dlsn))
        finally:
            await pool_r.close()
        pool = AgentPool(primary.meta, primary.credentials)
        producer = LogProducer(primary.meta, pool, name)
        try:
            futures = []
            for record, vt in stamped:
                if record.dlsn not in wanted:
                    continue
                headers = dict(record.headers)
                headers.pop(SOURCE_POSITION, None)  # a relayed record's old hop means nothing at the primary
                if ORIGIN_CLUSTER not in headers:
                    headers[ORIGIN_CLUSTER] = returning.cluster.name.encode()
                    headers[ORIGIN_DLSN] = str(record.dlsn).encode()
                headers[VECTOR_TIME] = encode_vt(vt)
                await producer.wait_writable()
                futures.append(producer.submit(record.payload, key=record.key, headers=headers))
            await producer.flush()
            return len(futures)
        finally:
            await producer.close()
            await pool.close()

    return asyncio.run(go())


def _rebuild(returning: ClusterSession, primary: ClusterSession, name: str) -> dict[str, Any]:
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


def failback_plan(primary: ClusterSession, returning: ClusterSession, *, choice: str | None = None, wait_workers: float = 30.0) -> tuple[Plan, dict[str, dr.Divergence]]:
    """``choice``: None (refuse when anything diverged), "reconcile" or "discard".

    The divergence shown in the plan is read before the returning cluster is frozen; every
    step decides again on what it finds after the freeze (a dead owner's last entries become
    visible only when its segment is recovered), and refuses rather than drop a record that
    was not part of the operator's choice."""
    if choice not in (None, "reconcile", "discard"):
        raise UsageError("choose --reconcile or --discard-divergent")
    config, state = _failed_over(primary, returning.cluster.name)
    at_risk = state.value.details.get("at_risk") or {}
    a, b = returning.cluster.name, primary.cluster.name
    divergences = _divergences(primary, returning, config, at_risk)
    diverged = {n: d for n, d in divergences.items() if d.count}
    names = list(config.logs)
    notes = []
    for name, d in sorted(divergences.items()):
        if d.count:
            notes.append(f"DIVERGED {a}/{name}: {d.count} record(s) from {d.records[0].dlsn} to {d.records[-1].dlsn} that {b} never received")
        else:
            notes.append(f"{a}/{name}: nothing diverged (as far as {a} can be read before it is frozen)")
    streams = StreamStore(primary.meta)
    stream_back = default_stream_id(b, a)
    rebuilt: set[str] = set()

    def tail_start(name: str) -> DLSN:
        risk = at_risk.get(name) or {}
        return DLSN.parse(risk["from"]) if risk.get("from") else streams.get_checkpoint(config.stream_id, name).value.next

    def freeze() -> dict[str, Any]:
        present = [n for n in names if n in returning.meta.list_logs()]
        return freeze_logs(returning, present, mode=AccessMode.READ_ONLY, reason=f"failback from {b}")

    def reconcile() -> dict[str, Any]:
        # Recomputed now that A is frozen and recovered; a re-run skips what B already holds.
        fresh = _divergences(primary, returning, config, at_risk)
        return {n: _reappend(primary, returning, n, d) for n, d in fresh.items() if d.count}

    def rebuild_logs() -> dict[str, Any]:
        out: dict[str, Any] = {}
        fresh = _divergences(primary, returning, config, at_risk)
        lost = {n: d.count for n, d in fresh.items() if d.count}
        if lost and choice != "discard":
            raise RefusedError(
                f"{a} holds record(s) {b} never received: {lost} (found after freezing {a}); nothing was dropped",
                hint="re-run failback and choose --reconcile or --discard-divergent",
                details=[d.to_dict() for d in fresh.values() if d.count],
            )
        for name in names:
            if name not in returning.meta.list_logs():
                out[name] = _rebuild(returning, primary, name)
                rebuilt.add(name)
                continue
            tail = _async(returning, lambda pool, name=name: dr.read_range(returning.meta, pool, name, tail_start(name)))
            if tail:  # a's log is not a prefix of b's: refill it from b
                out[name] = {**_rebuild(returning, primary, name), "dropped" if choice == "discard" else "re-appended at " + b: lost.get(name, 0), "tail_records": len(tail)}
                rebuilt.add(name)
            else:
                out[name] = {"prefix": True}
        return out

    def reverse() -> dict[str, Any]:
        if StreamStore(returning.meta).exists(stream_back) and StreamStore(returning.meta).get_state(stream_back).value.state is not StreamState.SETTING_UP:
            return {"stream": stream_back, "existed": True}
        starts: dict[str, tuple[DLSN, dict[str, int]]] = {}
        needs_copy = []
        for name in names:
            empty = _async(returning, lambda pool, name=name: log_end(returning.meta, pool, name)).next is None
            if name in rebuilt or empty:
                held = repl.records_held(primary, name)
                if held is not None and held[1] is not None:
                    needs_copy.append(name)
                    continue
                starts[name] = (INITIAL, {})
            else:
                risk = at_risk.get(name) or {}
                sink_last = DLSN.parse(risk["sink_last"]) if risk.get("sink_last") else None
                position = dr.after(sink_last) if sink_last else INITIAL
                vv = _async(primary, lambda pool, name=name, position=position: dr.vv_before(primary.meta, pool, name, b, position))
                starts[name] = (position, vv)
        if needs_copy:
            raise RefusedError(
                f"{b} no longer holds the beginning of {', '.join(needs_copy)}: {a}'s copy can only be rebuilt by a bootstrap copy",
                hint=f"run `dlctl init-replication --source {b} --sink {a} --logs ...` (it bootstraps), then re-run failback",
            )
        apply(Plan.of("reverse", repl.register_at_steps(primary, returning, starts, pin_max_age=config.pin_max_age_seconds, compression=config.compression, why=f"failback after failover from {a}")))
        return {"stream": stream_back, "starts": {n: str(p) for n, (p, _) in starts.items()}}

    def retire() -> dict[str, Any]:
        PinStore(returning.meta).delete(config.stream_id)
        streams.delete(config.stream_id)
        return {"deleted": config.stream_id}

    steps = [Step("freeze-returning", f"{a}/{','.join(names)}", f"make {a}'s logs read-only and take them from their writers (recovering what a dead owner left), so nothing more diverges", run=freeze)]
    if choice == "reconcile":
        count = sum(d.count for d in diverged.values())
        steps.append(Step("reconcile", f"{b}/{','.join(names)}", f"re-append at {b} the record(s) only {a} holds ({count} seen now), keeping their origin ({a}, DLSN)", run=reconcile))
    verb = "dropping its divergent records" if choice == "discard" else "refuse if anything diverged" if choice is None else "after the reconcile"
    steps.append(Step("rebuild", f"{a}/{','.join(names)}", f"where {a}'s log is not a prefix of {b}'s, recreate it empty ({verb}); {b} -> {a} refills it from the start", run=rebuild_logs))
    steps.append(Step("reverse", f"{a}/{stream_back}", f"start {b} -> {a}: incremental where {a}'s log is a prefix of {b}'s, from the start where rebuilt", run=reverse))
    steps.append(Step("retire", f"{b}/{config.stream_id}", f"delete the failed-over stream {config.stream_id} and its pins at {a}", run=retire))
    return Plan.of(f"failback {b} -> {a}", steps, notes), divergences


def refuse_undecided(divergences: dict[str, dr.Divergence], choice: str | None, returning: str, primary: str) -> None:
    diverged = {n: d for n, d in divergences.items() if d.count}
    if diverged and choice is None:
        total = sum(d.count for d in diverged.values())
        raise RefusedError(
            f"{returning} holds {total} record(s) that {primary} never received ({', '.join(f'{n}: {d.count}' for n, d in diverged.items())}); nothing was changed",
            hint=f"choose: --reconcile (re-append them at {primary}) or --discard-divergent (drop them; asks you to type {returning!r})",
            details=[d.to_dict() for d in diverged.values()],
        )


# -- dr recover -------------------------------------------------------------------------------------


def _streams_of(session: ClusterSession) -> list[tuple[StreamConfig, StreamState]]:
    streams = StreamStore(session.meta)
    out = []
    for stream_id in streams.list_streams():
        try:
            out.append((streams.get_config(stream_id).value, streams.get_state(stream_id).value.state))
        except (NotFoundError, ValueError):
            continue
    return out


async def _probe_segments(session: ClusterSession, pool: AgentPool, name: str) -> list[Any]:
    """The segments of the log from the first one no replica can serve on (lost data)."""
    from ..log.speculative import ReplicaReader

    replicas = ReplicaReader(pool)
    await pool.refresh()
    log_id = session.meta.get_log(name).value.log_id
    segments = [s for s in session.meta.segments(name) if s.value.state is not SegmentState.TRUNCATED]
    for index, seg in enumerate(segments):
        value = seg.value
        try:
            if value.state is SegmentState.INPROGRESS:
                if await _forgotten_everywhere(pool, log_id, value):
                    return segments[index:]
                try:
                    lac = await asyncio.wait_for(replicas.read_lac(log_id, value), 10)
                except AgentUnavailableError:
                    lac = -1  # no member answers: they may still hold it (not lost), as in _forgotten_everywhere
                if lac >= value.min_active_entry:
                    await asyncio.wait_for(replicas.read(log_id, value, value.min_active_entry), 10)
            elif value.last_entry_id >= value.min_active_entry:
                await asyncio.wait_for(replicas.read(log_id, value, value.last_entry_id), 10)
                await asyncio.wait_for(replicas.read(log_id, value, value.min_active_entry), 10)
        except Exception:  # noqa: BLE001 - no replica serves it: lost from here on
            return segments[index:]
    return []


async def _forgotten_everywhere(pool: AgentPool, log_id: int, segment: Any) -> bool:
    """Every member of the in-progress segment's last ensemble answers limbo: their disks were
    replaced (dlagent.disk) or their copies damaged, so no recovery can ever fence or read it —
    its data is lost here. (Members that do not answer at all may still hold it: not lost.)"""
    from ..log.errors import LimboError

    async def limbo(node: str) -> bool:
        try:
            await asyncio.wait_for((await pool.client(node)).read_lac(log_id, segment.seq), 10)
        except LimboError:
            return True
        except Exception:  # noqa: BLE001 - unreachable or other: cannot tell
            return False
        return False

    return all(await asyncio.gather(*(limbo(n) for n in segment.ensembles[-1].nodes)))


def _max_component(vvs: Iterable[dict[str, int]], location: str) -> int:
    return max((vv.get(location, 0) for vv in vvs), default=0)


def recover_plan(target: ClusterSession, peers: dict[str, ClusterSession], *, wait_workers: float = 30.0, drain_timeout: float = 600.0) -> Plan:
    """``dr recover``: ``target`` (X) lost all or part of its data (what it lost of its
    ZooKeeper metadata too — rebuilt empty, an old backup — is first recreated from its peers'
    records: ``dr_rebuild``). Metadata first — X's logs frozen, lost segments dropped from the metadata, X's
    clock raised above every counter of X any directly connected peer has seen, the peers'
    progress on streams from X reset to what X still has — then events: every stream into X
    restarts from its source's beginning with the unfiltered causality filter (X's own records
    come back), drains, and returns to normal. Resumable: an operation record in X's ZooKeeper
    remembers the steps done; re-running continues after the last one.

    A peer that deleted the beginning of a log (``dr_truncated``): its stream restarts at its
    first retained position with its clock there; into a log X holds nothing of, a bootstrap
    copy (Spark) of what it retains goes first (step ``bootstrap``), else the unfiltered filter
    skips what X kept. What it deleted is reported as a gap (``recover_gaps``; the CLI exits 3
    when no other stream into X holds that log whole) — unless the peer's cold store holds it
    (``dr_cold``): then step ``cold-restore`` replays it into X before the stream goes on."""
    x = target.cluster.name
    op_id = "dr-recover"
    incoming = [(c, st) for c, st in _streams_of(target) if c.sink_cluster == x and c.source_cluster in peers and st is not StreamState.FAILED_OVER]
    outgoing: list[tuple[ClusterSession, StreamConfig, StreamState]] = []
    for name, peer in peers.items():
        for c, st in _streams_of(peer):
            if c.source_cluster == x and st is not StreamState.FAILED_OVER:
                outgoing.append((peer, c, st))
    # X's metadata as its peers know it (X rebuilt empty, or an old backup): what X lost of it
    # is recreated first; streams recreated count as running before the loss (dr_rebuild).
    rebuilt = dr_rebuild.plan_rebuild(target, peers)
    incoming = rebuilt.incoming
    if not incoming:
        raise RefusedError(
            f"no stream flows into {x!r} from a cluster of the inventory: there is nothing to recover {x}'s records from",
            hint="set up streams into it (dlctl init-replication) or add its peers to the inventory",
        )
    logs = sorted({n for c, _ in incoming for n in c.logs} | {n for _, c, _ in outgoing for n in c.logs})
    try:
        record = target.meta.get_op(op_id)
        resumed = True
    except NotFoundError:
        record, resumed = None, False
    done: set[str] = set(record.value.get("done", [])) if record else set()
    state: dict[str, Any] = {"record": record}
    started = time.monotonic()

    def save(step: str, **extra: Any) -> None:
        current = state["record"] or target.meta.get_op(op_id)
        value = {**current.value, **extra, "done": sorted({*current.value.get("done", []), step})}
        state["record"] = target.meta.update_op(op_id, current, value)

    def begin() -> dict[str, Any]:
        modes = {n: AccessStore(target.meta).get(n).value.mode.value for n in logs if n in target.meta.list_logs()}
        modes.update(rebuilt.modes)  # logs recreated read-only: the mode they had before the loss
        running = [c.stream_id + "@" + x for c, st in incoming if st is StreamState.RUNNING]
        running += [c.stream_id + "@" + peer.cluster.name for peer, c, st in outgoing if st is StreamState.RUNNING]
        if state["record"] is None:
            state["record"] = target.meta.create_op(op_id, {"kind": "dr-recover", "cluster": x, "started": time.time(), "modes": modes, "running": running, "anchors": dr_truncated.anchors_of(target, incoming), "done": []})
        for c, st in incoming:
            _pause(StreamStore(target.meta), c.stream_id)
        for peer, c, st in outgoing:
            _pause(StreamStore(peer.meta), c.stream_id)
        stopped = all(StreamStore(target.meta).wait_released(c.stream_id, wait_workers) for c, _ in incoming)
        stopped = all([StreamStore(peer.meta).wait_released(c.stream_id, wait_workers) for peer, c, _ in outgoing]) and stopped
        # (No recovery of in-progress segments here: their replicas may be the lost data.)
        frozen = freeze_logs(target, [n for n in logs if n in target.meta.list_logs()], mode=AccessMode.READ_ONLY, reason="dr recover", close=False)
        save("begin")
        return {"paused": len(incoming) + len(outgoing), "workers_stopped": stopped, "frozen": sorted(frozen)}

    def drop_lost() -> dict[str, Any]:
        out = {}
        for name in logs:
            if name not in target.meta.list_logs():
                repl.create_if_missing(target, name, next(iter(peers.values())).meta.get_log(name).value.config if name in next(iter(peers.values())).meta.list_logs() else repl.LogConfig())
                AccessStore(target.meta).set(name, AccessMode.READ_ONLY, reason="dr recover")
                out[name] = {"recreated": True}
                continue
            lost = _async(target, lambda pool, name=name: _probe_segments(target, pool, name))
            for seg in reversed(lost):
                _drop_segment(target, name, seg)
            out[name] = {"dropped_segments": [s.value.seq for s in lost], "dropped_records": sum(s.value.records for s in lost)}
        save("drop-lost", kept={n: _count(target, n) for n in logs})
        return out

    def raise_clock() -> dict[str, Any]:
        out = {}
        for name in logs:
            vvs: list[dict[str, int]] = []
            for peer in peers.values():
                for c, _ in _streams_of(peer):
                    if name in c.logs:
                        try:
                            cp = StreamStore(peer.meta).get_checkpoint(c.stream_id, name).value
                        except NotFoundError:
                            continue
                        vvs += [cp.source_vv, cp.sink_vv]
            for c, _ in incoming:
                try:
                    cp = StreamStore(target.meta).get_checkpoint(c.stream_id, name).value
                    vvs += [cp.source_vv, cp.sink_vv]
                except NotFoundError:
                    pass
            # What the peers applied from X after their last checkpoint: their logs' tails.
            for peer, c, _ in outgoing:
                if name not in c.logs or name not in peer.meta.list_logs():
                    continue
                cp = StreamStore(peer.meta).get_checkpoint(c.stream_id, name).value
                tail = _async(peer, lambda pool, name=name, cp=cp, peer=peer: dr.read_range(peer.meta, pool, name, cp.sink_dlsn))
                for r in tail:
                    if ORIGIN_CLUSTER in r.headers:
                        from ..replication.origin import Origin

                        vvs.append(Origin.from_headers(r.headers).vt)  # type: ignore[union-attr]
            held = _async(target, lambda pool, name=name: dr.vv_before(target.meta, pool, name, x, None))
            floor = max(_max_component(vvs, x), held.get(x, 0))
            start = DLSN(target.meta.get_log(name).value.max_segment_seq + 1, 0, 0)
            steps = ClockStore(target.meta).raise_to(name, {x: floor}, start, reason="dr recover")
            out[name] = {"counter": floor, "from": str(start), "steps": len(steps)}
        save("raise-clock")
        return out

    def reset_outgoing() -> dict[str, Any]:
        out = {}
        for name in logs:
            end = _async(target, lambda pool, name=name: log_end(target.meta, pool, name)).next if name in target.meta.list_logs() else None
            # An emptied log starts after the segments it had (what comes back lands there): a
            # stream from INITIAL would find its source "truncated" and stop for a bootstrap.
            position = end or (dr_truncated.first_of(target, name) if name in target.meta.list_logs() else None) or INITIAL
            # (Nothing before an emptied log's position: the stream's clock starts from the base.)
            vv = _async(target, lambda pool, name=name, position=position: dr.vv_before(target.meta, pool, name, x, position)) if end is not None else {}
            for peer, c, _ in outgoing:
                if name not in c.logs:
                    continue
                streams = StreamStore(peer.meta)
                current = streams.get_checkpoint(c.stream_id, name)
                streams.update_checkpoint(c.stream_id, current, replace(current.value, next=position, source_vv=vv, needs_bootstrap="", last_error=""))
                PinStore(target.meta).reset(repl.PinRecord(holder=c.stream_id, log=name, position=position, sink_cluster=peer.cluster.name, max_age_seconds=c.pin_max_age_seconds))
                out[f"{c.stream_id}/{name}"] = str(position)
        save("reset-outgoing")
        return out

    def restore_modes(skip: set[str] | frozenset[str] = frozenset()) -> None:
        rec = state["record"] or target.meta.get_op(op_id)
        access = AccessStore(target.meta)
        modes = rec.value.get("modes", {})
        for name in logs:
            if name in skip:  # a bootstrap copy into it is pending: it stays frozen
                continue
            current = access.get(name)
            mode = AccessMode(modes.get(name, AccessMode.READ_WRITE.value))
            if current.value.mode is not mode:
                stream = next((c.stream_id for c, _ in incoming if name in c.logs and not c.bidirectional), "") if mode is AccessMode.REPLICA else ""
                access.set(name, mode, stream=stream, reason="dr recover: metadata recovered", current=current)

    def reset_incoming() -> dict[str, Any]:
        out: dict[str, Any] = {}
        streams = StreamStore(target.meta)
        rec = state["record"] or target.meta.get_op(op_id)
        saved = rec.value.get("anchors") or {}
        # Decide everything first (a refusal changes nothing), then apply. A source that
        # truncated a log is read from its first retained position with its clock there;
        # into a log X holds nothing of, a bootstrap copy goes first (dr_truncated).
        holds = {n: _count(target, n) for n in logs}
        complete = {n: [c.source_cluster for c, _ in incoming if n in c.logs and dr_truncated.first_of(peers[c.source_cluster], n) is None] for n in logs}
        copying: set[str] = set()
        replaying: set[str] = set()  # logs whose gap comes back from the peer's cold store first
        decided: list[tuple[Any, dr_truncated.Incoming]] = []
        for c, _ in incoming:
            source = peers[c.source_cluster]
            for name in c.logs:
                item = dr_truncated.decide(
                    target, source, c, name, saved=saved.get(f"{c.stream_id}/{name}"), others=[target, *peers.values()], x_holds=holds.get(name, 0),
                    copying=copying | replaying, complete_sources=[s for s in complete.get(name, []) if s != c.source_cluster],
                )
                if item.gap is not None and not item.gated and name not in replaying:
                    found, why = dr_cold.cover(source, name, item.first)
                    if found is not None:
                        item = replace(item, mode="cold", gap={**item.gap, "covered_by": [f"cold store of {c.source_cluster}: {found.describe()}"],
                                                               "note": dr_cold.covered_note(c.source_cluster, name, item.first, x, found)})
                    elif source.cluster.cold_storage is not None:
                        item.gap["cold_store"] = why  # configured, but it cannot help: say why
                if item.mode == "bootstrap":
                    copying.add(name)
                if item.mode == "cold":
                    replaying.add(name)
                decided.append((c, item))
        held_back = {c.stream_id for c, _ in incoming if (copying | replaying) & set(c.logs)}
        # The clock is raised and the peers reset: the logs may take writes again (the streams
        # into X write through its agents like any producer) — except those a copy goes into.
        restore_modes(skip=copying)
        for c, _ in incoming:
            current_config = streams.get_config(c.stream_id)
            if not current_config.value.unfiltered:
                streams.update_config(current_config, replace(current_config.value, unfiltered=True))
        for c, item in decided:
            source = peers[c.source_cluster]
            name = item.log
            held = _async(target, lambda pool, name=name: dr.held_vv(target.meta, pool, name, x))
            pending = dr_truncated.PENDING.format(first=item.first) if item.mode == "bootstrap" else ""
            current = streams.get_checkpoint(c.stream_id, name)
            streams.update_checkpoint(c.stream_id, current, replace(
                current.value, next=item.first, source_vv=dict(item.vv), sink_vv=held, sink_dlsn=None, needs_bootstrap=pending, last_error="", gated=item.gated, waiting_for={},
                safe_time=0.0,  # X lost what it held: no time is safe until the stream brings it back (the one reset)
            ))
            PinStore(source.meta).reset(repl.PinRecord(holder=c.stream_id, log=name, position=item.first, sink_cluster=x, max_age_seconds=c.pin_max_age_seconds))
            out[f"{c.stream_id}/{name}"] = {
                "start": "from the start, unfiltered",
                "stream": f"from {item.first} ({c.source_cluster} deleted what lay before), unfiltered"
                + (f", once {x} holds what {c.source_cluster} deleted again (from {', '.join(item.gap['covered_by'])})" if item.gated and item.gap else ""),
                "bootstrap": f"bootstrap copy from {item.first} ({c.source_cluster} deleted what lay before), then streaming, unfiltered",
                "cold": f"what {c.source_cluster} deleted before {item.first} replayed from its cold store, then streaming from there, unfiltered",
            }[item.mode]
        for c, _ in incoming:
            if c.stream_id not in held_back:
                _resume(streams, c.stream_id)
        items = [item.to_dict() for _, item in decided]
        save("reset-incoming", incoming=items, gaps=[i["gap"] for i in items if i["gap"]])
        return out

    def cold_restore() -> dict[str, Any]:
        rec = state["record"] or target.meta.get_op(op_id)
        items = [dr_truncated.Incoming.from_dict(i) for i in rec.value.get("incoming") or []]
        out: dict[str, Any] = {}
        for item in (i for i in items if i.mode == "cold"):
            config = next(c for c, _ in incoming if c.stream_id == item.stream)
            source = peers[config.source_cluster]
            found, why = dr_cold.cover(source, item.log, item.first)
            if found is None:
                raise RefusedError(f"{config.source_cluster}'s cold store no longer covers {item.log} before {item.first}: {why}", hint="make it reachable again and re-run `dlctl dr recover`")
            out[f"{item.stream}/{item.log}"] = _async(target, lambda pool, c=config, i=item, f=found: dr_cold.replay(target, pool, c.source_cluster, c, i.log, f, i.first))
        # Every stream carrying a replayed log filters from what X holds now.
        replayed = {i.log for i in items if i.mode == "cold"}
        for c, _ in incoming:
            for name in set(c.logs) & replayed:
                dr_truncated.set_sink_vv(target, c.stream_id, name)
        save("cold-restore")
        return out

    def bootstrap() -> dict[str, Any]:
        rec = state["record"] or target.meta.get_op(op_id)
        items = [dr_truncated.Incoming.from_dict(i) for i in rec.value.get("incoming") or []]
        copies = [i for i in items if i.mode == "bootstrap"]
        out: dict[str, Any] = {}
        streams = StreamStore(target.meta)
        sources = {i.stream: peers[next(c for c, _ in incoming if c.stream_id == i.stream).source_cluster] for i in copies}
        from .bootstrap import engines, prestart_for

        # One Spark context for every copy that needs it (small ones run in-process), its start
        # begun now, while the first copy is still being planned; stopped however this ends.
        with engines() as shared:
            for stream_id, source in sources.items():
                prestart_for(shared, source, [i.log for i in copies if i.stream == stream_id])
            for item in copies:
                out[f"{item.stream}/{item.log}"] = dr_truncated.bootstrap(target, sources[item.stream], item, shared)
        # Every stream carrying a copied log filters from what X holds now, then runs.
        copied = {i.log for i in copies}
        for c, _ in incoming:
            for name in set(c.logs) & copied:
                dr_truncated.set_sink_vv(target, c.stream_id, name)
        restore_modes()
        for c, _ in incoming:
            _resume(streams, c.stream_id)
        save("bootstrap")
        return out

    def events() -> dict[str, Any]:
        rec = state["record"] or target.meta.get_op(op_id)
        before = rec.value.get("kept") or {}
        t0 = rec.value.get("events_started") or time.time()
        if "events_started" not in rec.value:
            save("events-started", events_started=t0)
        gaps = {}
        for c, _ in incoming:
            try:
                repl.wait_drain(target, peers[c.source_cluster], c.stream_id, timeout=drain_timeout)
            except RefusedError as exc:  # the peer deleted what X needs: a bootstrap, or the gap stays
                gaps[c.stream_id] = exc.message
        if gaps:
            raise RefusedError(
                f"event recovery of {x} is incomplete: {gaps}",
                hint=f"bootstrap the missing range (dlctl bootstrap --stream ...) or accept the gap; re-running `dlctl dr recover --cluster {x}` continues",
                details={"gaps": gaps},
            )
        seconds = time.time() - t0
        after_ = {n: _count(target, n) for n in logs}
        recovered = sum(after_.values()) - sum(int(v) for v in before.values())
        save("events", recovered=recovered, seconds=seconds)
        gaps_ = rec.value.get("gaps") or []
        return {"recovered_records": recovered, "seconds": round(seconds, 3), "records_per_second": round(recovered / seconds, 1) if seconds > 0 else None, "records": after_, "gaps": gaps_}

    def finish() -> dict[str, Any]:
        streams = StreamStore(target.meta)
        for c, _ in incoming:
            current = streams.get_config(c.stream_id)
            if current.value.unfiltered:
                streams.update_config(current, replace(current.value, unfiltered=False))
        rec = state["record"] or target.meta.get_op(op_id)
        running = set(rec.value.get("running", []))
        for c, _ in incoming:
            if f"{c.stream_id}@{x}" not in running:
                _pause(streams, c.stream_id)
        for peer, c, _ in outgoing:
            if f"{c.stream_id}@{peer.cluster.name}" in running:
                _resume(StreamStore(peer.meta), c.stream_id)
        restore_modes()
        target.meta.delete_op(op_id, target.meta.get_op(op_id))
        gaps_ = rec.value.get("gaps") or []
        return {"total_seconds": round(time.monotonic() - started, 3), "recovered_records": rec.value.get("recovered"), "event_seconds": rec.value.get("seconds"), "gaps": gaps_, "notes": [dr_truncated.gap_note(g) for g in gaps_]}

    all_steps = [
        *rebuilt.steps,
        Step("begin", f"{x}+peers", f"pause the {len(incoming)} stream(s) into {x} and the {len(outgoing)} out of it; freeze {x}'s logs (read-only)", run=begin),
        Step("drop-lost", f"{x}/{','.join(logs)}", f"find the segments of {x}'s logs no replica can serve and drop them from the metadata (what {x} still has stays)", run=drop_lost),
        Step("raise-clock", f"{x}/{','.join(logs)}", f"raise {x}'s clock above every counter of {x} its peers have seen (so {x} never reuses a timestamp)", run=raise_clock),
        Step("reset-outgoing", ",".join(sorted({p.cluster.name for p, _, _ in outgoing})) or "-", f"reset the peers' progress on streams from {x} to what {x} still has", run=reset_outgoing),
        Step("reset-incoming", x, f"restart every stream into {x} from its source's beginning (or first retained position), unfiltered ({x}'s own records come back)", run=reset_incoming),
        Step("cold-restore", x, f"where a peer deleted the beginning of a log and its cold store holds it: replay those records into {x} from the copies", run=cold_restore),
        Step("bootstrap", x, f"where a peer deleted the beginning of a log {x} holds nothing of: copy what the peer retains (Spark), then stream on from there", run=bootstrap),
        Step("events", x, f"wait until {x} has every record its peers hold (timeout {drain_timeout:g}s per stream)", run=events),
        Step("finish", x, "streams back to normal filtering and to their states before; logs back to their access modes", run=finish),
    ]
    steps = [st for st in all_steps if st.action not in done]
    notes = [*rebuilt.notes, f"peers: {', '.join(sorted(peers))}; logs: {', '.join(logs)}"]
    notes += _truncated_notes(x, incoming, peers)
    if resumed:
        notes.insert(0, f"continuing the dr recover of {x} started before (done: {', '.join(sorted(done)) or 'nothing'})")
    return Plan.of(f"dr recover {x}", steps, notes)


def _truncated_notes(x: str, incoming: list[tuple[StreamConfig, Any]], peers: dict[str, ClusterSession]) -> list[str]:
    """What the plan can say before it runs: the peers that deleted the beginning of a log."""
    out = []
    for c, _ in incoming:
        for name in c.logs:
            first = dr_truncated.first_of(peers[c.source_cluster], name) if c.source_cluster in peers else None
            if first is None:
                continue
            found, why = dr_cold.cover(peers[c.source_cluster], name, first)
            if found is not None:
                out.append(dr_cold.covered_note(c.source_cluster, name, first, x, found) + f"; then streaming from {first}")
                continue
            cold = f" (its cold store cannot help: {why})" if peers[c.source_cluster].cluster.cold_storage is not None else ""
            out.append(f"GAP {c.source_cluster}/{name}: {c.source_cluster} no longer holds {name} before {first}{cold}; what of it {x} did not keep is reported as lost (exit 3); the rest comes back by a bootstrap copy (when {x} holds nothing of {name}) or by streaming from {first}")
    return out


def recover_gaps(result: Any) -> list[dict[str, Any]]:
    """The gaps an applied ``recover_plan`` reported (records the peers deleted that could not
    come back), from its last step's result."""
    for outcome in reversed(result.outcomes):
        if outcome.step.action in ("finish", "events") and isinstance(outcome.result, dict):
            return list(outcome.result.get("gaps") or [])
    return []


def _drop_segment(session: ClusterSession, name: str, seg: Any) -> None:
    """Forget a segment whose data is gone from every replica. An in-progress one too: no writer
    can recover it, and a new writer would wait on it for ever (``MetaStore.delete_segment``
    keeps in-progress segments for every other purpose)."""
    from kazoo.exceptions import BadVersionError, NoNodeError

    from ..meta import paths

    if seg.value.state is not SegmentState.INPROGRESS:
        session.meta.delete_segment(name, seg)
        return
    path = paths.segment(session.cluster.name, name, seg.value.seq)
    try:
        session.meta.client.delete(path, version=seg.version)
    except NoNodeError:
        pass
    except BadVersionError:
        raise ConflictError(f"aborted: {path} changed concurrently", hint="re-run dr recover") from None


# -- dr status ---------------------------------------------------------------------------------------


def dr_status(sessions: dict[str, ClusterSession], only: str | None = None) -> list[dict[str, Any]]:
    """Per location: its streams in and out (state, per-log lag and the last point applied),
    its logs' access modes, and which locations hold its records (it could be recovered from:
    the sources of its incoming streams)."""
    streams: list[tuple[str, StreamConfig, Any]] = []
    for name, session in sessions.items():
        try:
            for c, st in _streams_of(session):
                streams.append((name, c, st))
        except Exception:  # noqa: BLE001 - an unreachable cluster: reported below
            continue

    def describe(sink: str, c: StreamConfig, st: StreamState) -> dict[str, Any]:
        row: dict[str, Any] = {"stream": c.stream_id, "source": c.source_cluster, "sink": c.sink_cluster, "state": st.value, "mode": "active-active" if c.bidirectional else "one-way"}
        source = sessions.get(c.source_cluster)
        try:
            status = repl.stream_status(sessions[sink], source if source is not None and st is not StreamState.FAILED_OVER else None, c.stream_id)
            row["logs"] = {r["log"]: {"lag_records": r["lag_records"], "lag_seconds": r["lag_seconds"], "last_applied": r["last_applied"], "state": r["state"]} for r in status["logs"]}
        except Exception as exc:  # noqa: BLE001 - status shows what it could not measure
            row["logs"] = f"unknown ({getattr(exc, 'message', None) or exc!r})"
        return row

    out = []
    for name, session in sessions.items():
        if only is not None and name != only:
            continue
        entry: dict[str, Any] = {"location": name}
        try:
            access = AccessStore(session.meta)
            entry["logs"] = {n: access.get(n).value.describe() for n in session.meta.list_logs()}
            entry["reachable"] = True
        except Exception as exc:  # noqa: BLE001
            entry.update(reachable=False, error=getattr(exc, "message", None) or repr(exc))
        entry["in"] = [describe(sink, c, st) for sink, c, st in streams if c.sink_cluster == name]
        entry["out"] = [describe(sink, c, st) for sink, c, st in streams if c.source_cluster == name]
        entry["recoverable_from"] = sorted(
            {c.source_cluster for _, c, st in streams if c.sink_cluster == name and st is not StreamState.FAILED_OVER}
            | _pinning_for(sessions, name)
        )
        out.append(entry)
    return out


def _pinning_for(sessions: dict[str, ClusterSession], sink: str) -> set[str]:
    """The locations that keep records for streams into ``sink`` by their retention pins: they
    still name it when ``sink`` lost its own metadata (a location rebuilt empty), and
    ``dr recover`` rebuilds its streams from them."""
    out = set()
    for name, session in sessions.items():
        if name == sink:
            continue
        try:
            pins = PinStore(session.meta)
            logs = session.meta.list_logs()
            if any(p.value.sink_cluster == sink and not p.value.holder.startswith("bootstrap-") for log in logs for p in pins.pins_of_log(log)):
                out.add(name)
        except Exception:  # noqa: BLE001 - an unreachable cluster: reported on its own row
            continue
    return out


def one_way_source(sink: ClusterSession) -> str:
    """The source of the one running or paused one-way stream into ``sink`` (a switchover needs
    exactly one: ``UsageError`` otherwise)."""
    streams = StreamStore(sink.meta)
    sources = []
    for stream_id in streams.list_streams():
        try:
            config = streams.get_config(stream_id).value
            state = streams.get_state(stream_id).value.state
        except (NotFoundError, ValueError):
            continue
        if not config.bidirectional and state in (StreamState.RUNNING, StreamState.PAUSED):
            sources.append(config.source_cluster)
    if len(sources) != 1:
        raise UsageError(f"cluster {sink.cluster.name!r} has {len(sources)} one-way stream(s) into it; switchover needs exactly one")
    return sources[0]


def failed_over_from(session: ClusterSession, returning: str) -> bool:
    """Does ``session``'s cluster hold a failed-over stream from ``returning`` (is it the current
    primary a failback returns to)?"""
    streams = StreamStore(session.meta)
    for stream_id in streams.list_streams():
        config = streams.get_config(stream_id).value
        if config.source_cluster == returning and streams.get_state(stream_id).value.state is StreamState.FAILED_OVER:
            return True
    return False


def _pause(streams: StreamStore, stream_id: str) -> None:
    current = streams.get_state(stream_id)
    if current.value.state is StreamState.RUNNING:
        streams.set_state(stream_id, current, StreamState.PAUSED, reason="dr recover")


def _resume(streams: StreamStore, stream_id: str) -> None:
    current = streams.get_state(stream_id)
    if current.value.state is StreamState.PAUSED:
        streams.set_state(stream_id, current, StreamState.RUNNING, reason="dr recover")


def _count(session: ClusterSession, name: str) -> int:
    if name not in session.meta.list_logs():
        return 0
    return _async(session, lambda pool: log_end(session.meta, pool, name)).records


__all__ = [
    "at_risk_of", "depose_owner", "dr_status", "failback_plan", "failover_plan", "freeze_logs", "promote_logs",
    "promote_plan", "recover_gaps", "recover_plan", "refuse_undecided", "switchover_plan", "verify_copy",
]
