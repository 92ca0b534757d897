"""What a location's metadata should be, derived from what its peers hold (issue 11, ``dr recover``).

A location X rebuilt empty (or restored from an old backup) lacks some or all of its own
ZooKeeper records: its logs, the streams into it (config, state and checkpoints live at the
sink), its clock bases and access modes. Its directly connected peers still hold evidence:

- a stream P -> X registers retention *pins* in P (``pins/<stream>/<log>``, ``sink_cluster`` X):
  they name the stream and its logs even when X's copy of the stream is gone;
- a stream X -> P lives in P (config and checkpoints): it names X's logs, tells whether X takes
  local writes (an active-active stream out of X), and its checkpoints carry the version
  vectors P saw, X's counter included;
- every stream in a peer that carries one of X's logs has checkpoints whose vectors may hold
  X's counter (X's records relayed on);
- a stream X -> P's checkpoint, and the last record P's log holds from X, name positions of
  X's logs: a record's identity is (X, its position at X), so X's logs must never hand out a
  position again that its peers hold — a recreated log numbers its segments after them.

``derive`` compares that evidence with what X still has and answers what to recreate. Pure:
the facts are gathered (and the answer applied) by ``dlctl.ops.dr.rebuild``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from ..log.dlsn import DLSN, INITIAL
from ..meta.access import AccessMode
from ..meta.pins import PinRecord
from ..meta.records import LogConfig
from .records import DEFAULT_PIN_MAX_AGE, Checkpoint, StreamConfig, StreamState

# A stream into X recreated from its peers' records is registered paused (no worker may run it
# before ``dr recover`` has raised X's clock and reset the peers); this reason marks it as one
# that was running before the loss, so a re-run of ``dr recover`` still resumes it at the end.
REBUILT_REASON = "dr recover: rebuilt from its peers' records (running before the loss)"
# A log recreated read-only (no application may write before X's clock is raised); the mode it
# returns to when the recovery ends is derived again from the peers on every run.
REBUILT_LOG_REASON = "dr recover: rebuilt from its peers' records"
BOOTSTRAP_HOLDER_PREFIX = "bootstrap-"


@dataclass(frozen=True)
class PeerFacts:
    """What one directly connected location holds about its replication."""

    name: str
    zookeeper: str
    streams: tuple[tuple[StreamConfig, StreamState], ...] = ()  # streams whose sink it is
    checkpoints: Mapping[tuple[str, str], Checkpoint] = field(default_factory=dict)  # (stream, log)
    pins: tuple[PinRecord, ...] = ()  # pins it holds as a source
    logs: Mapping[str, LogConfig] = field(default_factory=dict)
    # Streams out of the location: the source position of the last record the peer's log holds
    # from it (what a restarting worker resumes after), per (stream, log).
    applied: Mapping[tuple[str, str], DLSN] = field(default_factory=dict)


@dataclass(frozen=True)
class TargetFacts:
    """What the location being recovered still has in its own ZooKeeper."""

    name: str
    streams: Mapping[str, tuple[StreamConfig, StreamState, str]] = field(default_factory=dict)  # id -> (config, state, reason)
    checkpoints: frozenset[tuple[str, str]] = frozenset()  # (stream, log) present
    logs: frozenset[str] = frozenset()
    rebuilt_logs: frozenset[str] = frozenset()  # logs whose access record says a rebuild made them
    layout: bool = True  # the cluster's root and config record exist
    max_segment_seq: Mapping[str, int] = field(default_factory=dict)  # of the logs it has


@dataclass(frozen=True)
class StreamRebuild:
    config: StreamConfig  # the config X should hold
    create: bool  # X has no such stream at all
    add_logs: tuple[str, ...] = ()  # logs X's config lacks (the stream exists)
    checkpoints: tuple[str, ...] = ()  # logs whose checkpoint X lacks
    evidence: str = ""

    def to_dict(self) -> dict:
        return {
            "stream": self.config.stream_id,
            "source": self.config.source_cluster,
            "logs": list(self.config.logs),
            "mode": "active-active" if self.config.bidirectional else "one-way",
            "create": self.create,
            "add_logs": list(self.add_logs),
            "checkpoints": list(self.checkpoints),
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class LogRebuild:
    name: str
    config: LogConfig
    config_from: str  # the peer whose log configuration is copied ("" = defaults)
    mode: AccessMode  # what the log returns to once recovered
    stream: str = ""  # replica: of which stream
    clock_floor: int = 0  # X's counter the peers' checkpoints saw (the recovery raises it further from their tails)
    max_segment_seq: int = 0  # the highest segment number of X's log its peers hold a position in

    def to_dict(self) -> dict:
        return {
            "log": self.name,
            "ensemble": self.config.ensemble_size,
            "write_quorum": self.config.write_quorum,
            "ack_quorum": self.config.ack_quorum,
            "config_from": self.config_from or None,
            "mode": self.mode.value,
            "replica_of": self.stream or None,
            "clock_floor": self.clock_floor,
            "first_segment": self.max_segment_seq + 1,
        }


@dataclass
class Rebuild:
    location: str
    layout: bool  # the cluster layout must be recreated
    streams: list[StreamRebuild] = field(default_factory=list)
    logs: list[LogRebuild] = field(default_factory=list)
    # Every log of X (recreated or not): the mode it must have after the recovery when a
    # rebuild made it (recreated now, or by an earlier run that stopped midway).
    modes: dict[str, tuple[AccessMode, str]] = field(default_factory=dict)
    incoming: list[tuple[StreamConfig, StreamState]] = field(default_factory=list)  # as recover sees them
    # Logs X still has whose numbering is behind positions its peers hold (an old backup):
    # log -> the segment number to continue after.
    renumber: dict[str, int] = field(default_factory=dict)
    known_by: list[str] = field(default_factory=list)  # peers that hold any record about X
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.layout or self.streams or self.logs or self.renumber)


def pinned_streams(location: str, peer: PeerFacts) -> dict[str, list[PinRecord]]:
    """Streams ``peer`` -> ``location`` named by the retention pins the peer holds for them."""
    out: dict[str, list[PinRecord]] = {}
    for pin in peer.pins:
        if pin.sink_cluster == location and not pin.holder.startswith(BOOTSTRAP_HOLDER_PREFIX):
            out.setdefault(pin.holder, []).append(pin)
    return out


def outgoing(location: str, peers: Iterable[PeerFacts]) -> list[tuple[PeerFacts, StreamConfig]]:
    """Streams out of ``location`` (held by its peers), failed-over ones left out."""
    return [(p, c) for p in peers for c, st in p.streams if c.source_cluster == location and st is not StreamState.FAILED_OVER]


def clock_floor(location: str, log: str, peers: Iterable[PeerFacts]) -> int:
    """The highest counter of ``location`` in the vectors of the peers' checkpoints of ``log``."""
    best = 0
    for peer in peers:
        for (_stream, name), cp in peer.checkpoints.items():
            if name == log:
                best = max(best, cp.source_vv.get(location, 0), cp.sink_vv.get(location, 0))
    return best


def positions_floor(location: str, log: str, peers: Iterable[PeerFacts]) -> int:
    """The highest segment number of ``location``'s log ``log`` in which a peer holds a
    position: the checkpoints of streams out of the location (how far they read, where they
    last saw its end) and the last record each of those peers applied from it."""
    best = 0
    for peer in peers:
        streams = {c.stream_id for c, st in peer.streams if c.source_cluster == location}
        for (stream, name), cp in peer.checkpoints.items():
            if name == log and stream in streams:
                best = max(best, cp.next.segment_seq, cp.source_end.segment_seq if cp.source_end else 0)
        for (stream, name), position in peer.applied.items():
            if name == log and stream in streams:
                best = max(best, position.segment_seq)
    return best


def _effective_state(state: StreamState, reason: str) -> StreamState:
    """A stream a rebuild registered paused was running before the loss."""
    return StreamState.RUNNING if state is StreamState.PAUSED and reason == REBUILT_REASON else state


def derive(target: TargetFacts, peers: Iterable[PeerFacts], *, now: float | None = None) -> Rebuild:
    peers = list(peers)
    x = target.name
    out = Rebuild(location=x, layout=not target.layout)
    by_name = {p.name: p for p in peers}
    leaving = outgoing(x, peers)
    # X takes local writes when a stream out of it is part of an active-active network: then the
    # streams into it are active-active too (the causality filter applies at X).
    writes_locally = {name for _, c in leaving if c.bidirectional for name in c.logs}
    known = {p.name for p, _ in leaving}

    incoming: dict[str, StreamConfig] = {}
    for sid, (config, state, _reason) in target.streams.items():
        if config.sink_cluster == x and config.source_cluster in by_name and state is not StreamState.FAILED_OVER:
            incoming[sid] = config
    for peer in peers:
        for sid, pins in sorted(pinned_streams(x, peer).items()):
            known.add(peer.name)
            logs = tuple(sorted({p.log for p in pins}))
            existing = target.streams.get(sid)
            if existing is not None:
                config, state, _ = existing
                if config.source_cluster != peer.name:
                    out.notes.append(f"{peer.name} pins logs for stream {sid}, but {x}'s stream {sid} replicates from {config.source_cluster}: left as it is")
                    continue
                if state is StreamState.FAILED_OVER:
                    continue
                missing = tuple(n for n in logs if n not in config.logs)
                if missing:
                    incoming[sid] = replace(config, logs=tuple(sorted({*config.logs, *missing})))
                    out.streams.append(StreamRebuild(incoming[sid], create=False, add_logs=missing, evidence=f"{peer.name} pins {', '.join(missing)} for it"))
                continue
            pair = next((c for p, c in leaving if p.name == peer.name and c.bidirectional), None)
            max_age = max((p.max_age_seconds for p in pins), default=DEFAULT_PIN_MAX_AGE)
            config = StreamConfig(
                stream_id=sid,
                source_cluster=peer.name,
                source_zookeeper=peer.zookeeper,
                sink_cluster=x,
                logs=logs,
                bidirectional=any(n in writes_locally for n in logs),
                throttle_bytes_per_second=pair.throttle_bytes_per_second if pair is not None else 0,
                pin_max_age_seconds=max_age if max_age > 0 else DEFAULT_PIN_MAX_AGE,
            )
            incoming[sid] = config
            expired = [p.log for p in pins if p.expired(now)]
            evidence = f"{peer.name} holds retention pins for it on {', '.join(logs)}"
            if expired:
                evidence += f" (expired on {', '.join(expired)}: {peer.name} may have deleted what {x} needs)"
            out.streams.append(StreamRebuild(config, create=True, checkpoints=logs, evidence=evidence))
    # Checkpoints an existing stream lacks (its config names the log; X lost or never had it).
    for sid, config in sorted(incoming.items()):
        if sid in target.streams and not any(s.config.stream_id == sid and s.create for s in out.streams):
            lacking = tuple(n for n in config.logs if (sid, n) not in target.checkpoints)
            if lacking:
                current = next((s for s in out.streams if s.config.stream_id == sid), None)
                if current is not None:
                    out.streams[out.streams.index(current)] = StreamRebuild(config, False, current.add_logs, lacking, current.evidence)
                else:
                    out.streams.append(StreamRebuild(config, False, (), lacking, f"{x}'s stream {sid} has no checkpoint for them"))

    rebuilt_ids = {s.config.stream_id for s in out.streams if s.create}
    for sid, config in sorted(incoming.items()):
        if sid in rebuilt_ids:
            out.incoming.append((config, StreamState.RUNNING))
        else:
            _, state, reason = target.streams[sid]
            out.incoming.append((config, _effective_state(state, reason)))
    out.known_by = sorted(known)

    logs = sorted({n for c in incoming.values() for n in c.logs} | {n for _, c in leaving for n in c.logs})
    for name in logs:
        one_way = sorted(c.stream_id for c in incoming.values() if name in c.logs and not c.bidirectional)
        mode, stream = (AccessMode.REPLICA, one_way[0]) if one_way else (AccessMode.READ_WRITE, "")
        if len(one_way) > 1:
            out.notes.append(f"{x}/{name} is the sink of several one-way streams ({', '.join(one_way)}): it becomes a replica of {one_way[0]}")
        numbered = positions_floor(x, name, peers)
        if name in target.logs:
            if name in target.rebuilt_logs:
                out.modes[name] = (mode, stream)
            if target.max_segment_seq.get(name, 0) < numbered:
                out.renumber[name] = numbered
            continue
        sources = [c.source_cluster for c in incoming.values() if name in c.logs] + [p.name for p, c in leaving if name in c.logs]
        donor = next((by_name[s] for s in sources if name in by_name[s].logs), None) or next((p for p in peers if name in p.logs), None)
        config = donor.logs[name] if donor is not None else LogConfig()
        if donor is None:
            out.notes.append(f"no peer holds log {name!r} itself: {x}/{name} is recreated with the default configuration")
        out.logs.append(LogRebuild(name, config, donor.name if donor else "", mode, stream, clock_floor(x, name, peers), numbered))
        out.modes[name] = (mode, stream)
    # The layout (root, config record) is recreated along with what was lost, not for itself:
    # a cluster whose other records survived needs nothing (the code creates parents as needed).
    out.layout = out.layout and bool(out.streams or out.logs)
    return out


def new_checkpoint(log: str) -> Checkpoint:
    """The checkpoint of a recreated stream's log (``dr recover`` restarts it from the start)."""
    return Checkpoint(log, next=INITIAL)
