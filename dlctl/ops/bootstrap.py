"""``dlctl bootstrap``: copy the logs a sink cluster lacks from a source cluster, in bulk, on Spark.

``plan`` reads both clusters (what each log's copy covers, the snapshot point, what stands in
the way at the sink), ``as_plan`` turns that into the ``Plan`` that ``--dry-run`` prints (per
log: source range, bytes, segments, an estimate of the time at a rate measured on the source,
the snapshot point), and ``bootstrap_logs`` is the library entry point that ``dlctl bootstrap``,
``init-replication`` and ``dr recover`` call. The engine is ``dlctl.spark``: Spark, or in-process
for a copy below ``local_below`` bytes. An operation that copies several logs opens one
``engines(...)`` and passes it to every ``bootstrap_logs``: they share one Spark context.

With a stream (``--stream ID``, or ``stream_hook`` for callers), after the commit and before
the bootstrap's pin is released, each log's stream checkpoint is set to the snapshot point and
the stream's own pin at the source is moved there: the stream continues exactly where the copy
ends, and the source keeps what it needs throughout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..errors import NotFoundError, RefusedError, UsageError
from ..log.errors import AgentError
from ..meta.pins import PinRecord, PinStore
from ..plan import Plan, Step
from ..spark import job as J
from ..spark import jobplan
from ..spark import plan as SP
from ..spark.engine import EngineOptions, parse_conf
from ..spark.engines import DEFAULT_LOCAL_BELOW, Engines
from ..spark.task import EncodedReader
from ..session import ClusterSession
from ..spark.transform import Clock, ContentDigest, EntryCopier

BootstrapResult = J.BootstrapResult
Progress = J.Progress


def plan(source: ClusterSession, sink: ClusterSession, *, logs: Sequence[str] | None = None, holder: str | None = None) -> jobplan.JobPlan:
    """What a bootstrap of ``logs`` (glob patterns; all source logs when None) would do."""
    names = jobplan.match_logs(source.meta.list_logs(), logs)
    return jobplan.plan_job(source, sink, names, holder=holder or jobplan.default_holder(source.cluster.name, sink.cluster.name))


def measure_rate(source: ClusterSession, job: jobplan.JobPlan, sample_bytes: int = 16 * 1024 * 1024, max_seconds: float = 3.0) -> float | None:
    """Bytes per second one copy task manages on the source side (read from the replicas,
    re-encode, digest on both sides), over a sample from the first segments to copy (so small
    segments' per-segment cost counts); None with nothing to copy. Writes to the sink are not
    part of it: the real rate is lower by their cost."""
    first = next((lp for lp in job.logs if lp.selection.copy), None)
    if first is None:
        return None
    log_id = first.source_log.value.log_id

    async def sample() -> float | None:
        pool = await source.pool()
        reader = EncodedReader(pool)  # type: ignore[arg-type]
        try:
            await pool.refresh()
            started = time.monotonic()
            total = 0
            for seg in first.selection.copy:
                copier = EntryCopier(source_cluster=job.source_cluster, source_seq=seg.seq, sink_log_id=1, sink_seq=1, clock=Clock(job.source_cluster))
                digest = ContentDigest()
                entry_id = seg.min_active_entry
                while entry_id <= seg.last_entry_id and total < sample_bytes:
                    batch = range(entry_id, min(entry_id + 16, seg.last_entry_id + 1))
                    for encoded in await asyncio.gather(*(reader.read(log_id, seg, i) for i in batch)):
                        digest.add_entry(encoded)
                        digest.add_entry(copier.copy(encoded))
                        total += len(encoded)
                    entry_id += len(batch)
                if total >= sample_bytes or time.monotonic() - started > max_seconds:
                    break
            elapsed = time.monotonic() - started
            return total / elapsed if elapsed > 0 and total else None
        except AgentError:
            return None

    return source.run(sample())


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def as_plan(job: jobplan.JobPlan, *, rate: float | None, parallelism: int | None, run: Callable[[str], Any] | None = None, relay: bool = False) -> Plan:
    """The plan ``--dry-run`` prints: one step per log with its range, size, estimate and
    snapshot point; ``run(log)`` applies one log's step on its own."""
    slots = max(1, parallelism or _cores())
    steps = []
    for lp in job.logs:
        sel = lp.selection
        info = lp.to_dict()
        estimate = None
        if rate and sel.copy:
            estimate = sel.bytes / (rate * min(slots, len(sel.copy)))
        info["estimated_seconds"] = round(estimate, 1) if estimate is not None else None
        info["measured_rate_bytes_per_second"] = int(rate) if rate else None
        if sel.copy:
            what = (
                f"copy {lp.log} segments {sel.copy[0].seq}..{sel.copy[-1].seq} ({len(sel.copy)} segment(s), {_size(sel.bytes)}, {sel.records} records)"
                + (f", ~{_duration(estimate)} at {_size(rate)}/s per task" if estimate is not None and rate else "")
                + f"; stream continues at {sel.snapshot}"
            )
        else:
            what = f"nothing to copy for {lp.log}; stream starts at {sel.snapshot}"
        steps.append(Step("copy" if sel.copy else "none", f"{job.source_cluster}/{lp.log} -> {job.sink_cluster}/{lp.log}", what, params=info, run=(lambda name=lp.log: run(name)) if run else None, piecewise=True))
    notes = []
    for lp in job.logs:
        notes += [f"{lp.log}: {n}" for n in lp.notes]
    notes += job.blockers
    if rate:
        notes.append(f"estimates use a read+re-encode rate of {_size(rate)}/s per task measured on the source now; writing W sink replicas costs extra")
    if job.total_segments:
        notes.insert(0, f"{job.total_segments} segment(s), {_size(job.total_bytes)} from {job.source_cluster} to {job.sink_cluster} (pin holder {job.holder})")
        notes.append(
            "every segment is relayed through the copying tasks (--relay)" if relay else
            f"{job.sink_cluster}'s agents that read {job.source_cluster} (its credentials installed, as init-replication does) pull the segments themselves; "
            "the others' segments are relayed through the copying tasks"
        )
    return Plan.of("bootstrap", steps, notes=notes)


def _cores() -> int:
    import os

    return os.cpu_count() or 1


# -- streams -------------------------------------------------------------------------------------


def find_stream(inventory: Any, stream_id: str, sink_hint: str | None = None) -> tuple[str, str, tuple[str, ...]]:
    """(source cluster, sink cluster, logs) of stream ``stream_id``, from its config in the sink
    cluster: ``sink_hint`` if given, else every cluster of the inventory is asked."""
    from ..replication.store import StreamStore

    names = [sink_hint] if sink_hint else [c for c in inventory.clusters]
    for name in names:
        with ClusterSession(inventory.cluster(name)) as session:
            store = StreamStore(session.meta)
            if store.exists(stream_id):
                config = store.get_config(stream_id).value
                return config.source_cluster, config.sink_cluster, config.logs
    raise NotFoundError(f"stream {stream_id!r} is not registered in {'cluster ' + repr(sink_hint) if sink_hint else 'any cluster of the inventory'}", hint="create it with `dlctl init-replication`, or give --source and --sink")


def stream_hook(source: ClusterSession, sink: ClusterSession, stream_id: str) -> Callable[[dict[str, J.LogResult]], None]:
    """``before_release`` for a stream: per log, set its checkpoint to the snapshot point (the
    stream continues exactly after the copy) and move the stream's pin at the source there."""
    from ..replication.records import Checkpoint, StreamState
    from ..replication.store import StreamStore

    streams = StreamStore(sink.meta)
    config = streams.get_config(stream_id).value
    state = streams.get_state(stream_id).value.state
    if state is StreamState.RUNNING:
        raise RefusedError(
            f"stream {stream_id!r} is running: its workers append to the sink logs the bootstrap must commit into",
            hint=f"pause it first (dlctl replication pause {stream_id}), bootstrap, then resume it",
        )
    pins = PinStore(source.meta)

    def hook(results: dict[str, J.LogResult]) -> None:
        for name, result in results.items():
            checkpoint = Checkpoint(log=name, next=result.snapshot, source_vv=dict(result.source_vv), sink_vv=dict(result.source_vv), sink_dlsn=result.sink_dlsn)
            try:
                current = streams.get_checkpoint(stream_id, name)
                streams.update_checkpoint(stream_id, current, replace(current.value, next=result.snapshot, source_vv=dict(result.source_vv), sink_vv=dict(result.source_vv), sink_dlsn=result.sink_dlsn, needs_bootstrap=""))
            except NotFoundError:
                streams.create_checkpoint(stream_id, checkpoint)
            pins.reset(PinRecord(holder=stream_id, log=name, position=result.snapshot, sink_cluster=sink.cluster.name, max_age_seconds=config.pin_max_age_seconds))

    return hook


# -- engines -----------------------------------------------------------------------------------------


def engines(
    *,
    spark_master: str | None = None,
    parallelism: int | None = None,
    conf: dict[str, str] | Sequence[str] | None = None,
    verbose: int = 0,
    local_below: int = DEFAULT_LOCAL_BELOW,
    relay: bool = False,
) -> Engines:
    """The engines of one operation (close it at the end: ``with engines(...) as e``): copies
    below ``local_below`` bytes run in-process, the others share one Spark context (an explicit
    ``spark_master`` means Spark for every copy)."""
    if parallelism is not None and parallelism < 1:
        raise UsageError("--parallelism must be at least 1")
    if local_below < 0:
        raise UsageError("--local-below must be a size of at least 0 bytes")
    spark_conf = parse_conf(conf) if conf is not None and not isinstance(conf, dict) else dict(conf or {})
    return Engines(EngineOptions(master=spark_master, parallelism=parallelism, conf=spark_conf, verbose=verbose, relay=relay), local_below=local_below)


def copy_bytes(source: ClusterSession, name: str) -> int:
    """Bytes a bootstrap of ``name`` would copy from ``source`` now (its metadata only): what
    decides, before the copy's own plan, whether it will need Spark."""
    log = source.meta.get_log(name).value
    return SP.select([v.value for v in source.meta.segments(name)], log.max_segment_seq).bytes


def prestart_for(shared: Engines, source: ClusterSession, names: Sequence[str]) -> list[str]:
    """Start Spark in the background if a copy of one of ``names`` will need it; those logs."""
    big = [name for name in names if shared.needs_spark(copy_bytes(source, name))]
    if big:
        shared.prestart()
    return big


# -- the library entry point ------------------------------------------------------------------------


def bootstrap_logs(
    source_session: ClusterSession,
    sink_session: ClusterSession,
    logs: Sequence[str] | None,
    *,
    holder: str,
    spark_master: str | None = None,
    parallelism: int | None = None,
    throttle: float | None = None,
    progress: Callable[[J.Progress], None] | None = None,
    conf: dict[str, str] | Sequence[str] | None = None,
    verbose: int = 0,
    before_release: Callable[[dict[str, J.LogResult]], None] | None = None,
    job: jobplan.JobPlan | None = None,
    local_below: int = DEFAULT_LOCAL_BELOW,
    shared: Engines | None = None,
    relay: bool = False,
) -> J.BootstrapResult:
    """Copy ``logs`` (names or glob patterns; None: every source log) from the source cluster to
    the sink cluster and commit them atomically per log; returns, per log, the snapshot point
    (the source DLSN after the last copied record: a stream continues there), the source's
    version vector there, and the sink position of the last copied record.

    ``holder`` names the source pins and the job (``bootstrap-<stream>`` for a stream); running
    again with the same holder resumes an interrupted job. ``before_release(results)`` runs after
    the commit and before the pins are released (``stream_hook`` sets a stream's checkpoints).

    The copy runs in-process below ``local_below`` bytes, else on Spark. ``shared``: the
    operation's engines (``engines(...)``), which then decide that, and which the caller
    closes; without, this call opens its own from the engine arguments and closes them."""
    if throttle is not None and throttle <= 0:
        raise UsageError("--throttle must be a positive number of bytes per second")
    own = shared is None
    if shared is None:
        shared = engines(spark_master=spark_master, parallelism=parallelism, conf=conf, verbose=verbose, local_below=local_below, relay=relay)
    try:
        if job is None:
            job = plan(source_session, sink_session, logs=logs, holder=holder)
        return J.execute(job, source_session, sink_session, shared, throttle=throttle, progress=progress, before_release=before_release)
    finally:
        if own:
            shared.close()


__all__ = ["DEFAULT_LOCAL_BELOW", "BootstrapResult", "Progress", "as_plan", "bootstrap_logs", "copy_bytes", "engines", "find_stream", "measure_rate", "plan", "prestart_for", "stream_hook"]
