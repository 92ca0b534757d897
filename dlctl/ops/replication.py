"""Setting up replication streams between clusters (DESIGN.md §7); what follows — inspecting,
pausing, resuming, deleting and draining them — is ``dlctl.ops.streams``. Every mutating verb
builds a ``Plan``.

``init-replication`` registers a stream in both clusters — sink: config, state, per-log
checkpoints; source: retention pins — and creates missing sink logs. Each step is idempotent
and the stream is switched to ``running`` only by the last one, so re-running after any
failure completes the setup, and no worker ever runs half a stream.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConflictError,
    NotFoundError,
    RefusedError,
    UsageError,
)
from ..log.dlsn import DLSN, INITIAL
from ..log.readpolicy import live_segments
from ..log.speculative import ReplicaReader
from ..log.timeindex import locate_time, to_ms
from ..meta.pins import PinRecord, PinStore
from ..meta.records import LogConfig
from ..plan import Plan, Step
from ..replication import positions
from ..meta.access import AccessMode, AccessStore
from ..replication.decision import (
    Decision,
    LogFacts,
    decide,
    first_retained,
    gated,
    start_position,
)
from ..replication.causal import describe_missing, merge, missing_past
from ..replication.clock import ClockStore
from ..replication.filters import RecordFilter
from ..replication.history import NetworkEvent
from ..replication.network import current_version_vector, deletion_vector
from ..replication.records import (
    COMPRESSIONS,
    Checkpoint,
    StreamConfig,
    StreamState,
    default_stream_id,
)
from ..replication.store import StreamStore
from . import network_rules as rules
from . import source_credentials
from ..session import ClusterSession

if TYPE_CHECKING:  # types only: the copy engines are imported when a copy runs
    from ..spark.engines import Engines

BOOTSTRAP_MODES = ("auto", "never", "always")
# A new stream's compression when init-replication is not told (issue 23): WAN bandwidth is what
# a stream costs, and zstd at level 1 costs little CPU (tests/benchmarks/bench_compression.py).
# An existing stream keeps its own unless told.
NEW_STREAM_COMPRESSION = "zstd"


# -- init-replication ------------------------------------------------------------------------


@dataclass
class LogDecision:
    stream: str
    log: str
    decision: Decision
    reason: str
    start: DLSN
    gated: bool = False  # a new causal connection: its worker checks the location-addition rule first
    waiting_for: dict[str, tuple[int, int]] = field(default_factory=dict)  # what the sink lacks of the source's deleted past

    def to_dict(self) -> dict[str, Any]:
        out = {"stream": self.stream, "log": self.log, "decision": self.decision.value, "start": str(self.start), "reason": self.reason}
        if self.waiting_for:
            out["waiting_for"] = {o: list(r) for o, r in self.waiting_for.items()}
        return out


@dataclass
class InitPlan:
    plan: Plan
    decisions: list[LogDecision] = field(default_factory=list)

    @property
    def needs_bootstrap(self) -> list[LogDecision]:
        return [d for d in self.decisions if d.decision is Decision.BOOTSTRAP]


def matching_logs(names: Iterable[str], patterns: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns))


def records_held(session: ClusterSession, name: str) -> tuple[int, DLSN | None] | None:
    """(data records, first retained position) of a log, or None when it does not exist. An
    in-progress segment's records are counted from its agents (its metadata says 0 until it
    is closed)."""
    try:
        record = session.meta.get_log(name)
        segments = [s.value for s in session.meta.segments(name)]
    except NotFoundError:
        return None
    first = first_retained(segments, record.value.max_segment_seq)
    if not any(s.state.value == "inprogress" for s in segments):
        return sum(s.records for s in segments), first
    return session.with_pool(lambda pool: positions.log_end(session.meta, pool, name)).records, first


@dataclass(frozen=True)
class StartFrom:
    """``init-replication --start-from``: ``now``; a source position (one-way streams); or a
    time (one-way streams: the first source record appended at or after it,
    ``dlctl.log.timeindex``)."""

    kind: str  # "now" | "position" | "time"
    position: DLSN | None = None
    time: float | None = None

    def describe(self) -> str:
        return "now" if self.kind == "now" else str(self.position) if self.kind == "position" else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.time or 0))


def _resolve_start(source: ClusterSession, name: str, start: StartFrom) -> DLSN:
    """Where a one-way stream of ``name`` starts for ``--start-from`` (refused: a position the
    source no longer holds)."""
    held = records_held(source, name)
    first = (held[1] if held else None) or INITIAL
    if start.kind == "now":
        end = source.run(_source_end(source, name))
        return max(end or first, first)
    if start.kind == "position":
        assert start.position is not None
        if start.position < first:
            raise RefusedError(f"--start-from {start.position}: {source.cluster.name}/{name} no longer holds it (it starts at {first})", hint="pick a later position, or let init-replication bootstrap the sink")
        return start.position
    log = source.meta.get_log(name).value
    live = live_segments([s.value for s in source.meta.segments(name)])
    found, _ = source.with_pool(lambda pool: locate_time(ReplicaReader(pool), log.log_id, live, to_ms(start.time or 0), log.max_segment_seq))
    return max(found, first)


async def _source_end(source: ClusterSession, name: str) -> DLSN | None:
    pool = await source.pool()
    return (await positions.log_end(source.meta, pool, name)).next


def _join_vectors(source: ClusterSession, sink: ClusterSession, logs: list[str]) -> dict[str, dict[str, int]]:
    """``--start-from now`` on a causal stream: per log, the past ``source`` deleted, which the
    joining sink takes as its own deletion and version vectors (Eventuate #314: a location that
    joins with new events only starts from the LUB of its new peers' DVVs). Refused when the
    sink log holds records already, or the source's deleted past is unknown."""
    out = {}
    for name in logs:
        held = records_held(sink, name)
        if held is not None and held[0] > 0:
            raise RefusedError(
                f"--start-from now: {sink.cluster.name}/{name} holds {held[0]} record(s) already; only a location without a past of its own can join without its peers' past",
                hint="leave out --start-from (the stream decides how to start), or replicate another log",
            )
        dvv = deletion_vector(source.meta, name) if _exists(source, name) else {}
        if dvv is None:
            raise RefusedError(f"--start-from now: {source.cluster.name}/{name} truncated without recording what it deleted", hint="leave out --start-from: a bootstrap copy is planned instead")
        out[name] = dvv
    return out


def _log_facts(
    source: ClusterSession, sink: ClusterSession, name: str, checkpoint: Checkpoint | None, pin_reason: str, *,
    causal_stream: str | None = None, source_join: dict[str, int] | None = None, sink_join: dict[str, int] | None = None,
) -> LogFacts:
    """``causal_stream``: the id of a causal stream, for which the location-addition rule's
    vectors are read too (``dlctl.replication.network``); ``source_join``/``sink_join``: the
    past the source/sink takes as deleted by joining without it (``--start-from now``), which
    this plan records before the stream starts."""
    held = records_held(source, name)
    source_records, source_first = held if held is not None else (0, None)
    sink_held = records_held(sink, name)
    dvv = cvv = None
    if causal_stream is not None and checkpoint is None:
        dvv = deletion_vector(source.meta, name) if _exists(source, name) else {}
        cvv = current_version_vector(sink.meta, name, exclude=causal_stream) if _exists(sink, name) else {}
        if dvv is not None and source_join:
            dvv = merge(dvv, source_join)
        if sink_join:
            cvv = merge(cvv, sink_join)
    return LogFacts(
        sink=sink.cluster.name,
        source_dvv=dvv,
        sink_cvv=cvv,
        log=name,
        source_first=source_first,
        source_records=source_records,
        sink_exists=sink_held is not None,
        sink_records=sink_held[0] if sink_held is not None else 0,
        checkpoint_next=checkpoint.next if checkpoint is not None else None,
        needs_bootstrap=(checkpoint.needs_bootstrap if checkpoint is not None else "") or pin_reason,
    )


def _direction(
    source: ClusterSession,
    sink: ClusterSession,
    logs: list[str],
    *,
    bidirectional: bool,
    bootstrap: str,
    throttle: int,
    pin_max_age: float,
    start_from: StartFrom | None = None,
    source_join: dict[str, dict[str, int]] | None = None,
    sink_join: dict[str, dict[str, int]] | None = None,
    record_filter: str = "",
    patterns: tuple[str, ...] = (),
    compression: str | None = None,
    view: rules.NetworkView,
    copies: Engines | None = None,
) -> tuple[list[Step], list[LogDecision]]:
    """``source_join``/``sink_join``: per log, the deleted past the source/sink joins without
    (``--start-from now`` on a causal stream; the sink's is recorded by this direction's steps).
    ``copies``: the operation's bootstrap engines (``bootstrap.engines``), shared by its copies."""
    src, snk = source.cluster.name, sink.cluster.name
    rules.check_connection(view, src, snk, record_filter, causal=bidirectional)  # the network's rules before the stream's
    stream_id = default_stream_id(src, snk)
    streams = StreamStore(sink.meta)
    pins = PinStore(source.meta)
    existing = None
    try:
        existing = streams.get_config(stream_id)
    except NotFoundError:
        pass
    if existing is not None and existing.value.source_cluster != src:
        raise ConflictError(f"stream {stream_id!r} in cluster {snk!r} replicates from {existing.value.source_cluster!r}, not {src!r}")
    if existing is not None and existing.value.bidirectional != bidirectional:
        raise RefusedError(
            f"stream {stream_id!r} is {'active-active' if existing.value.bidirectional else 'one-way'}; "
            f"init-replication was asked for {'active-active' if bidirectional else 'one-way'}",
            hint="a stream's mode applies to all its logs: keep the mode, or delete the stream and set it up again",
        )
    all_logs = sorted(set(logs) | set(existing.value.logs if existing else ()))
    config = StreamConfig(
        stream_id=stream_id,
        source_cluster=src,
        source_zookeeper=source.cluster.zookeeper,
        sink_cluster=snk,
        logs=tuple(all_logs),
        bidirectional=bidirectional,
        throttle_bytes_per_second=throttle,
        pin_max_age_seconds=pin_max_age,
        created=existing.value.created if existing else time.time(),
        filter=record_filter,
        patterns=tuple(sorted(set(patterns) | set(existing.value.patterns if existing else ()))),
        compression=compression or (existing.value.compression if existing else NEW_STREAM_COMPRESSION),
    )
    decisions: list[LogDecision] = []
    steps: list[Step] = []
    checkpoints = set(streams.checkpoints(stream_id)) if existing else set()
    for name in all_logs:
        checkpoint = streams.get_checkpoint(stream_id, name).value if name in checkpoints else None
        pin_reason = ""
        try:
            pin = pins.get(stream_id, name).value
            if pin.needs_bootstrap:
                pin_reason = pin.reason or "the source deleted data the stream's pin protected"
        except NotFoundError:
            pass
        facts = _log_facts(
            source, sink, name, checkpoint, pin_reason, causal_stream=stream_id if config.bidirectional else None,
            source_join=(source_join or {}).get(name), sink_join=(sink_join or {}).get(name),
        )
        decision, reason = decide(facts, bidirectional=config.bidirectional)
        start = start_position(decision, facts)
        if start_from is not None and not config.bidirectional and checkpoint is None:
            start = _resolve_start(source, name, start_from)
            decision, reason = Decision.START, f"--start-from {start_from.describe()}: stream from {start}; the records before it are not replicated"
        if bootstrap == "always" and decision is not Decision.BOOTSTRAP:
            decision, reason = Decision.BOOTSTRAP, "--bootstrap always"
        waiting = missing_past(facts.source_dvv or {}, facts.sink_cvv or {}, snk) if decision is Decision.WAIT else {}
        decisions.append(LogDecision(stream_id, name, decision, reason, start, gated(decision, facts, bidirectional=config.bidirectional), waiting))
    where = f"{snk}/{stream_id}"
    if existing is None:
        # Recorded first: a run cut short after it records the connection again (harmless: the
        # history replays to the same network), never a stream without its record.
        steps.append(rules.history_step(source, sink, NetworkEvent("connect", src, snk, stream_id, config.bidirectional, config.logs, filter=config.filter)))
        steps.append(Step("register-stream", where, f"register stream {stream_id} ({src} -> {snk}) in {snk}: config, state setting-up", run=lambda: streams.create(config) and None))
    elif existing.value.logs != config.logs or existing.value.patterns != config.patterns or existing.value.throttle_bytes_per_second != throttle or existing.value.pin_max_age_seconds != pin_max_age or existing.value.filter != config.filter or existing.value.compression != config.compression:
        steps.append(Step("update-stream", where, f"update stream {stream_id}: logs {', '.join(config.logs)}" + (f"; filter {config.filter or 'none'}" if existing.value.filter != config.filter else "") + (f"; compression {config.compression}" if existing.value.compression != config.compression else ""), run=lambda: streams.update_config(streams.get_config(stream_id), config) and None))
        if existing.value.filter != config.filter:
            steps.append(rules.history_step(source, sink, NetworkEvent("filter", src, snk, stream_id, config.bidirectional, config.logs, filter=config.filter)))
    for d in decisions:
        if d.decision is Decision.BOOTSTRAP:
            steps.append(_bootstrap_step(source, sink, stream_id, d, copies))
            continue
        pin = PinRecord(holder=stream_id, log=d.log, position=d.start, sink_cluster=snk, max_age_seconds=pin_max_age)
        steps.append(Step("pin", f"{src}/{d.log}", f"pin {src}/{d.log} from {d.start} for {stream_id}", run=lambda pin=pin: pins.set(pin) and None))
    for d in decisions:
        if d.decision is Decision.BOOTSTRAP:
            continue
        if not _exists(sink, d.log):
            log_config = _source_log_config(source, d.log)
            steps.append(Step("create-sink-log", f"{snk}/{d.log}", f"create log {d.log} in {snk} (E={log_config.ensemble_size}, W={log_config.write_quorum}, A={log_config.ack_quorum})", run=lambda name=d.log, c=log_config: create_if_missing(sink, name, c)))
        joined = (sink_join or {}).get(d.log)
        if joined:
            steps.append(Step(
                "join-without-past", f"{snk}/{d.log}", f"{snk}/{d.log} joins without the past {src} deleted ({describe_missing({o: (1, n) for o, n in joined.items()})}): its deletion and version vectors start there",
                run=lambda name=d.log, vv=joined: ClockStore(sink.meta).join_without_past(name, vv) and None,
            ))
        if d.decision in (Decision.START, Decision.WAIT):
            cp = Checkpoint(d.log, next=d.start, gated=d.gated, waiting_for={o: list(r) for o, r in d.waiting_for.items()})
            steps.append(Step("checkpoint", f"{snk}/{stream_id}/{d.log}", f"checkpoint {d.log}: stream from {d.start} ({d.reason})", run=lambda cp=cp: streams.create_checkpoint(stream_id, cp) and None))
    if not config.bidirectional:
        # A one-way sink is a standby: its logs take the stream's records only, until promoted.
        access = AccessStore(sink.meta)
        for d in decisions:
            steps.append(Step("mark-replica", f"{snk}/{d.log}", f"make {snk}/{d.log} a replica of {stream_id} (application writes refused until promoted)", run=lambda name=d.log: _mark_replica(access, name, stream_id)))
    activate = existing is None or streams.get_state(stream_id).value.state is StreamState.SETTING_UP
    if activate:
        steps.append(Step("activate", where, f"start stream {stream_id}: workers in {snk} pick it up", run=lambda: _activate(streams, stream_id)))
    return steps, decisions


def _mark_replica(access: AccessStore, name: str, stream_id: str) -> str:
    current = access.get(name)
    mode = current.value
    if mode.mode is AccessMode.REPLICA and mode.stream != stream_id:
        raise RefusedError(
            f"log {name!r} in cluster {access.cluster!r} is already a replica of stream {mode.stream!r}",
            hint="a log has one primary: delete the other stream first (or fail it over)",
        )
    try:
        return access.set(name, AccessMode.REPLICA, stream=stream_id, reason=f"sink of {stream_id}", current=current).value.describe()
    except NotFoundError:
        return "the log does not exist (yet)"


def _bootstrap_step(source: ClusterSession, sink: ClusterSession, stream_id: str, decision: LogDecision, copies: Engines | None) -> Step:
    """THE call site of the bootstrap copy (``dlctl.ops.bootstrap``): a copy job (on Spark, or
    in-process for a small log) copies what the source retains into the sink log and commits it
    atomically; before it lets its extra pin go, ``stream_hook`` sets the stream's checkpoint to
    the snapshot point and moves the stream's pin there, so the stream continues exactly after
    the copy. Re-running resumes the job. ``copies``: the engines every copy of this run shares
    (one Spark context however many logs); the plan's cleanup stops it."""

    def run() -> Any:
        from .bootstrap import bootstrap_logs, stream_hook

        result = bootstrap_logs(source, sink, [decision.log], holder=f"bootstrap-{stream_id}", before_release=stream_hook(source, sink, stream_id), shared=copies)
        return {
            "snapshot": str(result.logs[decision.log].snapshot), "bytes_copied": result.bytes_copied, "seconds": round(result.seconds, 3),
            "engine": result.engine, "spark_starts": result.spark_starts, "spark_log": result.spark_log,
        }

    return Step("bootstrap", f"{sink.cluster.name}/{decision.log}", f"bootstrap copy of {decision.log} from {source.cluster.name}: {decision.reason}", run=run, piecewise=True)


def _start_copies_step(source: ClusterSession, sink: ClusterSession, decisions: list[LogDecision], copies: Engines) -> Step | None:
    """The first step when a bootstrap copy of this run will need Spark: its start begins in the
    background, so it overlaps the steps before the copies; None when every copy is small
    enough to run in-process (below ``copies.local_below``)."""
    from .bootstrap import copy_bytes

    forward = default_stream_id(source.cluster.name, sink.cluster.name)
    sizes = {d.log: copy_bytes(source if d.stream == forward else sink, d.log) for d in decisions if d.decision is Decision.BOOTSTRAP}
    big = sorted(name for name, size in sizes.items() if copies.needs_spark(size))
    if not big:
        return None
    return Step(
        "start-spark", "spark",
        f"start Spark in the background for the bootstrap copies of {', '.join(big)} (one context for all of them, stopped at the end)",
        params={"logs": big, "bytes": sum(sizes[n] for n in big), "local_below": copies.local_below}, run=copies.prestart,
    )


def bootstrap_available() -> bool:
    """A bootstrap copy runs Spark: pyspark importable, and a Java runtime (``JAVA_HOME`` or
    ``java`` on the PATH), as pyspark's launcher looks for one."""
    if importlib.util.find_spec("pyspark") is None:
        return False
    java_home = os.environ.get("JAVA_HOME")
    return bool((java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK)) or shutil.which("java"))


def refuse_unavailable_bootstrap(built: InitPlan) -> None:
    if built.needs_bootstrap and not bootstrap_available():
        names = ", ".join(f"{d.log} ({d.reason})" for d in built.needs_bootstrap)
        raise RefusedError(
            f"init-replication: a bootstrap copy is required for: {names}; the bootstrap engine (Spark: pyspark and a Java runtime) is not available on this machine, so nothing was changed",
            hint="empty the sink log or replicate other logs (--logs); see the plan with --dry-run",
            details=[d.to_dict() for d in built.decisions],
        )


def _exists(session: ClusterSession, name: str) -> bool:
    return name in session.meta.list_logs()


def _source_log_config(source: ClusterSession, name: str) -> LogConfig:
    try:
        return source.meta.get_log(name).value.config
    except NotFoundError:
        return LogConfig()


def create_if_missing(session: ClusterSession, name: str, config: LogConfig) -> dict[str, Any]:
    try:
        return {"log_id": session.meta.create_log(name, config).log_id}
    except ConflictError:
        return {"existed": True}


def _activate(streams: StreamStore, stream_id: str) -> str:
    state = streams.get_state(stream_id)
    if state.value.state is StreamState.SETTING_UP:
        streams.set_state(stream_id, state, StreamState.RUNNING)
    return "running"


def init_plan(
    source: ClusterSession,
    sink: ClusterSession,
    *,
    patterns: tuple[str, ...] = ("*",),
    bidirectional: bool = False,
    bootstrap: str = "auto",
    throttle: int = 0,
    pin_max_age: float = 7 * 24 * 3600.0,
    causal: bool = False,
    start_from: StartFrom | None = None,
    filters: tuple[str, ...] = (),
    peers: Sequence[ClusterSession] = (),
    compression: str | None = None,
    install_credentials: bool = True,
    bootstrap_local_below: int | None = None,
) -> InitPlan:
    """``causal``: a one-way stream that is one edge of an active-active network (e.g. a cycle
    a -> b -> c -> a): the sink takes local writes too and applies the causality filter.
    ``start_from``: ``now`` on a causal stream joins the sink without the past its new peer
    deleted (its deletion and version vectors start at the peer's deletion vector, Eventuate
    #314); on a one-way stream, ``now``, a position or a time is where the stream starts.
    ``filters``: clauses of the stream's filter (``dlctl.replication.filters``). ``peers``: the
    other locations the caller knows (its inventory), read for the network's shape (filters
    never on a cycle); the network history their streams passed on counts too. ``compression``:
    "zstd" or "none" (``StreamConfig.compression``); None keeps an existing stream's and gives a
    new one ``NEW_STREAM_COMPRESSION``. ``install_credentials``: first deliver the source's
    credentials to the sink's agents the inventory lists (``source_credentials``; both ways for
    a bidirectional pair), so their workers can read it. ``bootstrap_local_below``: bootstrap
    copies of fewer bytes run in-process, the others share one Spark context (None: the
    default, ``bootstrap.DEFAULT_LOCAL_BELOW``)."""
    if bootstrap not in BOOTSTRAP_MODES:
        raise UsageError(f"--bootstrap must be one of {', '.join(BOOTSTRAP_MODES)}")
    if source.cluster.name == sink.cluster.name:
        raise UsageError(f"source and sink are the same cluster ({source.cluster.name!r})")
    logs = matching_logs(source.meta.list_logs(), patterns)
    if bidirectional:
        logs = sorted(set(logs) | set(matching_logs(sink.meta.list_logs(), patterns)))
    if not logs:
        raise NotFoundError(f"no log of cluster {source.cluster.name!r} matches {' '.join(patterns)}", hint="list logs with `dlctl log list`")
    if bidirectional and causal:
        raise UsageError("--bidirectional and --causal: a bidirectional pair is causal already; give one of them")
    view = rules.network_view(source, sink, peers)  # read once: every rule below decides on it
    gone = view.retired_among(source.cluster.name, sink.cluster.name)
    if gone:
        raise RefusedError(
            f"location(s) {', '.join(gone)} were retired from the replication network: a retired location never comes back (its counters live on in others' vector timestamps)",
            hint="set the location up under a new cluster name",
        )
    record_filter = ""
    if filters:
        try:
            record_filter = RecordFilter.parse(filters).canonical()
        except ValueError as exc:
            raise UsageError(f"--filter: {exc}") from None
        if bidirectional:
            raise RefusedError("--filter on a bidirectional pair: a pair is a cycle, and a filter on a cycle loses records (Eventuate #314)", hint="filter a one-way connection into a location that passes nothing on")
    joins: dict[str, dict[str, int]] = {}
    if start_from is not None and (bidirectional or causal):
        if start_from.kind != "now":
            raise UsageError("--start-from on a causal stream takes only 'now': where it starts is the location-addition rule's to decide")
        joins = _join_vectors(source, sink, logs)
    if compression is not None and compression not in COMPRESSIONS:
        raise UsageError(f"--compression must be one of {', '.join(COMPRESSIONS)} (got {compression!r})")
    from .bootstrap import DEFAULT_LOCAL_BELOW, engines

    copies = engines(local_below=DEFAULT_LOCAL_BELOW if bootstrap_local_below is None else bootstrap_local_below)  # started only if a copy needs Spark
    opts: dict[str, Any] = dict(bidirectional=bidirectional or causal, bootstrap=bootstrap, throttle=throttle, pin_max_age=pin_max_age, view=view, patterns=patterns, compression=compression, copies=copies)
    notes: list[str] = []
    steps, decisions = _direction(source, sink, logs, **opts, start_from=start_from, sink_join=joins, record_filter=record_filter)
    if install_credentials:
        steps = _with_credentials(source, sink, steps, notes)
    if bidirectional:
        back_steps, back_decisions = _direction(sink, source, logs, **opts, source_join=joins)
        steps += _with_credentials(sink, source, back_steps, notes) if install_credentials else back_steps
        decisions += back_decisions
    notes += [f"{d.stream} {d.log}: {d.decision.value} — {d.reason}" for d in decisions]
    if bootstrap == "never" and any(d.decision is Decision.BOOTSTRAP for d in decisions):
        raise RefusedError(
            "init-replication: --bootstrap never, but a bootstrap copy is required for: " + ", ".join(d.log for d in decisions if d.decision is Decision.BOOTSTRAP),
            details=[d.to_dict() for d in decisions],
        )
    start = _start_copies_step(source, sink, decisions, copies)
    if start is not None:
        steps.insert(0, start)
    name = f"init-replication {source.cluster.name} -> {sink.cluster.name}" + (" (bidirectional)" if bidirectional else "")
    return InitPlan(Plan.of(name, steps, notes, cleanup=[copies.close]), decisions)


def _with_credentials(source: ClusterSession, sink: ClusterSession, steps: list[Step], notes: list[str], *, partial_ok: bool = False) -> list[Step]:
    """``steps`` of a stream source -> sink, after delivering the source's credentials to the
    sink's agents (before the stream exists: its workers find them when they start)."""
    step, note = source_credentials.credentials_step(source.cluster, sink.cluster, partial_ok=partial_ok)
    if note:
        notes.append(note)
    return [step, *steps] if step is not None else steps


def register_at_steps(
    source: ClusterSession,
    sink: ClusterSession,
    starts: dict[str, tuple[DLSN, dict[str, int]]],
    *,
    pin_max_age: float = 7 * 24 * 3600.0,
    compression: str = NEW_STREAM_COMPRESSION,
    why: str = "",
    install_credentials: bool = True,
) -> list[Step]:
    """A one-way stream source -> sink whose logs continue at given source positions (with the
    source's version vector there): no copy, no decision — the caller knows the sink holds
    everything before them (a switchover's reversed stream, a failback onto a prefix; it takes
    the forward stream's ``compression``). Idempotent steps; the stream runs only after the last one.
    ``install_credentials``: first deliver the source's credentials to the sink's agents the
    inventory lists, skipping (and reporting) those out of reach."""
    src, snk = source.cluster.name, sink.cluster.name
    stream_id = default_stream_id(src, snk)
    streams, pins, access = StreamStore(sink.meta), PinStore(source.meta), AccessStore(sink.meta)
    config = StreamConfig(stream_id=stream_id, source_cluster=src, source_zookeeper=source.cluster.zookeeper, sink_cluster=snk, logs=tuple(sorted(starts)), pin_max_age_seconds=pin_max_age, created=time.time(), compression=compression)

    def register() -> str:
        if streams.exists(stream_id):
            existing = streams.get_config(stream_id).value
            state = streams.get_state(stream_id).value.state
            if existing.source_cluster != src or existing.bidirectional or set(existing.logs) != set(config.logs) or state is not StreamState.SETTING_UP:
                raise RefusedError(f"stream {stream_id!r} already exists in {snk!r} ({state.value}, logs {', '.join(existing.logs)})", hint="delete it first")
            return "exists (setting up)"
        streams.create(config)
        return "registered"

    steps = [
        rules.history_step(source, sink, NetworkEvent("connect", src, snk, stream_id, False, config.logs, note=why)),
        Step("register-stream", f"{snk}/{stream_id}", f"register stream {stream_id} ({src} -> {snk}) in {snk}" + (f": {why}" if why else ""), run=register),
    ]
    for name, (position, vv) in sorted(starts.items()):
        pin = PinRecord(holder=stream_id, log=name, position=position, sink_cluster=snk, max_age_seconds=pin_max_age)
        steps.append(Step("pin", f"{src}/{name}", f"pin {src}/{name} from {position} for {stream_id}", run=lambda pin=pin: pins.reset(pin) and None))
        cp = Checkpoint(name, next=position, source_vv=dict(vv))
        steps.append(Step("checkpoint", f"{snk}/{stream_id}/{name}", f"checkpoint {name}: continue at {position} (the sink holds everything before it)", run=lambda cp=cp: _set_checkpoint(streams, stream_id, cp)))
        steps.append(Step("mark-replica", f"{snk}/{name}", f"make {snk}/{name} a replica of {stream_id}", run=lambda name=name: _mark_replica(access, name, stream_id)))
    steps.append(Step("activate", f"{snk}/{stream_id}", f"start stream {stream_id}: workers in {snk} pick it up", run=lambda: _activate(streams, stream_id)))
    return _with_credentials(source, sink, steps, [], partial_ok=True) if install_credentials else steps


def _set_checkpoint(streams: StreamStore, stream_id: str, cp: Checkpoint) -> str:
    current = streams.create_checkpoint(stream_id, cp)
    if current.value.next != cp.next or current.value.source_vv != cp.source_vv:
        if streams.get_state(stream_id).value.state is not StreamState.SETTING_UP:
            raise RefusedError(f"stream {stream_id!r} already runs from {current.value.next}")
        streams.update_checkpoint(stream_id, current, cp)
    return str(cp.next)
