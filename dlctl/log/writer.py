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
changes); it *rolls*. A failed agent is dropped from the segment's write sets and entries are
acknowledged by the remaining members while they still form an ack quorum. The writer then
rolls to a new segment on a fresh ensemble without the failed agent: in-flight entries are
given the chance to be acknowledged, the segment is completed at its last acknowledged entry,
and entries that could not reach quorum are re-encoded into the new segment (their DLSNs are
assigned only then, so nothing acknowledged moves). When no fresh ensemble can be formed (too
few agents) the writer stays on the degraded segment as long as ack quorum holds and retries
every ``ensemble_retry`` seconds; if an entry can no longer reach quorum it waits up to
``stall_timeout`` for agents to come back and then fails. Segments left with fewer than W
replicas are for re-replication (DESIGN.md §6) to repair. A *silent* agent (packets dropped, no
connection reset) counts as failed once the oldest unacknowledged entry has waited
``silent_after`` (or ``SILENT_FACTOR`` smoothed add latencies, if longer) for it: a silent region
costs about a second, not the request timeout. A slow agent outside the ack quorum never holds an
entry up, so it is left alone.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import ConnectionLoss, OperationTimeoutError

from ..errors import ConflictError, DlctlError, NotFoundError, RefusedError
from ..meta.access import AccessStore
from ..meta.bounds import BoundsStore
from ..meta.records import NO_ENTRY, NO_TXID, EnsembleChange, LogRecord, SegmentRecord, SegmentState, Versioned
from ..meta.store import MetaStore
from ..meta import policy as placement_store
from ..placement import PlacementPolicy
from . import format as fmt
from .dlsn import DLSN
from .ensembles import probed_ensemble
from .errors import AgentError, AgentUnavailableError, FencedError
from .ownership import Ownership
from .readpolicy import AdaptiveTimeout
from .records import RECORD_PLAIN, Record, encode_records
from .quorum import can_still_ack, write_set_of
from .recovery import TOTALS_RECORD_SIZE, RecoveryResult, recover_segment, totals_record
from .takeover import ACTIVE_FOR, BoundsKeeper, BoundsLost, takeover_floor
from .pool import ReplicaPool

log = logging.getLogger(__name__)

# One record without key or headers, encoded without building a Record: size, flags, txid, key
# length (0), header count (0); then the payload. Same layout as records.encode_records.
_PLAIN = RECORD_PLAIN  # (a record without key or headers: its layout is records.py's)
_PLAIN_BODY = _PLAIN.size - 4  # bytes counted by the size field before the payload
_MAX_RECORD = fmt.MAX_PAYLOAD - TOTALS_RECORD_SIZE
SILENT_FACTOR = 8.0  # a replica is silent after this many smoothed add latencies (at least silent_after)
_TXID_MAX = 2**63 - 1
# ZooKeeper answers lost to a connection blip: the request may or may not have been applied.
_ZK_BLIPS = (ConnectionLoss, OperationTimeoutError)


class WriterError(DlctlError):
    """The writer stopped: appends pending at that moment and every later one fail with it."""


class WriterDeposedError(WriterError):
    """Another writer took the log over (fenced our segment, or our ownership was lost)."""


class WriterClosedError(WriterError):
    """The writer was closed; open a new one to append."""


class TxidOrderError(RefusedError):
    """An application-given txid does not increase; nothing was appended."""


@dataclass(frozen=True)
class WriterOptions:
    batch_bytes: int = 256 * 1024  # cut an entry once its records reach this size
    batch_delay: float = 0.002  # ... or this long after its first record
    flush_when_idle: bool = True  # cut at once when nothing is in flight (low latency when idle)
    lac_delay: float = 0.002  # idle this long after an ack: write a control entry to publish LAC
    max_pending_bytes: int = 64 * 1024 * 1024  # append() waits while more are unacknowledged
    ensemble_retry: float = 1.0  # degraded segment: how often to look for a fresh ensemble
    stall_timeout: float = 30.0  # how long entries may wait for agents before the writer fails
    ownership_wait: float = 0.0  # open(): how long to wait for a current owner to go away
    recovery_timeout: float = 30.0  # open(): bound on recovering the previous owner's segment
    roll_bytes: int | None = None  # override the log's config
    roll_seconds: float | None = None  # override the log's config
    # A replica that has not answered the add of the oldest unacknowledged entry this long (at
    # least; longer when adds are slow: SILENT_FACTOR times their smoothed latency) is taken
    # for failed: a silent agent (packets dropped, no reset) costs this, not a request timeout.
    # None: wait for the request timeout.
    silent_after: float | None = 1.0
    # The wall clock entries' append times come from (seconds since the epoch). A host whose
    # clock is behind the previous owner's never appends earlier times: the log's last time is
    # a floor. (Replaceable to play such a host.)
    clock: Callable[[], float] = time.time
    # open(): when the previous owner left a segment in progress, open our own segment while
    # that one is still being recovered, above the bounds it reserved (dlctl.log.takeover), so
    # appends resume before its recovery ends. False: recover first, then append (txids then
    # continue without a gap). Either way readers read our segment only after that one.
    fast_takeover: bool = True

    def __post_init__(self) -> None:
        if self.batch_bytes < 1 or self.batch_delay < 0 or self.lac_delay < 0:
            raise ValueError("batch_bytes must be >= 1 and delays >= 0")


class _Batch:
    """Records cut (or being cut) into one entry; their futures resolve when it is acknowledged.
    One slot per record: None for a record submitted without a future of its own (all but the
    last of ``submit_encoded``'s)."""

    __slots__ = ("parts", "futures", "size", "first_txid", "last_txid", "control")

    def __init__(self, first_txid: int, control: bool = False) -> None:
        self.parts: list[bytes] = []
        self.futures: list[asyncio.Future[DLSN] | None] = []
        self.size = 0
        self.first_txid = first_txid
        self.last_txid = first_txid
        self.control = control


class _Entry:
    __slots__ = ("batch", "entry_id", "encoded", "body_len", "acks", "outstanding", "acked", "sent_at", "waiting", "append_ms")

    def __init__(self, batch: _Batch, entry_id: int, encoded: bytes, body_len: int, targets: list[str], sent_at: float, append_ms: int) -> None:
        self.batch = batch
        self.append_ms = append_ms
        self.entry_id = entry_id
        self.encoded = encoded
        self.body_len = body_len
        self.acks = 0
        self.outstanding = len(targets)
        self.acked = False
        self.sent_at = sent_at
        self.waiting = set(targets)  # replicas that have not answered its add yet


class _Segment:
    """The in-progress segment being written, and its replication state."""

    def __init__(self, versioned: Versioned[SegmentRecord], clients: dict[str, Any], failed: dict[str, str]) -> None:
        rec = versioned.value
        self.versioned = versioned
        self.seq = rec.seq
        self.ensemble = rec.ensembles[-1].nodes
        self.w, self.a = rec.write_quorum, rec.ack_quorum
        self.clients = clients
        self.failed = failed  # node -> why; dropped from this segment's write sets
        # Dropped members: node -> the entry before the first one it failed (what it holds at
        # most, contiguously); the closed record names them (SegmentRecord.short).
        self.short: dict[str, int] = {}
        # Per member, the entries sent to it that it has not answered yet, in order: what a
        # member given up on as silent holds at most is what comes before the first of them.
        self.unanswered: dict[str, deque[int]] = {}
        self.silent: set[str] = set()  # members given up on for silence: not probed again to roll
        self.next_entry_id = 0
        self.inflight: deque[_Entry] = deque()  # dispatched, not yet acknowledged, in entry order
        self.lac = NO_ENTRY
        self.published_lac = NO_ENTRY  # highest LAC carried by a dispatched entry
        self.last_data_entry = NO_ENTRY  # highest acknowledged entry that holds records
        self.records = 0  # acknowledged
        self.bytes = 0
        self.last_txid = NO_TXID
        self.first_time: int | None = None  # append times (ms) of its first and last acknowledged records
        self.last_time = 0
        self.sent_records = 0  # dispatched: the totals each new entry carries
        self.sent_bytes = 0
        self.sent_txid = NO_TXID
        self.created = time.monotonic()
        self.retry_at = 0.0  # degraded: when to look for a fresh ensemble next
        self.closing = False  # no new entries: a roll or close is under way
        self.sealed = False  # done: late answers of its agents are ignored
        self.tasks: set[asyncio.Task] = set()
        self.waiter: asyncio.Future[None] | None = None

    def notify(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def changed(self, timeout: float) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self.waiter, timeout)
        except TimeoutError:
            pass
        finally:
            self.waiter = None

    def all_ackable(self) -> bool:
        return all(e.acked or can_still_ack(e.acks, e.outstanding, self.a) for e in self.inflight)


class LogWriter:
    """The single writer of a log; create with ``await LogWriter.open(...)`` (see module doc)."""

    def __init__(self, meta: MetaStore, pool: ReplicaPool, name: str, owner_id: str | None, options: WriterOptions, owner_info: dict | None = None) -> None:
        self.meta = meta
        self.pool = pool
        self.name = name
        self.options = options
        self.ownership = Ownership(meta, name, owner_id, owner_info)
        self.recovered: tuple[RecoveryResult, ...] = ()
        self._loop = asyncio.get_running_loop()
        self._log: Versioned[LogRecord] | None = None
        self._segment: _Segment | None = None
        self._batch: _Batch | None = None
        self._queue: deque[_Batch] = deque()  # cut, waiting for a segment
        self._timer: asyncio.Handle | None = None
        self._lac_timer: asyncio.TimerHandle | None = None
        self._transition: asyncio.Task | None = None  # opening, rolling or closing a segment
        self._add_latency = AdaptiveTimeout(floor=0.0005, ceiling=10.0)  # replicas' answers to adds (_check_silent)
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
        self._bounds: BoundsKeeper | None = None  # the txids and times we may write (dlctl.log.takeover)
        self._extending: asyncio.Task | None = None  # reserving more of them
        self._lac_waits_for_bounds = False
        self._last_dispatch = float("-inf")  # loop time of the last entry sent
        self._recovery: asyncio.Task | None = None  # fast takeover: the previous owner's segments
        self._recovery_error: WriterError | None = None
        self._taken_over_seq = 0

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
            self._log = await self._zk(self.meta.get_log, self.name)
            self._taken_over_seq = self._log.value.max_segment_seq
            segments = await self._zk(self.meta.segments, self.name)
            self._learn_ends(segments)
            inprogress = [s for s in segments if s.value.state is SegmentState.INPROGRESS]
            self._bounds = BoundsKeeper(BoundsStore(self.meta), self.name, self.owner_id, self.ownership.session_id or 0, self._zk, self.options.clock)
            previous = await self._bounds.claim(self._last_txid + 1, self._last_append_ms)
            floor = takeover_floor(previous, inprogress[-1].value.writer if inprogress else None)
            if floor is not None and self.options.fast_takeover:
                # Everything the previous writer left in progress is within the bounds it had
                # reserved: start above them, and recover its segments meanwhile.
                self._last_txid = max(self._last_txid, floor.txid)
                self._last_append_ms = max(self._last_append_ms, floor.time_ms)
                self._recovery = asyncio.ensure_future(self._recover_in_background(inprogress))
            elif inprogress:
                await self._recover(inprogress)
            if self.ownership.lost:
                raise WriterDeposedError(f"lost ownership of log {self.name!r} while opening it: {self.ownership.lost_reason}")
            self._log = await self._zk(self.meta.get_log, self.name)
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

    async def _recover(self, inprogress: list[Versioned[SegmentRecord]]) -> None:
        """Fence, recover and close the segments a previous owner left in progress, in order."""
        assert self._log is not None
        results = []
        for seg in inprogress:
            results.append(await recover_segment(self.meta, self.pool, self.name, self._log.value.log_id, seg, timeout=self.options.recovery_timeout))
        self.recovered = tuple(results)
        self._learn_ends(await self._zk(self.meta.segments, self.name))

    async def _recover_in_background(self, inprogress: list[Versioned[SegmentRecord]]) -> None:
        try:
            await self._recover(inprogress)
        except Exception as exc:  # noqa: BLE001 - every failure stops the writer (its appends say why)
            error = self._writer_error(exc, f"recovering segment(s) {', '.join(str(s.value.seq) for s in inprogress)} of the previous owner failed")
            self._recovery_error = error
            self._fail(error)
            return
        log.info("log %r: the previous owner's segments are recovered: %s", self.name, [r.to_dict() for r in self.recovered])

    def _writer_error(self, exc: Exception, what: str | None = None) -> WriterError:
        """The error that stops the writer when ``exc`` ended ``what`` it was doing (a bug
        included: it must fail the appends, not hang them)."""
        if isinstance(exc, WriterError):
            return exc
        doing = f"{what}: " if what else ""
        if isinstance(exc, DlctlError):
            return WriterError(f"writer of log {self.name!r} stopped: {doing}{exc.message}", hint=exc.hint)
        log.error("writer of log %r failed%s", self.name, f": {what}" if what else "", exc_info=exc)
        return WriterError(f"writer of log {self.name!r} failed unexpectedly: {doing}{exc!r}")

    async def recovery_done(self) -> tuple[RecoveryResult, ...]:
        """Wait until the segments the previous owner left in progress are recovered and closed
        (already so unless ``open`` took the log over fast); returns what was recovered. Raises
        the writer's error when that recovery failed. A replication worker or a write proxy
        waits for this before reading the log's tail back (the tail ends in those segments)."""
        task = self._recovery
        if task is not None and not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise  # we were cancelled, not the recovery
        if self._recovery_error is not None:
            raise self._recovery_error
        if task is not None and task.cancelled():  # the writer stopped before it ended
            raise self._error or WriterClosedError(f"writer of log {self.name!r} is closed")
        return self.recovered

    @property
    def taken_over_seq(self) -> int:
        """The log's last segment when this writer took it over: the previous owners' segments
        are those up to it, ours come after."""
        return self._taken_over_seq

    @property
    def recovering(self) -> bool:
        """The previous owner's segments are still being recovered (a fast takeover)."""
        return self._recovery is not None and not self._recovery.done()

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
            batch = self._batch = _Batch(first_txid)
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
        if seg.closing:
            return
        roll_bytes = self._roll_bytes()
        while self._queue:
            if not self._within_bounds(self._queue[0].last_txid):
                break  # until more is reserved (_extend_bounds pumps again)
            self._dispatch(seg, self._queue.popleft())
            if seg.sent_bytes >= roll_bytes and self._request_roll(f"segment {seg.seq} reached {seg.sent_bytes} bytes"):
                break  # the rest goes to the next segment

    # -- replication -----------------------------------------------------------------------------

    def _dispatch(self, seg: _Segment, batch: _Batch) -> None:
        entry_id = seg.next_entry_id
        seg.next_entry_id += 1
        lac = seg.lac
        seg.published_lac = lac
        body = b"".join(batch.parts)
        count = len(batch.futures)
        size = fmt.HEADER_SIZE + len(body) + TOTALS_RECORD_SIZE
        seg.sent_records += count
        seg.sent_bytes += size
        if count:
            seg.sent_txid = batch.last_txid
        # (Within the reserved time: _within_bounds checked it a moment ago.)
        append_ms = self._last_append_ms = max(min(int(self.options.clock() * 1000), self._reserved_ms()), self._last_append_ms)
        totals = encode_records([totals_record(seg.sent_txid, seg.sent_records, seg.sent_bytes, append_ms)])
        encoded = fmt.encode(
            fmt.Entry(self._log_id, seg.seq, entry_id, lac, body + totals, fmt.FLAG_CONTROL if batch.control else 0)
        )
        batch.parts = []  # the entry's bytes hold them now
        targets = [n for n in write_set_of(seg.ensemble, seg.w, entry_id) if n not in seg.failed]
        entry = _Entry(batch, entry_id, encoded, len(body), targets, self._loop.time(), append_ms)
        self._last_dispatch = entry.sent_at
        seg.inflight.append(entry)
        self._cancel_lac_timer()  # this entry carries the LAC
        # A lone entry (a synchronous writer) goes out now; entries dispatched together are
        # coalesced into one write per agent at the end of the loop turn.
        flush = len(seg.inflight) == 1
        unanswered = seg.unanswered
        for node in targets:
            if node in unanswered:
                unanswered[node].append(entry_id)
            else:
                unanswered[node] = deque((entry_id,))
            # The hot path has no task per replica: the reply is handled where it is parsed.
            if not seg.clients[node].add_nowait(entry.encoded, lambda exc, node=node: self._added(seg, entry, node, exc), flush=flush):
                task = self._loop.create_task(self._send(seg, entry, node))
                seg.tasks.add(task)
                task.add_done_callback(seg.tasks.discard)
        if not can_still_ack(0, len(targets), seg.a):
            self._request_roll(f"entry {entry_id} of segment {seg.seq} cannot reach ack quorum", failure=True, urgent=True)

    async def _send(self, seg: _Segment, entry: _Entry, node: str) -> None:
        """An add that must wait for its connection (being opened, or held by flow control)."""
        try:
            await seg.clients[node].add(entry.encoded)
        except AgentError as exc:
            self._added(seg, entry, node, exc)
            return
        self._added(seg, entry, node, None)

    def _added(self, seg: _Segment, entry: _Entry, node: str, exc: BaseException | None) -> None:
        """Agent ``node`` answered the add of ``entry``: stored (``exc`` None) or not."""
        pending = seg.unanswered.get(node)
        if pending:
            if pending[0] == entry.entry_id:
                pending.popleft()
            else:  # answers out of order (one connection keeps them in order; a reconnect may not)
                try:
                    pending.remove(entry.entry_id)
                except ValueError:
                    pass
        if isinstance(exc, FencedError):
            if not seg.sealed:
                self._fail(
                    WriterDeposedError(
                        f"writer {self.owner_id} of log {self.name!r} was deposed: segment {seg.seq} was fenced "
                        f"by a newer writer (agent {node}: {exc.message})",
                        hint="records not yet acknowledged may or may not be in the log; reopen the log to continue",
                    )
                )
            return
        if exc is not None:
            if not isinstance(exc, AgentError):  # not from the agent: the writer itself is broken
                raise exc
            self._on_replica_failed(seg, entry, node, exc)
            return
        if seg.sealed or self._error is not None:
            return
        if node in entry.waiting:
            entry.waiting.discard(node)
            entry.outstanding -= 1
            self._add_latency.observe(self._loop.time() - entry.sent_at)
        else:  # a replica given up on as silent answers after all: its ack is real, and it lives
            seg.silent.discard(node)
        entry.acks += 1
        if entry.acks == seg.a:
            entry.acked = True
            if seg.inflight and seg.inflight[0] is entry:
                self._advance(seg)

    def _advance(self, seg: _Segment) -> None:
        """Acknowledge the acked prefix of in-flight entries, in entry order."""
        q = seg.inflight
        seq = seg.seq
        freed = 0
        while q and q[0].acked:
            entry = q.popleft()
            seg.lac = entry.entry_id
            seg.bytes += fmt.HEADER_SIZE + entry.body_len + TOTALS_RECORD_SIZE
            batch = entry.batch
            futures = batch.futures
            if futures:  # the times of its first and last records
                if seg.first_time is None:
                    seg.first_time = entry.append_ms
                seg.last_time = entry.append_ms
                eid = entry.entry_id
                for slot, fut in enumerate(futures):
                    if fut is not None and not fut.done():
                        fut.set_result(DLSN(seq, eid, slot))
                seg.records += len(futures)
                self._acked += len(futures)
                seg.last_txid = batch.last_txid
                seg.last_data_entry = eid
                self._last_dlsn = DLSN(seq, eid, len(futures) - 1)
                freed += batch.size
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
        seg.notify()
        if not q and seg.published_lac < seg.last_data_entry and not seg.closing and self._batch is None and not self._queue:
            if self._lac_timer is None:
                self._lac_timer = self._loop.call_later(self.options.lac_delay, self._publish_lac)

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
            self._dispatch(seg, _Batch(seg.sent_txid, control=True))

    # -- bounds (dlctl.log.takeover) ----------------------------------------------------------------

    def _reserved_ms(self) -> int:
        assert self._bounds is not None
        return self._bounds.confirmed.time_ms

    def _within_bounds(self, txid: int) -> bool:
        """May an entry with txids up to ``txid`` go out now? Nothing above the bounds we have
        reserved may: a new owner would start above them before our segment is recovered.
        Reserves more ahead of need, and at once when they do not cover it."""
        assert self._bounds is not None
        now_ms = max(int(self.options.clock() * 1000), self._last_append_ms)
        if self._bounds.covers(txid, now_ms):
            if self._extending is None and self._bounds.running_low(txid, now_ms):
                self._extend_bounds(txid, now_ms)
            return True
        if self._extending is None:
            self._extend_bounds(txid, now_ms)
        return False

    def _extend_bounds(self, txid: int, time_ms: int) -> None:
        self._extending = asyncio.ensure_future(self._extend(txid, time_ms))

    async def _extend(self, txid: int, time_ms: int) -> None:
        assert self._bounds is not None
        deadline = time.monotonic() + self.options.stall_timeout
        try:
            while True:
                self._check_still_owner()
                try:
                    await self._bounds.extend(txid, time_ms)
                    break
                except _ZK_BLIPS as exc:
                    self._check_blip_deadline(deadline, "reserving txids and append time", exc)
                await asyncio.sleep(0.2)
        except BoundsLost as exc:
            self._fail(self._deposed(exc.message))
            return
        except Exception as exc:  # noqa: BLE001 - a writer that cannot reserve cannot write
            self._fail(self._writer_error(exc, "reserving txids and append time"))
            return
        finally:
            self._extending = None
        if self._error is None:
            self._pump()
            if self._lac_waits_for_bounds:
                self._lac_waits_for_bounds = False
                self._publish_lac()

    def _cancel_lac_timer(self) -> None:
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None

    def _on_replica_failed(self, seg: _Segment, entry: _Entry, node: str, exc: AgentError) -> None:
        if seg.sealed or self._error is not None or node not in entry.waiting:
            return  # (not waiting: given up on as silent already, and counted then)
        entry.waiting.discard(node)
        entry.outstanding -= 1
        seg.short[node] = min(seg.short.get(node, entry.entry_id - 1), entry.entry_id - 1)
        new = node not in seg.failed
        if new:
            seg.failed[node] = str(exc)
            log.warning("log %r segment %d: agent %s failed (%s); continuing without it", self.name, seg.seq, node, exc)
        if not entry.acked and not can_still_ack(entry.acks, entry.outstanding, seg.a):
            self._request_roll(f"entry {entry.entry_id} of segment {seg.seq} cannot reach ack quorum", failure=True, urgent=True)
        elif new:
            self._request_roll(f"agent {node} failed", failure=True)
        seg.notify()

    # -- segments: open, roll, close -----------------------------------------------------------

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
        except Exception as exc:  # noqa: BLE001 - see _writer_error
            self._fail(self._writer_error(exc))
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
            return seg.closing  # the housekeeper looks at failed agents again
        if not urgent and time.monotonic() < seg.retry_at:
            return False  # no fresh ensemble a moment ago: do not ask ZooKeeper on every entry
        self._start_transition(self._roll(seg, reason, failure))
        return True

    async def _roll(self, seg: _Segment, reason: str, failure: bool) -> None:
        # The next ensemble first: if none can be formed (too few agents), rolling would leave
        # us with no segment at all, so stay on this one while it can still acknowledge.
        ensemble = await self._fresh_ensemble(set(seg.failed), silent=seg.silent)
        if ensemble is None:
            if seg.all_ackable():
                level = logging.WARNING if seg.retry_at == 0.0 else logging.DEBUG  # once, not every retry
                log.log(level, "log %r: cannot roll segment %d (%s): too few agents; continuing on it", self.name, seg.seq, reason)
                seg.retry_at = time.monotonic() + self.options.ensemble_retry
                return
            ensemble = await self._wait_for_ensemble(seg, reason)
            if ensemble is None:
                return  # the stuck entries reached quorum after all
        log.info("log %r: rolling segment %d (%s)", self.name, seg.seq, reason)
        seg.closing = True
        self._cancel_lac_timer()
        # Let in-flight entries be acknowledged here first, so the segment ends cleanly; entries
        # that can no longer reach quorum here move to the next segment.
        deadline = time.monotonic() + self.options.stall_timeout
        while seg.inflight and seg.all_ackable() and self._error is None and time.monotonic() < deadline:
            await seg.changed(deadline - time.monotonic())
        if self._error is not None:
            return
        await self._seal(seg)
        self._segment = None
        self._avoid = set(seg.failed)
        if self._queue:
            await self._open_segment(ensemble, self._avoid)

    async def _wait_for_ensemble(self, seg: _Segment, reason: str) -> tuple[str, ...] | None:
        """Entries cannot reach quorum on ``seg``: wait for agents to form a fresh ensemble, or
        for the entries to get their acks after all (None), up to ``stall_timeout``."""
        deadline = time.monotonic() + self.options.stall_timeout
        delay = 0.1
        while True:
            if self._error is not None:
                raise self._error
            if seg.all_ackable():
                return None
            ensemble = await self._fresh_ensemble(set(seg.failed), silent=seg.silent)
            if ensemble is not None:
                return ensemble
            if time.monotonic() + delay > deadline:
                raise WriterError(
                    f"writer of log {self.name!r} stalled: {reason}; failed agents: "
                    + "; ".join(f"{n}: {why}" for n, why in sorted(seg.failed.items()))
                    + f"; no fresh ensemble of {self._ensemble_size()} agents for {self.options.stall_timeout:g}s",
                    hint="bring agents back; records not yet acknowledged may or may not be in the log",
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _ensemble_size(self) -> int:
        assert self._log is not None
        return self._log.value.config.ensemble_size

    async def _fresh_ensemble(self, failed: set[str], silent: set[str] = frozenset()) -> tuple[str, ...] | None:  # type: ignore[assignment]
        """An ensemble without agents that are still failing, or None when too few are left.
        ``silent``: failed members that just went silent; a probe of them would only wait."""
        nodes = await self._available()
        suspects = {n for n in failed if n in nodes and n not in silent}
        still_failing = set(failed) - suspects
        if suspects:
            # A failed agent that answers now (a dropped connection, a restart) may serve again.
            checks = await asyncio.gather(*(self._healthy(n) for n in sorted(suspects)))
            still_failing |= {n for n, ok in zip(sorted(suspects), checks) if not ok}
        try:
            return await self._probed_ensemble(nodes, still_failing, await self._placement(), healthy=suspects - still_failing)
        except RefusedError:
            return None

    async def _probed_ensemble(self, nodes: dict[str, dict], exclude: set[str], policy: PlacementPolicy, healthy: set[str] | None = None) -> tuple[str, ...]:
        """An ensemble whose members answer right now (``dlctl.log.ensembles``); ``RefusedError``
        when too few do."""
        return await probed_ensemble(nodes, policy, self._healthy, exclude=exclude, known_healthy=healthy or ())

    async def _placement(self) -> PlacementPolicy:
        """This log's placement policy (its E/W/A, the cluster's m, regions and drains), read at
        every ensemble choice so a drain or a new m applies from the next segment on."""
        assert self._log is not None
        deadline = time.monotonic() + self.options.stall_timeout
        while True:
            try:
                cluster_policy = (await self._zk(placement_store.load, self.meta.client, self.meta.cluster)).value
                self._last_placement = cluster_policy.for_log(self.name, self._log.value.config)
                return self._last_placement
            except _ZK_BLIPS as exc:
                if getattr(self, "_last_placement", None) is not None:
                    return self._last_placement  # as last read: a blip must not stop a roll
                # Never read yet: a blip is retried like every other ZooKeeper call here.
                self._check_still_owner()
                self._check_blip_deadline(deadline, "reading the placement policy", exc)
            await asyncio.sleep(0.2)

    async def _available(self) -> dict[str, dict]:
        try:
            return await self.pool.refresh()
        except _ZK_BLIPS:
            return self.pool.nodes  # as last seen: the agents themselves are checked anyway

    async def _healthy(self, node: str) -> bool:
        try:
            client = await self.pool.client(node)
            await asyncio.wait_for(client.stat(), 1.0)
            return True
        except (AgentError, TimeoutError):
            return False

    async def _open_segment(self, ensemble: tuple[str, ...] | None, avoid: set[str]) -> None:
        """Create the next in-progress segment (sequence number by CAS on the log record)."""
        assert self._log is not None
        if ensemble is None:
            deadline = time.monotonic() + self.options.stall_timeout
            while ensemble is None:
                nodes = await self._available()
                policy = await self._placement()
                try:
                    ensemble = await self._probed_ensemble(nodes, avoid, policy)
                except RefusedError as exc:
                    try:  # agents we saw fail may be back: better than no segment at all
                        ensemble = await self._probed_ensemble(nodes, set(), policy)
                    except RefusedError:
                        if time.monotonic() > deadline:
                            raise WriterError(f"writer of log {self.name!r} cannot start a segment: {exc.message}", hint=exc.hint) from None
                        await asyncio.sleep(0.2)
        first_txid = self._queue[0].first_txid if self._queue else self._last_txid + 1
        while True:
            log_rec = self._log.value
            record = SegmentRecord(
                seq=log_rec.max_segment_seq + 1,
                state=SegmentState.INPROGRESS,
                ensembles=(EnsembleChange(0, ensemble),),
                write_quorum=log_rec.config.write_quorum,
                ack_quorum=log_rec.config.ack_quorum,
                created=time.time(),
                writer=self.owner_id,
                first_txid=first_txid,
            )
            if self.ownership.lost:
                raise self._deposed(f"ownership lost: {self.ownership.lost_reason}")
            try:
                self._log, versioned = await self._create_segment(record)
                break
            except ConflictError:
                fresh = await self._zk(self.meta.get_log, self.name)
                if fresh.value.max_segment_seq != log_rec.max_segment_seq:
                    raise self._deposed(f"another writer created segment {fresh.value.max_segment_seq}") from None
                self._log = fresh  # only the config changed: use it
        clients: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for node in ensemble:
            try:
                clients[node] = await self.pool.client(node)
            except AgentUnavailableError as exc:
                failed[node] = str(exc)
        seg = _Segment(versioned, clients, failed)
        log.info("log %r: segment %d in progress on %s", self.name, seg.seq, ", ".join(ensemble))
        if self._error is not None:
            return
        self._segment = seg
        self._avoid = set()

    async def _seal(self, seg: _Segment) -> None:
        """Complete ``seg`` at its last acknowledged entry (CAS); requeue what was not acknowledged."""
        if seg.sealed:
            return
        seg.sealed = True
        leftovers = list(seg.inflight)
        seg.inflight.clear()
        for entry in leftovers:
            batch = entry.batch
            batch.parts = [entry.encoded[fmt.HEADER_SIZE : fmt.HEADER_SIZE + entry.body_len]]
        self._queue.extendleft(reversed([e.batch for e in leftovers if e.batch.futures]))
        # Agents that failed before the segment was opened were never sent anything.
        short = {n: NO_ENTRY for n in seg.failed} | seg.short
        times = (seg.first_time, seg.last_time) if seg.first_time is not None else None
        completed = seg.versioned.value.completed_with(seg.lac, seg.last_txid, seg.records, seg.bytes, time.time(), short=short, times=times)
        try:
            await self._update_segment(seg.versioned, completed)
        except (ConflictError, NotFoundError) as exc:
            raise self._deposed(f"segment {seg.seq} was closed by someone else ({exc.message})") from None
        if leftovers:
            log.info("log %r: segment %d completed at entry %d; %d entries move to the next segment", self.name, seg.seq, seg.lac, len(leftovers))

    # -- metadata updates that survive a ZooKeeper connection blip ------------------------------

    async def _create_segment(self, record: SegmentRecord) -> tuple[Versioned[LogRecord], Versioned[SegmentRecord]]:
        assert self._log is not None
        deadline = time.monotonic() + self.options.stall_timeout
        while True:
            # Before every attempt, retries included: a retry must never create a segment for
            # an owner that was deposed meanwhile (its next owner would then depose itself).
            self._check_still_owner()
            try:
                return await self._zk(self.meta.create_segment, self.name, self._log, record)
            except _ZK_BLIPS as exc:
                self._check_blip_deadline(deadline, f"creating segment {record.seq}", exc)
            # Did it go through before the answer was lost? Then the segment is ours as written.
            await asyncio.sleep(0.2)
            try:
                log_now = await self._zk(self.meta.get_log, self.name)
                if log_now.value.max_segment_seq != record.seq:
                    continue  # not applied (or someone else's: the retry's CAS says so)
                seg_now = await self._zk(self.meta.get_segment, self.name, record.seq)
            except _ZK_BLIPS:
                continue
            if seg_now.value == record:
                return log_now, seg_now
            raise ConflictError(f"segment {record.seq} of log {self.name!r} was created by another writer")

    async def _update_segment(self, current: Versioned[SegmentRecord], new: SegmentRecord) -> Versioned[SegmentRecord]:
        deadline = time.monotonic() + self.options.stall_timeout
        while True:
            self._check_still_owner()
            try:
                return await self._zk(self.meta.update_segment, self.name, current, new)
            except _ZK_BLIPS as exc:
                self._check_blip_deadline(deadline, f"completing segment {new.seq}", exc)
            await asyncio.sleep(0.2)
            try:
                now = await self._zk(self.meta.get_segment, self.name, new.seq)
            except _ZK_BLIPS:
                continue
            if now.value == new:
                return now  # applied before the answer was lost
            if now.version != current.version:
                raise ConflictError(f"segment {new.seq} of log {self.name!r} was changed by someone else")

    def _check_still_owner(self) -> None:
        """Raise unless this writer still owns the log through the session that claimed it.

        kazoo replays requests queued while disconnected on a *new* session after an expiry, so
        "no error yet" is not enough: the session must be the one the ownership znode belongs to."""
        if self._error is not None:
            raise self._error
        if self.ownership.lost:
            raise self._deposed(self.ownership.lost_reason or "ownership lost")
        client_id = self.meta.client.client_id
        if client_id is not None and self.ownership.session_id is not None and client_id[0] != self.ownership.session_id:
            raise self._deposed("its ZooKeeper session expired (the ownership belonged to the old session)")

    def _check_blip_deadline(self, deadline: float, what: str, exc: Exception) -> None:
        if time.monotonic() > deadline:
            raise WriterError(
                f"writer of log {self.name!r} stalled {what}: ZooKeeper unreachable for {self.options.stall_timeout:g}s ({exc!r})",
                hint="check the ZooKeeper ensemble; records not yet acknowledged may or may not be in the log",
            )
        log.warning("log %r: ZooKeeper connection trouble while %s (%r); retrying", self.name, what, exc)

    # -- failure and housekeeping ----------------------------------------------------------------

    def _deposed(self, why: str) -> WriterDeposedError:
        return WriterDeposedError(
            f"writer {self.owner_id} of log {self.name!r} was deposed: {why}",
            hint="records not yet acknowledged may or may not be in the log; reopen the log to continue",
        )

    def _on_ownership_lost(self, reason: str) -> None:
        self._fail(self._deposed(reason))

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
            seg.sealed = True
            batches += [e.batch for e in seg.inflight]
            seg.inflight.clear()
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
        for task in (self._housekeeper, self._recovery, self._extending):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if not keep_transition and self._transition is not None and self._transition is not asyncio.current_task():
            self._transition.cancel()

    async def _housekeeping(self) -> None:
        """Roll by time; on a degraded segment, look for a fresh ensemble now and then; give up
        on replicas that went silent (``_check_silent``)."""
        tick = min(0.25, self._roll_seconds() / 4)
        while self._error is None:
            await asyncio.sleep(tick)
            if self._extending is None and self._loop.time() - self._last_dispatch < ACTIVE_FOR:
                self._within_bounds(self._last_txid)  # reserve ahead while entries flow
            seg = self._segment
            if seg is None or self._closing:
                continue
            self._check_silent(seg)  # during a roll too: it waits for the in-flight entries
            if self._transition is not None or seg.closing:
                continue
            now = time.monotonic()
            if seg.failed and now >= seg.retry_at:
                self._request_roll("looking for a fresh ensemble for a degraded segment", failure=True)
            elif seg.next_entry_id > 0 and now - seg.created >= self._roll_seconds():
                self._request_roll(f"segment {seg.seq} is {now - seg.created:.1f}s old")

    def _check_silent(self, seg: _Segment) -> None:
        """The oldest unacknowledged entry waited longer than a replica may take to answer:
        its replicas that have not answered are taken for failed (``silent_after``), as if their
        adds had failed — the writer goes on without them while the others still make an ack
        quorum, and rolls to a fresh ensemble when they do not (``_on_replica_failed``). Only
        an entry that holds the others up counts (a slow replica outside the ack quorum costs
        nothing and is left alone), and only once another replica has stored it: silence is
        relative to the others, not a stall of everything."""
        if self.options.silent_after is None or not seg.inflight or seg.sealed:
            return
        entry = seg.inflight[0]
        if entry.acked or not entry.waiting or entry.acks == 0:
            # (Nobody answered: the writer's own side or every disk is slow — a stall for all,
            # not a silent member; giving up on every replica would only stop the writer.)
            return
        silence = max(self.options.silent_after, SILENT_FACTOR * self._add_latency.current)
        waited = self._loop.time() - entry.sent_at
        if waited < silence:
            return
        for node in sorted(entry.waiting):
            pending = seg.unanswered.get(node)
            if pending:  # it may lack entries acknowledged without it, before this one
                seg.short[node] = min(seg.short.get(node, pending[0] - 1), pending[0] - 1)
            seg.silent.add(node)
            self._on_replica_failed(seg, entry, node, AgentUnavailableError(f"agent {node} has not answered the add of entry {entry.entry_id} for {waited:.2f}s (silent)"))

    async def _zk(self, fn: Any, *args: Any) -> Any:
        return await self._loop.run_in_executor(None, fn, *args)
