# Over ~600 lines (about 800), deliberately: StreamWorker is one state machine (read, filter,
# stamp, append, checkpoint, and the upkeep that rides on the same loop: pins, the sink's view,
# the source's end, retained data), and its parts share that loop's state (the reader, the clock,
# the progress, the appender). What has a job of its own is elsewhere: the C path over whole
# entries (fastpath), clocks (source), filters, causality, the store.
"""One replication worker: applies log ``log`` of a stream from the source to the sink, exactly once.

The loop (DESIGN.md §7):

1. Read the checkpoint (sink ZooKeeper) and take the sink log's appender (today the log's
   ``LogWriter``: ownership, fencing and recovery of whatever a previous worker left in progress).
2. Find the last record this stream applied by scanning the sink log back from its end to the
   checkpoint's sink position (``dl.src`` header). Records up to that source position are in
   the sink already: they are re-read (to rebuild the vector clocks) but not appended again.
3. Read the source log from the checkpoint (speculative reads, long-poll tailing, nearest
   region first; answers zstd-compressed when the stream's compression says so and the source
   agent can, ``dlctl.log.compression``), stamp each record's origin (cluster, DLSN, vector
   timestamp) and its source position, drop what the causality filter says the sink has seen
   (active-active only), and submit the rest to the sink appender, pipelined. The records of
   one source producer request (``dl.p``, dlctl.log.idempotence) are submitted together, as
   one sink request / entry: the sink applies what the source wrote atomically whole or not at
   all, too.
4. Every ``checkpoint_interval``, once the records submitted so far are acknowledged, write the
   checkpoint by compare-and-set (a lost CAS means another worker took over: stop); every
   ``pin_interval`` move the stream's retention pin on the source to the checkpoint. A
   checkpoint is only ever taken between source requests, never inside one.

Lag in seconds (``Checkpoint.caught_up_at``, read by ``dlctl replication status``) is the age
of the newest moment at which the worker had read everything the source held: a read that
waited in vain (idle), or, while records keep flowing, passing the source's end as measured
every ``contact_interval`` (at the time of that measurement). A worker that keeps up with a
steady load therefore shows a lag of at most about ``contact_interval``, not the time since it
last found the source idle.

The safe time (``Checkpoint.safe_time``, ``dlctl.replication.safetime``) is the start of the
newest such measure whose end a written checkpoint has reached: everything the source held
then is at the sink. Only checkpointed positions count (acknowledged at the sink), and it never
goes back, across runs too.

An observer (``StreamWorker(observer=...)``: the agent exports it as metrics) is told the
checkpoint's counts when the run starts and after every checkpoint, and the lag whenever the
source's end is measured, by ``positions.records_from`` as ``dlctl replication status`` does.

So a crash anywhere loses nothing and applies nothing twice: what was appended but not yet
checkpointed is found again in step 2. An ambiguous append failure ends the run; the supervisor
starts a new one, which goes through step 2 again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..errors import ConflictError, DlctlError, NotFoundError
from ..log.compression import WireStats
from ..log.dlsn import DLSN
from ..log.errors import AgentError
from ..log.idempotence import PRODUCER_HEADER, producer_mark
from ..log.pool import AgentPool
from ..log.reader import LogReader, ReadAhead, WholeEntry
from ..log.readpolicy import AdaptiveTimeout
from ..log.records import Record
from ..log.speculative import EntryReadError
from ..log.writer import LogWriter
from ..meta.pins import PinRecord, PinStore
from ..meta.records import Versioned
from ..meta.store import MetaStore
from ..meta.access import replication_role
from ..ratelimit import TokenBucket
from .causal import CausalityFilter, SourceClock, describe_missing, merge
from .clock import ClockStore
from .decision import first_retained
from . import fastpath
from .origin import ORIGIN_CLUSTER, Origin, applied_headers
from .filters import RecordFilter
from .network import causal_gate, current_version_vector
from . import settle
from .seen import SEEN_MARK
from .positions import find_applied, log_end, quorum_end, records_from
from .records import Checkpoint, StreamConfig, lag_seconds
from .safetime import SafeTime
from .store import StreamStore

log = logging.getLogger(__name__)


class NeedsBootstrap(DlctlError):
    """The source no longer holds what this stream needs; only a bootstrap copy can continue."""


class StreamGone(DlctlError):
    """The stream or this worker's claim went away (deleted, or another worker took over)."""


class SinkAppender(Protocol):
    """What the worker needs from the sink side: ``LogWriter`` (one-way streams) or
    ``LogProducer`` (write proxy, shared sinks); both have this shape."""

    def submit(self, payload: bytes | Record, *, key: bytes = b"", headers: Mapping[str, bytes] | None = None) -> asyncio.Future[DLSN]: ...

    def submit_group(self, records: list[Record]) -> list[asyncio.Future[DLSN]]: ...

    async def wait_writable(self) -> None: ...

    async def flush(self) -> Any: ...

    async def close(self) -> None: ...


async def open_appender(meta: MetaStore, pool: AgentPool, name: str, *, owner_id: str, region: str | None, ownership_wait: float, shared: bool, role: str = "application") -> SinkAppender:
    """The sink log's appender.

    One-way streams (``shared`` false) own the sink log outright with the library writer: no
    one else writes a standby, and a sole owner that re-reads the tail after any failure
    applies every record exactly once. Active-active sinks also take local writes, so the worker
    appends through the log's owner (write proxy) like any other producer; to do that for
    one-way streams too, return the ``LogProducer`` unconditionally (exactly once then needs the
    owner to drop records whose ``dl.src`` it already holds, see the module doc of
    ``dlctl.replication.worker`` and the design notes). ``role`` is what the sink log's access
    mode must admit (a standby's logs are replicas of the stream: only its worker writes)."""
    if shared:
        from ..log.producer import LogProducer, ProducerOptions
        from ..log.writer import WriterOptions

        # A source request (at most the default 128 KiB) grows by the origin headers of each
        # record; the owner keeps a request in one entry up to its batch size (less room for
        # the dl.p mark it adds): let requests be that large, so a replicated request still
        # fits one (``StreamWorker._submit_group``).
        options = ProducerOptions(max_request_bytes=WriterOptions().batch_bytes - 1024)
        return LogProducer(meta, pool, name, options=options, region=region)
    from ..log.writer import LogWriter, WriterOptions

    # No fast takeover: the worker reads the sink's tail back at once to find what it applied,
    # and that tail ends in the segment a previous owner left in progress. LAC published as soon
    # as the writer is idle (no 2 ms wait for more): a stream's records come in bursts, one per
    # source entry, and the sink's tailing readers see a burst only once its LAC is out
    # (bench_replication: p50 lag 60.9 -> 58.8 ms at 50 ms one-way).
    options = WriterOptions(ownership_wait=ownership_wait, fast_takeover=False, lac_delay=0.0)
    return await LogWriter.open(meta, pool, name, owner_id=owner_id, options=options, role=role)


@dataclass(frozen=True)
class WorkerOptions:
    checkpoint_interval: float = 0.5  # seconds between checkpoints while records flow
    pin_interval: float = 5.0  # seconds between pin refreshes at the source
    idle_read_timeout: float = 0.5  # a read that waits this long means: caught up
    contact_interval: float = 2.0  # while idle, probe the source this often (last contact)
    ownership_wait: float = 60.0  # how long to wait for a dead predecessor's sink ownership
    region: str | None = None  # the source region nearest to this worker
    # A stream reads across a WAN: keep a bandwidth-delay product of entries in flight
    # (at 100 ms round trip, 64 entries in flight would cap a stream at 640 entries/s).
    read_ahead_entries: int = 2048
    read_ahead_bytes: int = 32 * 1024 * 1024
    # Across a WAN every replica is a round trip away: ask a second one only when the first is
    # clearly slower than that, not on every read.
    speculative_floor: float = 0.25
    # Caught up, keep long polls outstanding this many entries ahead at the source (growing with
    # the link): a new entry then crosses the WAN once, pushed by the poll already waiting for
    # it, instead of waiting for a poll to travel there and a read after it
    # (``LogReader(poll_depth=)``). 1: one poll per replica, a poll and a read per new entry.
    poll_depth: int = 8
    # Entries of local records applied whole by a C loop (dlctl.replication.fastpath) where it
    # applies; False: every record through the per-record path (the two give the same bytes).
    whole_entries: bool = True
    causal_poll: float = 1.0  # a stream waiting for the causal past re-checks this often
    # Causal streams: send the sink's version vector with every read, so the source leaves the
    # records the sink holds behind (``dlctl.replication.seen``).
    source_filtering: bool = True


def _request_size(headers: Mapping[str, bytes]) -> int:
    """How many records the source request that starts with this record holds (its ``dl.p``
    mark: they follow it in the log, consecutive); 1 for a record without a (valid) mark."""
    try:
        mark = producer_mark(headers)
    except ValueError:
        return 1
    return mark.count if mark is not None else 1


@dataclass(frozen=True)
class WorkerReport:
    """A worker's progress for its observer. ``applied_records`` and ``last_applied_at`` are the
    checkpoint's (what every run of this stream's log applied, on any agent); the lag is the
    source records (and their bytes) after the checkpoint when the worker last measured the
    source's end, None until it first has."""

    stream_id: str
    log: str
    applied_records: int
    last_applied_at: float  # Unix time; 0: never
    caught_up_at: float  # Unix time the worker last had read everything the source held; 0: never
    created: float  # the stream's creation (the lag's start if it never caught up)
    lag_records: int | None = None
    lag_bytes: int | None = None
    wire_bytes: int = 0  # the checkpoint's: source answers as they crossed the wire ...
    wire_payload_bytes: int = 0  # ... and decoded (issue 23)
    safe_time: float = 0.0  # the checkpoint's (dlctl.replication.safetime; Unix time, 0: none yet)

    def lag_seconds(self, now: float) -> float | None:
        return lag_seconds(self.lag_records, self.caught_up_at, self.created, now)


@dataclass
class _Progress:
    """The worker's state after the last record it handled (what a checkpoint records)."""

    last: DLSN | None
    processed: int
    applied: int
    applied_bytes: int
    last_applied_at: float
    left_at_source: int = 0  # records the source sent as stubs (the sink held them)


class StreamWorker:
    """Runs one (stream, log); ``run`` returns when ``stop`` is set, raises on failure."""

    def __init__(
        self,
        config: StreamConfig,
        log_name: str,
        node_id: str,
        *,
        sink_meta: MetaStore,
        sink_pool: AgentPool,
        source_meta: MetaStore,
        source_pool: AgentPool,
        stop: asyncio.Event,
        options: WorkerOptions | None = None,
        observer: Callable[[WorkerReport], None] | None = None,
    ) -> None:
        self.config = config
        self.observer = observer
        self.log_name = log_name
        self.node_id = node_id
        self.sink_meta, self.sink_pool = sink_meta, sink_pool
        self.source_meta, self.source_pool = source_meta, source_pool
        self.stop = stop
        self.options = options or WorkerOptions()
        self.streams = StreamStore(sink_meta)
        self.pins = PinStore(source_meta)
        self.source = config.source_cluster
        self.here = config.sink_cluster
        self._loop = asyncio.get_running_loop()
        self._checkpoint: Versioned[Checkpoint] | None = None
        self._appender: SinkAppender | None = None
        # Set once the run reads and applies: before that (waiting for the sink log's ownership,
        # up to ownership_wait) a stop does not reach it, and cancelling it is safe.
        self.started = False
        self._reader: LogReader | None = None
        self._last_contact = 0.0
        self._caught_up_at = 0.0
        self._last_probe = 0.0
        self._last_pin = 0.0
        self._last_end = 0.0
        self._pin_error = ""
        self._pin_task: asyncio.Task[str] | None = None
        self._end_task: asyncio.Task[None] | None = None
        self._source_end: dict[str, Any] = {}  # Checkpoint.source_end* fields, last measured
        self._sink_cvv: dict[str, int] = {}  # what the sink log holds, as its streams checkpointed it
        self._cvv_task: asyncio.Task[None] | None = None
        self._last_cvv = 0.0
        self._clock: SourceClock | None = None  # this run's, once it reads
        self._settled: settle.SettledFloors | None = None  # the sink's settled retired locations, read as they come
        self._filtering = False  # reads carry the sink's version vector (source-side filtering)
        self._split_warned = False  # said once that a source request was too large to keep whole
        self.stats_whole_records = 0  # records applied by the C loop over whole entries (fastpath)
        self._lag: tuple[int, int] | None = None  # (records, bytes) after the checkpoint, last measured
        self._safe = SafeTime()  # from the measures of the source's end (floor: the checkpoint's, at the run's start)
        # The source's answers to this run's reads (compressed when the stream says zstd and the
        # agent can), added to the checkpoint's counts of earlier runs (``_wire_base``).
        self._wire = WireStats(ask=config.compression == "zstd")
        self._wire_base = (0, 0)

    @property
    def checkpoint(self) -> Checkpoint | None:
        return self._checkpoint.value if self._checkpoint is not None else None

    async def _zk(self, fn: Any, *args: Any) -> Any:
        return await self._loop.run_in_executor(None, fn, *args)

    # -- the run ----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            await self._shutdown()

    async def _run(self) -> None:
        self._checkpoint = await self._zk(self.streams.get_checkpoint, self.config.stream_id, self.log_name)
        self._safe = SafeTime(self._checkpoint.value.safe_time)  # an earlier run's, maybe on another agent
        self._report()
        cp = self._checkpoint.value
        if cp.needs_bootstrap:
            raise NeedsBootstrap(f"stream {self.config.stream_id!r}, log {self.log_name!r} needs a bootstrap: {cp.needs_bootstrap}")
        if cp.gated:
            await self._await_causal_past()
            if self.stop.is_set():
                return
            cp = self._checkpoint.value
        await self._check_retained(cp.next)
        self._appender = await open_appender(
            self.sink_meta, self.sink_pool, self.log_name, owner_id=f"replication:{self.config.stream_id}:{self.node_id}",
            region=None, ownership_wait=self.options.ownership_wait, shared=self.config.bidirectional,
            role=replication_role(self.config.stream_id),
        )
        applied = await find_applied(self.sink_meta, self.sink_pool, self.log_name, self.source, floor=cp.sink_dlsn)
        already = applied.source if applied is not None else None
        log.info(
            "stream %s, log %s: resuming at %s (sink has up to source position %s)",
            self.config.stream_id, self.log_name, cp.next, already,
        )
        base = await self._zk(ClockStore(self.source_meta).steps, self.log_name)
        self._settled = settle.SettledFloors(self.sink_meta)
        settled = await self._zk(self._settled.of, self.log_name)
        self._clock = clock = SourceClock(self.source, cp.source_vv, base=base, start=cp.next, settled=settled)
        causal = CausalityFilter(self.here, cp.sink_vv, unfiltered=self.config.unfiltered) if self.config.bidirectional or self.config.unfiltered else None
        progress = _Progress(None, cp.processed_records, cp.applied_records, cp.applied_bytes, cp.last_applied_at, cp.left_at_source)
        self._wire_base = (cp.wire_bytes, cp.wire_payload_bytes)
        sink_dlsn = applied.sink if applied is not None else cp.sink_dlsn
        throttle = TokenBucket(self.config.throttle_bytes_per_second)
        carried = RecordFilter.parse(self.config.filter) if self.config.filter else None
        source_name = self.source.encode()
        seen = None
        if causal is not None and not causal.unfiltered and self.options.source_filtering:
            here = self.here
            # Per read, what the sink log holds: this stream's filter, and what every stream into
            # the sink has checkpointed (``_sink_cvv``, refreshed in the background). Both only grow.
            seen = lambda: (here, merge(causal.vv, self._sink_cvv))  # noqa: E731
            self._filtering = True
            self._maybe_refresh_sink_view(force=True)
            assert self._cvv_task is not None
            await self._cvv_task  # the first reads already leave behind what the sink holds
        self._reader = reader = LogReader(
            self.source_meta, self.source_pool, self.log_name, start_dlsn=cp.next, region=self.options.region, seen=seen, wire=self._wire,
            read_ahead=ReadAhead(self.options.read_ahead_entries, self.options.read_ahead_bytes, adaptive=False),
            speculative_timeout=AdaptiveTimeout(floor=self.options.speculative_floor, ceiling=max(1.0, 2 * self.options.speculative_floor)),
            poll_depth=self.options.poll_depth,
        )
        await reader.open()
        await self._refuse_skips(reader, causal)
        appender = self._appender
        last_future: asyncio.Future[DLSN] | None = None
        candidate: tuple[asyncio.Future[DLSN] | None, Checkpoint] | None = None
        next_checkpoint = time.monotonic() + self.options.checkpoint_interval
        read_errors = 0
        count = 0
        # Atomic requests: a source request (a record marked ``dl.p`` and the next count - 1)
        # is in one source entry, so once its first record is read the others are decoded
        # already and come without waiting (LogReader hands out an entry's records from memory;
        # it waits, times out or fails only between entries). Its admitted records collect in
        # ``group`` and go to the sink together once its last one is read; no checkpoint is
        # taken in between and a stop waits for its end, so the checkpoint's source position is
        # always between requests (a resumed run never applies part of one, nor skips part).
        # Whatever else the reader gives (a timeout, a read error, a record of another entry or
        # with a mark of its own) ends the request there: the rest is not in that entry (a
        # request larger than the source writer's entry: not atomic at the source either).
        group: list[Record] = []
        group_left = 0  # records of the current source request still to read
        group_entry: tuple[int, int] | None = None  # its (segment, entry) at the source

        async def checkpoint_when_due(now: float, between_requests: bool = True) -> None:
            """Checkpoints: snapshot now (only between source requests), write once what was
            submitted up to here is acknowledged."""
            nonlocal candidate, last_future, next_checkpoint, sink_dlsn
            if candidate is None and now >= next_checkpoint and progress.last is not None and between_requests:
                candidate = (last_future, self._snapshot(progress, clock, causal))
            if candidate is not None and (candidate[0] is None or candidate[0].done()):
                future, snapshot = candidate
                if future is not None:
                    sink_dlsn = future.result()  # raises the appender's failure: the run ends
                await self._write_checkpoint(replace(snapshot, sink_dlsn=sink_dlsn))
                candidate = None
                last_future = None if last_future is future else last_future
                next_checkpoint = time.monotonic() + self.options.checkpoint_interval
                await self._maybe_pin()
                self._maybe_measure_end()
                self._maybe_refresh_sink_view()

        # Whole entries of local records in C (dlctl.replication.fastpath): a one-way stream
        # without a filter, into the library writer (the producer of an active-active sink
        # takes records one by one).
        whole = self._whole_entries(appender, causal, carried)
        self.started = True
        while not self.stop.is_set() or group_left:
            if whole is not None and not group_left:
                entry = reader.take_entry()
                if entry is None and not await reader.wait_entry(self.options.idle_read_timeout):
                    now = time.monotonic()
                    await self._idle(now, reader)  # (a read that waited in vain)
                    await checkpoint_when_due(now)
                    continue
                entry = entry or reader.take_entry()
                await self._refuse_skips(reader, causal)
                if entry is not None and (already is None or DLSN(entry.seq, entry.entry_id, 0) > already):
                    assert isinstance(appender, LogWriter)
                    last_future = await self._apply_whole(entry, whole, reader, appender, clock, progress, throttle) or last_future
                    await checkpoint_when_due(time.monotonic())
                    continue
                if entry is not None:
                    reader.records_from(entry, 0)  # (records the sink holds: the per-record path skips them)
            try:
                record = await reader.read_next(self.options.idle_read_timeout)
                read_errors = 0
                await self._refuse_skips(reader, causal)
            except EntryReadError as exc:
                if group_left:
                    last_future = self._submit_group(appender, group) or last_future
                    group, group_left = [], 0
                read_errors += 1
                await self._note_error(f"reading the source: {exc.message}")
                await self._wait_stop(min(5.0, 0.1 * 2**read_errors))
                continue
            now = time.monotonic()
            if group_left and (record is None or (record.dlsn.segment_seq, record.dlsn.entry_id) != group_entry or PRODUCER_HEADER in record.headers):
                last_future = self._submit_group(appender, group) or last_future
                group, group_left = [], 0
            if record is None:
                await self._idle(now, reader)
            else:
                self._last_contact = time.time()
                headers = record.headers
                if not group_left and PRODUCER_HEADER in headers:
                    group_left = _request_size(headers)
                    group_entry = (record.dlsn.segment_seq, record.dlsn.entry_id)
                origin = Origin.from_headers(headers) if ORIGIN_CLUSTER in headers else None
                vt = clock.stamp(origin, record.dlsn)
                progress.last = record.dlsn
                progress.processed += 1
                origin_cluster = origin.cluster if origin is not None else self.source
                if already is not None and record.dlsn <= already:
                    if causal is not None:
                        causal.seen(vt)  # in the sink already, appended by an earlier run
                elif SEEN_MARK in headers and causal is not None:
                    causal.seen(vt)  # the sink holds it: the source left its payload behind
                    progress.left_at_source += 1
                elif (carried is None or carried.admits(record.key, headers)) and (causal is None or causal.admit(origin_cluster, vt)):
                    # (Not admitted: outside the stream's filter, or in the sink's causal past —
                    # seen already, or its own.)
                    out = applied_headers(headers, origin, source_name, str(record.dlsn).encode(), vt)
                    await throttle.take(len(record.payload))
                    if group_left:
                        group.append(Record(0, record.payload, record.key, out))
                    else:
                        last_future = appender.submit(record.payload, key=record.key, headers=out)
                    progress.applied += 1
                    progress.applied_bytes += len(record.payload)
                    progress.last_applied_at = time.time()
                    count += 1
                    if count & 255 == 0:
                        await appender.wait_writable()
                        # Let the loop run: while the reader has entries in hand, read_next and
                        # submit never suspend, and the sink writer's sends and acks (and the
                        # reader's next requests) would wait until the reader ran dry — reading
                        # and appending in turns instead of overlapped.
                        await asyncio.sleep(0)
                if group_left:
                    group_left -= 1
                    if not group_left:  # the request's last record: submit what was admitted of it
                        last_future = self._submit_group(appender, group) or last_future
                        group = []
            await checkpoint_when_due(now, between_requests=not group_left)
        # Stopping: apply what was submitted, then a final checkpoint.
        if progress.last is not None:
            snapshot = self._snapshot(progress, clock, causal)
            if last_future is not None:
                await appender.flush()
                sink_dlsn = last_future.result()
            await self._write_checkpoint(replace(snapshot, sink_dlsn=sink_dlsn))
            await self._maybe_pin(force=True)

    async def _await_causal_past(self) -> None:
        """A new causal connection (``dlctl.replication.network``): read nothing until the sink
        holds everything the source deleted. Meanwhile the checkpoint names what the sink lacks
        (``replication status``: waiting-for-causal-past) and the pin keeps the source's retained
        part. Once the rule holds, the causality filter starts from the sink's version vector, so
        the source's retained records the sink has already are skipped."""
        assert self._checkpoint is not None
        sid = self.config.stream_id
        while not self.stop.is_set():
            missing, cvv = await self._zk(lambda: causal_gate(self.source_meta, self.sink_meta, self.log_name, stream_id=sid, own_events=self.config.unfiltered))
            cp = self._checkpoint.value
            if missing == {}:
                log.info("stream %s, log %s: the sink holds the source's deleted past; streaming from %s", sid, self.log_name, cp.next)
                await self._write_checkpoint(replace(cp, gated=False, waiting_for={}, sink_vv=merge(cp.sink_vv, cvv)))
                return
            wanted = {o: list(r) for o, r in (missing or {}).items()}
            if missing is None:
                await self._note_error("the source truncated without recording what it deleted: the stream cannot tell when the sink has it")
            elif cp.waiting_for != wanted:
                log.info("stream %s, log %s: waiting for the causal past: the sink lacks %s", sid, self.log_name, describe_missing(missing))
                await self._write_checkpoint(replace(cp, waiting_for=wanted))
            await self._maybe_pin()
            await self._wait_stop(self.options.causal_poll)

    def _whole_entries(self, appender: SinkAppender, causal: CausalityFilter | None, carried: RecordFilter | None) -> fastpath.LocalEntries | None:
        """The C loop over whole entries, where it applies: a one-way stream without a filter,
        appending through the library writer (``dlctl.replication.fastpath``)."""
        if not self.options.whole_entries or causal is not None or carried is not None or not isinstance(appender, LogWriter) or not fastpath.available():
            return None
        return fastpath.LocalEntries(self.source, appender.options.batch_bytes)

    async def _apply_whole(
        self, entry: WholeEntry, whole: fastpath.LocalEntries, reader: LogReader, appender: LogWriter, clock: SourceClock, progress: _Progress, throttle: TokenBucket,
    ) -> asyncio.Future[DLSN] | None:
        """Apply ``entry`` in pieces of one sink entry each; from the first record the C loop
        leaves (headers, a clock step), the reader hands the rest out one by one. Returns the
        future of the last record submitted, if any."""
        last_future: asyncio.Future[DLSN] | None = None
        pos = slot = 0
        while pos < len(entry.payload):
            piece = whole.piece(entry, pos, slot, clock, appender.next_txid)
            if piece is None:
                reader.records_from(entry, slot)
                return last_future
            pos, slot = piece.next_pos, piece.next_slot
            if piece.count:
                await throttle.take(piece.payload_bytes)
                last_future = appender.submit_encoded(piece.encoded, piece.count, piece.first_txid)
                progress.last = piece.last
                progress.processed += piece.count
                progress.applied += piece.count
                progress.applied_bytes += piece.payload_bytes
                progress.last_applied_at = time.time()
                self.stats_whole_records += piece.count
        reader.entry_done(entry, slot)
        self._last_contact = time.time()
        await appender.wait_writable()
        await asyncio.sleep(0)  # let the loop run (see the per-record path)
        return last_future

    def _submit_group(self, appender: SinkAppender, group: list[Record]) -> asyncio.Future[DLSN] | None:
        """Submit the admitted records of one source request as one sink request (one entry),
        so the sink applies it whole or not at all; the future of its last record (None: none
        admitted)."""
        if len(group) <= 1:
            return appender.submit(group[0].payload, key=group[0].key, headers=group[0].headers) if group else None
        try:
            return appender.submit_group(group)[-1]
        except ValueError as exc:
            # Larger than one sink request (the origin headers add bytes to every record):
            # applied in order, but no longer atomically. Nothing of it was queued.
            if not self._split_warned:
                self._split_warned = True
                log.warning("stream %s, log %s: a source request of %d records is split at the sink: %s", self.config.stream_id, self.log_name, len(group), exc)
            return [appender.submit(r.payload, key=r.key, headers=r.headers) for r in group][-1]

    def _snapshot(self, progress: _Progress, clock: SourceClock, causal: CausalityFilter | None) -> Checkpoint:
        assert self._checkpoint is not None and progress.last is not None
        last = progress.last
        next_ = DLSN(last.segment_seq, last.entry_id, last.slot + 1)
        end = self._source_end.get("source_end")
        if end is not None and next_ >= end:  # read everything the source held when it was measured
            self._caught_up_at = max(self._caught_up_at, self._source_end["source_end_at"])
        return replace(
            self._checkpoint.value,
            next=next_,
            source_vv=dict(clock.vv),
            sink_vv=dict(causal.vv) if causal is not None else {},
            processed_records=progress.processed,
            applied_records=progress.applied,
            applied_bytes=progress.applied_bytes,
            last_applied_at=progress.last_applied_at,
            left_at_source=progress.left_at_source,
            wire_bytes=self._wire_base[0] + self._wire.wire,
            wire_payload_bytes=self._wire_base[1] + self._wire.payload,
            compression=self._wire.mode(),
            last_contact=self._last_contact,
            caught_up_at=self._caught_up_at,
            safe_time=self._safe.value_at(next_),  # true once written: after what precedes next_ is acknowledged
            worker=self.node_id,
            **self._source_end,
            last_error="" if time.time() - self._checkpoint.value.last_error_at > 30 else self._checkpoint.value.last_error,
        )

    async def _write_checkpoint(self, new: Checkpoint) -> None:
        assert self._checkpoint is not None
        # A snapshot taken before an idle write may carry an older safe time: it never goes back.
        new = replace(new, safe_time=max(new.safe_time, self._checkpoint.value.safe_time))
        try:
            self._checkpoint = await self._zk(self.streams.update_checkpoint, self.config.stream_id, self._checkpoint, new)
        except (ConflictError, NotFoundError) as exc:
            raise StreamGone(f"stream {self.config.stream_id!r}, log {self.log_name!r}: checkpoint taken over or deleted ({exc.message})") from None
        self._safe.settle(new.safe_time)
        self._report()

    def _report(self) -> None:
        if self.observer is None or self._checkpoint is None:
            return
        cp = self._checkpoint.value
        lag_records, lag_bytes = self._lag if self._lag is not None else (None, None)
        report = WorkerReport(
            self.config.stream_id, self.log_name, cp.applied_records, cp.last_applied_at, cp.caught_up_at, self.config.created, lag_records, lag_bytes,
            cp.wire_bytes, cp.wire_payload_bytes, safe_time=cp.safe_time,
        )
        try:
            self.observer(report)
        except Exception:  # noqa: BLE001 - an observer's trouble must not stop the stream
            log.exception("stream %s, log %s: the worker's observer failed", self.config.stream_id, self.log_name)

    async def _idle(self, now: float, reader: LogReader) -> None:
        """Caught up (a read waited in vain): probe the source now and then, so status can tell
        'nothing to do' from 'cannot reach the source'."""
        if now - self._last_probe < self.options.contact_interval:
            return
        self._last_probe = now
        if await self._probe():
            self._last_contact = self._caught_up_at = time.time()
            cp = self._checkpoint
            if cp is not None and time.time() - cp.value.updated > self.options.checkpoint_interval:
                await self._write_checkpoint(replace(
                    cp.value, last_contact=self._last_contact, caught_up_at=self._caught_up_at, safe_time=self._safe.value_at(cp.value.next), **self._source_end,
                ))
        await self._maybe_pin()
        self._maybe_measure_end()  # the safe time of an idle stream moves with these measures
        self._maybe_refresh_sink_view()

    async def _probe(self) -> bool:
        nodes = await self.source_pool.refresh() if not self.source_pool.nodes else self.source_pool.nodes
        for node in list(nodes)[:3]:
            try:
                client = await self.source_pool.client(node)
                await asyncio.wait_for(client.stat(), 2.0)
                return True
            except (AgentError, TimeoutError):
                continue
        return False

    async def _maybe_pin(self, force: bool = False) -> None:
        """Move the retention pin at the source to the checkpoint. In the background: the
        source's ZooKeeper is far away (a WAN round trip or more) and the stream must not wait
        for it; one refresh at a time. ``force`` (stopping) refreshes now and waits."""
        if self._pin_task is not None:
            if force:
                await asyncio.wait([self._pin_task])
            if not self._pin_task.done():
                return
            await self._collect_pin()
        now = time.monotonic()
        cp = self._checkpoint
        if cp is None or (not force and now - self._last_pin < self.options.pin_interval):
            return
        self._last_pin = now
        self._maybe_measure_end(force=True)
        pin = PinRecord(
            holder=self.config.stream_id,
            log=self.log_name,
            position=cp.value.next,
            sink_cluster=self.here,
            max_age_seconds=self.config.pin_max_age_seconds,
        )
        self._pin_task = asyncio.ensure_future(self._set_pin(pin))
        if force:
            await asyncio.wait([self._pin_task])
            await self._collect_pin()

    def _maybe_refresh_sink_view(self, force: bool = False) -> None:
        """Read in the background, at most every ``contact_interval`` unless ``force``: what the
        streams into the sink have checkpointed (``current_version_vector``; with source-side
        filtering, whose view of the sink log grows with it), and the retired locations the
        sink's network history says are settled in this log (new timestamps omit them)."""
        if self._cvv_task is not None and not self._cvv_task.done():
            return
        now = time.monotonic()
        if not force and now - self._last_cvv < self.options.contact_interval:
            return
        self._last_cvv = now

        async def refresh() -> None:
            try:
                if self._filtering:
                    self._sink_cvv = merge(self._sink_cvv, await self._zk(current_version_vector, self.sink_meta, self.log_name))
                if self._clock is not None and self._settled is not None:
                    floors = await self._zk(self._settled.of, self.log_name)
                    self._clock.settled = {k: v for k, v in floors.items() if k != self.source}
            except Exception as exc:  # noqa: BLE001 - ZooKeeper trouble: the last view stays (it only filters less)
                log.debug("stream %s, log %s: reading the sink's version vector and settled locations: %r", self.config.stream_id, self.log_name, exc)

        self._cvv_task = asyncio.ensure_future(refresh())

    def _maybe_measure_end(self, force: bool = False) -> None:
        """Measure the source's end in the background, one measure at a time, at most every
        ``contact_interval`` unless ``force``."""
        cp = self._checkpoint
        if cp is None or (self._end_task is not None and not self._end_task.done()):
            return
        now = time.monotonic()
        if not force and now - self._last_end < self.options.contact_interval:
            return
        self._last_end = now
        self._end_task = asyncio.ensure_future(self._measure_source_end(cp.value))

    async def _measure_source_end(self, cp: Checkpoint) -> None:
        """Where the source ends and how many records lie after the checkpoint (what a failover
        would report at risk if the source vanished now). Best effort, off the hot path."""
        started = time.time()  # the source held at least this much then: caught up to it means caught up to then
        await self._observe_end(started, cp)
        try:
            end = await log_end(self.source_meta, self.source_pool, self.log_name, region=self.options.region)
            behind, behind_bytes = await records_from(self.source_meta, self.source_pool, self.log_name, cp.next, region=self.options.region)
        except Exception as exc:  # noqa: BLE001 - the source may be unreachable: keep the last measure
            log.debug("stream %s, log %s: measuring the source end: %r", self.config.stream_id, self.log_name, exc)
            return
        self._source_end = {
            "source_end": end.next if end.next is not None else cp.next,
            "source_end_records": behind,
            "source_end_processed": cp.processed_records,
            "source_end_at": started,
        }
        self._lag = (behind, behind_bytes)
        self._report()

    async def _observe_end(self, started: float, cp: Checkpoint) -> None:
        """An observation for the safe time: the source held nothing after this end at ``started``.
        A claim needs a firmer end than the estimate of ``log_end`` (``positions.quorum_end``)."""
        try:
            end = await quorum_end(self.source_meta, self.source_pool, self.log_name, region=self.options.region)
        except Exception as exc:  # noqa: BLE001 - too few source replicas answered: no observation this time
            log.debug("stream %s, log %s: no safe-time observation: %r", self.config.stream_id, self.log_name, exc)
            return
        self._safe.observe(started, end if end is not None else cp.next)  # (None: the source holds no record)

    async def _collect_pin(self) -> None:
        assert self._pin_task is not None
        task, self._pin_task = self._pin_task, None
        reason = task.result()
        if reason:
            await self._mark_needs_bootstrap(reason)

    async def _set_pin(self, pin: PinRecord) -> str:
        """Refresh the pin; returns why the stream needs a bootstrap when the pin says so."""
        try:
            current = await self._zk(self.pins.set, pin)
        except Exception as exc:  # noqa: BLE001 - the source's ZooKeeper may be unreachable: retry next time
            self._pin_error = f"cannot refresh the retention pin at the source: {exc}"
            log.warning("stream %s, log %s: %s", self.config.stream_id, self.log_name, self._pin_error)
            return ""
        if current.value.needs_bootstrap:
            return current.value.reason or "the source deleted pinned data"
        return ""

    async def _check_retained(self, position: DLSN) -> None:
        try:
            record = await self._zk(self.source_meta.get_log, self.log_name)
            segments = await self._zk(self.source_meta.segments, self.log_name)
        except NotFoundError:
            raise NeedsBootstrap(f"log {self.log_name!r} does not exist in source cluster {self.source!r}") from None
        first = first_retained([s.value for s in segments], record.value.max_segment_seq)
        if first is not None and position < first:
            await self._mark_needs_bootstrap(f"the source starts at {first}, the stream needs {position}")
        try:
            pin = await self._zk(self.pins.get, self.config.stream_id, self.log_name)
        except NotFoundError:
            return
        if pin.value.needs_bootstrap:
            await self._mark_needs_bootstrap(pin.value.reason or "the source deleted pinned data")

    async def _refuse_skips(self, reader: LogReader, causal: CausalityFilter | None) -> None:
        """The source was truncated under the reader (past the pin: a forced truncation) and the
        reader moved on to its truncation point: what was skipped never reaches the sink, so
        nothing after it may be applied, nor checkpointed. (What was applied before is, and the
        checkpoint stays at or before it.) Not for streams judged by causality: there the sink
        may hold what was skipped already (`dr recover` of a location restored from a backup
        starts such streams before their source's truncation point on purpose)."""
        if reader.truncation_skips and causal is None:
            await self._mark_needs_bootstrap(f"the source was truncated under the stream: its reader skipped {reader.truncation_skips[0]}")

    async def _mark_needs_bootstrap(self, reason: str) -> None:
        assert self._checkpoint is not None
        await self._write_checkpoint(replace(self._checkpoint.value, needs_bootstrap=reason).with_error(f"needs bootstrap: {reason}"))
        raise NeedsBootstrap(f"stream {self.config.stream_id!r}, log {self.log_name!r} needs a bootstrap: {reason}")

    async def _note_error(self, message: str) -> None:
        log.warning("stream %s, log %s: %s", self.config.stream_id, self.log_name, message)
        cp = self._checkpoint
        if cp is not None:
            try:
                await self._write_checkpoint(cp.value.with_error(message))
            except StreamGone:
                raise
            except Exception:  # noqa: BLE001 - ZooKeeper trouble too: the log line stays
                pass

    async def _wait_stop(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except TimeoutError:
            pass

    async def _shutdown(self) -> None:
        for task in (self._end_task, self._cvv_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._pin_task is not None:
            self._pin_task.cancel()
            await asyncio.gather(self._pin_task, return_exceptions=True)
        if self._reader is not None:
            await self._reader.close()
        if self._appender is not None:
            try:
                await self._appender.close()
            except Exception as exc:  # noqa: BLE001 - the run's own error matters more
                log.debug("closing the sink appender of %s: %s", self.log_name, exc)


async def record_error(streams: StreamStore, stream_id: str, log_name: str, message: str) -> None:
    """Write ``message`` as the checkpoint's last error (for status), by CAS; best effort."""
    loop = asyncio.get_running_loop()

    def update() -> None:
        for _ in range(3):
            try:
                current = streams.get_checkpoint(stream_id, log_name)
                streams.update_checkpoint(stream_id, current, current.value.with_error(message))
                return
            except ConflictError:
                continue

    try:
        await loop.run_in_executor(None, update)
    except Exception:  # noqa: BLE001 - status just misses this one
        pass
