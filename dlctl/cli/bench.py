"""``dlctl bench write|read|replication``: throughput and latency of a log, with issue 4's
targets beside them, and the replication lag between two clusters (issue 27).

Figures are data (stdout; ``-o json``); progress goes to stderr. Every verb writes to a log
(they are mutating: ``--dry-run`` prints what they would do). ``--create`` makes the log when
it is missing; ``write``/``read`` delete it at the end with ``--delete-after``, ``replication``
removes what it created (its stream, the log on both sides) unless ``--keep``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from ..errors import DlctlError, NotFoundError
from ..meta.records import LogConfig
from ..ops import bench, bench_replication
from ..ops.bench_lag import MIN_RECORD_SIZE, LagSpec
from ..plan import Plan, Step, apply
from ..session import ClusterSession
from .complete import complete_cluster, complete_log
from .context import AppContext, output_option, pass_app, yes_option

log = logging.getLogger("dlctl.bench")


@click.group("bench")
def bench_group() -> None:
    """Measure write and read throughput and latency of a log (issue 4's targets shown), and
    replication lag between two clusters."""


def _log_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--create", is_flag=True, help="Create LOG when it is missing (with -e/-w/-a)."),
        click.option("-e", "--ensemble-size", type=click.IntRange(1), default=3, show_default=True, help="E, for --create."),
        click.option("-w", "--write-quorum", type=click.IntRange(1), default=3, show_default=True, help="W, for --create."),
        click.option("-a", "--ack-quorum", type=click.IntRange(1), default=2, show_default=True, help="A, for --create."),
        click.option("--delete-after", is_flag=True, help="Delete LOG at the end if this run created it (never a log it found)."),
        click.option("--runs", type=click.IntRange(1), default=3, show_default=True, help="Timed runs; the median is reported, every run is listed."),
        click.option("--dry-run", is_flag=True, help="Print what would be done and do nothing."),
        yes_option,
        output_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


@contextmanager
def _progress(app: AppContext) -> Iterator[bench.Progress]:
    with app.progress() as bar:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int | None) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
                log.info("bench: %s", phase)
            bar.update(tasks[phase], completed=done, total=total)

        yield update


def _plan(
    app: AppContext,
    verb: str,
    name: str,
    create: bool,
    quorums: tuple[int, int, int],
    delete_after: bool,
    middle: list[Step],
) -> tuple[Plan, dict[str, bool]]:
    session = app.session()
    state = {"created": False, "deleted": False}
    exists = bench.log_exists(session, name)
    if not exists and not create:
        raise NotFoundError(
            f"log {name!r} does not exist in cluster {session.cluster.name!r}",
            hint="create it with `dlctl log create`, or pass --create",
        )
    config = _log_config(quorums)
    target = f"{session.cluster.name}/{name}"
    steps: list[Step] = []
    notes: list[str] = []
    if not exists:

        def create_log() -> dict[str, Any]:
            _, state["created"] = bench.prepare_log(session, name, create=True, config=config)
            return {"created": state["created"]}

        steps.append(Step("create-log", target, f"create log {name} (E={quorums[0]}, W={quorums[1]}, A={quorums[2]})", run=create_log))
    steps += middle
    if delete_after:
        if exists:
            notes.append(f"log {name} exists already: --delete-after leaves it (only a log this run creates is deleted)")
        else:

            def delete_log() -> dict[str, Any]:
                if state["created"]:
                    bench.delete_created_log(session, name)
                    state["deleted"] = True
                return {"deleted": state["deleted"]}

            steps.append(Step("delete-log", target, f"delete log {name}, which this run created", run=delete_log))
    return Plan.of(f"bench {verb}", steps, notes=notes), state


def _run(app: AppContext, plan: Plan, state: dict[str, bool], name: str, dry_run: bool, figures_action: str) -> None:
    if dry_run:
        app.render(plan)
        return
    session = app.session()
    try:
        result = apply(plan)
    except BaseException:
        # A failed or interrupted benchmark still removes the log it created, when asked to.
        if state["created"] and not state["deleted"] and any(s.action == "delete-log" for s in plan.steps):
            try:
                bench.delete_created_log(session, name)
                state["deleted"] = True
            except Exception:  # noqa: BLE001 - the original failure is what the operator must see
                log.warning("could not delete log %s, which this run created", name, exc_info=True)
        raise
    figures = next(o.result for o in result.outcomes if o.step.action == figures_action)
    figures["created_log"] = state["created"]
    figures["deleted_log"] = state["deleted"]
    app.render(figures)


@bench_group.command("write")
@click.argument("name", metavar="LOG", shell_complete=complete_log)
@click.option("--record-size", type=click.IntRange(8), default=100, show_default=True, help="Payload bytes per record.")
@click.option("--records", type=click.IntRange(1), help="Records per timed run (default 300000 unless --seconds).")
@click.option("--seconds", type=click.FloatRange(min=0.1), help="Length of each timed run, instead of --records.")
@click.option("--warmup-records", type=click.IntRange(0), help="Records written before the timed runs (default: a fifth of a run, at least 5000).")
@click.option("--sync-latency-samples", type=click.IntRange(0), default=1000, show_default=True, help="Single-record synchronous appends to time (0: skip).")
@_log_options
@pass_app
def bench_write(
    app: AppContext,
    name: str,
    record_size: int,
    records: int | None,
    seconds: float | None,
    warmup_records: int | None,
    sync_latency_samples: int,
    create: bool,
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    delete_after: bool,
    runs: int,
    dry_run: bool,
) -> None:
    """Write throughput and single-record append latency of LOG.

    \b
    (a) throughput: one pipelined writer (submit under wait_writable backpressure); a run ends
        when its last record is acknowledged; acknowledged records/s and MB/s (10^6 payload
        bytes), median of --runs runs after a warm-up; pipelined submit->ack latency sampled;
    (b) latency: append one record, wait for its acknowledgement, repeat: p50/p99/p999 in ms.

    Targets (issue 4; 3 agents, E=W=3, A=2): 100-byte records >= 100,000 records/s;
    1 KiB records >= 50 MB/s.
    """
    if records is not None and seconds is not None:
        raise click.UsageError("give --records or --seconds, not both")
    if records is None and seconds is None:
        records = 300_000
    spec = bench.WriteSpec(record_size, records, seconds, runs, warmup_records, sync_latency_samples)
    session = app.session()

    def run() -> dict[str, Any]:
        with _progress(app) as progress:
            return session.run(bench.bench_write(session, name, spec, progress))

    per_run = f"{records} records" if records is not None else f"{seconds:g} s"
    step = Step(
        "bench-write",
        f"{session.cluster.name}/{name}",
        f"append {record_size}-byte records to {name}: warm-up, {runs} timed run(s) of {per_run}, then {sync_latency_samples} synchronous appends",
        run=run,
    )
    plan, state = _plan(app, "write", name, create, (ensemble_size, write_quorum, ack_quorum), delete_after, [step])
    _run(app, plan, state, name, dry_run, "bench-write")


@bench_group.command("read")
@click.argument("name", metavar="LOG", shell_complete=complete_log)
@click.option("--rate", type=click.IntRange(0), default=bench.TARGET_TAIL_RATE, show_default=True, help="Records/s of the paced writer for the tailing measurement (0: skip it).")
@click.option("--tail-seconds", type=click.FloatRange(min=0.1), default=5.0, show_default=True, help="How long the tailing latency is measured.")
@click.option("--tail-warmup", type=click.FloatRange(min=0.0), default=1.0, show_default=True, help="Seconds of tailing before latencies count.")
@click.option("--record-size", type=click.IntRange(12), default=100, show_default=True, help="Payload bytes of the records written here (tailing, --prefill).")
@click.option("--limit", type=click.IntRange(1), help="Catch-up: read at most this many records.")
@click.option("--prefill", type=click.IntRange(0), default=0, show_default=True, help="Append this many records first (a fresh log has nothing to catch up on).")
@_log_options
@pass_app
def bench_read(
    app: AppContext,
    name: str,
    rate: int,
    tail_seconds: float,
    tail_warmup: float,
    record_size: int,
    limit: int | None,
    prefill: int,
    create: bool,
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    delete_after: bool,
    runs: int,
    dry_run: bool,
) -> None:
    """Catch-up read throughput and tailing end-to-end latency of LOG.

    \b
    (a) catch-up: read what is in LOG from its start (median of --runs reads): records/s, MB/s;
    (b) tailing: a writer in another process appends --rate records/s, each carrying its send
        time; a tailing reader here records receive time - send time: p50/p99/p999 in ms.
        These records stay in LOG.

    Target (issue 4; 3 agents, E=W=3, A=2): tailing p99 <= 20 ms at 10,000 records/s.
    """
    spec = bench.ReadSpec(runs, limit, 2.0, rate, tail_seconds, tail_warmup, record_size)
    session = app.session()
    target = f"{session.cluster.name}/{name}"
    steps = []
    if prefill:

        def fill() -> dict[str, Any]:
            with _progress(app) as progress:
                return session.run(bench.prefill(session, name, prefill, record_size, progress))

        steps.append(Step("prefill", target, f"append {prefill} records of {record_size} bytes to {name}", run=fill, piecewise=True))

    def run() -> dict[str, Any]:
        with _progress(app) as progress:
            return session.run(bench.bench_read(session, name, spec, progress))

    tailing = f"; tail it while a writer appends {rate} records/s for {tail_warmup + tail_seconds:g} s" if rate else ""
    steps.append(Step("bench-read", target, f"read {name} from its start {runs} time(s){tailing}", run=run))
    plan, state = _plan(app, "read", name, create, (ensemble_size, write_quorum, ack_quorum), delete_after, steps)
    _run(app, plan, state, name, dry_run, "bench-read")


def _cluster_session(app: AppContext, name: str) -> ClusterSession:
    """A session to cluster ``name`` of the inventory, closed with the command."""
    if name == app.cluster:
        return app.session()
    session = ClusterSession(app.inventory().cluster(name))
    click.get_current_context().call_on_close(session.close)
    return session


@bench_group.command("replication")
@click.option("--source", required=True, metavar="CLUSTER", shell_complete=complete_cluster, help="Cluster the records are written to.")
@click.option("--sink", required=True, metavar="CLUSTER", shell_complete=complete_cluster, help="Cluster they are replicated to.")
@click.option("--log", "name", default=bench_replication.DEFAULT_LOG, show_default=True, metavar="NAME", help="Log to measure: one SOURCE replicates to SINK already, or (--create) a new one.")
@click.option("--create", is_flag=True, help="Set LOG up when it does not exist: the log in SOURCE and a stream for it alone (as init-replication does); removed at the end.")
@click.option("--keep", is_flag=True, help="Leave what --create set up in place (the stream and the log on both sides).")
@click.option("--rate", type=click.IntRange(1), default=1000, show_default=True, help="Records/s written to SOURCE.")
@click.option("--seconds", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help="How long the lag is measured (after the warm-up).")
@click.option("--warmup", type=click.FloatRange(min=0.0), default=1.0, show_default=True, help="Seconds written before lags count.")
@click.option("--record-size", type=click.IntRange(MIN_RECORD_SIZE), default=100, show_default=True, help="Payload bytes per record.")
@click.option("--deliver-timeout", type=click.FloatRange(min=0.1), default=60.0, show_default=True, help="Seconds the sink may stay silent: for the first record (the stream starting), and after the last one was written.")
@click.option("-e", "--ensemble-size", type=click.IntRange(1), default=3, show_default=True, help="E, for --create.")
@click.option("-w", "--write-quorum", type=click.IntRange(1), default=3, show_default=True, help="W, for --create.")
@click.option("-a", "--ack-quorum", type=click.IntRange(1), default=2, show_default=True, help="A, for --create.")
@click.option(
    "--install-credentials/--no-install-credentials", default=True, show_default=True,
    help="For --create, as init-replication: deliver SOURCE's credentials over SSH to the SINK agents the inventory lists.",
)
@click.option("--dry-run", is_flag=True, help="Print what would be done and do nothing.")
@yes_option
@output_option
@pass_app
def bench_replication_command(
    app: AppContext, source: str, sink: str, name: str, create: bool, keep: bool, rate: int, seconds: float, warmup: float, record_size: int,
    deliver_timeout: float, ensemble_size: int, write_quorum: int, ack_quorum: int, install_credentials: bool, dry_run: bool,
) -> None:
    """Replication lag from SOURCE to SINK: what a record acknowledged in SOURCE takes to be
    readable in SINK (the RPO operators watch), next to the same reader tailing SOURCE.

    \b
    A writer (a child process) appends --rate records/s to LOG in SOURCE for --warmup +
    --seconds; each record's acknowledgement time is noted. A tailing reader in SINK and one in
    SOURCE note when each record becomes visible to them. Per record after the warm-up:
      lag      = visible in SINK   - acknowledged in SOURCE
      baseline = visible in SOURCE - acknowledged in SOURCE
    printed as p50/p90/p99/max in ms with lag - baseline and the machine's conditions. First one
    record must reach SINK within --deliver-timeout (the stream starting), so that is not timed.

    \b
    All times are this host's clock: no clock skew between the clusters enters, but this
    host's network distance to each cluster does. A record becomes readable in SOURCE when the
    writer here tells SOURCE's agents it was acknowledged (the LAC it sends next), so both
    figures include this host's round trip to SOURCE; the lag's reader is answered from SINK,
    the baseline's from SOURCE. So lag - baseline = the stream's own delay (the worker's read
    in SOURCE, the SOURCE -> SINK transfer, SINK's append and acknowledgement) + this host's
    one-way distance from SINK - its distance from SOURCE. For the link's figure run it on a
    host about as far from both clusters, or correct by the difference.

    \b
    LOG: a log SOURCE replicates to SINK already is measured as it is (this run's records stay
    in it, tagged so readers here skip any others; its writer in SOURCE is taken over). With
    --create a missing LOG is set up — the log in SOURCE, then a stream for it alone, as
    `init-replication --source SOURCE --sink SINK --logs LOG` (it creates the SINK log) — and
    removed at the end (stream and pins, then the log on both sides), also after a failure or
    Ctrl-C, unless --keep. Refused when a stream SOURCE -> SINK exists already, or a stream out
    of SOURCE or SINK has a pattern matching LOG: the new log would join it.

    \b
    Exit codes: 0 measured; 1 failed (no agent in a cluster, the stream delivered nothing
    within --deliver-timeout, records written never reached SINK — the figures are printed
    first); 2 usage (unknown cluster, bad options); 3 failed and what it created could not all
    be removed (named); 4 refused (a stream would take the new log in, SINK has the log
    already; not confirmed); 130 interrupted.
    """
    spec = bench_replication.ReplicationBenchSpec(
        log=name, create=create, keep=keep, log_config=_log_config((ensemble_size, write_quorum, ack_quorum)),
        lag=LagSpec(rate=rate, seconds=seconds, warmup=warmup, record_size=record_size, deliver_timeout=deliver_timeout),
        install_credentials=install_credentials,
    )
    source_session, sink_session = _cluster_session(app, source), _cluster_session(app, sink)
    peers = [_cluster_session(app, c) for c in app.inventory().clusters if c not in (source, sink)] if create else []
    built = bench_replication.build(source_session, sink_session, spec, peers)
    if dry_run:
        app.render(built.plan)
        return
    app.confirm(built.plan)
    with _progress(app) as progress:

        def on_step(index: int, step: Step) -> None:
            log.info("bench replication: %s", step.description)
            progress("steps", index, len(built.plan.steps))

        figures = bench_replication.run(built, progress, on_step)
    app.render(figures)
    if figures["records_missing_at_sink"]:
        raise DlctlError(
            f"{figures['records_missing_at_sink']} of {figures['records_written']} records written to {source}/{name} never reached {sink} (nothing for {deliver_timeout:g}s)",
            hint=f"see `dlctl replication status --sink {sink} {figures['stream']}`" + ("" if keep or not figures["created"] else "; the stream was removed: re-run with --keep to look at it"),
        )


def _log_config(quorums: tuple[int, int, int]) -> LogConfig:
    try:
        # Rolling as `dlctl log create` does by default: a benchmark log is an ordinary log.
        return LogConfig(*quorums, 256 * 1024 * 1024, 3600.0)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


__all__ = ["bench_group"]
