"""Every metric the agent exports (Prometheus text / OpenMetrics at ``[metrics] listen``).

One ``AgentMetrics`` per agent, with a registry of its own, never prometheus_client's global
one: tests run several agents' parts in one process, and one agent's numbers must not mix with
another's. The parts that record are handed it (the protocol server, the store's group commit,
the replication workers, the auditor, the elected roles); the endpoint is ``metrics_http``.

Cost on the hot paths: one observation per request or per group-commit batch, never one per
record (a histogram observation costs under a microsecond, an add request tens of them).

States are read when scraped, from what the parts keep anyway, by collectors: replicas, bytes
and free space on disk and the store's read and reclaim counters (``SegmentStore.stat``), the
write proxy's logs (``WriteProxy.stat``), the replication workers' last reports. Nothing polls
ZooKeeper or the disk for metrics' sake. What the event loop owns is read on the loop thread
(``call_soon_threadsafe``), so a scrape sees one consistent snapshot and never iterates a dict
the loop is changing; a loop that does not answer within ``SNAPSHOT_TIMEOUT`` leaves those
families out of that scrape rather than hold the scraper.

``dlagent_under_replicated_segments`` is set by the elected auditor after each survey of the
cluster's replicas; every other agent reports 0 (sum over the cluster, or take the max).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from dlctl import __version__
from dlctl.log.protocol import Op
from dlctl.logthrottle import LogThrottle

if TYPE_CHECKING:
    from dlctl.replication.worker import WorkerReport

log = logging.getLogger("dlagent.metrics")

# The ``op`` label of dlagent_request_duration_seconds: the protocol's requests by name.
# Anything else an authenticated connection sends (undecodable frames, AUTH again) is "other".
REQUEST_OPS: dict[int, str] = {
    Op.ADD_ENTRY: "add",
    Op.ADD_BATCH: "add_batch",
    Op.READ_ENTRY: "read",
    Op.READ_RANGE: "read_range",
    Op.READ_LAC: "read_lac",
    Op.LONG_POLL: "long_poll",
    Op.FENCE: "fence",
    Op.DIGEST: "digest",
    Op.LIST_SEGMENTS: "list_segments",
    Op.DELETE_SEGMENT: "delete_segment",
    Op.STAT: "stat",
    Op.APPEND: "append",
    Op.RELEASE: "release",
    Op.PULL_RANGE: "pull_range",
    Op.PULL_SEGMENT: "pull_segment",
}
OTHER_OP = "other"
ROLES = ("auditor", "housekeeper")
REPAIR_RESULTS = ("done", "stuck", "data_lost")

# Long polls wait up to [server] max_long_poll (120 s by default): the buckets reach that far.
REQUEST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.5, 5.0)
BATCH_ENTRY_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
BATCH_BYTE_BUCKETS = (1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20)

SNAPSHOT_TIMEOUT = 5.0  # seconds a scrape waits for the event loop's snapshot


@dataclass
class _StreamLog:
    """One (stream, log) as this agent's workers reported it."""

    applied: int = 0  # records this agent's workers applied (the counter)
    report: WorkerReport | None = None  # the running worker's last report; None: none runs here now
    wire: int = 0  # bytes of the source's answers to them on the wire (compressed or not) ...
    payload: int = 0  # ... and decoded (issue 23)


class _WorkerRun:
    """Observer of one worker run (``StreamWorker(observer=...)``). A checkpoint counts what every
    run of the stream's log applied, on any agent: only the growth after this run's first report
    (its start) is counted here."""

    def __init__(self, metrics: AgentMetrics) -> None:
        self._metrics = metrics
        self._last: WorkerReport | None = None

    def __call__(self, report: WorkerReport) -> None:
        last, self._last = self._last, report
        if last is None:
            self._metrics._worker_reported(report, 0)
            return
        self._metrics._worker_reported(
            report, max(0, report.applied_records - last.applied_records),
            max(0, report.wire_bytes - last.wire_bytes), max(0, report.wire_payload_bytes - last.wire_payload_bytes),
        )


class AgentMetrics:
    def __init__(self, *, node: str = "", cluster: str = "", region: str = "", rack: str = "", version: str = __version__) -> None:
        r = self.registry = CollectorRegistry()
        Info("dlagent", "This agent: node id, cluster, region, rack and dlctl version", registry=r).info(
            {"node": node, "cluster": cluster, "region": region, "rack": rack, "version": version}
        )
        requests = Histogram(
            "dlagent_request_duration_seconds", "Protocol requests from receipt to answer (long polls include their wait)",
            ["op"], buckets=REQUEST_BUCKETS, registry=r,
        )
        self._request_by_op = {op: requests.labels(name) for op, name in REQUEST_OPS.items()}
        self._request_other = requests.labels(OTHER_OP)
        self._fsync = Histogram("dlagent_fsync_duration_seconds", "fdatasync of a segment file by group commit (sync = always)", buckets=FSYNC_BUCKETS, registry=r)
        self._batch_entries = Histogram("dlagent_group_commit_entries", "Entries made durable by one group-commit batch", buckets=BATCH_ENTRY_BUCKETS, registry=r)
        self._batch_bytes = Histogram("dlagent_group_commit_bytes", "Bytes made durable by one group-commit batch", buckets=BATCH_BYTE_BUCKETS, registry=r)
        self._written_bytes = Counter("dlagent_written_bytes_total", "Bytes of entries stored durably (re-adds of stored entries not counted)", registry=r)
        self._written_entries = Counter("dlagent_written_entries_total", "Entries stored durably (re-adds of stored entries not counted)", registry=r)
        self._under_replicated = Gauge(
            "dlagent_under_replicated_segments", "Completed segments with a replica missing, damaged or short, at the elected auditor's last survey (0 on other agents)", registry=r,
        )
        roles = Gauge("dlagent_role", "1 while this agent holds the cluster-wide role", ["role"], registry=r)
        self._roles = {name: roles.labels(name) for name in ROLES}
        for gauge in self._roles.values():
            gauge.set(0)
        self._repair_bytes = Counter("dlagent_repair_copied_bytes_total", "Bytes this agent's auditor copied to re-replicate or refill replicas", registry=r)
        repaired = Counter("dlagent_repair_segments_total", "Segments this agent's auditor re-replicated or refilled, by outcome", ["result"], registry=r)
        self._repaired = {result: repaired.labels(result) for result in REPAIR_RESULTS}
        self._repair_pending = Gauge("dlagent_repair_pending_segments", "Segments the elected auditor found to copy and has not done (0 on other agents)", registry=r)
        self._pending: dict[str, int] = {}
        # Replication workers report from the loop thread; scrapes read from the endpoint's.
        self._lock = threading.Lock()
        self._streams: dict[tuple[str, str], _StreamLog] = {}
        # What the collector reads on the event loop (watch()).
        self.store: Any = None
        self.proxy: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._throttle = LogThrottle(log)
        r.register(_StateCollector(self))

    @classmethod
    def for_agent(cls, config: Any) -> AgentMetrics:
        """Labelled with the agent's identity (``dlagent.config.AgentConfig``)."""
        return cls(node=config.node_id, cluster=config.cluster, region=config.region, rack=config.rack)

    def watch(self, store: Any) -> None:
        """Call from the event loop: scrapes read ``store`` (and ``proxy`` once set) on it."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.store = store

    # -- recording (hot paths) ------------------------------------------------------------------

    def request(self, op: int, seconds: float) -> None:
        self._request_by_op.get(op, self._request_other).observe(seconds)

    def fsync(self, seconds: float) -> None:
        self._fsync.observe(seconds)

    def committed(self, entries: int, nbytes: int) -> None:
        """A group-commit batch is durable."""
        self._batch_entries.observe(entries)
        self._batch_bytes.observe(nbytes)
        self._written_entries.inc(entries)
        self._written_bytes.inc(nbytes)

    # -- recording (roles, auditor, replication) ----------------------------------------------

    def role(self, name: str, held: bool) -> None:
        self._roles[name].set(1 if held else 0)

    def under_replicated(self, segments: int) -> None:
        self._under_replicated.set(segments)

    def repair_pending(self, kind: str, segments: int) -> None:
        """Segments of one kind of the auditor's work (re-replication of gone agents' replicas,
        refills of live ones) still to copy; the gauge shows their sum."""
        with self._lock:
            self._pending[kind] = segments
            total = sum(self._pending.values())
        self._repair_pending.set(total)

    def repaired(self, copied_bytes: int, outcomes: Mapping[str, int]) -> None:
        """A re-replication or refill run ended: bytes it copied, segments per REPAIR_RESULTS."""
        self._repair_bytes.inc(copied_bytes)
        for result, count in outcomes.items():
            if count:
                self._repaired[result].inc(count)

    def worker_observer(self) -> Callable[[WorkerReport], None]:
        """An observer for one replication worker run (``StreamWorker(observer=...)``)."""
        return _WorkerRun(self)

    def worker_stopped(self, stream_id: str, log_name: str) -> None:
        """No worker of this (stream, log) runs here any more: its lag is another agent's to report."""
        with self._lock:
            state = self._streams.get((stream_id, log_name))
            if state is not None:
                state.report = None

    def _worker_reported(self, report: WorkerReport, applied: int, wire: int = 0, payload: int = 0) -> None:
        with self._lock:
            state = self._streams.setdefault((report.stream_id, report.log), _StreamLog())
            state.applied += applied
            state.wire += wire
            state.payload += payload
            state.report = report

    # -- reading (the collector) ----------------------------------------------------------------

    def _replication(self) -> list[tuple[tuple[str, str], _StreamLog]]:
        with self._lock:
            return [(key, _StreamLog(s.applied, s.report, s.wire, s.payload)) for key, s in sorted(self._streams.items())]

    def _on_loop(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` run on the event loop, its result; None when the loop is gone or too busy."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return None
        if threading.get_ident() == self._loop_thread:
            return fn()  # scraped from the loop itself (in-process tests): waiting would deadlock
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the scraping thread
                    done.set_exception(exc)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # closed meanwhile: the agent is stopping
            return None
        try:
            return done.result(SNAPSHOT_TIMEOUT)
        except concurrent.futures.TimeoutError:
            done.cancel()
            self._throttle.warning("slow snapshots", "metrics: the event loop did not answer within %gs; storage and proxy metrics left out of this scrape", SNAPSHOT_TIMEOUT)
            return None

    def _snapshot(self) -> tuple[dict | None, dict | None]:
        """On the loop thread: the store's and the write proxy's stat."""
        store, proxy = self.store, self.proxy
        return (store.stat() if store is not None else None, proxy.stat() if proxy is not None else None)


class _StateCollector:
    """The families read at scrape time (module docstring)."""

    def __init__(self, metrics: AgentMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        try:
            snapshot = m._on_loop(m._snapshot)
        except Exception as exc:  # noqa: BLE001 - one part's trouble must not fail the whole scrape
            m._throttle.warning("failed snapshots", "metrics: reading the agent's state failed: %r", exc)
            snapshot = None
        store, proxy = snapshot if snapshot is not None else (None, None)
        if store is not None:
            yield from _store_families(store)
        if proxy is not None:
            yield from _proxy_families(proxy)
        yield from _replication_families(m._replication(), time.time())


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _store_families(stat: dict) -> Iterator[Metric]:
    yield _gauge("dlagent_segments", "Segment replicas on this agent's disk", stat["segments"])
    yield _gauge("dlagent_segment_bytes", "Bytes of entries in those replicas (preallocated space not counted)", stat["bytes"])
    yield _gauge("dlagent_limbo_replicas", "Replicas in limbo (corrupt, cut, or forgotten with a replaced disk): to be re-copied", stat["limbo"])
    if stat["disk_total_bytes"] >= 0:  # -1: the data dir's file system could not be asked
        yield _gauge("dlagent_disk_free_bytes", "Free bytes on the data directory's file system", stat["disk_free_bytes"])
        yield _gauge("dlagent_disk_total_bytes", "Size of the data directory's file system", stat["disk_total_bytes"])
    yield CounterMetricFamily("dlagent_read_entries", "Entries read for clients (reads, range reads, long polls, fencing reads)", value=stat["read_entries"])
    yield CounterMetricFamily("dlagent_read_bytes", "Bytes of the entries read for clients, as stored", value=stat["read_bytes"])
    # The store keeps these across restarts (reclaimed.json): since the data directory exists.
    yield CounterMetricFamily("dlagent_gc_reclaimed_bytes", "Bytes freed by deleting replicas of collected segments", value=stat["reclaimed_bytes"])
    yield CounterMetricFamily("dlagent_gc_deleted_segments", "Replicas deleted (their segments were truncated and collected)", value=stat["reclaimed_replicas"])


def _proxy_families(stat: dict) -> Iterator[Metric]:
    yield _gauge("dlagent_proxy_owned_logs", "Logs this agent writes as their owner (write proxy)", len(stat["owned"]))
    queued = GaugeMetricFamily("dlagent_proxy_queue_bytes", "Queued plus unacknowledged bytes of an owned log (bounded by [proxy] max_log_bytes)", labels=["log"])
    producers = GaugeMetricFamily("dlagent_proxy_producers", "Idempotent producers an owned log remembers", labels=["log"])
    for name, info in sorted(stat["logs"].items()):
        queued.add_metric([name], info["queued_bytes"] + info["pending_bytes"])
        producers.add_metric([name], info["producers"])
    yield queued
    yield producers


def _replication_families(streams: list[tuple[tuple[str, str], _StreamLog]], now: float) -> Iterator[Metric]:
    labels = ["stream", "log"]
    lag_records = GaugeMetricFamily("dlagent_replication_lag_records", "Source records after the checkpoint, as last measured (replication status's lag)", labels=labels)
    lag_bytes = GaugeMetricFamily("dlagent_replication_lag_bytes", "Their bytes", labels=labels)
    lag_seconds = GaugeMetricFamily("dlagent_replication_lag_seconds", "0 when caught up, else seconds since the worker last had read all the source held", labels=labels)
    last_apply = GaugeMetricFamily("dlagent_replication_last_apply_timestamp_seconds", "When a record was last applied to the sink (Unix time)", labels=labels)
    # Per log; the stream's is the oldest of its logs' (PromQL: min by (stream)).
    safe = GaugeMetricFamily("dlagent_replication_safe_timestamp_seconds", "Safe time: the sink holds everything the source log held then (Unix time)", labels=labels)
    applied = CounterMetricFamily("dlagent_replication_applied_records", "Records this agent's workers applied to the sink", labels=labels)
    wire = CounterMetricFamily("dlagent_replication_wire_bytes", "Bytes of the source's answers to them as they crossed the WAN (compressed or not)", labels=labels)
    payload = CounterMetricFamily("dlagent_replication_payload_bytes", "The same answers' bytes decoded (payload / wire: the compression ratio)", labels=labels)
    for key, state in streams:
        applied.add_metric(list(key), state.applied)
        wire.add_metric(list(key), state.wire)
        payload.add_metric(list(key), state.payload)
        report = state.report
        if report is None:
            continue  # no worker here now: another agent reports this log's lag
        if report.lag_records is not None:
            lag_records.add_metric(list(key), report.lag_records)
            lag_bytes.add_metric(list(key), report.lag_bytes or 0)
            lag_seconds.add_metric(list(key), report.lag_seconds(now))
        if report.last_applied_at:
            last_apply.add_metric(list(key), report.last_applied_at)
        if report.safe_time:
            safe.add_metric(list(key), report.safe_time)
    yield from (lag_records, lag_bytes, lag_seconds, last_apply, safe, applied, wire, payload)
