"""``dlctl bench replication --source A --sink B``: replication lag of a real link between two
clusters, with the source's own tailing latency as the baseline (issue 27). The measurement is
``dlctl.ops.bench_lag``; this module decides what to measure and owns what the run creates.

Either the log (``--log``) exists at the source and a stream replicates it to the sink — it is
measured as it is, and only this run's records are added to it — or, with ``create``, the run
sets one up: the log at the source, then a stream for that log alone, exactly as
``init-replication --source A --sink B --logs LOG`` would (it creates the sink log), and
removes them afterwards (stream with its pins, then the log on both sides) unless ``keep``.

A run never adds its log to a stream that exists already: the stream A -> B would take it in
and could not give it back without touching the operator's stream, and a stream *from* A or B
whose patterns match the name would carry it on to a third cluster. Such a run is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import DlctlError, ExitCode, NotFoundError, PartialFailure, RefusedError, TimeoutExpired, UsageError
from ..meta.pins import PinStore
from ..meta.records import LogConfig
from ..names import validate_name
from ..plan import Plan, PlanFailed, Step, apply
from ..replication.records import StreamState, default_stream_id
from ..replication.store import StreamStore
from ..replication.upkeep import matches
from ..session import ClusterSession
from . import replication
from . import streams as stream_ops
from .bench import Progress, available_agents, log_exists
from .bench_lag import MIN_RECORD_SIZE, LagSpec, measure

DEFAULT_LOG = "bench-replication"
# How long a log deletion waits for its last writer (the stream's, the bench's) to let go.
_OWNER_WAIT = 30.0


def _quiet(_phase: str, _done: int, _total: int | None) -> None:
    pass


@dataclass(frozen=True)
class ReplicationBenchSpec:
    log: str = DEFAULT_LOG
    create: bool = False  # set the log and its stream up when the log does not exist
    keep: bool = False  # leave what was created in place
    log_config: LogConfig = field(default_factory=LogConfig)
    lag: LagSpec = field(default_factory=LagSpec)
    install_credentials: bool = True  # as init-replication: the source's credentials to the sink's agents

    def __post_init__(self) -> None:
        try:
            validate_name("log", self.log)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if self.lag.rate < 1 or self.lag.seconds <= 0 or self.lag.warmup < 0 or self.lag.deliver_timeout <= 0:
            raise UsageError("--rate must be >= 1, --seconds and --deliver-timeout > 0, --warmup >= 0")
        if self.lag.record_size < MIN_RECORD_SIZE:
            raise UsageError(f"--record-size must be at least {MIN_RECORD_SIZE} bytes (send time, sequence number, run tag)")


@dataclass
class Made:
    """What this run created (set before each creation: a failed step may have half-done it)."""

    source_log: bool = False
    stream: bool = False
    removed: list[str] = field(default_factory=list)

    @property
    def anything(self) -> bool:
        return self.source_log or self.stream


@dataclass
class ReplicationBench:
    source: ClusterSession
    sink: ClusterSession
    spec: ReplicationBenchSpec
    stream_id: str
    plan: Plan
    creates: bool  # the plan sets up the log and the stream
    peers: Sequence[ClusterSession] = ()
    made: Made = field(default_factory=Made)
    on_progress: Progress = _quiet

    @property
    def where(self) -> str:
        return f"{self.source.cluster.name} -> {self.sink.cluster.name}"


# -- what to measure -------------------------------------------------------------------------------


def _replicating(sink: ClusterSession, source: str, log: str) -> tuple[str, StreamState] | None:
    """The stream into ``sink`` that carries ``log`` from ``source`` (id, state), if any."""
    streams = StreamStore(sink.meta)
    for config in streams.configs():
        if config.source_cluster == source and log in config.logs:
            try:
                return config.stream_id, streams.get_state(config.stream_id).value.state
            except (NotFoundError, ValueError):
                continue  # being deleted: it carries nothing
    return None


def _streams_that_would_take(sessions: Sequence[ClusterSession], source: str, sink: str, log: str) -> list[str]:
    """Streams (``id (A -> B)``) that a new ``log`` at ``source`` (and its copy at ``sink``) would
    end up in: any stream source -> sink, and any stream out of either whose patterns match."""
    found = set()
    for session in sessions:
        for config in StreamStore(session.meta).configs():
            pair = (config.source_cluster, config.sink_cluster)
            if pair == (source, sink) or (config.source_cluster in (source, sink) and config.patterns and matches(log, config.patterns)):
                found.add(f"{config.stream_id} ({config.source_cluster} -> {config.sink_cluster})")
    return sorted(found)


def _require_agents(session: ClusterSession, role: str) -> int:
    agents = available_agents(session)
    if not agents:
        raise DlctlError(
            f"{role} cluster {session.cluster.name!r} has no available agent",
            hint=f"start its agents (`dlctl --cluster {session.cluster.name} agent start`) and see `dlctl --cluster {session.cluster.name} cluster status`",
        )
    return agents


def build(source: ClusterSession, sink: ClusterSession, spec: ReplicationBenchSpec, peers: Sequence[ClusterSession] = ()) -> ReplicationBench:
    """The run's plan: [create the log, set up its stream], measure, [remove both]. ``peers``:
    the inventory's other clusters, read for streams that would take a new log in (and, as by
    init-replication, for the network's rules)."""
    src, snk, log = source.cluster.name, sink.cluster.name, spec.log
    if src == snk:
        raise UsageError(f"--source and --sink are the same cluster ({src!r})")
    agents = {"source": _require_agents(source, "source"), "sink": _require_agents(sink, "sink")}
    at_source = log_exists(source, log)
    carried = _replicating(sink, src, log) if at_source else None
    notes = [f"agents available: {agents['source']} in {src}, {agents['sink']} in {snk}"]
    if at_source:
        if carried is None:
            raise NotFoundError(
                f"log {log!r} of cluster {src!r} is not replicated to {snk!r} by any stream",
                hint=f"set one up with `dlctl init-replication --source {src} --sink {snk} --logs {log}`, or let the bench make its own: --create --log NEW-NAME",
            )
        stream_id, state = carried
        if state is not StreamState.RUNNING:
            raise DlctlError(f"stream {stream_id!r} ({src} -> {snk}) is {state.value}: it would deliver nothing", hint="resume it with `dlctl replication resume`, or measure a log of its own: --create --log NEW-NAME")
        notes.append(f"log {log} exists and stream {stream_id} replicates it: this run's records are added to it and stay (their tag tells them from others); its writer is taken over at {src}")
        if spec.keep:
            notes.append("--keep: nothing is created, so nothing is removed")
        steps = [_measure_step(source, sink, spec, stream_id)]
        bench = ReplicationBench(source, sink, spec, stream_id, Plan.of(f"bench replication {src} -> {snk}", steps, notes), creates=False)
        _bind(bench)
        return bench
    if not spec.create:
        raise NotFoundError(f"log {log!r} does not exist in cluster {src!r}", hint="pass --create: the bench sets up the log and a stream for it, and removes them afterwards")
    if log_exists(sink, log):
        raise RefusedError(f"cluster {snk!r} has a log {log!r} already; a new stream would have to bootstrap over it", hint="pick another name with --log")
    taking = _streams_that_would_take([source, sink, *peers], src, snk, log)
    if taking:
        raise RefusedError(
            f"a new log {log!r} would join existing stream(s): {', '.join(taking)}; the bench would then write into a stream it cannot take the log out of again",
            hint="measure a log that stream replicates already: --log NAME (without --create; this run's records stay in it), or pick a name no stream's patterns match",
        )
    stream_id = default_stream_id(src, snk)
    c = spec.log_config
    steps = [
        Step("create-log", f"{src}/{log}", f"create log {log} in {src} (E={c.ensemble_size}, W={c.write_quorum}, A={c.ack_quorum})"),
        Step("init-replication", f"{snk}/{stream_id}", f"set up stream {stream_id} for {log} alone, as `init-replication --source {src} --sink {snk} --logs {log}`: its steps are planned when the log exists (credentials, register, pin, create {snk}/{log}, checkpoint, mark replica, start)"),
        _measure_step(source, sink, spec, stream_id),
    ]
    if spec.keep:
        notes.append(f"--keep: stream {stream_id} and log {log} in {src} and {snk} stay; remove them with `dlctl replication delete {stream_id} --sink {snk}` and `dlctl log delete {log}` in each")
    else:
        steps += [
            Step("delete-stream", f"{snk}/{stream_id}", f"delete stream {stream_id}: pause, wait for its workers, delete its pins in {src}, then the stream"),
            Step("delete-sink-log", f"{snk}/{log}", f"delete log {log} in {snk}"),
            Step("delete-source-log", f"{src}/{log}", f"delete log {log} in {src}"),
        ]
        notes.append("the network history of both clusters keeps the stream's connect and disconnect")
    bench = ReplicationBench(source, sink, spec, stream_id, Plan.of(f"bench replication {src} -> {snk}", steps, notes), creates=True, peers=list(peers))
    _bind(bench)
    return bench


def _measure_step(source: ClusterSession, sink: ClusterSession, spec: ReplicationBenchSpec, stream_id: str) -> Step:
    lag = spec.lag
    return Step(
        "bench-replication", f"{source.cluster.name}/{spec.log} -> {sink.cluster.name}/{spec.log}",
        f"append {lag.rate} records/s of {lag.record_size} bytes to {spec.log} in {source.cluster.name} for {lag.warmup + lag.seconds:g} s "
        f"({lag.warmup:g} s warm-up); tail it in {sink.cluster.name} (lag) and in {source.cluster.name} (baseline)",
        params={"rate": lag.rate, "seconds": lag.seconds, "warmup": lag.warmup, "record_size": lag.record_size, "deliver_timeout": lag.deliver_timeout},
    )


def _bind(bench: ReplicationBench) -> None:
    """Give each planned step its action (the plan is built before them: actions see ``bench``)."""
    actions: dict[str, Callable[[], Any]] = {
        "create-log": lambda: _create_source_log(bench),
        "init-replication": lambda: _set_up_stream(bench),
        "bench-replication": lambda: _measure(bench),
        "delete-stream": lambda: _delete_stream(bench),
        "delete-sink-log": lambda: _delete_log(bench, bench.sink),
        "delete-source-log": lambda: _delete_log(bench, bench.source),
    }
    steps = [Step(s.action, s.target, s.description, s.params, run=actions[s.action]) for s in bench.plan.steps]
    bench.plan = Plan.of(bench.plan.operation, steps, bench.plan.notes)


# -- the steps -------------------------------------------------------------------------------------


def _create_source_log(bench: ReplicationBench) -> dict[str, Any]:
    bench.made.source_log = True
    return {"log_id": bench.source.meta.create_log(bench.spec.log, bench.spec.log_config).log_id}


def _set_up_stream(bench: ReplicationBench) -> dict[str, Any]:
    """init-replication's own plan for this one log, built now that the log exists."""
    built = replication.init_plan(
        bench.source, bench.sink, patterns=(bench.spec.log,), bootstrap="never", peers=bench.peers,
        install_credentials=bench.spec.install_credentials,
    )
    bench.made.stream = True
    result = apply(built.plan)
    return {"steps": [o.step.action for o in result.outcomes]}


def _measure(bench: ReplicationBench) -> dict[str, Any]:
    return bench.source.run(measure(bench.source, bench.sink, bench.spec.log, bench.stream_id, bench.spec.lag, bench.on_progress))


def _delete_stream(bench: ReplicationBench) -> str:
    streams = StreamStore(bench.sink.meta)
    if streams.exists(bench.stream_id):
        apply(stream_ops.delete_plan(bench.sink, bench.source, bench.stream_id))
    else:
        PinStore(bench.source.meta).delete(bench.stream_id)  # a setup cut short before the stream existed
    bench.made.removed.append(_stream_key(bench))
    return "deleted"


def _delete_log(bench: ReplicationBench, session: ClusterSession) -> str:
    """Delete the run's log in ``session``'s cluster once its last writer has let go (the stream's
    worker closes its writer when it stops; the bench's paced writer has closed its own)."""
    name = bench.spec.log
    deadline = time.monotonic() + _OWNER_WAIT
    while True:
        if not log_exists(session, name):
            return "absent"
        try:
            session.meta.delete_log(name)
            break
        except RefusedError:  # a live owner: a writer that has not closed yet
            if time.monotonic() > deadline:
                raise TimeoutExpired(f"log {name!r} in {session.cluster.name!r} still has a live owner after {_OWNER_WAIT:g}s", hint=f"delete it later with `dlctl --cluster {session.cluster.name} log delete {name}`") from None
            time.sleep(0.2)
    bench.made.removed.append(_log_key(session, name))
    return "deleted"


# -- running ---------------------------------------------------------------------------------------


def _clean_up(bench: ReplicationBench) -> list[str]:
    """Remove what the run created, after a failure or an interruption: what could not be
    removed, for the error message."""
    left = []
    undo: list[tuple[str, bool, Callable[[], Any]]] = [
        (_stream_key(bench), bench.made.stream, lambda: _delete_stream(bench)),
        (_log_key(bench.sink, bench.spec.log), bench.made.stream, lambda: _delete_log(bench, bench.sink)),  # init-replication made it
        (_log_key(bench.source, bench.spec.log), bench.made.source_log, lambda: _delete_log(bench, bench.source)),
    ]
    for what, made, action in undo:
        if not made or what in bench.made.removed:
            continue
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - each leftover is named, the rest still goes
            left.append(f"{what} ({getattr(exc, 'message', None) or exc})")
    return left


def _stream_key(bench: ReplicationBench) -> str:
    return f"stream {bench.sink.cluster.name}/{bench.stream_id}"


def _log_key(session: ClusterSession, name: str) -> str:
    return f"log {session.cluster.name}/{name}"


def run(bench: ReplicationBench, on_progress: Progress = _quiet, on_step: Callable[[int, Step], None] | None = None) -> dict[str, Any]:
    """Apply the plan; the figures of the run with what it created and removed. On a failure or
    an interruption what the run created is removed (unless ``keep``) before the error goes up."""
    bench.on_progress = on_progress
    try:
        result = apply(bench.plan, on_step=on_step)
    except BaseException as exc:
        left = _clean_up(bench) if bench.made.anything and not bench.spec.keep else []
        if isinstance(exc, PlanFailed):
            raise _failure(bench, exc, left) from exc
        if left:
            raise PartialFailure(f"interrupted; could not remove: {'; '.join(left)}") from exc
        raise
    figures = next(o.result for o in result.outcomes if o.step.action == "bench-replication")
    return {
        "benchmark": "replication",
        "source": bench.source.cluster.name,
        "sink": bench.sink.cluster.name,
        "log": bench.spec.log,
        "stream": bench.stream_id,
        "created": bench.creates,
        "removed": list(bench.made.removed),
        **figures,
    }


def _failure(bench: ReplicationBench, failed: PlanFailed, left: list[str]) -> DlctlError:
    """The failed step's error, saying what became of what the run created (the plan's own
    'steps were applied' would mislead: the run took them back)."""
    cause = failed.__cause__
    code = getattr(cause, "exit_code", ExitCode.FAILED)
    message = getattr(cause, "message", None) or str(cause)
    hint = getattr(cause, "hint", None)
    if left:
        return PartialFailure(f"{message}; and could not remove: {'; '.join(left)}", hint=hint, details=failed.details)
    if bench.made.removed:
        message += f" (removed what this run created: {', '.join(bench.made.removed)})"
    elif bench.spec.keep and bench.made.anything:
        message += " (--keep: what this run created stays)"
    error = DlctlError(message, hint=hint, details=failed.details)
    error.exit_code = code
    return error
