# Over ~600 lines (about 730), deliberately: LogWriter is both the log's public face (submit,
# submit_encoded, submit_group, append, flush, close, their contracts in their docstrings) and
# the state machine that opens, rolls, seals and fails its segments, and both work on the same
# state (the open segment, the batch being cut, the queue of cut batches, the transition under
# way). What has a job of its own lives in its own room: the open segment's pipeline
# (segment_pipeline), the ZooKeeper side and ensemble choice (writer_meta), the change of owner
# (writer_takeover), options and errors (writer_options). Splitting the rest would put that
# shared state behind callbacks on the hot path (every submit).
"""The log writer: ownership, recovery on open, batching, pipelined replication, rolling.

``LogWriter.open`` takes ownership of a log, fences and recovers its in-progress segment if
the previous owner left one (``writer.recovered``), and is then the only writer of the log.

Records are batched into entries (cut at ``batch_bytes`` or ``batch_delay`` after the first
record of a batch, or at once when nothing is in flight, so a lone append is not delayed).
Entries are pipelined: each goes to its write set as soon as it is cut, many in flight. An
entry is acknowledged once A replicas of its write set confirm *and* every earlier entry is
acknowledged; each record's future then gets its DLSN. Every entry carries the LAC; when the
writer goes idle a control entry carries the final one, so tailing readers see the last data.

Every entry ends with a control record holding the segment's running totals (records and
bytes up to that entry), so closing a recovered segment needs only its last entry, and the
entry's append time: the owner's clock, never below the log's previous entry (not after a
change of owner either: the segments record their last times), so readers position by time
(``dlctl.log.timeindex``).

Segments are created lazily, when the first entry needs one, with its first txid known, and
roll by size and time (the old one is completed by compare-and-set after its in-flight entries
are acknowledged).

**Agent failures.** The writer does not splice replacements into a live segment (no ensemble
changes); it *rolls*. The open segment's pipeline (``dlctl.log.segment_pipeline``: entries in
flight, their ack sets, the LAC) drops a failed or silent agent from the segment's write sets
and acknowledges entries with the remaining members while they still form an ack quorum. The
writer then rolls to a new segment on a fresh ensemble without the failed agent: in-flight
entries are given the chance to be acknowledged, the segment is completed at its last
acknowledged entry, and entries that could not reach quorum are re-encoded into the new segment
(their DLSNs are assigned only then, so nothing acknowledged moves). When no fresh ensemble can
be formed (too few agents) the writer stays on the degraded segment as long as ack quorum holds
and retries every ``ensemble_retry`` seconds; if an entry can no longer reach quorum it waits up
to ``stall_timeout`` for agents to come back and then fails. Segments left with fewer than W
replicas are for re-replication (DESIGN.md §6) to repair.

**Deposition.** A fencing error from any agent, the loss of the ZooKeeper session (or of the
owner znode), or a lost compare-and-set on our own segment means another writer took over:
every pending and later append fails with ``WriterDeposedError``; no entry is reported
acknowledged after that moment, and acknowledgements that arrive later are ignored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from ..errors import ConflictError, NotFoundError
from ..meta.access import AccessStore
from ..meta.records import NO_TXID, LogRecord, SegmentRecord, Versioned
from ..meta.store import MetaStore
from . import format as fmt
from .dlsn import DLSN
from .errors import AgentUnavailableError, FencedError
from .ownership import Ownership
from .pool import ReplicaPool
from .readpolicy import AdaptiveTimeout
from .records import RECORD_PLAIN, Record, encode_records
from .recovery import TOTALS_RECORD_SIZE, RecoveryResult
from .segment_pipeline import SILENT_FACTOR, Batch, SegmentPipeline
from .takeover import ACTIVE_FOR
from .writer_options import TxidOrderError, WriterClosedError, WriterDeposedError, WriterError, WriterOptions, stopped_by
from .writer_meta import WriterMeta
from .writer_takeover import WriterTakeover

log = logging.getLogger(__name__)

# One record without key or headers, encoded without building a Record: size, flags, txid, key
# length (0), header count (0); then the payload. Same layout as records.encode_records.
_PLAIN = RECORD_PLAIN  # (a record without key or headers: its layout is records.py's)
_PLAIN_BODY = _PLAIN.size - 4  # bytes counted by the size field before the payload
_MAX_RECORD = fmt.MAX_PAYLOAD - TOTALS_RECORD_SIZE
_TXID_MAX = 2**63 - 1


class LogWriter:
    """The single writer of a log; create with ``await LogWriter.open(...)`` (see module doc)."""

    def __init__(self, meta: MetaStore, pool: ReplicaPool, name: str, owner_id: str | None, options: WriterOptions, owner_info: dict | None = None) -> None:
        self.meta = meta
        self.pool = pool
        self.name = name
        self.options = options
        self.ownership = Ownership(meta, name, owner_id, owner_info)
        self._loop = asyncio.get_running_loop()
        # ZooKeeper: the log's record, our segments' records, ensembles for new ones.
        self._wmeta = WriterMeta(meta, pool, name, self.ownership, stall_timeout=options.stall_timeout, stopped=lambda: self._error)
        self._zk = self._wmeta.zk
        # The previous owner's segments; the txids and times we may write (dlctl.log.takeover).
        self._takeover = WriterTakeover(self._wmeta, pool, options, learn_ends=self._learn_ends, on_error=self._fail, on_reserved=self._reserved)
        self._segment: SegmentPipeline | None = None  # the open segment
        self._batch: Batch | None = None
        self._queue: deque[Batch] = deque()  # cut, waiting for a segment
        self._timer: asyncio.Handle | None = None
        self._lac_timer: asyncio.TimerHandle | None = None
        self._transition: asyncio.Task | None = None  # opening, rolling or closing a segment
        self._rolling = False  # a roll looks for the next ensemble: new entries wait for its outcome
        self._add_latency = AdaptiveTimeout(floor=0.0005, ceiling=10.0)  # replicas' answers to adds (SegmentPipeline.check_silent)
        self._housekeeper: asyncio.Task | None = None
        self._last_txid = NO_TXID  # last assigned
        # The last entry's append time (ms): the next is never lower, across owners too (the
        # log's segments carry their last times), so the log is ordered in time.
        self._last_append_ms = 0
        self._submitted = 0  # records accepted by submit()
        self._acked = 0  # records acknowledged (always a prefix of the submitted ones)
        self._flushes: list[tuple[int, asyncio.Future[None]]] = []
        self._last_dlsn: DLSN | None = None  # last acknowledged record
        self._pending_bytes = 0
        self._writable = asyncio.Event()
        self._writable.set()
        self._error: WriterError | None = None
        self._avoid: set[str] = set()  # agents that failed the last segment: not in the next one if possible
        self._closing = False
        self._closed = False
        self._lac_waits_for_bounds = False
        self._last_dispatch = float("-inf")  # loop time of the last entry sent

    # -- opening ---------------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        meta: MetaStore,
        pool: ReplicaPool,
        name: str,
        *,
        owner_id: str | None = None,
        options: WriterOptions | None = None,
        owner_info: dict | None = None,
        role: str = "application",
        **overrides: Any,
    ) -> LogWriter:
        """Own log ``name``, recover what the previous owner left in progress, and get ready to
        append. ``overrides`` are ``WriterOptions`` fields (e.g. ``batch_delay=0.005``);
        ``owner_info`` is published in the owner znode (a proxy's address). ``role``
        ("application" or "replication:<stream>") must be admitted by the log's access mode
        (``dlctl.meta.access``), else ``LogReadOnlyError``."""
        opts = options or WriterOptions()
        if overrides:
            opts = WriterOptions(**{**opts.__dict__, **overrides})
        writer = cls(meta, pool, name, owner_id, opts, owner_info)
        writer.role = role
        await writer._start()
        return writer

    role = "application"

    async def _start(self) -> None:
        # Before taking ownership too: a log its mode refuses to this role (a standby's, owned
        # by its stream's worker) is refused now, not after waiting for an owner that stays.
        await self._zk(AccessStore(self.meta).check, self.name, self.role)
        await self.ownership.acquire(wait=self.options.ownership_wait)
        try:
            # After taking ownership: whoever changes the mode deposes the owner it finds, so
            # a writer that raced the change either sees the new mode here or is deposed.
            await self._zk(AccessStore(self.meta).check, self.name, self.role)
            self.ownership.on_lost(self._on_ownership_lost)
            self._wmeta.log = await self._zk(self.meta.get_log, self.name)
            segments = await self._zk(self.meta.segments, self.name)
            self._learn_ends(segments)
            floor = await self._takeover.begin(segments, self._last_txid + 1, self._last_append_ms)
            if floor is not None:  # a fast takeover: start above the previous owner's bounds
                self._last_txid = max(self._last_txid, floor.txid)
                self._last_append_ms = max(self._last_append_ms, floor.time_ms)
            if self.ownership.lost:
                raise WriterDeposedError(f"lost ownership of log {self.name!r} while opening it: {self.ownership.lost_reason}")
            self._wmeta.log = await self._zk(self.meta.get_log, self.name)
        except BaseException:
            await self.ownership.release()
            raise
        self._housekeeper = asyncio.ensure_future(self._housekeeping())

    def _learn_ends(self, segments: list[Versioned[SegmentRecord]]) -> None:
        """Never below the last txid and append time the log's closed segments record."""
        for seg in reversed(segments):
            if seg.value.records > 0 and seg.value.last_txid != NO_TXID:
                self._last_txid = max(self._last_txid, seg.value.last_txid)
                break
        self._last_append_ms = max([self._last_append_ms] + [s.value.last_time or 0 for s in segments])

    async def recovery_done(self) -> tuple[RecoveryResult, ...]:
        """Wait until the segments the previous owner left in progress are recovered and closed
        (already so unless ``open`` took the log over fast); returns what was recovered. Raises
        the writer's error when that recovery failed. A replication worker or a write proxy
        waits for this before reading the log's tail back (the tail ends in those segments)."""
        if not await self._takeover.wait_recovered():  # the writer stopped before it ended
            raise self._error or WriterClosedError(f"writer of log {self.name!r} is closed")
        return self.recovered

    @property
    def recovered(self) -> tuple[RecoveryResult, ...]:
        """What recovering the previous owner's in-progress segments found (so far: see
        ``recovery_done``)."""
        return self._takeover.recovered

    @property
    def taken_over_seq(self) -> int:
        """The log's last segment when this writer took it over: the previous owners' segments
        are those up to it, ours come after."""
        return self._takeover.taken_over_seq

    @property
    def recovering(self) -> bool:
        """The previous owner's segments are still being recovered (a fast takeover)."""
        return self._takeover.recovering

    # -- public state --------------------------------------------------------------------------

    @property
    def owner_id(self) -> str:
        return self.ownership.owner_id

    @property
    def last_txid(self) -> int:
        """The last txid assigned (or accepted) by ``submit``; NO_TXID (-1) for an empty log."""
        return self._last_txid

    @property
    def last_dlsn(self) -> DLSN | None:
        """The last acknowledged record's position."""
        return self._last_dlsn

    @property
    def segment_seq(self) -> int | None:
        return self._segment.seq if self._segment is not None else None

    @property
    def error(self) -> WriterError | None:
        """Why the writer stopped (deposed, stalled), or None while it is healthy."""
        return self._error

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def next_txid(self) -> int:
        """The txid ``submit`` assigns next (and ``submit_encoded`` expects)."""
        return self._last_txid + 1

    # -- appending -------------------------------------------------------------------------------

    def submit(
        self,
        payload: bytes | Record,
        txid: int | None = None,
        *,
        key: bytes = b"",
        headers: Mapping[str, bytes] | None = None,
    ) -> asyncio.Future[DLSN]:
        """Queue one record; the returned future gets its DLSN when it is acknowledged.

        Never blocks (see ``wait_writable`` for backpressure). ``txid``: None assigns the last
        txid + 1; an application txid must be greater than every earlier one. A ``Record``
        brings its own txid, key and headers (``txid`` overrides its txid).
        """
        if self._error is not None:
            raise self._error
        if self._closing:
            raise WriterClosedError(f"writer of log {self.name!r} is closed", hint="open a new writer to append")
        if isinstance(payload, Record):
            if payload.control:
                raise ValueError("control records are written by the writer itself, not appended")
            record = payload
            payload, key, headers = record.payload, record.key, record.headers
            if txid is None:
                txid = record.txid
        if txid is None:
            txid = self._last_txid + 1
        elif txid <= self._last_txid:
            raise TxidOrderError(
                f"txid {txid} refused for log {self.name!r}: txids must increase and the last one is {self._last_txid}",
                hint="give a txid greater than the last, or none to let the writer assign one",
            )
        if txid > _TXID_MAX:
            raise ValueError(f"txid {txid} exceeds the int64 range")
        if key or headers:
            encoded = encode_records([Record(txid, bytes(payload), bytes(key), dict(headers or {}))])
            parts: tuple[bytes, ...] = (encoded,)
            size = len(encoded)
        else:
            size = _PLAIN.size + len(payload)
            parts = (_PLAIN.pack(_PLAIN_BODY + len(payload), 0, txid, 0, 0), payload)
        if size > _MAX_RECORD:
            raise ValueError(f"record of {size} bytes exceeds the {_MAX_RECORD}-byte maximum of one entry")
        return self._queue_records(parts, size, 1, txid, txid)

    def submit_encoded(self, encoded: bytes, count: int, first_txid: int) -> asyncio.Future[DLSN]:
        """Queue ``count`` records already encoded (``dlctl.log.records``' layout, no control
        record) whose txids are ``first_txid`` (``next_txid``), ``first_txid + 1``, ...: a
        replication stream's records, built in one C loop (``dlctl.replication.fastpath``). They
        land in one entry (the batch is cut before them when they would not fit with it); the
        future gets the DLSN of the last when they are acknowledged. The caller vouches for the
        layout: records are not parsed here."""
        if self._error is not None:
            raise self._error
        if self._closing:
            raise WriterClosedError(f"writer of log {self.name!r} is closed", hint="open a new writer to append")
        if count < 1 or not encoded:
            raise ValueError("submit_encoded needs at least one record")
        if first_txid != self._last_txid + 1:
            raise TxidOrderError(f"encoded records of log {self.name!r} start at txid {first_txid}, the writer is at {self._last_txid}")
        last_txid = first_txid + count - 1
        if last_txid > _TXID_MAX:
            raise ValueError(f"txid {last_txid} exceeds the int64 range")
        if len(encoded) > self.options.batch_bytes:
            raise ValueError(f"{len(encoded)} bytes of encoded records exceed one entry's {self.options.batch_bytes}")
        return self._queue_records((encoded,), len(encoded), count, first_txid, last_txid)

    def _queue_records(self, parts: tuple[bytes, ...], size: int, count: int, first_txid: int, last_txid: int) -> asyncio.Future[DLSN]:
        """Add ``count`` encoded records (``size`` bytes in ``parts``) to the batch being cut,
        cutting it first when they would not fit; the future is the last record's."""
        self._last_txid = last_txid
        fut: asyncio.Future[DLSN] = self._loop.create_future()
        batch = self._batch
        if batch is not None and batch.size + size > self.options.batch_bytes:
            self._cut()
            batch = None
        if batch is None:
            batch = self._batch = Batch(first_txid)
            self._arm_batch_timer()
        batch.parts.extend(parts)
        if count > 1:
            batch.futures.extend([None] * (count - 1))
        batch.futures.append(fut)
        batch.size += size
        batch.last_txid = last_txid
        self._submitted += count
        self._pending_bytes += size
        if self._pending_bytes > self.options.max_pending_bytes:
            self._writable.clear()
        if batch.size >= self.options.batch_bytes:
            self._cut()
        return fut

    def submit_group(self, records: list[Record]) -> list[asyncio.Future[DLSN]]:
        """Queue records (txids assigned by the writer; the records' own are ignored) so that
        they land in one entry whenever together they fit in ``batch_bytes``: a write proxy's
        request is then acknowledged or lost as a whole, never in part. Validates every record
        before queueing any."""
        sizes = [r.encoded_size for r in records]
        for size in sizes:
            if size > _MAX_RECORD:
                raise ValueError(f"record of {size} bytes exceeds the {_MAX_RECORD}-byte maximum of one entry")
        if any(r.control for r in records):
            raise ValueError("control records are written by the writer itself, not appended")
        batch = self._batch
        if batch is not None and batch.size + sum(sizes) > self.options.batch_bytes:
            self._cut()
        return [self.submit(r.payload, key=r.key, headers=r.headers) for r in records]

    async def append(
        self,
        payload: bytes | Record,
        txid: int | None = None,
        *,
        key: bytes = b"",
        headers: Mapping[str, bytes] | None = None,
    ) -> DLSN:
        """Append one record and wait until it is acknowledged; returns its DLSN."""
        if not self._writable.is_set():
            await self.wait_writable()
        return await self.submit(payload, txid, key=key, headers=headers)

    async def wait_writable(self) -> None:
        """Wait while more than ``max_pending_bytes`` are unacknowledged (backpressure for ``submit``)."""
        while not self._writable.is_set():
            if self._error is not None:
                raise self._error
            await self._writable.wait()

    async def flush(self) -> DLSN | None:
        """Send what is batched and wait until everything submitted so far is acknowledged.
        Returns the last acknowledged DLSN."""
        if self._batch is not None:
            self._cut()
        if self._acked < self._submitted:
            if self._error is not None:
                raise self._error
            done: asyncio.Future[None] = self._loop.create_future()
            self._flushes.append((self._submitted, done))
            await done
        return self._last_dlsn

    async def close(self) -> None:
        """Flush, complete the in-progress segment, release ownership. Idempotent.

        Raises if the writer fails while closing (records submitted before the close may or
        may not be in the log). A writer that had already failed closes quietly: its appends
        have reported the error."""
        if self._closed:
            return
        self._closing = True
        failed_before = self._error is not None
        error: BaseException | None = None
        try:
            if self._error is None:
                await self.flush()
            # Complete the segment once nothing is in flight. A roll may still be under way (or
            # start: an agent failing now moves stuck entries on), so look again after each.
            while self._error is None:
                if self._transition is not None:
                    await asyncio.shield(self._transition)
                    continue
                seg = self._segment
                if seg is None:
                    break
                seg.closing = True
                self._cancel_lac_timer()
                if seg.inflight:
                    await seg.changed(self.options.stall_timeout)
                    continue
                await self._seal(seg)
                self._segment = None
            if self._error is None and self.recovering:
                await self.recovery_done()  # leave no segment of the previous owner in progress
            if self._error is not None and not failed_before:
                error = self._error
        except WriterError as exc:
            self._fail(exc)
            error = exc
        finally:
            self._closed = True
            if self._error is None:
                self._error = WriterClosedError(f"writer of log {self.name!r} is closed", hint="open a new writer to append")
                self._fail_pending(self._error)
            self._stop_background()
            await self.ownership.release()
        if error is not None:
            raise error

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- batching --------------------------------------------------------------------------------

    def _busy(self) -> bool:
        seg = self._segment
        return bool(self._queue) or self._transition is not None or (seg is not None and bool(seg.inflight))

    def _arm_batch_timer(self) -> None:
        if self.options.flush_when_idle and not self._busy():
            # Cut at the end of this loop iteration: records submitted together still share an entry.
            self._timer = self._loop.call_soon(self._on_batch_timer)
        else:
            self._timer = self._loop.call_later(self.options.batch_delay, self._on_batch_timer)

    def _on_batch_timer(self) -> None:
        self._timer = None
        if self._batch is not None:
            self._cut()

    def _cut(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._batch = self._batch, None
        if batch is not None:
            self._queue.append(batch)
            self._pump()

    def _pump(self) -> None:
        """Move cut batches into the current segment, opening one when needed."""
        if self._error is not None:
            return
        seg = self._segment
        if seg is None:
            if self._queue and self._transition is None:
                self._start_transition(self._open_segment(None, self._avoid))
            return
        if seg.closing or self._rolling:
            return
        roll_bytes = self._roll_bytes()
        while self._queue:
            if not self._within_bounds(self._queue[0].last_txid):
                break  # until more is reserved (_reserved pumps again)
            self._dispatch(seg, self._queue.popleft())
            if seg.sent_bytes >= roll_bytes and self._request_roll(f"segment {seg.seq} reached {seg.sent_bytes} bytes"):
                break  # the rest goes to the next segment

    # -- replication -----------------------------------------------------------------------------

    def _dispatch(self, seg: SegmentPipeline, batch: Batch) -> None:
        # (Within the reserved time: _within_bounds checked it a moment ago.)
        append_ms = self._last_append_ms = max(min(int(self.options.clock() * 1000), self._takeover.reserved_ms()), self._last_append_ms)
        self._cancel_lac_timer()  # this entry carries the LAC
        self._last_dispatch = seg.dispatch(batch, append_ms)

    def _acknowledged(self, seg: SegmentPipeline, records: int, freed: int, last: DLSN | None) -> None:
        """``seg``'s LAC moved: ``records`` records (``freed`` bytes) were acknowledged, the last
        at ``last``. Wakes flushes and back-pressured appenders; once nothing more is in flight
        or to send, publishes the LAC after ``lac_delay``."""
        if records:
            self._acked += records
            self._last_dlsn = last
        if freed:
            self._pending_bytes -= freed
            if self._pending_bytes <= self.options.max_pending_bytes:
                self._writable.set()
            if self._flushes and self._flushes[0][0] <= self._acked:
                waiting = [f for f in self._flushes if f[0] > self._acked]
                for target, done in self._flushes:
                    if target <= self._acked and not done.done():
                        done.set_result(None)
                self._flushes = waiting
        if not seg.inflight and seg.published_lac < seg.last_data_entry and not seg.closing and self._batch is None and not self._queue:
            if self._lac_timer is None:
                self._lac_timer = self._loop.call_later(self.options.lac_delay, self._publish_lac)
        if self._batch is not None and self._timer is not None and self.options.flush_when_idle and not self._busy():
            # Nothing is in flight any more: a batch held back because something was (the idle
            # LAC's control entry, the last entry of a burst) goes now, not a whole batch_delay
            # later. At the end of this turn, as a lone append's cut is.
            self._timer.cancel()
            self._timer = self._loop.call_soon(self._on_batch_timer)

    def _fenced(self, seg: SegmentPipeline, node: str, exc: FencedError) -> None:
        self._fail(self._wmeta.deposed(f"segment {seg.seq} was fenced by a newer writer (agent {node}: {exc.message})"))

    def _publish_lac(self) -> None:
        """Idle: write a control entry so replicas (and tailing readers) learn the final LAC."""
        self._lac_timer = None
        seg = self._segment
        if seg is None or seg.closing or self._error is not None or self._batch is not None or self._queue:
            return
        if seg.published_lac < seg.last_data_entry:
            if not self._within_bounds(seg.sent_txid):
                self._lac_waits_for_bounds = True  # published once more is reserved
                return
            self._dispatch(seg, Batch(seg.sent_txid, control=True))

    # -- bounds (dlctl.log.takeover) ----------------------------------------------------------------

    def _within_bounds(self, txid: int) -> bool:
        """May an entry with txids up to ``txid`` go out now (``WriterTakeover.within``)?"""
        return self._takeover.within(txid, max(int(self.options.clock() * 1000), self._last_append_ms))

    def _reserved(self) -> None:
        """More txids and time are reserved: what waited for them goes out."""
        if self._error is None:
            self._pump()
            if self._lac_waits_for_bounds:
                self._lac_waits_for_bounds = False
                self._publish_lac()

    def _cancel_lac_timer(self) -> None:
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None

    # -- segments: open, roll, close -----------------------------------------------------------

    @property
    def _log(self) -> Versioned[LogRecord] | None:
        return self._wmeta.log

    @property
    def _log_id(self) -> int:
        assert self._log is not None
        return self._log.value.log_id

    def _roll_bytes(self) -> int:
        assert self._log is not None
        return self.options.roll_bytes or self._log.value.config.roll_bytes

    def _roll_seconds(self) -> float:
        assert self._log is not None
        return self.options.roll_seconds or self._log.value.config.roll_seconds

    def _start_transition(self, coro: Any) -> None:
        self._transition = asyncio.ensure_future(self._run_transition(coro))

    async def _run_transition(self, coro: Any) -> None:
        try:
            await coro
        except Exception as exc:  # noqa: BLE001 - see writer_options.stopped_by
            self._fail(stopped_by(self.name, exc))
        finally:
            self._transition = None
            if self._error is None:
                self._pump()

    def _request_roll(self, reason: str, *, failure: bool = False, urgent: bool = False) -> bool:
        """Start rolling unless a transition is under way or a recent attempt found no ensemble;
        True when the current segment takes no more entries for now."""
        seg = self._segment
        if seg is None or self._error is not None:
            return True
        if self._transition is not None:
            return seg.closing or self._rolling  # the housekeeper looks at failed agents again
        if not urgent and time.monotonic() < seg.retry_at:
            return False  # no fresh ensemble a moment ago: do not ask ZooKeeper on every entry
        # New entries wait while the next ensemble is found (ZooKeeper reads, agent probes):
        # dispatched meanwhile, they would all land in this segment, far past roll_bytes. Set
        # now, not when the roll's task starts: a burst of batches comes before that. But once an
        # attempt found no ensemble, a segment that can still acknowledge keeps taking entries
        # during the retries, or appends would stall at each one (a probe of an agent that does
        # not answer takes 1 s).
        self._rolling = urgent or seg.retry_at == 0.0
        self._start_transition(self._roll(seg, reason, failure))
        return self._rolling

    async def _roll(self, seg: SegmentPipeline, reason: str, failure: bool) -> None:
        try:
            ensemble = await self._next_ensemble(seg, reason)
        finally:
            self._rolling = False
        if ensemble is None:
            return  # staying on this segment: _run_transition pumps what waited into it
        log.info("log %r: rolling segment %d (%s)", self.name, seg.seq, reason)
        seg.closing = True
        self._cancel_lac_timer()
        # Let in-flight entries be acknowledged here first, so the segment ends cleanly; entries
        # that can no longer reach quorum here move to the next segment.
        await seg.drain(time.monotonic() + self.options.stall_timeout)
        if self._error is not None:
            return
        await self._seal(seg)
        self._segment = None
        self._avoid = set(seg.failed)
        if self._queue:
            await self._open_segment(ensemble, self._avoid)

    async def _next_ensemble(self, seg: SegmentPipeline, reason: str) -> tuple[str, ...] | None:
        """The ensemble to roll ``seg`` onto, or None to stay on it: if none can be formed (too few
        agents), rolling would leave us with no segment at all, so stay on this one while it can
        still acknowledge."""
        ensemble = await self._wmeta.fresh_ensemble(set(seg.failed), silent=seg.silent, answering=set(seg.ensemble) - set(seg.failed))
        if ensemble is None:
            if seg.all_ackable():
                level = logging.WARNING if seg.retry_at == 0.0 else logging.DEBUG  # once, not every retry
                log.log(level, "log %r: cannot roll segment %d (%s): too few agents; continuing on it", self.name, seg.seq, reason)
                seg.retry_at = time.monotonic() + self.options.ensemble_retry
                return None
            ensemble = await self._wmeta.wait_for_ensemble(seg, reason)  # None: the stuck entries reached quorum after all
        return ensemble

    async def _open_segment(self, ensemble: tuple[str, ...] | None, avoid: set[str]) -> None:
        """Create the next in-progress segment (sequence number by CAS on the log record)."""
        if ensemble is None:
            ensemble = await self._wmeta.new_ensemble(avoid)
        first_txid = self._queue[0].first_txid if self._queue else self._last_txid + 1
        versioned = await self._wmeta.create_next_segment(ensemble, first_txid)
        clients: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for node in ensemble:
            try:
                clients[node] = await self.pool.client(node)
            except AgentUnavailableError as exc:
                failed[node] = str(exc)
        seg = SegmentPipeline(
            versioned, clients, failed, log_name=self.name, log_id=self._log_id, add_latency=self._add_latency,
            on_acknowledged=self._acknowledged, on_fenced=self._fenced, request_roll=self._request_roll,
        )
        log.info("log %r: segment %d in progress on %s", self.name, seg.seq, ", ".join(ensemble))
        if self._error is not None:
            return
        self._segment = seg
        self._avoid = set()

    async def _seal(self, seg: SegmentPipeline) -> None:
        """Complete ``seg`` at its last acknowledged entry (CAS); requeue what was not acknowledged."""
        if seg.sealed:
            return
        leftovers = seg.seal()
        self._queue.extendleft(reversed([batch for batch in leftovers if batch.futures]))
        try:
            await self._wmeta.update_segment(seg.versioned, seg.completed(time.time()))
        except (ConflictError, NotFoundError) as exc:
            raise self._wmeta.deposed(f"segment {seg.seq} was closed by someone else ({exc.message})") from None
        if leftovers:
            log.info("log %r: segment %d completed at entry %d; %d entries move to the next segment", self.name, seg.seq, seg.lac, len(leftovers))

    # -- failure and housekeeping ----------------------------------------------------------------

    def _on_ownership_lost(self, reason: str) -> None:
        self._fail(self._wmeta.deposed(reason))

    def _fail(self, error: WriterError) -> None:
        """Stop for good: fail every unacknowledged append; ignore whatever agents answer later."""
        if self._error is not None:
            return
        self._error = error
        log.error("%s", error.message)
        self._fail_pending(error)
        self._writable.set()
        self._stop_background(keep_transition=True)
        if not self._closing:
            # Let another writer in at once rather than when our session ends.
            task = asyncio.ensure_future(self.ownership.release())
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _fail_pending(self, error: WriterError) -> None:
        batches = list(self._queue)
        self._queue.clear()
        if self._batch is not None:
            batches.append(self._batch)
            self._batch = None
        seg = self._segment
        if seg is not None:
            batches += seg.seal()
            seg.notify()
        for batch in batches:
            for fut in batch.futures:
                if fut is not None and not fut.done():
                    fut.set_exception(error)
                    fut.exception()  # a caller that dropped the future must not get "never retrieved" noise
        flushes, self._flushes = self._flushes, []
        for _target, done in flushes:
            if not done.done():
                done.set_exception(error)
                done.exception()

    def _stop_background(self, keep_transition: bool = False) -> None:
        for handle in (self._timer, self._lac_timer):
            if handle is not None:
                handle.cancel()
        self._timer = self._lac_timer = None
        if self._housekeeper is not None and self._housekeeper is not asyncio.current_task():
            self._housekeeper.cancel()
        self._takeover.cancel()
        if not keep_transition and self._transition is not None and self._transition is not asyncio.current_task():
            self._transition.cancel()

    async def _housekeeping(self) -> None:
        """Roll by time; on a degraded segment, look for a fresh ensemble now and then; give up
        on replicas that went silent (``SegmentPipeline.check_silent``)."""
        tick = min(0.25, self._roll_seconds() / 4)
        while self._error is None:
            await asyncio.sleep(tick)
            if self._takeover.extending is None and self._loop.time() - self._last_dispatch < ACTIVE_FOR:
                self._within_bounds(self._last_txid)  # reserve ahead while entries flow
            seg = self._segment
            if seg is None or self._closing:
                continue
            seg.check_silent(self.options.silent_after)  # during a roll too: it waits for the in-flight entries
            if self._transition is not None or seg.closing:
                continue
            now = time.monotonic()
            if seg.failed and now >= seg.retry_at:
                self._request_roll("looking for a fresh ensemble for a degraded segment", failure=True)
            elif seg.next_entry_id > 0 and now - seg.created >= self._roll_seconds():
                self._request_roll(f"segment {seg.seq} is {now - seg.created:.1f}s old")


__all__ = ["LogWriter", "SILENT_FACTOR", "TxidOrderError", "WriterClosedError", "WriterDeposedError", "WriterError", "WriterOptions"]
