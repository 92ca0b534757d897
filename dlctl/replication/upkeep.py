"""A stream's upkeep (issue 23): the sink agents keep a stream in step with its source.

``init-replication --logs PATTERN`` stores the patterns with the stream; every
``[replication] upkeep_seconds`` (10 s) one sink agent (``dlagent.worker``) runs ``upkeep``, which

- **joins new source logs** that match a pattern: pins the new log at the source from its first
  position, creates the sink log with the source's configuration, writes its checkpoint (stream
  from the start), marks it a replica on a one-way stream, and only then adds it to the stream's
  logs, so a worker never picks up a half-prepared log. Each step is idempotent: a run cut short
  is completed by the next. A log the source no longer holds whole (it truncated before the
  upkeep saw it), or whose name the sink already uses for data of its own on a one-way stream,
  is not joined: it is reported as drift, for ``init-replication`` (which can bootstrap) to do;
- **propagates configuration** on one-way streams: the sink log takes the source log's
  retention and roll settings (quorums stay the sink's: its placement is its own). On causal
  streams every location is a source, so a difference is only reported;
- **handles logs deleted at the source**: the log leaves the stream (its worker stops; the sink
  keeps its copy, still read-only on a one-way stream until promoted or deleted) and the
  deletion is reported. Only a deletion the source recorded counts (its tombstone,
  ``MetaStore.delete_log``): a log merely gone — the source's ZooKeeper wiped or restored from
  an old backup — stays in the stream and is reported as ``missing-at-source``, since taking it
  out would leave ``dr recover`` nothing to bring it back by.

What it found is stored with the stream (``streams/<id>/drift``) and shown by ``dlctl
replication status``. A sink agent connects only to sources an operator declared: the upkeep
reads the source's ZooKeeper through the same link the stream's workers use.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConflictError, CorruptMetadata, NotFoundError
from ..log.dlsn import INITIAL
from ..meta.access import AccessMode, AccessStore
from ..meta.pins import PinRecord, PinStore
from ..meta.records import LogConfig
from ..meta.store import MetaStore
from .decision import first_retained
from .records import Checkpoint, StreamConfig
from .store import StreamStore

PROPAGATED = ("retention_seconds", "retention_bytes", "roll_bytes", "roll_seconds")


@dataclass
class UpkeepReport:
    joined: list[str] = field(default_factory=list)
    propagated: dict[str, list[str]] = field(default_factory=dict)  # log -> settings copied
    left: list[str] = field(default_factory=list)  # logs deleted at the source, out of the stream
    drift: dict[str, dict[str, Any]] = field(default_factory=dict)


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def upkeep(stream_id: str, sink: MetaStore, source: MetaStore, now: float | None = None) -> UpkeepReport:
    now = time.time() if now is None else now
    streams = StreamStore(sink)
    config = streams.get_config(stream_id).value
    before = streams.get_drift(stream_id)
    report = UpkeepReport()
    source_logs = set(source.list_logs())
    sink_logs = set(sink.list_logs())

    def found(log: str, kind: str, detail: str) -> None:
        since = before.get(log, {}).get("since", now) if before.get(log, {}).get("kind") == kind else now
        report.drift[log] = {"kind": kind, "detail": detail, "since": since}

    for name in sorted(n for n in source_logs - set(config.logs) if config.patterns and matches(n, config.patterns)):
        try:
            problem = _join(config, source, sink, name, name in sink_logs)
        except CorruptMetadata as exc:  # one record dlctl did not write: named, the other logs go on
            problem = f"its metadata cannot be read: {exc.message}"
        if problem:
            found(name, "not-joined", problem)
        else:
            report.joined.append(name)
    for name in config.logs:
        if name not in source_logs and source.was_deleted(name):
            report.left.append(name)
            found(name, "deleted-at-source", "the source deleted the log: it left the stream; the sink keeps its copy (`dlctl log delete` removes it, `dlctl failover` promotes it)")
            continue
        if name not in source_logs:
            # Gone without a deletion: the source lost its metadata (a wiped or restored
            # ZooKeeper). The stream keeps the log: `dr recover` needs it to bring it back.
            found(name, "missing-at-source", "the source no longer lists the log and recorded no deletion of it (lost metadata?): the stream keeps it; `dlctl dr recover` of the source brings it back")
            continue
        if name not in sink_logs:
            found(name, "missing-at-sink", "the sink log is gone: re-run init-replication for it")
            continue
        try:
            _compare_config(config, source, sink, name, report, found)
        except CorruptMetadata as exc:
            found(name, "unreadable", f"its metadata cannot be read: {exc.message}")
    if report.joined or report.left:
        _update_logs(streams, stream_id, add=report.joined, remove=report.left)
    for name, entry in before.items():  # a deletion stays reported after the log left the stream
        if entry.get("kind") == "deleted-at-source" and name not in report.drift and name not in source_logs:
            report.drift[name] = entry
    if report.drift != before:
        streams.set_drift(stream_id, report.drift)
    return report


def _join(config: StreamConfig, source: MetaStore, sink: MetaStore, name: str, sink_has_log: bool) -> str:
    """Prepare ``name`` for the stream; "" when done, else why not."""
    try:
        record = source.get_log(name)
    except NotFoundError:
        return "deleted at the source while joining"
    segments = [s.value for s in source.segments(name)]
    if first_retained(segments, record.value.max_segment_seq) is not None:
        return "the source no longer holds the whole log (it truncated before the stream saw it): run init-replication, which bootstraps it"
    if sink_has_log and not config.bidirectional and (sink.segments(name) or _replica_of(sink, name) not in ("", config.stream_id)):
        return f"the sink already has a log {name!r} of its own: run init-replication, which decides (bootstrap or refuse)"
    PinStore(source).set(PinRecord(holder=config.stream_id, log=name, position=INITIAL, sink_cluster=config.sink_cluster, max_age_seconds=config.pin_max_age_seconds))
    if not sink_has_log:
        try:
            sink.create_log(name, record.value.config)
        except ConflictError:
            pass  # created meanwhile (an earlier upkeep, or the operator): the checks above ran on it
    StreamStore(sink).create_checkpoint(config.stream_id, Checkpoint(name, next=INITIAL))  # kept if an earlier run wrote it
    if not config.bidirectional:
        access = AccessStore(sink)
        current = access.get(name)
        if current.value.mode is not AccessMode.REPLICA:
            access.set(name, AccessMode.REPLICA, stream=config.stream_id, reason=f"sink of {config.stream_id} (joined by pattern)", current=current)
    return ""


def _replica_of(sink: MetaStore, name: str) -> str:
    mode = AccessStore(sink).get(name).value
    return mode.stream if mode.mode is AccessMode.REPLICA else ""


def _compare_config(config: StreamConfig, source: MetaStore, sink: MetaStore, name: str, report: UpkeepReport, found) -> None:
    theirs = source.get_log(name).value.config
    mine = sink.get_log(name)
    differs = [k for k in PROPAGATED if getattr(theirs, k) != getattr(mine.value.config, k)]
    if not differs:
        return
    if config.bidirectional:
        found(name, "config-differs", "; ".join(f"{k}: source {getattr(theirs, k)}, sink {getattr(mine.value.config, k)}" for k in differs) + " (a causal stream propagates nothing: every location is a source)")
        return
    new: LogConfig = replace(mine.value.config, **{k: getattr(theirs, k) for k in differs})
    try:
        sink.update_log_config(name, new, mine.version)
        report.propagated[name] = differs
    except ConflictError:
        pass  # changed meanwhile: the next upkeep compares again


def _update_logs(streams: StreamStore, stream_id: str, *, add: list[str], remove: list[str]) -> None:
    for _ in range(8):
        current = streams.get_config(stream_id)
        logs = tuple(sorted((set(current.value.logs) | set(add)) - set(remove)))
        if logs == current.value.logs:
            return
        try:
            streams.update_config(current, replace(current.value, logs=logs))
            return
        except ConflictError:
            continue
