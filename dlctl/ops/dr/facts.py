"""What failover, switchover and failback decide on, read from ZooKeeper and the agents as
immutable snapshots (``dlctl.ops.dr.decide`` decides over them without any I/O).

Each reader reads once and returns a frozen value: a step that must decide again on fresher
state (after a freeze, after the workers stopped) calls its reader again rather than updating
a value in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ...errors import NotFoundError
from ...log.dlsn import DLSN
from ...log.pool import AgentPool
from ...meta.zk import UNREADABLE, why_unreadable
from ...replication import dr
from ...replication.positions import AppliedPosition, find_applied, log_end
from ...replication.records import Checkpoint, StreamConfig, StreamState, StreamStatus
from ...replication.store import StreamStore
from ...session import ClusterSession


@dataclass(frozen=True)
class StreamFacts:
    """One stream as its sink's ZooKeeper holds it (configuration and state live at the sink)."""

    config: StreamConfig
    status: StreamStatus

    @property
    def state(self) -> StreamState:
        return self.status.state


def read_streams(session: ClusterSession, unreadable: dict[str, str] | None = None) -> tuple[StreamFacts, ...]:
    """Every readable stream of ``session``'s cluster (half-deleted or malformed ones are left
    out: they are evidence of nothing). ``unreadable``, when given, gets the malformed ones:
    stream id -> why, for a report to name them."""
    streams = StreamStore(session.meta)
    out = []
    for stream_id in streams.list_streams():
        try:
            out.append(StreamFacts(streams.get_config(stream_id).value, streams.get_state(stream_id).value))
        except NotFoundError:
            continue
        except UNREADABLE as exc:
            if unreadable is not None:
                unreadable[stream_id] = why_unreadable(exc)
    return tuple(out)


def read_status(session: ClusterSession, stream_id: str) -> StreamStatus | None:
    """The state of stream ``stream_id`` in ``session``'s cluster; None when it does not exist."""
    streams = StreamStore(session.meta)
    return streams.get_state(stream_id).value if streams.exists(stream_id) else None


@dataclass(frozen=True)
class SinkProgress:
    """How far a sink applied one log of a stream: its checkpoint, and the last record its log
    holds from the source (found as a restarting worker finds it; None when there is none, or
    no log)."""

    log: str
    checkpoint: Checkpoint
    applied: AppliedPosition | None


def read_progress(sink: ClusterSession, config: StreamConfig, name: str) -> SinkProgress:
    cp = StreamStore(sink.meta).get_checkpoint(config.stream_id, name).value
    applied = None
    if name in sink.meta.list_logs():
        applied = sink.with_pool(lambda pool: find_applied(sink.meta, pool, name, config.source_cluster, floor=cp.sink_dlsn))
    return SinkProgress(name, cp, applied)


def read_checkpoints(sink: ClusterSession, stream_id: str, names: Iterable[str]) -> dict[str, Checkpoint]:
    streams = StreamStore(sink.meta)
    return {name: streams.get_checkpoint(stream_id, name).value for name in names}


def read_ends(session: ClusterSession, names: Iterable[str]) -> dict[str, DLSN | None]:
    """Where each log ends now (None: empty)."""
    names = list(names)

    async def ends(pool: AgentPool) -> dict[str, DLSN | None]:
        return {n: (await log_end(session.meta, pool, n)).next for n in names}

    return session.with_pool(ends)


def read_identities(session: ClusterSession, name: str) -> list[dr.Identity]:
    """The identity of every record of ``session``'s log ``name``, in order."""
    records = session.with_pool(lambda pool: dr.read_range(session.meta, pool, name))
    return [dr.identity(r, session.cluster.name) for r in records]


def read_divergences(primary: ClusterSession, returning: ClusterSession, logs: Iterable[str], starts: Mapping[str, DLSN]) -> dict[str, dr.Divergence]:
    """Per log: the returning cluster's records at or after ``starts[log]`` (where the primary's
    copy stopped) that the primary does not hold — by identity, so a re-run after a partial
    reconcile finds fewer."""
    out = {}
    for name in logs:
        start = starts[name]
        if name not in returning.meta.list_logs():
            out[name] = dr.Divergence(name, returning.cluster.name, start)
            continue
        already = set(read_identities(primary, name)) if name in primary.meta.list_logs() else set()
        out[name] = returning.with_pool(lambda pool, name=name, start=start, already=already: dr.divergence(returning.meta, pool, name, returning.cluster.name, start, already))
    return out


def read_tail(session: ClusterSession, name: str, start: DLSN) -> int:
    """How many records ``session``'s log ``name`` holds at or after ``start``."""
    return len(session.with_pool(lambda pool: dr.read_range(session.meta, pool, name, start)))


def is_empty(session: ClusterSession, name: str) -> bool:
    return session.with_pool(lambda pool: log_end(session.meta, pool, name)).next is None


__all__ = [
    "SinkProgress", "StreamFacts", "is_empty", "read_checkpoints", "read_divergences", "read_ends", "read_identities", "read_progress",
    "read_status", "read_streams", "read_tail",
]
