"""What ``dr recover`` decides on, read from X's and its peers' ZooKeeper and agents as
immutable snapshots (``dlctl.ops.dr.recover_decide`` decides over them without any I/O).

A step reads the facts it needs when it runs — after the steps before it paused the streams,
dropped what was lost and raised the clock — not when the plan is built.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import NotFoundError
from ...log.dlsn import DLSN
from ...log.errors import AgentUnavailableError, LimboError
from ...log.pool import AgentPool
from ...meta.records import SegmentRecord, SegmentState, Versioned
from ...replication import dr, truncation_base
from ...replication.decision import first_retained
from ...replication.origin import ORIGIN_CLUSTER, Origin
from ...replication.positions import log_end
from ...replication.records import StreamConfig, StreamState
from ...replication.store import StreamStore
from ...session import ClusterSession
from .cold import ColdCover, cover
from .facts import read_streams
from .truncated import SourceStart, saved_anchor


@dataclass(frozen=True)
class Outgoing:
    """A stream out of X, as the peer it flows into holds it."""

    peer: str
    config: StreamConfig
    state: StreamState


def read_outgoing(x: str, peers: Mapping[str, ClusterSession]) -> tuple[Outgoing, ...]:
    """The streams out of ``x`` its peers hold (failed-over ones are over: left out). ``peers``
    is keyed by cluster name, as everywhere in ``dr recover``."""
    return tuple(Outgoing(peer.cluster.name, s.config, s.state) for peer in peers.values() for s in read_streams(peer) if s.config.source_cluster == x and s.state is not StreamState.FAILED_OVER)


def read_record(target: ClusterSession, op_id: str) -> Versioned[dict] | None:
    """The operation record an earlier run of ``dr recover`` left (None: this is the first)."""
    try:
        return target.meta.get_op(op_id)
    except NotFoundError:
        return None


# -- a peer that deleted the beginning of a log ----------------------------------------------------


@dataclass(frozen=True)
class Truncation:
    """A peer that no longer holds the beginning of a log: where its log starts now, and
    whether its cold store holds what lay before (``dlctl.ops.dr.cold``)."""

    first: DLSN
    cover: ColdCover | None  # its cold copies of everything before ``first``
    why: str  # why they do not cover it ("" when they do)
    cold_store: bool  # the inventory gives the peer a cold store at all


def first_of(session: ClusterSession, name: str) -> DLSN | None:
    """The first position ``session``'s log still holds; None when it holds all it ever had."""
    try:
        record = session.meta.get_log(name)
    except NotFoundError:
        return None
    return first_retained([s.value for s in session.meta.segments(name)], record.value.max_segment_seq)


def read_truncations(peers: Mapping[str, ClusterSession], pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Truncation]:
    """Per (peer, log) of ``pairs`` whose peer deleted the log's beginning: its ``Truncation``."""
    out = {}
    for peer, name in dict.fromkeys(pairs):
        first = first_of(peers[peer], name) if peer in peers else None
        if first is not None:
            found, why = cover(peers[peer], name, first)
            out[(peer, name)] = Truncation(first, found, why, peers[peer].cluster.cold_storage is not None)
    return out


def anchors_of(target: ClusterSession, incoming: Iterable[tuple[StreamConfig, Any]]) -> dict[str, dict[str, Any]]:
    """X's checkpoints of its incoming streams as they are before ``dr recover`` resets them:
    ``{"stream/log": {"next", "source_vv", "processed"}}`` (kept in the operation record)."""
    streams = StreamStore(target.meta)
    out = {}
    for c, _ in incoming:
        for name in c.logs:
            try:
                cp = streams.get_checkpoint(c.stream_id, name).value
            except NotFoundError:
                continue
            out[f"{c.stream_id}/{name}"] = {"next": str(cp.next), "source_vv": dict(cp.source_vv), "processed": cp.processed_records}
    return out


def _other_anchors(sessions: Sequence[ClusterSession], source: str, name: str, exclude: str) -> list[tuple[DLSN, dict[str, int]]]:
    """Checkpoints of every other stream from ``source`` carrying ``name`` (other sinks)."""
    out = []
    for session in sessions:
        streams = StreamStore(session.meta)
        for s in read_streams(session):
            if s.config.stream_id == exclude or s.config.source_cluster != source or name not in s.config.logs:
                continue
            try:
                cp = streams.get_checkpoint(s.config.stream_id, name).value
            except (NotFoundError, ValueError):
                continue
            if not cp.needs_bootstrap:
                out.append((cp.next, dict(cp.source_vv)))
    return out


def read_source_start(source: ClusterSession, config: StreamConfig, name: str, first: DLSN, saved: Mapping[str, Any] | None, others: Sequence[ClusterSession]) -> SourceStart:
    """The source's clock at ``first`` (its log's first retained position): its recorded
    truncation base when it has one (exact; X's saved checkpoint then only counts the records
    between), else derived backwards from X's saved checkpoint or another sink's
    (``dlctl.replication.dr.clock_before``)."""
    p = config.source_cluster
    own = saved_anchor(saved)
    anchors = ([own] if own is not None else []) + _other_anchors(others, p, name, exclude=config.stream_id)
    persisted = truncation_base.base_at(source.meta, name, first)
    try:
        if persisted is None:
            vv, used, between = source.with_pool(lambda pool: dr.clock_before(source.meta, pool, name, p, first, anchors))
            return SourceStart(first, vv, used, between)
        if own is not None and own[0] >= first:
            records = source.with_pool(lambda pool: dr.read_range(source.meta, pool, name, first, own[0]))
            return SourceStart(first, persisted, own[0], len(records))
        return SourceStart(first, persisted)
    except ValueError as exc:
        return SourceStart(first, unknown=str(exc))


@dataclass(frozen=True)
class IncomingFacts:
    """What restarting the streams into X decides on (step ``reset-incoming``)."""

    holds: Mapping[str, int]  # records each of X's logs holds now
    saved: Mapping[str, Mapping[str, Any]]  # X's checkpoints from before the recovery ("stream/log": ``anchors_of``)
    truncations: Mapping[tuple[str, str], Truncation]  # (source, log): the sources that deleted a log's beginning
    starts: Mapping[tuple[str, str], SourceStart] = field(default_factory=dict)  # (stream, log) of those: the source's clock there


def read_incoming_facts(target: ClusterSession, peers: Mapping[str, ClusterSession], incoming: Sequence[tuple[StreamConfig, Any]], logs: Iterable[str], saved: Mapping[str, Any]) -> IncomingFacts:
    holds = {n: count_records(target, n) for n in logs}
    truncations = read_truncations(peers, ((c.source_cluster, n) for c, _ in incoming for n in c.logs))
    others = [target, *peers.values()]
    starts = {}
    for c, _ in incoming:
        for name in c.logs:
            truncation = truncations.get((c.source_cluster, name))
            if truncation is not None:
                starts[(c.stream_id, name)] = read_source_start(peers[c.source_cluster], c, name, truncation.first, saved.get(f"{c.stream_id}/{name}"), others)
    return IncomingFacts(holds, saved, truncations, starts)


# -- X's clock and positions -----------------------------------------------------------------------


@dataclass(frozen=True)
class ClockEvidence:
    """What is known of X's own counter on one log: the version vectors of every checkpoint of a
    stream carrying it (at the peers and at X), the timestamps of the records the peers applied
    from X after their last checkpoint, and what X's log holds."""

    seen: tuple[Mapping[str, int], ...]
    held: Mapping[str, int]  # the version vector of X's log, clock base included
    max_segment_seq: int


def read_clock_evidence(target: ClusterSession, peers: Mapping[str, ClusterSession], incoming: Iterable[tuple[StreamConfig, Any]], outgoing: Iterable[Outgoing], name: str) -> ClockEvidence:
    x = target.cluster.name
    seen: list[Mapping[str, int]] = []
    for peer in peers.values():
        streams = StreamStore(peer.meta)
        for s in read_streams(peer):
            if name in s.config.logs:
                try:
                    cp = streams.get_checkpoint(s.config.stream_id, name).value
                except NotFoundError:
                    continue
                seen += [cp.source_vv, cp.sink_vv]
    for c, _ in incoming:
        try:
            cp = StreamStore(target.meta).get_checkpoint(c.stream_id, name).value
            seen += [cp.source_vv, cp.sink_vv]
        except NotFoundError:
            pass
    # What the peers applied from X after their last checkpoint: their logs' tails.
    for o in outgoing:
        peer = peers[o.peer]
        if name not in o.config.logs or name not in peer.meta.list_logs():
            continue
        cp = StreamStore(peer.meta).get_checkpoint(o.config.stream_id, name).value
        tail = peer.with_pool(lambda pool, peer=peer, cp=cp: dr.read_range(peer.meta, pool, name, cp.sink_dlsn))
        seen += [Origin.from_headers(r.headers).vt for r in tail if ORIGIN_CLUSTER in r.headers]  # type: ignore[union-attr]
    held = target.with_pool(lambda pool: dr.vv_before(target.meta, pool, name, x, None))
    return ClockEvidence(tuple(seen), held, target.meta.get_log(name).value.max_segment_seq)


def read_end(session: ClusterSession, name: str) -> DLSN | None:
    """Where the log ends now (None: empty or absent)."""
    if name not in session.meta.list_logs():
        return None
    return session.with_pool(lambda pool: log_end(session.meta, pool, name)).next


def count_records(session: ClusterSession, name: str) -> int:
    if name not in session.meta.list_logs():
        return 0
    return session.with_pool(lambda pool: log_end(session.meta, pool, name)).records


# -- what X lost -------------------------------------------------------------------------------------


def read_live_segments(session: ClusterSession, name: str) -> tuple[list[Versioned[SegmentRecord]], int | None]:
    """The log's segments not truncated, and the index of the first one no replica can serve
    (None: every one is served). The probing stops there: what follows it is lost with it."""
    segments = [s for s in session.meta.segments(name) if s.value.state is not SegmentState.TRUNCATED]

    async def probe(pool: AgentPool) -> int | None:
        from ...log.speculative import ReplicaReader

        replicas = ReplicaReader(pool)
        await pool.refresh()
        log_id = session.meta.get_log(name).value.log_id
        for index, seg in enumerate(segments):
            value = seg.value
            try:
                if value.state is SegmentState.INPROGRESS:
                    if await _forgotten_everywhere(pool, log_id, value):
                        return index
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
                return index
        return None

    return segments, session.with_pool(probe)


async def _forgotten_everywhere(pool: AgentPool, log_id: int, segment: SegmentRecord) -> bool:
    """Every member of the in-progress segment's last ensemble answers limbo: their disks were
    replaced (dlagent.disk) or their copies damaged, so no recovery can ever fence or read it —
    its data is lost here. (Members that do not answer at all may still hold it: not lost.)"""

    async def limbo(node: str) -> bool:
        try:
            await asyncio.wait_for((await pool.client(node)).read_lac(log_id, segment.seq), 10)
        except LimboError:
            return True
        except Exception:  # noqa: BLE001 - unreachable or other: cannot tell
            return False
        return False

    return all(await asyncio.gather(*(limbo(n) for n in segment.ensembles[-1].nodes)))


__all__ = [
    "ClockEvidence", "IncomingFacts", "Outgoing", "Truncation", "anchors_of", "count_records", "first_of", "read_clock_evidence", "read_end",
    "read_incoming_facts", "read_live_segments", "read_outgoing", "read_record", "read_source_start", "read_truncations",
]
