"""The driver of a bootstrap copy (DESIGN.md §8): pin, reserve, copy on Spark, verify, commit
atomically, clean up, release — the plan it applies is ``dlctl.spark.jobplan``'s.

Order of events for each log, and why:

1. **Pin** the source log at the first segment to copy (``PinStore``, holder ``bootstrap-…``),
   *then* re-read its segments: whatever truncation ran before the pin took hold is seen, and
   nothing the copy needs can be deleted after it.
2. **Reserve** the sink segment numbers by CAS on the sink log record (created first when the
   sink has no such log). Numbers are assigned up front; a reserved number is never a writer's,
   so replicas an interrupted job leaves behind can never mix with a later segment.
3. **Copy** on Spark, one task per source segment or range of them (``task.copy_segments``);
   a small copy runs the same tasks in-process instead (``engines``: Spark's fixed cost would
   be most of it). Each verified result is recorded at once in the job record
   ``ops/<holder>.<log>`` of the *sink* cluster.
4. **Commit** once every segment of the log is verified: one ZooKeeper transaction
   (``MetaStore.commit_segments``) makes them all visible in order, or none. Until then the
   sink's metadata names none of them: a failed or killed job leaves nothing visible.
5. **Clean up** replicas of the reserved numbers that the committed segments do not name
   (earlier attempts on other agents), then hand the results to the caller (which sets the
   stream checkpoint) and **release** the pin.

Re-running the same job (same holder) resumes: the reservation is kept while the sink log is
untouched, verified copies whose replicas still answer with the recorded digests are not copied
again, and orphans of earlier attempts are deleted before copying.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConflictError, NotFoundError, PartialFailure, RefusedError
from ..log.dlsn import DLSN
from ..log.errors import AgentError
from ..meta.operations import OperationRecord
from ..meta.pins import PinRecord, PinStore
from ..meta.records import SegmentState
from . import clockbase
from . import plan as P
from .engine import EngineOptions, StageProgress
from .engines import Engine, Engines
from .jobplan import OP_KIND, JobPlan, LogPlan, op_id
from .task import Endpoints, copy_segments, scan_clocks
from .transform import ClockEffect

if TYPE_CHECKING:  # (imported for types only: executors never load it)
    from ..session import ClusterSession

log = logging.getLogger(__name__)

_DIGEST_CHARS = 32  # digests kept in the job record: 128 bits is plenty to recognise a copy


# -- results -----------------------------------------------------------------------------------------


@dataclass
class LogResult:
    log: str
    snapshot: DLSN  # the first source position the sink does not hold: a stream continues here
    source_vv: dict[str, int]  # the source log's version vector before ``snapshot``
    sink_dlsn: DLSN | None  # sink position of the last copied record
    segments: int  # source segments in the copy
    copied: int  # copied by this run
    reused: int  # verified by an earlier run and kept
    records: int
    bytes: int  # sink bytes
    source_range: tuple[int, int] | None
    sink_range: tuple[int, int] | None
    committed: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "log": self.log,
            "snapshot": str(self.snapshot),
            "source_vv": dict(self.source_vv),
            "sink_dlsn": str(self.sink_dlsn) if self.sink_dlsn else None,
            "segments": self.segments,
            "copied": self.copied,
            "reused": self.reused,
            "records": self.records,
            "bytes": self.bytes,
            "source_range": list(self.source_range) if self.source_range else None,
            "sink_range": list(self.sink_range) if self.sink_range else None,
            "committed": self.committed,
        }


@dataclass
class BootstrapResult:
    holder: str
    source_cluster: str
    sink_cluster: str
    logs: dict[str, LogResult]
    seconds: float
    bytes_copied: int  # source bytes read by this run's copies
    spark_log: str | None
    engine: str = "none"  # where the copy ran: "spark", "local" (in-process: a small copy) or "none" (nothing to copy)
    spark_starts: int = 0  # Spark contexts started since the operation began (shared by its copies)
    pulled_segments: int = 0  # of the copied segments, those the sink agents read from the source themselves (the rest were relayed)

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_copied / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "holder": self.holder,
            "source": self.source_cluster,
            "sink": self.sink_cluster,
            "seconds": round(self.seconds, 3),
            "bytes_copied": self.bytes_copied,
            "bytes_per_second": int(self.bytes_per_second),
            "spark_log": self.spark_log,
            "engine": self.engine,
            "spark_starts": self.spark_starts,
            "pulled_segments": self.pulled_segments,
            "logs": [r.to_dict() for r in self.logs.values()],
        }


@dataclass
class Progress:
    """What the caller's progress display gets: the phase and the running stage's numbers."""

    phase: str
    segments_total: int
    segments_done: int
    bytes_total: int
    bytes_done: int
    rate: float
    eta: float | None
    active: int = 0


# -- the job record (sink ops/<holder>.<log>) ---------------------------------------------------------


class _Record:
    """One log's job record (``dlctl.meta.operations``; results arrive from the Spark monitor
    thread). A finished job of the same holder is started over; an unfinished one continues."""

    def __init__(self, meta: Any, holder: str, lp: LogPlan, source_cluster: str) -> None:
        fresh = {"kind": OP_KIND, "holder": holder, "log": lp.log, "source": source_cluster, "sink": meta.cluster}
        self.record = OperationRecord.start(meta, op_id(holder, lp.log), fresh, restart_if=lambda record: record.get("state") == "done")

    def write(self, **changes: Any) -> None:
        try:
            self.record.set(**changes)
        except ConflictError as exc:
            raise ConflictError(f"aborted: job record ops/{self.record.op_id} keeps changing (is another run of this job going on?)") from exc


def _compact(result: dict[str, Any]) -> dict[str, Any]:
    """What the job record keeps of a verified copy (enough to commit it and to re-check it)."""
    keep = ("sink_seq", "first_entry", "last_entry", "start_vv", "end_vv", "ensemble", "replica_entries", "records", "sink_bytes", "source_bytes", "first_txid", "last_txid", "last_data_slot")
    out = {k: result.get(k) for k in keep}
    out["replica_expected"] = {n: d[:_DIGEST_CHARS] for n, d in (result.get("replica_expected") or {}).items()}
    out["digest"] = str(result.get("sink_digest", ""))[:_DIGEST_CHARS]
    return out


# -- applying ----------------------------------------------------------------------------------------


def execute(
    job: JobPlan,
    source: ClusterSession,
    sink: ClusterSession,
    engines: Engines,
    *,
    throttle: float | None = None,
    progress: Callable[[Progress], None] | None = None,
    before_release: Callable[[dict[str, LogResult]], None] | None = None,
) -> BootstrapResult:
    """Run the job (see the module docstring). Raises ``RefusedError`` before changing anything
    when a sink log is in the way, ``PartialFailure`` naming the segments when some copies
    failed (their logs stay uncommitted, verified copies are kept for the next run).

    ``engines`` runs the copy: in-process when it is small, else on the operation's shared Spark
    context, whose start begins here, before the pins and reservations, so it overlaps them;
    the caller closes ``engines`` (Spark is not stopped here: the operation's next copy reuses it)."""
    if job.blockers:
        raise RefusedError("bootstrap refused: " + "; ".join(job.blockers), hint="nothing was changed")
    started = time.monotonic()
    to_copy = _bytes_to_copy(job)
    if to_copy is not None and engines.needs_spark(to_copy):
        engines.prestart()
    pins = PinStore(source.meta)
    work = [lp for lp in job.logs]
    records = {lp.log: _Record(sink.meta, job.holder, lp, job.source_cluster) for lp in work}
    tasks: dict[str, list[P.SegmentTask]] = {}
    progresses: dict[str, P.LogProgress] = {}
    for lp in work:
        _pin(pins, job, lp)
        _recheck_source(source, lp)
        progresses[lp.log] = _reserve(sink, lp, records[lp.log])
    engine: Engine | None = None
    copied_bytes = 0
    pulled = 0
    reused: dict[str, int] = {}
    copied: dict[str, int] = {}
    failures: list[str] = []
    if to_copy is not None:
        sink_nodes = sink.meta.available_nodes()  # read once: the engine's size and the tasks' endpoints
        engine = engines.for_copy(to_copy, sink_agents=len(sink_nodes))
        endpoints = _endpoints(engine, source, sink, sink_nodes, throttle, engines.options)
        effects = _clock_effects(engine, endpoints, job, [lp for lp in work if not lp.assume_local and lp.selection.copy], progresses, progress)
        for lp in work:
            tasks[lp.log] = _tasks(job, lp, progresses[lp.log], effects.get(lp.log))
        pending: list[P.SegmentTask] = []
        for lp in work:
            keep = _still_verified(sink, progresses[lp.log], tasks[lp.log])
            prog = progresses[lp.log]
            prog.verified = {seq: r for seq, r in prog.verified.items() if seq in keep}
            records[lp.log].write(progress=prog.to_dict())
            reused[lp.log] = len(keep)
            pending += [t for t in tasks[lp.log] if t.source.seq not in keep]
        _sweep_orphans(sink, progresses, tasks, committed=False)
        results, needs_clock = _copy(engine, endpoints, pending, progresses, records, progress, job)
        if needs_clock:
            # A log assumed to hold only its own records holds replicated ones: its clocks
            # (and so every copy of it) must be redone after a pre-pass.
            redo = [lp for lp in work if lp.log in needs_clock]
            for lp in redo:
                lp.assume_local = False
                progresses[lp.log].verified = {}
            effects.update(_clock_effects(engine, endpoints, job, redo, progresses, progress))
            again = []
            for lp in redo:
                tasks[lp.log] = _tasks(job, lp, progresses[lp.log], effects.get(lp.log))
                again += tasks[lp.log]
            results = [r for r in results if r.get("log") not in needs_clock]
            more, _ = _copy(engine, endpoints, again, progresses, records, progress, job)
            results += more
        for r in results:
            problem = P.verification_problem(r)
            if problem is None:
                copied[r["log"]] = copied.get(r["log"], 0) + 1
                copied_bytes += int(r.get("source_bytes", 0))
                pulled += bool(r.get("pulled"))
            else:
                failures.append(problem)
    out: dict[str, LogResult] = {}
    incomplete = []
    for lp in work:
        prog = progresses[lp.log]
        log_tasks = tasks.get(lp.log, [])
        if any(t.source.seq not in prog.verified for t in log_tasks):
            incomplete.append(lp.log)
            records[lp.log].write(state="incomplete", progress=prog.to_dict())
            continue
        _commit(sink, lp, prog, log_tasks, job, records[lp.log], progress)
        out[lp.log] = _log_result(lp, prog, log_tasks, copied.get(lp.log, 0), reused.get(lp.log, 0))
    _sweep_orphans(sink, {k: v for k, v in progresses.items() if k in out}, tasks, committed=True)
    if before_release is not None and out:
        before_release(out)
    for name in out:
        pins.delete(job.holder, name)
        records[name].write(state="done", summary=out[name].to_dict())
    result = BootstrapResult(
        job.holder, job.source_cluster, job.sink_cluster, out, time.monotonic() - started, copied_bytes,
        str(engine.log_path) if engine is not None and engine.log_path else None,
        engine=engine.kind if engine is not None else "none", spark_starts=engines.spark_starts, pulled_segments=pulled,
    )
    if incomplete:
        raise PartialFailure(
            f"bootstrap of {', '.join(incomplete)} did not complete: " + "; ".join(failures[:5]) + (f"; and {len(failures) - 5} more" if len(failures) > 5 else ""),
            hint="nothing of those logs is visible at the sink; fix what is named and re-run the same command: verified copies are kept",
            details=dict(result.to_dict(), failures=failures, incomplete=incomplete),
        )
    return result


def _bytes_to_copy(job: JobPlan) -> int | None:
    """Source bytes this run copies (an earlier run's verified copies are likely kept, so they
    do not count); None when no log has anything to copy."""
    if not any(lp.selection.copy for lp in job.logs):
        return None
    kept = {lp.log: set(lp.progress.verified) if lp.progress else set() for lp in job.logs}
    return sum(seg.bytes for lp in job.logs for seg in lp.selection.copy if seg.seq not in kept[lp.log])


def _pin(pins: PinStore, job: JobPlan, lp: LogPlan) -> None:
    sel = lp.selection
    position = DLSN(sel.copy[0].seq, 0, 0) if sel.copy else sel.snapshot
    pins.reset(PinRecord(holder=job.holder, log=lp.log, position=position, sink_cluster=job.sink_cluster))


def _recheck_source(source: ClusterSession, lp: LogPlan) -> None:
    """After the pin: every segment to copy must still be there, unchanged."""
    now = {v.value.seq: v.value for v in source.meta.segments(lp.log)}
    for seg in lp.selection.copy:
        cur = now.get(seg.seq)
        if cur is None or cur.state is SegmentState.TRUNCATED or cur.last_entry_id != seg.last_entry_id or cur.min_active_entry > seg.min_active_entry:
            raise ConflictError(
                f"source segment {seg.seq} of log {lp.log!r} was truncated or changed before the copy's pin took hold",
                hint="re-run: the plan is made again from what the source holds now (the pin stays)",
            )


def _reserve(sink: ClusterSession, lp: LogPlan, record: _Record) -> P.LogProgress:
    """Create the sink log if needed, and reserve (or keep reserved) its segment numbers."""
    meta = sink.meta
    count = len(lp.selection.copy)
    try:
        current = meta.get_log(lp.log)
    except NotFoundError:
        meta.create_log(lp.log, lp.sink_config)
        current = meta.get_log(lp.log)
    prog = lp.progress
    if prog is not None:
        existing = {v.value.seq for v in meta.segments(lp.log)}
        if any(prog.reserved[0] <= s <= prog.reserved[1] for s in existing):
            prog.committed = True  # an earlier run committed; its record lagged behind
            return prog
        if count and P.reservation_still_ours(prog, sink_log_id=current.value.log_id, log_version=current.version, max_segment_seq=current.value.max_segment_seq, count=count, first_seq=prog.reserved[0]):
            return prog
    abandoned = list(prog.abandoned) if prog is not None else []
    if prog is not None and prog.sink_log_id == current.value.log_id and prog.reserved[1] >= prog.reserved[0]:
        abandoned.append(prog.reserved)
    if count == 0:
        fresh = P.LogProgress(current.value.log_id, (current.value.max_segment_seq + 1, current.value.max_segment_seq), current.version, abandoned=abandoned)
    else:
        reserved = meta.reserve_segment_seqs(lp.log, current, count)
        first = current.value.max_segment_seq + 1
        fresh = P.LogProgress(current.value.log_id, (first, first + count - 1), reserved.version, abandoned=abandoned)
    record.write(progress=fresh.to_dict(), source_range=[lp.selection.copy[0].seq, lp.selection.copy[-1].seq] if count else None)
    return fresh


def _endpoints(engine: Engine, source: ClusterSession, sink: ClusterSession, sink_nodes: dict[str, dict], throttle: float | None, options: EngineOptions) -> Endpoints:
    # The engine's own count, not --parallelism: without it the engine still runs every core's
    # worth of tasks at once, and a throttle left whole would let the job run that many times over.
    slots = _slots(engine)
    return Endpoints(
        source_cluster=source.cluster.name,
        source_nodes=source.meta.available_nodes(),
        source_secret=engine.secret(source.cluster.secret_file, source.cluster.name),
        sink_cluster=sink.cluster.name,
        sink_nodes=sink_nodes,
        sink_secret=engine.secret(sink.cluster.secret_file, sink.cluster.name),
        throttle=(throttle / slots) if throttle else None,  # the limit is the job's: split over the tasks running at once
        source_tls=engine.tls(source.tls, source.cluster.name),
        sink_tls=engine.tls(sink.tls, sink.cluster.name),
        pull=not options.relay,
    )


def _tasks(job: JobPlan, lp: LogPlan, prog: P.LogProgress, effects: list[ClockEffect] | None) -> list[P.SegmentTask]:
    copy = lp.selection.copy
    if prog.committed or not copy:
        return []
    effect_list = effects if effects is not None else [P.local_effect(s, lp.skipped if i == 0 else 0) for i, s in enumerate(copy)]
    starts = clockbase.start_vectors(job.source_cluster, effect_list, clockbase.place(copy, lp.clock_steps, lp.clock_derived).at_start, lp.start_vv)
    seqs = list(range(prog.reserved[0], prog.reserved[0] + len(copy)))
    return [
        P.SegmentTask(lp.log, job.source_cluster, lp.source_log.value.log_id, seg, job.sink_cluster, prog.sink_log_id, seq, lp.sink_policy, start, assume_local=effects is None, settled=lp.settled)
        for seg, seq, start in zip(copy, seqs, starts)
    ]


def _clock_effects(engine: Engine, endpoints: Endpoints, job: JobPlan, logs: list[LogPlan], progresses: dict[str, P.LogProgress], progress: Callable[[Progress], None] | None) -> dict[str, list[ClockEffect]]:
    """The clock pre-pass over logs that hold replicated records (one task per segment)."""
    if not logs:
        return {}
    scan = [P.SegmentTask(lp.log, job.source_cluster, lp.source_log.value.log_id, seg, job.sink_cluster, progresses[lp.log].sink_log_id, 0, lp.sink_policy, {}, False) for lp in logs for seg in lp.selection.copy]
    results = engine.run(
        functools.partial(scan_clocks, endpoints=endpoints),
        P.batches(scan, _slots(engine)),
        description="bootstrap clock pre-pass",
        weight=lambda b: sum(t.estimated_bytes for t in b),
        count=len,
        on_progress=_forward("reading vector clocks", progress),
    )
    errors = [r["error"] for r in results if r.get("error")]
    if errors:
        raise PartialFailure("bootstrap clock pre-pass failed: " + "; ".join(errors[:5]), hint="nothing is visible at the sink; re-run once the source replicas answer")
    out: dict[str, list[ClockEffect]] = {}
    for r in results:
        out.setdefault(r["log"], []).append(ClockEffect.from_dict(r["effect"]))
    return out


def _slots(engine: Engine) -> int:
    """Tasks the engine runs at once (Spark: ``local[N]``'s N, else the cluster's default parallelism)."""
    return engine.slots


def _forward(phase: str, progress: Callable[[Progress], None] | None, reused: int = 0, total: int | None = None) -> Callable[[StageProgress], None] | None:
    if progress is None:
        return None

    def on(p: StageProgress) -> None:
        progress(Progress(phase, (total if total is not None else p.tasks + reused), p.completed + reused, p.bytes_total, p.bytes_done, p.rate, p.eta, p.active))

    return on


def _still_verified(sink: ClusterSession, prog: P.LogProgress, tasks: list[P.SegmentTask]) -> set[int]:
    """Source seqs whose earlier verified copy this run keeps: same task, and every replica
    still answers DIGEST with the recorded digest and entry count."""
    candidates = P.reusable(prog, tasks)
    if not candidates:
        return set()

    async def check() -> set[int]:
        pool = await sink.pool()
        await pool.refresh()

        async def one(seq: int, done: dict) -> bool:
            for node in done.get("ensemble") or []:
                try:
                    got = await (await pool.client(node)).digest(prog.sink_log_id, int(done["sink_seq"]))
                except AgentError:
                    return False
                if not got.digest.startswith(done["replica_expected"].get(node, "-")) or got.entries != int(done["replica_entries"].get(node, -1)):
                    return False
            return bool(done.get("ensemble"))

        oks = await asyncio.gather(*(one(seq, done) for seq, done in candidates.items()))
        return {seq for seq, ok in zip(candidates, oks) if ok}

    return sink.run(check())


def _copy(
    engine: Engine,
    endpoints: Endpoints,
    pending: list[P.SegmentTask],
    progresses: dict[str, P.LogProgress],
    records: dict[str, _Record],
    progress: Callable[[Progress], None] | None,
    job: JobPlan,
) -> tuple[list[dict], set[str]]:
    needs_clock: set[str] = set()
    reused = sum(len(p.verified) for p in progresses.values())

    def on_result(r: dict) -> None:
        if r.get("needs_clock"):
            needs_clock.add(r["log"])
            return
        if P.verification_problem(r) is None:
            prog = progresses[r["log"]]
            prog.verified[int(r["source_seq"])] = _compact(r)
            records[r["log"]].write(progress=prog.to_dict())
        else:
            log.warning("%s", P.verification_problem(r))

    results = engine.run(
        functools.partial(copy_segments, endpoints=endpoints),
        P.batches(pending, _slots(engine)),
        description="bootstrap copy",
        weight=lambda b: sum(t.estimated_bytes for t in b),
        count=len,
        result_bytes=lambda r: int(r.get("source_bytes", 0)),
        on_result=on_result,
        on_progress=_forward("copying", progress, reused=reused, total=job.total_segments),
    )
    for r in results:  # the monitor may have missed the last ones: the returned list is complete
        if r.get("needs_clock"):
            needs_clock.add(r["log"])
        elif P.verification_problem(r) is None and int(r["source_seq"]) not in progresses[r["log"]].verified:
            on_result(r)
    return results, needs_clock


def _commit(sink: ClusterSession, lp: LogPlan, prog: P.LogProgress, tasks: list[P.SegmentTask], job: JobPlan, record: _Record, progress: Callable[[Progress], None] | None) -> None:
    if prog.committed or not tasks:
        prog.committed = True
        record.write(progress=prog.to_dict())
        return
    if progress is not None:
        progress(Progress("committing", job.total_segments, job.total_segments, 0, 0, 0.0, None))
    current = sink.meta.get_log(lp.log)
    if current.version != prog.log_version:
        raise RefusedError(
            f"sink log {lp.log!r} changed since the copy reserved segments {prog.reserved[0]}..{prog.reserved[1]} (a writer created a segment, or its configuration changed)",
            hint="nothing was committed; stop writers of the sink log and re-run (the copy is redone under new numbers)",
        )
    config = current.value.config
    segments = [
        P.sink_segment(t.source, t.sink_seq, prog.verified[t.source.seq], write_quorum=config.write_quorum, ack_quorum=config.ack_quorum, writer=f"bootstrap:{job.holder}")
        for t in tasks
    ]
    sink.meta.commit_segments(lp.log, current, segments)
    prog.committed = True
    record.write(state="committed", progress=prog.to_dict())


def _sweep_orphans(sink: ClusterSession, progresses: dict[str, P.LogProgress], tasks: dict[str, list[P.SegmentTask]], *, committed: bool) -> int:
    """Delete sink replicas of reserved numbers that no verified (or committed) copy names.

    Only numbers reserved by this job are touched; before the commit they are invisible to
    readers, after it only replicas outside the committed ensembles go."""
    wanted: dict[tuple[int, int], set[str]] = {}
    ranges: dict[int, list[tuple[int, int]]] = {}
    for prog in progresses.values():
        ranges.setdefault(prog.sink_log_id, []).extend([prog.reserved, *prog.abandoned])
        for done in prog.verified.values():
            wanted[(prog.sink_log_id, int(done["sink_seq"]))] = set(done.get("ensemble") or [])
    if not ranges:
        return 0

    def ours(log_id: int, seq: int) -> bool:
        return any(a <= seq <= b for a, b in ranges.get(log_id, []))

    async def sweep() -> int:
        pool = await sink.pool()
        deleted = 0
        nodes = await pool.refresh()
        for node in nodes:
            try:
                client = await pool.client(node)
                held = await client.list_segments()
            except AgentError as exc:
                log.warning("cannot list replicas on sink agent %s (orphans there stay until a re-run): %s", node, exc)
                continue
            for info in held:
                key = (info.log_id, info.segment_seq)
                if ours(*key) and node not in wanted.get(key, set()):
                    try:
                        deleted += bool(await client.delete_segment(*key))
                    except AgentError as exc:
                        log.warning("cannot delete orphan replica %s/%s on %s: %s", *key, node, exc)
        return deleted

    deleted = sink.run(sweep())
    if deleted:
        log.info("deleted %d orphan replica(s) of %s copies", deleted, "committed" if committed else "unverified")
    return deleted


def _log_result(lp: LogPlan, prog: P.LogProgress, tasks: list[P.SegmentTask], copied: int, reused: int) -> LogResult:
    sel = lp.selection
    vv: dict[str, int] = {}
    sink_dlsn = None
    records = nbytes = 0
    for t in tasks:
        done = prog.verified.get(t.source.seq)
        if done is None:
            continue
        vv = dict(done.get("end_vv") or vv)
        records += int(done.get("records", 0))
        nbytes += int(done.get("sink_bytes", 0))
        if done.get("last_data_slot"):
            entry, slot = done["last_data_slot"]
            sink_dlsn = DLSN(int(done["sink_seq"]), int(entry), int(slot))
    return LogResult(
        lp.log,
        sel.snapshot,
        vv,
        sink_dlsn,
        len(sel.copy),
        copied,
        reused if tasks else 0,
        records,
        nbytes,
        (sel.copy[0].seq, sel.copy[-1].seq) if sel.copy else None,
        (prog.reserved[0], prog.reserved[1]) if sel.copy else None,
        True,
    )


__all__ = ["BootstrapResult", "LogResult", "Progress", "execute"]
