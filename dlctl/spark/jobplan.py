"""Planning a bootstrap copy (DESIGN.md §8): which logs, which of their source segments, what
the sink already holds from an earlier run of the same job (its holder), and what refuses the
job before anything changes. The driver, ``dlctl.spark.job``, applies the plan."""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import DlctlError, NotFoundError, UsageError
from ..log.dlsn import DLSN
from ..log.errors import AgentError
from ..log.records import decode_records
from ..log.speculative import ReplicaReader
from ..meta import policy as placement_store
from ..meta.records import LogConfig, LogRecord, SegmentRecord, SegmentState, Versioned
from ..names import validate_name
from ..placement import PlacementPolicy
from ..replication import settle
from ..replication.origin import decode_source_position
from . import clockbase
from . import plan as P

if TYPE_CHECKING:  # (imported for types only: executors never load it)
    from ..session import ClusterSession

OP_KIND = "bootstrap"  # the ``kind`` of a bootstrap's job records (``ops/<holder>.<log>``)


def default_holder(source: str, sink: str) -> str:
    return validate_name("pin holder", f"bootstrap-{source}-to-{sink}")


def op_id(holder: str, log_name: str) -> str:
    name = f"{holder}.{log_name}"
    if len(name) > 128:
        name = f"{holder[:80]}.{hashlib.sha256(log_name.encode()).hexdigest()[:40]}"
    return validate_name("operation", name)


# -- planning ----------------------------------------------------------------------------------------


@dataclass
class LogPlan:
    log: str
    source_log: Versioned[LogRecord]
    selection: P.Selection
    sink_log: Versioned[LogRecord] | None
    sink_config: LogConfig
    sink_policy: PlacementPolicy
    blockers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    assume_local: bool = True  # the source log holds only its own records (clock from metadata)
    progress: P.LogProgress | None = None  # an earlier run of this job
    clock_steps: tuple = ()  # the source log's clock base steps: applied as a stream applies them (clockbase)
    clock_derived: tuple = ()  # those that are truncation bases (exact: passed over inside a copied segment)
    skipped: int = 0  # data records of the first copied segment before its first active entry (not copied)
    start_vv: dict[str, int] = field(default_factory=dict)  # the source's version vector before the first copied record
    settled: dict[str, int] = field(default_factory=dict)  # retired locations settled in this log (the sink's history)

    def to_dict(self) -> dict[str, Any]:
        sel = self.selection
        return {
            "log": self.log,
            "source_range": [sel.copy[0].seq, sel.copy[-1].seq] if sel.copy else None,
            "first": str(sel.first) if sel.first else None,
            "segments": len(sel.copy),
            "bytes": sel.bytes,
            "records": sel.records - self.skipped,  # a partially truncated first segment: from its first active entry
            "snapshot": str(sel.snapshot),
            "sink_log": "exists" if self.sink_log else "created by the copy",
            "resumes": bool(self.progress and self.progress.verified),
            "blockers": list(self.blockers),
            "notes": list(self.notes),
        }


@dataclass
class JobPlan:
    holder: str
    source_cluster: str
    sink_cluster: str
    logs: list[LogPlan]
    notes: list[str] = field(default_factory=list)

    @property
    def blockers(self) -> list[str]:
        return [f"sink log {p.log!r}: {b}" for p in self.logs for b in p.blockers]

    @property
    def total_bytes(self) -> int:
        return sum(p.selection.bytes for p in self.logs)

    @property
    def total_segments(self) -> int:
        return sum(len(p.selection.copy) for p in self.logs)


def match_logs(available: Sequence[str], patterns: Sequence[str] | None) -> list[str]:
    """The source logs named by ``patterns`` (shell globs); every log when none are given."""
    if not patterns:
        return list(available)
    out = [name for name in available if any(fnmatch.fnmatchcase(name, p) for p in patterns)]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in available)]
    if unmatched:
        raise NotFoundError(f"no source log matches {', '.join(repr(p) for p in unmatched)}", hint="list them with `dlctl --cluster SOURCE log list`")
    return out


def plan_job(source: ClusterSession, sink: ClusterSession, logs: Sequence[str], *, holder: str) -> JobPlan:
    """Read both clusters and decide, per log, what the copy does (blocking; changes nothing)."""
    validate_name("pin holder", holder)
    if source.cluster.name == sink.cluster.name:
        raise UsageError(f"source and sink are the same cluster ({sink.cluster.name!r})")
    sink_policies = placement_store.load(sink.meta.client, sink.cluster.name).value
    sink_logs = set(sink.meta.list_logs())
    replicated_into_source = _logs_replicated_into(source)
    settled = settle.SettledFloors(sink.meta)  # the sink's history, read once for every log
    plans = []
    for name in logs:
        source_log = source.meta.get_log(name)
        selection = P.select([v.value for v in source.meta.segments(name)], source_log.value.max_segment_seq)
        sink_log = sink.meta.get_log(name) if name in sink_logs else None
        if sink_log is not None:
            config = sink_log.value.config
        else:
            default = sink_policies.default
            config = replace(source_log.value.config, ensemble_size=default.ensemble_size, write_quorum=default.write_quorum, ack_quorum=default.ack_quorum)
        lp = LogPlan(name, source_log, selection, sink_log, config, sink_policies.for_log(name, config), assume_local=name not in replicated_into_source)
        if not lp.assume_local:
            lp.notes.append("the source log receives records from another location: their vector clocks are read in a first pass")
        lp.clock_steps = _clock_steps(source, name)
        lp.settled = settled.of(name)
        lp.clock_derived, recorded = _clock_kinds(source, name)
        lp.blockers += clockbase.blockers(selection.copy, lp.clock_steps, lp.clock_derived)
        skipped = clockbase.skipped(selection.copy[0], recorded) if selection.copy else 0
        if skipped is None and lp.assume_local:
            # Unknown how many records precede the first active entry: read the clocks instead.
            lp.assume_local = False
            lp.notes.append(f"segment {selection.copy[0].seq} is partially truncated and no truncation recorded its records before entry "
                            f"{selection.copy[0].min_active_entry}: the vector clocks are read in a first pass")
        lp.skipped = skipped or 0
        found = _find_progress(sink, holder, name)
        if sink_log is not None:
            _check_sink(sink, lp, source.cluster.name, found)
        lp.progress = found
        if not selection.copy:
            lp.notes.append(f"nothing to copy ({selection.reason}); a stream starts at {selection.snapshot}")
        plans.append(lp)
    return JobPlan(holder, source.cluster.name, sink.cluster.name, plans)


def _clock_steps(session: ClusterSession, name: str) -> tuple:
    from ..replication.clock import ClockStore

    return ClockStore(session.meta).steps(name)


def _clock_kinds(session: ClusterSession, name: str) -> tuple[tuple, dict[tuple[int, int], int]]:
    """The source log's derived clock steps, and the records its last truncation recorded
    before its first active entry ((segment, entry) -> records)."""
    from ..replication.clock import ClockStore

    store = ClockStore(session.meta)
    return store.derived_steps(name), store.skipped_records(name)


def _logs_replicated_into(session: ClusterSession) -> set[str]:
    """Logs that some stream replicates *into* ``session``'s cluster (their records carry
    origins from elsewhere, so their clock cannot be derived from record counts alone)."""
    try:
        from ..replication.store import StreamStore
    except ImportError:  # pragma: no cover - replication is part of the package
        return set()
    store = StreamStore(session.meta)
    out: set[str] = set()
    for stream_id in store.list_streams():
        try:
            out |= set(store.get_config(stream_id).value.logs)
        except (NotFoundError, ValueError):
            continue
    return out


def _find_progress(sink: ClusterSession, holder: str, name: str) -> P.LogProgress | None:
    try:
        record = sink.meta.get_op(op_id(holder, name)).value
    except NotFoundError:
        return None
    if record.get("kind") != OP_KIND or record.get("state") == "done" or "progress" not in record:
        return None
    try:
        return P.LogProgress.from_dict(record["progress"])
    except (KeyError, TypeError, ValueError):
        return None


def _check_sink(sink: ClusterSession, lp: LogPlan, source_cluster: str, progress: P.LogProgress | None) -> None:
    """What the sink log already holds decides whether the copy may go after it."""
    name = lp.log
    segments = [v.value for v in sink.meta.segments(name)]
    owner = sink.meta.owner_of(name)
    lp.blockers += P.sink_blockers(owner=owner[0].decode(errors="replace") if owner else None, segments=segments)
    ours = progress is not None and any(progress.reserved[0] <= s.seq <= progress.reserved[1] for s in segments)
    if ours:
        return  # an earlier run committed already (its record lags): apply finishes the job
    with_data = [s for s in segments if s.records > 0 and s.state is not SegmentState.TRUNCATED]
    if not with_data or not lp.selection.copy:
        return
    last = with_data[-1]
    first_txid = lp.selection.copy[0].first_txid
    if last.last_txid >= first_txid >= 0:
        lp.blockers.append(
            f"it already holds txids up to {last.last_txid} and the copy starts at txid {first_txid}: txids must increase along a log; "
            "the sink log cannot take the copy after its own records (delete or rename the sink log first)"
        )
    position = _sink_source_position(sink, name, last)
    if position is not None and position[0] == source_cluster:
        pos = position[1]
        first = lp.selection.first
        if first is not None and pos >= first:
            lp.blockers.append(
                f"it already holds the source's records up to {pos} (at or after the copy's first position {first}): "
                "no bootstrap is needed; a stream can resume from there"
            )
        elif first is not None:
            lp.notes.append(f"the sink holds the source's records up to {pos}; the source now starts at {first}: what lies between is gone at the source")


def _sink_source_position(sink: ClusterSession, name: str, seg: SegmentRecord) -> tuple[str, DLSN] | None:
    """``dl.src`` of the sink log's last data record (where its records came from), if any."""

    async def read() -> tuple[str, DLSN] | None:
        pool = await sink.pool()
        try:
            await pool.refresh()
            entry = await ReplicaReader(pool).read(sink.meta.get_log(name).value.log_id, seg, seg.last_entry_id)
            found = None
            for record in decode_records(entry.payload):
                if not record.control:
                    found = decode_source_position(record.headers)
            return found
        except (AgentError, DlctlError, ValueError):
            return None

    return sink.run(read())
