"""``dlctl init-replication`` and ``dlctl replication list|status|pause|resume|delete|check|wait-drain``."""

from __future__ import annotations

from datetime import datetime, timezone

import click

from ..errors import ConfigError, NotFoundError
from ..log.dlsn import DLSN
from ..ops import replication as ops
from ..ops import streams as stream_ops
from ..session import ClusterSession
from ..output import Table
from ..plan import Plan
from ..replication.records import COMPRESSIONS
from .bootstrap import LOCAL_BELOW_DEFAULT, parse_size
from .complete import complete_cluster, complete_stream
from .context import (
    AppContext,
    command_options,
    mutating,
    output_option,
    pass_app,
    yes_option,
)


def cluster_session(app: AppContext, name: str | None) -> ClusterSession:
    """A session to cluster ``name`` (the selected cluster when None), closed with the command."""
    if name is None or name == app.cluster:
        return app.session()
    session = ClusterSession(app.inventory().cluster(name))
    click.get_current_context().call_on_close(session.close)
    return session


def _source_of(app: AppContext, sink: ClusterSession, stream_id: str) -> ClusterSession | None:
    source = stream_ops.source_of(sink, stream_id)
    try:
        return cluster_session(app, source)
    except (ConfigError, NotFoundError):
        return None


sink_option = click.option("--sink", metavar="CLUSTER", default=None, shell_complete=complete_cluster, help="The stream's sink cluster (default: the selected cluster).")


@click.command("init-replication")
@click.option("--source", required=True, metavar="CLUSTER", shell_complete=complete_cluster, help="Cluster to replicate from.")
@click.option("--sink", required=True, metavar="CLUSTER", shell_complete=complete_cluster, help="Cluster to replicate to.")
@click.option("--logs", "patterns", multiple=True, metavar="PATTERN", help="Logs to replicate (shell patterns; repeatable). Default: every log.")
@click.option("--bidirectional", is_flag=True, help="Active-active: also replicate SINK -> SOURCE, with the causality filter.")
@click.option("--causal", is_flag=True, help="A one-way edge of an active-active network (a chain, a directed cycle): the sink takes local writes too and applies the causality filter.")
@click.option("--start-from", "start_from", metavar="now|SEG/ENTRY/SLOT|TIME", help="Causal streams: 'now' joins SINK without the past SOURCE deleted. One-way streams: start at the source's end (now), at a position, or at a time (ISO 8601; the first segment open or completed at or after it).")
@click.option("--filter", "filters", multiple=True, metavar="CLAUSE", help="Carry only records matching CLAUSE: key=PATTERN or header.NAME=PATTERN (shell patterns; repeatable: all must match). Only into a terminal location (passing nothing on) whose every feed carries the same filter, never on a connection that is or was on a cycle; a filter once set is never changed or removed.")
@click.option("--bootstrap", type=click.Choice(ops.BOOTSTRAP_MODES), default="auto", show_default=True, help="auto: copy only where needed; never: refuse if needed; always: copy every log.")
@click.option("--throttle", type=click.IntRange(0), default=0, show_default=True, help="Bytes per second per log and direction (0: unlimited).")
@click.option("--pin-max-age", type=click.FloatRange(min=1.0), default=7 * 24 * 3600.0, show_default=True, help="Seconds after which an unrefreshed retention pin stops protecting source data.")
@click.option(
    "--compression", type=click.Choice(COMPRESSIONS), default=None,
    help=f"How records cross the WAN: zstd (negotiated with each source agent; plain from one that cannot) or none. Default: an existing stream keeps its own, a new one gets {ops.NEW_STREAM_COMPRESSION}.",
)
@click.option(
    "--install-credentials/--no-install-credentials", default=True, show_default=True,
    help="Deliver SOURCE's credentials (secret, ZooKeeper credentials, a client certificate of its CA) over SSH to every SINK agent the inventory lists (and back with --bidirectional), into <home>/sources/SOURCE/. Without: each agent must declare the source in its agent.toml.",
)
@click.option("--bootstrap-local-below", "local_below", metavar="SIZE", default=LOCAL_BELOW_DEFAULT, show_default=True, help="Bootstrap copies of less than SIZE bytes (e.g. 512M, 2GiB) run in this process instead of on Spark, whose start costs seconds; the others share one Spark context, started in the background at the beginning. 0: always Spark.")
@click.option("--dry-run", is_flag=True, help="Print the plan (each log's decision and why) and change nothing.")
@yes_option
@output_option
@pass_app
def init_replication_command(
    app: AppContext, source: str, sink: str, patterns: tuple[str, ...], bidirectional: bool, causal: bool, start_from: str | None,
    filters: tuple[str, ...], bootstrap: str, throttle: int, pin_max_age: float, compression: str | None, install_credentials: bool, local_below: str, dry_run: bool,
) -> None:
    """Set up replication of logs from SOURCE to SINK (and back with --bidirectional).

    Registers the stream in both clusters (sink: config, state, checkpoints; source: retention
    pins), creates missing sink logs, and decides per log: stream from the start (new stream,
    the source holds the whole log), resume (existing stream, checkpoint still retained) or
    bootstrap (the sink has data or the source truncated what it needs). A new causal connection
    (--bidirectional, --causal) from a source that deleted events starts only once the sink holds
    them (the location-addition rule): until then `replication status` shows it
    waiting-for-causal-past, naming what the sink lacks. Idempotent: re-run it after any failure
    to complete the setup. A sink agent reads only sources declared to it: this command installs
    SOURCE's credentials on SINK's agents first (a node out of reach: exit 3, re-run). Exit 4 when
    a bootstrap is required and unavailable."""
    built = ops.init_plan(
        cluster_session(app, source), cluster_session(app, sink),
        patterns=patterns or ("*",), bidirectional=bidirectional, causal=causal, bootstrap=bootstrap, throttle=throttle, pin_max_age=pin_max_age,
        start_from=_start_from(start_from) if start_from else None, filters=filters,
        peers=[cluster_session(app, name) for name in app.inventory().clusters if name not in (source, sink)], compression=compression,
        install_credentials=install_credentials, bootstrap_local_below=parse_size(local_below, "--bootstrap-local-below"),
    )
    if dry_run:
        app.render(built.plan)
        return
    ops.refuse_unavailable_bootstrap(built)
    if built.plan.empty:
        app.render(built.plan)
        return
    app.confirm(built.plan)
    app.render(app.run_plan(built.plan))


def _start_from(text: str) -> ops.StartFrom:
    """``now``, a position (SEG/ENTRY/SLOT) or an ISO 8601 time (``Z`` or an offset; no zone: UTC)."""
    if text == "now":
        return ops.StartFrom("now")
    if "/" in text:
        try:
            return ops.StartFrom("position", position=DLSN.parse(text))
        except ValueError as exc:
            raise click.BadParameter(f"{text!r}: {exc}", param_hint="--start-from") from None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither 'now', a position SEG/ENTRY/SLOT nor an ISO 8601 time", param_hint="--start-from") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return ops.StartFrom("time", time=when.timestamp())


@click.group("replication")
def replication_group() -> None:
    """Inspect and operate replication streams between clusters."""


@replication_group.command("list")
@command_options
@pass_app
def list_command(app: AppContext) -> None:
    """Streams of every cluster in the inventory (as sinks), with state and worker count."""
    inventory = app.inventory()
    sessions = [cluster_session(app, name) for name in inventory.clusters]
    app.render(Table(stream_ops.list_streams(sessions), ["stream", "source", "sink", "state", "logs", "workers", "bidirectional"], title="replication streams"))


def _status_table(status: dict) -> Table:
    columns = [
        "log", "state", "lag_records", "lag_bytes", "lag_seconds", "safe_time_ago", "last_applied", "last_contact_ago", "worker", "worker_region", "last_error", "needs_bootstrap",
        "waiting_for", "left_at_source", "compression", "compression_ratio",
    ]
    drift = "; ".join(f"{d['log']}: {d['kind']} ({d['detail']})" for d in status.get("drift", ()))
    patterns = " ".join(status.get("patterns", ())) or "-"
    return Table(
        status["logs"], columns, title=f"stream {status['stream']}: {status['source']} -> {status['sink']} ({status['state']})",
        caption=f"logs joining by pattern: {patterns}" + (f"\ndrift: {drift}" if drift else "") + f"\nsafe time: {_safe_time(status)}",
    )


def _safe_time(status: dict) -> str:
    """The stream's safe time for people: when, and how long ago."""
    if not status.get("safe_time"):
        return "none yet (a log has not caught up with a measure of its source)"
    when = datetime.fromtimestamp(status["safe_time"], timezone.utc).isoformat(timespec="milliseconds")
    return f"{when} ({status['safe_time_ago']}s ago): the sink holds everything the source held then"


def _statuses(app: AppContext, stream: str | None, sink_name: str | None) -> list[dict]:
    sink = cluster_session(app, sink_name)
    ids = [stream] if stream else stream_ops.stream_ids(sink)
    if not ids:
        raise NotFoundError(f"no stream has cluster {sink.cluster.name!r} as its sink", hint="create one with `dlctl init-replication`")
    return [stream_ops.stream_status(sink, _source_of(app, sink, i), i) for i in ids]


@replication_group.command("status")
@click.argument("stream", required=False, shell_complete=complete_stream)
@sink_option
@command_options
@pass_app
def status_command(app: AppContext, stream: str | None, sink: str | None) -> None:
    """Per log: lag in records, bytes and seconds, last applied source position, last contact,
    last error, worker and its region, paused/running, whether a bootstrap is needed, the safe
    time (every record the source held then is at the sink; per log, and the stream's: the
    oldest of its logs'), and the compression in effect (zstd, none, or none when the source
    agents lack zstd) with its ratio (the source's answers' bytes decoded / on the wire, over the
    stream's life)."""
    statuses = _statuses(app, stream, sink)
    if app.output == "table":
        for status in statuses:
            app.render(_status_table(status))
    else:
        app.render(statuses if stream is None else statuses[0])


@replication_group.command("check")
@click.argument("stream", required=False, shell_complete=complete_stream)
@sink_option
@click.option("--max-lag-seconds", type=click.FloatRange(min=0), default=None, help="Critical above this lag in seconds.")
@click.option("--max-lag-records", type=click.IntRange(0), default=None, help="Critical above this lag in records.")
@command_options
@pass_app
def check_command(app: AppContext, stream: str | None, sink: str | None, max_lag_seconds: float | None, max_lag_records: int | None) -> None:
    """Monitoring check: exit 0 ok, 1 warning (paused, no worker, recent error), 2 critical
    (a threshold exceeded, a log needs a bootstrap, or its checkpoint or pin cannot be read)."""
    worst, results = 0, []
    for status in _statuses(app, stream, sink):
        code, problems = stream_ops.check(status, max_lag_seconds=max_lag_seconds, max_lag_records=max_lag_records)
        worst = max(worst, code)
        results.append({"stream": status["stream"], "status": ("OK", "WARNING", "CRITICAL")[code], "problems": problems})
    if app.output == "table":
        for r in results:
            app.stdout.print(f"{r['status']}: stream {r['stream']}" + ("".join(f"\n  {p}" for p in r["problems"])), markup=False, highlight=False)
    else:
        app.render(results if stream is None else results[0])
    if worst:
        raise click.exceptions.Exit(worst)


@replication_group.command("topology")
@command_options
@pass_app
def topology_command(app: AppContext) -> None:
    """The replication network of the inventory's locations: every connection (a pair <==>, a
    one-way edge ===>), whether it lies on a cycle now or ever did, its filter; then the
    network's history (connections made and removed, filters, retirements), merged from every
    location. Locations out of reach are named (their view is missing)."""
    from ..ops import network

    view = network.topology([cluster_session(app, name) for name in app.inventory().clusters])
    if app.output != "table":
        app.render(view)
        return
    for line in network.graph_lines(view):
        app.stdout.print(line, markup=False, highlight=False)
    if view["retired"]:
        app.stdout.print("retired: " + ", ".join(view["retired"]), markup=False, highlight=False)
    for gone, counters in sorted(view["settled"].items()):
        logs = ", ".join(f"{log} at {n}" for log, n in sorted(counters.items()))
        app.stdout.print(f"settled: {gone} (left the timestamps of new records in {logs})", markup=False, highlight=False)
    for gone in view["unreachable"]:
        app.stdout.print(f"unreachable: {gone['location']} ({gone['error']}): its part of the network is missing", markup=False, highlight=False)
    history = [{"time": e["time"], "event": e["kind"], "edge": f"{e['source']} -> {e['sink']}" if e["sink"] else e["source"], "stream": e["stream"], "filter": e["filter"], "note": e["note"]} for e in view["history"]]
    app.render(Table(history, ["time", "event", "edge", "stream", "filter", "note"], title="network history"))


@replication_group.command("pause")
@click.argument("stream", shell_complete=complete_stream)
@sink_option
@mutating(confirm=False)
def pause_command(app: AppContext, stream: str, sink: str | None) -> Plan:
    """Pause STREAM: its workers checkpoint and stop; pins keep the source data it needs."""
    return stream_ops.pause_plan(cluster_session(app, sink), stream)


@replication_group.command("resume")
@click.argument("stream", shell_complete=complete_stream)
@sink_option
@mutating(confirm=False)
def resume_command(app: AppContext, stream: str, sink: str | None) -> Plan:
    """Resume a paused STREAM from its checkpoints."""
    return stream_ops.resume_plan(cluster_session(app, sink), stream)


@replication_group.command("delete")
@click.argument("stream", shell_complete=complete_stream)
@sink_option
@mutating(confirm=True)
def delete_command(app: AppContext, stream: str, sink: str | None) -> Plan:
    """Delete STREAM: stop its workers, remove its pins at the source and its state at the sink.
    The sink logs and their data stay."""
    sink_session = cluster_session(app, sink)
    return stream_ops.delete_plan(sink_session, _source_of(app, sink_session, stream), stream)


@replication_group.command("retire")
@click.argument("location", shell_complete=complete_cluster)
@mutating(confirm=True)
def retire_command(app: AppContext, location: str) -> Plan:
    """Remove LOCATION from the replication network for good: delete every stream into or out
    of it (as `replication delete`), then record its retirement in the network history of every
    location in reach. A retired location never joins again under that name. Once every location
    holds its events in a log, that is recorded too (settled): new records' timestamps stop
    carrying its id there. The result names the logs still behind; run retire again to settle
    them once they caught up (it is idempotent)."""
    from ..ops import network

    return network.retire_plan(location, [cluster_session(app, name) for name in app.inventory().clusters])


@replication_group.command("wait-drain")
@click.argument("stream", shell_complete=complete_stream)
@sink_option
@click.option("--timeout", type=click.FloatRange(min=0), default=None, help="Give up (exit 1) after this many seconds.")
@command_options
@pass_app
def wait_drain_command(app: AppContext, stream: str, sink: str | None, timeout: float | None) -> None:
    """Wait until the sink has everything the source held when this command started."""
    sink_session = cluster_session(app, sink)
    source = _source_of(app, sink_session, stream)
    if source is None:
        raise ConfigError(f"the source cluster of stream {stream!r} is not in the inventory; wait-drain needs to read it")
    with app.progress() as bar:
        task = bar.add_task(f"draining {stream}", total=None)

        def on_progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        app.render(stream_ops.wait_drain(sink_session, source, stream, timeout=timeout, on_progress=on_progress))
