"""``dlctl bootstrap``: bulk-copy logs from a source cluster to a sink cluster with Spark."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from ..errors import RefusedError, UsageError
from ..ops import bootstrap as ops
from ..session import ClusterSession
from .complete import complete_cluster, complete_stream
from .context import AppContext, output_option, pass_app, yes_option

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)(?:/s)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_rate(text: str | None) -> float | None:
    """``--throttle`` values: bytes per second, with an optional K/M/G/T suffix (powers of 1024)."""
    if text is None:
        return None
    match = _SIZE.fullmatch(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f"--throttle {text!r}: expected bytes per second, e.g. 50M or 2GiB/s")
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


def parse_size(text: str, option: str = "--local-below") -> int:
    """A size in bytes, with an optional K/M/G/T suffix (powers of 1024); 0 is allowed."""
    match = _SIZE.fullmatch(text.strip())
    if not match or text.strip().lower().endswith("/s"):
        raise UsageError(f"{option} {text!r}: expected a size, e.g. 0, 512M or 2GiB")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _mib(n: int) -> str:
    return f"{n // 1024**3}GiB" if n % 1024**3 == 0 else f"{n // 1024**2}MiB"


LOCAL_BELOW_DEFAULT = _mib(ops.DEFAULT_LOCAL_BELOW)
LOCAL_BELOW_HELP = (
    "Copies of less than SIZE bytes (e.g. 512M, 2GiB) run in this process on a thread pool instead of on Spark, whose start costs "
    "seconds; same verification, same resumable job records. 0: always Spark. An explicit --spark-master always means Spark."
)


def _patterns(values: tuple[str, ...]) -> list[str] | None:
    out = [p.strip() for v in values for p in v.split(",") if p.strip()]
    return out or None


@contextmanager
def _progress(app: AppContext) -> Iterator[Any]:
    """Segments, bytes, rate and ETA on stderr (fed by the Spark status tracker and the tasks'
    results); silent with -q or without a terminal."""
    disable = app.verbosity < 0 or not app.stderr.is_terminal
    with Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[segments]}"),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=app.stderr,
        transient=True,
        disable=disable,
    ) as bar:
        task = bar.add_task("planning", total=None, segments="")

        def update(p: ops.Progress) -> None:
            bar.update(
                task,
                description=p.phase,
                total=max(1, p.bytes_total) if p.bytes_total else None,
                completed=min(p.bytes_done, p.bytes_total) if p.bytes_total else 0,
                segments=f"{p.segments_done}/{p.segments_total} segments" + (f" ({p.active} running)" if p.active else ""),
            )

        yield update


@click.command("bootstrap")
@click.option("--source", "source_name", metavar="CLUSTER", shell_complete=complete_cluster, help="The cluster that holds the data.")
@click.option("--sink", "sink_name", metavar="CLUSTER", shell_complete=complete_cluster, help="The cluster to copy it to.")
@click.option("--stream", "stream_id", metavar="ID", shell_complete=complete_stream, help="Bootstrap a replication stream: its source, sink and logs; afterwards its checkpoints are set to the snapshot point.")
@click.option("--logs", "logs", multiple=True, metavar="PATTERN", help="Logs to copy (shell globs; repeat or separate with commas). Default: every source log (or the stream's).")
@click.option("--spark-master", metavar="URL", help="Run the job on this Spark master instead of local mode (local[N] by default).")
@click.option("--parallelism", type=click.IntRange(1, 1024), default=None, help="Segments copied at the same time (local[N]); default: every core, and an in-process copy the sink agents pull keeps two pulls per sink agent going (at most 32).")
@click.option("--throttle", metavar="BYTES/S", help="Cap the job's copy rate, e.g. 50M (split evenly over the tasks running at once).")
@click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE", help="A Spark setting passed through (repeatable). Secrets are refused here: use spark-defaults.conf.")
@click.option("--local-below", "local_below", metavar="SIZE", default=LOCAL_BELOW_DEFAULT, show_default=True, help=LOCAL_BELOW_HELP)
@click.option("--relay", is_flag=True, help="Copy every segment through this machine (or the Spark executors), even where the sink agents could read the source themselves.")
@click.option("--dry-run", is_flag=True, help="Print per log: source range, bytes, segments, estimated time at a rate measured now, snapshot point. Change nothing.")
@yes_option
@output_option
@pass_app
def bootstrap_command(
    app: AppContext,
    source_name: str | None,
    sink_name: str | None,
    stream_id: str | None,
    logs: tuple[str, ...],
    spark_master: str | None,
    parallelism: int | None,
    throttle: str | None,
    conf: tuple[str, ...],
    local_below: str,
    relay: bool,
    dry_run: bool,
) -> None:
    """Copy logs in bulk from a source cluster to a sink cluster with a Spark job, when streaming
    alone cannot catch up (a new sink cluster, or a sink behind what the source retains).

    The source is pinned at the copy's first segment while it runs; one Spark task per source
    segment reads it from any replica (CRC-checked, speculative) and writes a sink segment on an
    ensemble chosen by the sink's placement policy, each record keeping its origin. Content
    digests are compared on both sides, and only when every segment of a log is verified is the
    sink's segment list committed, in one atomic update. An interrupted or failed job leaves
    nothing visible at the sink; running it again resumes (verified copies are kept).

    A copy of less than --local-below bytes runs in this process instead (the same tasks on a
    thread pool): for a small copy, starting Spark would cost more than the copy. The result
    names the engine that ran it.

    Sink agents that read the source cluster (it is declared on them, as init-replication does)
    copy each segment themselves, one network leg instead of two; the tasks then only choose
    ensembles and verify. --relay moves every byte through the tasks instead.

    Local mode runs here. With --spark-master the cluster secrets travel to executors as a Spark
    broadcast, refused unless spark.authenticate, spark.network.crypto.enabled and
    spark.io.encryption.enabled are true (pass them with --conf; the authentication secret goes
    in spark-defaults.conf, never on the command line). Spark's own log goes to a file (named in
    the output) unless -v.
    """
    inventory = app.inventory()
    patterns = _patterns(logs)
    rate = parse_rate(throttle)
    threshold = parse_size(local_below)
    holder = None
    if stream_id is not None:
        src, dst, stream_logs = ops.find_stream(inventory, stream_id, sink_name or app.cluster_option)
        if source_name and source_name != src or sink_name and sink_name != dst:
            raise UsageError(f"stream {stream_id!r} replicates {src} -> {dst}, not {source_name or src} -> {sink_name or dst}")
        source_name, sink_name = src, dst
        patterns = patterns or list(stream_logs)
        holder = f"bootstrap-{stream_id}"
    if not source_name or not sink_name:
        raise UsageError("name the clusters: --source CLUSTER --sink CLUSTER (or --stream ID)")
    shared = ops.engines(spark_master=spark_master, parallelism=parallelism, conf=list(conf), verbose=max(0, app.verbosity), local_below=threshold, relay=relay)
    with shared, ClusterSession(inventory.cluster(source_name)) as source, ClusterSession(inventory.cluster(sink_name)) as sink:
        if not dry_run and shared.needs_spark(0):
            shared.prestart()  # Spark whatever the size: it starts while the plan is made
        job = ops.plan(source, sink, logs=patterns, holder=holder)
        if dry_run:
            measured = ops.measure_rate(source, job)
            app.render(ops.as_plan(job, rate=measured, parallelism=parallelism, relay=relay))
            return
        if job.blockers:
            raise RefusedError("bootstrap refused: " + "; ".join(job.blockers), hint="nothing was changed; --dry-run shows the plan")
        plan = ops.as_plan(job, rate=None, parallelism=parallelism, relay=relay)
        app.confirm(plan)
        hook = ops.stream_hook(source, sink, stream_id) if stream_id else None
        with _progress(app) as update:
            result = ops.bootstrap_logs(
                source, sink, patterns,
                holder=job.holder,
                throttle=rate,
                progress=update,
                before_release=hook,
                job=job,
                shared=shared,
            )
    app.render(result.to_dict())
