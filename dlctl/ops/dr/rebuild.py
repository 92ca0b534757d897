"""``dr recover`` of a location rebuilt empty (or restored from an old backup): its metadata
from its peers (issue 11; DESIGN.md §7).

``dlctl.ops.dr.recover.recover_plan`` recovers a location X from the streams into it, its logs and
their clocks as X's own ZooKeeper records them. When X lost those records (its ZooKeeper was
rebuilt empty, or restored from a backup older than some streams or logs), this module reads
what X's directly connected peers hold about X (``dlctl.replication.rebuild`` says what that
implies) and returns the steps that recreate, in X's ZooKeeper, before the recovery begins:

- the cluster layout (root, config record, children) when it is gone;
- each missing log, with the configuration of a peer's copy, *read-only* from the first moment
  (one transaction) and its clock base raised to the highest counter of X the peers'
  checkpoints saw — no application can write at X before the recovery raised its clock;
- each missing stream into X (named by the retention pins its source holds), *paused* (no
  worker runs before the peers are reset), with a checkpoint per log; missing logs and
  checkpoints of streams X still has.

It also tells ``recover_plan`` what the recovery must treat as X's state before the loss:
the streams into X (a recreated one counts as running) and the access modes the recreated
logs return to at the end. Re-running re-derives all of it, so a recovery stopped midway
continues (the op record of ``recover_plan`` keeps the rest).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from kazoo.exceptions import NoNodeError

from ...errors import ConflictError, NotFoundError, RefusedError
from ...log.dlsn import DLSN, INITIAL
from ...meta import paths
from ...meta.access import AccessMode, AccessStore, LogAccess
from ...meta.pins import PinRecord, PinStore, holder_path
from ...plan import Step
from ...replication.clock import ClockStore
from ...replication.positions import find_applied
from ...replication.rebuild import (
    REBUILT_LOG_REASON,
    REBUILT_REASON,
    LogRebuild,
    PeerFacts,
    Rebuild,
    StreamRebuild,
    TargetFacts,
    derive,
    new_checkpoint,
)
from ...replication.records import Checkpoint, StreamConfig, StreamState
from ...replication.store import StreamStore
from .. import source_credentials
from ...session import ClusterSession
from .facts import read_streams

# -- facts ------------------------------------------------------------------------------------------


def target_facts(target: ClusterSession) -> TargetFacts:
    meta, x = target.meta, target.cluster.name
    store = StreamStore(meta)
    streams = {s.config.stream_id: (s.config, s.state, s.status.reason) for s in read_streams(target)}
    checkpoints = frozenset((sid, log) for sid in streams for log in store.checkpoints(sid))
    logs = frozenset(meta.list_logs())
    access = AccessStore(meta)
    rebuilt = frozenset(n for n in logs if access.get(n).value.reason == REBUILT_LOG_REASON)
    layout = meta.client.exists(paths.config(x)) is not None
    numbering = {}
    for name in logs:
        try:
            numbering[name] = meta.get_log(name).value.max_segment_seq
        except NotFoundError:
            continue
    return TargetFacts(x, streams, checkpoints, logs, rebuilt, layout, numbering)


def _pins_for(peer: ClusterSession, location: str) -> list[PinRecord]:
    """The pins ``peer`` holds (as a source) for streams into ``location``."""
    pins = PinStore(peer.meta)
    out = []
    for holder in pins.holders():
        try:
            logs = peer.meta.client.get_children(holder_path(peer.cluster.name, holder))
        except NoNodeError:  # deleted between the listing and the read
            continue
        for log in sorted(logs):
            try:
                pin = pins.get(holder, log).value
            except (NotFoundError, ValueError):
                continue
            if pin.sink_cluster == location:
                out.append(pin)
    return out


def _evidence(peer: ClusterSession, location: str) -> tuple[list[tuple[StreamConfig, StreamState]], list[PinRecord]]:
    """``peer``'s streams and the pins it holds for streams into ``location``."""
    return [(s.config, s.state) for s in read_streams(peer)], _pins_for(peer, location)


def peer_facts(peer: ClusterSession, location: str, relevant: set[str], evidence: tuple[list[tuple[StreamConfig, StreamState]], list[PinRecord]] | None = None) -> PeerFacts:
    """What ``peer`` holds about ``location``: its pins for streams into it, its streams, and
    for ``location``'s logs (``relevant``) the checkpoints, log configurations and the last
    position applied from ``location``."""
    store = StreamStore(peer.meta)
    streams, pins = evidence if evidence is not None else _evidence(peer, location)
    checkpoints = {}
    for c, _ in streams:
        for log in relevant & set(c.logs):
            try:
                checkpoints[(c.stream_id, log)] = store.get_checkpoint(c.stream_id, log).value
            except (NotFoundError, ValueError):
                continue
    have = set(peer.meta.list_logs())
    logs = {}
    for name in sorted(relevant & have):
        try:
            logs[name] = peer.meta.get_log(name).value.config
        except NotFoundError:
            continue
    leaving = [(c.stream_id, log) for c, st in streams if c.source_cluster == location and st is not StreamState.FAILED_OVER for log in c.logs if log in have]
    applied = _applied(peer, location, {k: checkpoints.get(k) for k in leaving}) if leaving else {}
    return PeerFacts(peer.cluster.name, peer.cluster.zookeeper, tuple(streams), checkpoints, tuple(pins), logs, applied)


def _applied(peer: ClusterSession, location: str, wanted: dict[tuple[str, str], Checkpoint | None]) -> dict[tuple[str, str], DLSN]:
    """Per (stream out of ``location``, log): the source position of the last record the
    peer's log holds from ``location`` — found as a restarting worker finds it, scanning back
    from the end of the peer's log to the checkpoint's sink position."""

    async def go() -> dict[tuple[str, str], DLSN]:
        pool = await peer.pool()
        out = {}
        for (stream, log), cp in sorted(wanted.items(), key=lambda kv: kv[0]):
            found = await find_applied(peer.meta, pool, log, location, floor=cp.sink_dlsn if cp is not None else None)
            if found is not None:
                out[(stream, log)] = found.source
        return out

    return peer.run(go())


def gather(target: ClusterSession, peers: dict[str, ClusterSession]) -> tuple[TargetFacts, list[PeerFacts]]:
    """X's facts and its peers': first every peer's streams and pins (which name X's logs),
    then, for all of X's logs so named, what each peer holds about them."""
    tf = target_facts(target)
    evidence = {name: _evidence(p, tf.name) for name, p in sorted(peers.items())}
    relevant = set(tf.logs) | {n for c, _, _ in tf.streams.values() for n in c.logs}
    for streams, pins in evidence.values():
        relevant |= {p.log for p in pins} | {n for c, _ in streams if c.source_cluster == tf.name for n in c.logs}
    return tf, [peer_facts(peers[name], tf.name, relevant, ev) for name, ev in evidence.items()]


# -- applying ---------------------------------------------------------------------------------------


def _create_log(target: ClusterSession, log: LogRebuild) -> dict[str, Any]:
    meta = target.meta
    x = target.cluster.name
    created = False
    if log.name not in meta.list_logs():
        frozen = LogAccess(AccessMode.READ_ONLY, "", 1, REBUILT_LOG_REASON, time.time())
        try:
            meta.create_log_with(log.name, log.config, {"access": frozen.to_json()}, max_segment_seq=log.max_segment_seq)
            created = True
        except ConflictError:
            pass  # created meanwhile (a concurrent run): its clock is still raised below
    steps = ClockStore(meta).raise_to(log.name, {x: log.clock_floor}, INITIAL, reason="dr recover: rebuilt from peers") if log.clock_floor > 0 else ()
    numbered = _renumber(target, log.name, log.max_segment_seq)  # (created meanwhile by another run)
    return {"created": created, "access": "read-only until recovered", "clock_floor": log.clock_floor, "clock_steps": len(steps), "first_segment": numbered + 1}


def _renumber(target: ClusterSession, name: str, floor: int) -> int:
    """Make the log's next segment number come after ``floor`` (reserving the numbers in
    between by CAS: no writer ever gets them). Returns the log's max segment number."""
    meta = target.meta
    for _ in range(8):
        current = meta.get_log(name)
        if current.value.max_segment_seq >= floor:
            return current.value.max_segment_seq
        try:
            return meta.reserve_segment_seqs(name, current, floor - current.value.max_segment_seq).value.max_segment_seq
        except ConflictError:
            continue  # a writer created a segment meanwhile: read again
    raise ConflictError(f"aborted: log {name!r} in cluster {target.cluster.name!r} kept changing", hint="re-run dr recover")


def _rebuild_stream(target: ClusterSession, rebuild: StreamRebuild) -> dict[str, Any]:
    store = StreamStore(target.meta)
    sid = rebuild.config.stream_id
    out: dict[str, Any] = {}
    if rebuild.create:
        existing = store.create(rebuild.config)  # (an existing one is returned as it is)
        if existing.value.source_cluster != rebuild.config.source_cluster:
            raise ConflictError(f"aborted: stream {sid!r} appeared in {target.cluster.name!r} from {existing.value.source_cluster!r} meanwhile", hint="re-run dr recover")
        state = store.get_state(sid)
        if state.value.state is StreamState.SETTING_UP:
            store.set_state(sid, state, StreamState.PAUSED, reason=REBUILT_REASON)
        out["registered"] = "paused until the recovery restarts it"
    elif rebuild.add_logs:
        current = store.get_config(sid)
        wanted = tuple(sorted({*current.value.logs, *rebuild.add_logs}))
        if wanted != current.value.logs:
            store.update_config(current, replace(current.value, logs=wanted))
        out["added_logs"] = list(rebuild.add_logs)
    created = []
    for log in rebuild.checkpoints:
        cp: Checkpoint = new_checkpoint(log)
        if store.create_checkpoint(sid, cp).value == cp:
            created.append(log)
    out["checkpoints"] = created
    return out


def _ensure_layout(target: ClusterSession) -> dict[str, Any]:
    from ..cluster import create_layout

    return create_layout(target)


def _refuse_unknown(x: str, peers: dict[str, ClusterSession], facts: list[PeerFacts]) -> None:
    sources_only = sorted({c.stream_id for p in facts for c, st in p.streams if c.source_cluster == x and st is not StreamState.FAILED_OVER})
    if sources_only:
        raise RefusedError(
            f"{x!r} is only the source of stream(s) {', '.join(sources_only)}: no location of the inventory replicates into {x}, so none can bring its records back",
            hint=f"fail over to the standby (`dlctl failover --to ...`), or set up a stream into {x} (`dlctl init-replication --source ... --sink {x}`)",
        )
    reached = ", ".join(sorted(peers)) or "none"
    raise RefusedError(
        f"no cluster of the inventory knows {x!r}: no stream into {x} in its own ZooKeeper, and no peer ({reached}) holds a stream from {x} or a retention pin for a stream into it",
        hint=f"list {x}'s replication peers in the inventory (and check they are reachable: `dlctl dr status`); a location that never replicated cannot be recovered from peers",
    )


# -- the hook ---------------------------------------------------------------------------------------


@dataclass
class MetadataRebuild:
    """What ``recover_plan`` needs: ``steps`` to run before its first one (empty when X lost
    nothing its peers know of), ``incoming`` (X's streams in, each with its state before the
    loss), ``modes`` (access mode values the logs a rebuild recreated return to at the end)."""

    rebuild: Rebuild
    steps: list[Step] = field(default_factory=list)

    @property
    def incoming(self) -> list[tuple[StreamConfig, StreamState]]:
        return list(self.rebuild.incoming)

    @property
    def modes(self) -> dict[str, str]:
        return {name: mode.value for name, (mode, _stream) in self.rebuild.modes.items()}

    @property
    def notes(self) -> list[str]:
        return list(self.rebuild.notes)


def plan_rebuild(target: ClusterSession, peers: dict[str, ClusterSession]) -> MetadataRebuild:
    """Derive X's metadata from its peers (``peers``: the other clusters of the inventory) and
    compare it with what X has. Raises ``RefusedError`` when no stream into X is known
    anywhere (nothing to recover from)."""
    tf, facts = gather(target, peers)
    rebuild = derive(tf, facts)
    x = tf.name
    if not rebuild.incoming:
        _refuse_unknown(x, peers, facts)
    steps: list[Step] = []
    if rebuild.layout:
        steps.append(Step("rebuild-layout", paths.cluster_root(x), f"recreate {paths.cluster_root(x)} and its layout (its ZooKeeper lost them)", run=lambda: _ensure_layout(target)))
    for log in rebuild.logs:
        after = f"replica of {log.stream}" if log.mode is AccessMode.REPLICA else log.mode.value
        clock = f", clock from {x}'s counter {log.clock_floor} (the highest its peers' checkpoints saw)" if log.clock_floor else ""
        steps.append(
            Step(
                "rebuild-log",
                f"{x}/{log.name}",
                f"recreate log {log.name} in {x} (E={log.config.ensemble_size}, W={log.config.write_quorum}, A={log.config.ack_quorum}"
                + (f", as at {log.config_from}" if log.config_from else ", default configuration")
                + f"), read-only until recovered, then {after}{clock}"
                + (f"; its segments start at {log.max_segment_seq + 1}, after every position of {x}'s log its peers hold" if log.max_segment_seq else ""),
                params=log.to_dict(),
                run=lambda log=log: _create_log(target, log),
            )
        )
    for name, floor in sorted(rebuild.renumber.items()):
        steps.append(
            Step(
                "rebuild-numbering",
                f"{x}/{name}",
                f"continue {x}/{name}'s segments after {floor}: its peers hold positions of {x}'s log up to segment {floor} (an older copy of {x}'s metadata), and a record's identity is its position at {x}",
                params={"log": name, "first_segment": floor + 1},
                run=lambda name=name, floor=floor: {"max_segment_seq": _renumber(target, name, floor)},
            )
        )
    for stream in rebuild.streams:
        c = stream.config
        if stream.create:
            what = f"register stream {c.stream_id} ({c.source_cluster} -> {x}, {'active-active' if c.bidirectional else 'one-way'}, logs {', '.join(c.logs)}) in {x}, paused: {stream.evidence}"
        else:
            parts = []
            if stream.add_logs:
                parts.append(f"add logs {', '.join(stream.add_logs)} ({stream.evidence})")
            if stream.checkpoints:
                parts.append(f"create checkpoints of {', '.join(stream.checkpoints)}")
            what = f"complete stream {c.stream_id} in {x}: " + "; ".join(parts)
        steps.append(Step("rebuild-stream", f"{x}/{c.stream_id}", what, params=stream.to_dict(), run=lambda stream=stream: _rebuild_stream(target, stream)))
    # A location rebuilt from scratch lost its agents' installed credentials with its disks:
    # deliver each recreated stream's source ones again (agents out of reach are reported).
    for source in sorted({s.config.source_cluster for s in rebuild.streams if s.create} & set(peers)):
        step, _ = source_credentials.credentials_step(peers[source].cluster, target.cluster, partial_ok=True)
        if step is not None:
            steps.append(step)
    if steps:
        rebuild.notes.insert(0, f"{x} lost metadata its peers know of ({', '.join(rebuild.known_by)}): it is recreated first ({len(steps)} step(s)); streams into it count as running before the loss")
    return MetadataRebuild(rebuild, steps)


__all__ = ["MetadataRebuild", "gather", "peer_facts", "plan_rebuild", "target_facts"]
