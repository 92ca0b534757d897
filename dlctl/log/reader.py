"""The log reader: records in DLSN order, never past LAC, from whichever replica answers first.

Two halves share one event loop:

- A **fetcher** (one task, whose decisions are synchronous so its state is never seen half
  updated) walks the segments in order and keeps up to ``ReadAhead`` entries requested ahead of
  the consumer, each a speculative read (``ReplicaReader``). It never requests an entry past the
  readable end: a closed segment's ``last_entry_id``, or an in-progress segment's LAC as learned
  from the replicas. Caught up with an in-progress segment, it long-polls the replicas for
  LAC > the LAC it knows, one outstanding poll per replica, re-armed as each returns; a poll
  that returns carries the next entry, which then needs no read. A segment moves on only once
  the metadata says it is closed (ZooKeeper watches tell), so a roll leaves no gap.
- The **consumer** (``read_next`` / ``tail``) takes entries off the head of the buffer in order,
  decodes their records, drops control records and anything before the start position, and
  hands out ``ReadRecord`` objects.

Every entry is CRC-verified by the client; a corrupt answer is that replica failing. An entry no
replica could serve surfaces from ``read_next`` as ``EntryReadError``; reading again retries it.

**Truncation** (DESIGN.md §9): nothing before the log's truncation point is delivered. A reader
asked to start before it, or overtaken by a truncation while it reads (segments marked
truncated, or an entry whose replicas were collected), continues at the truncation point — the
min-active DLSN — and says so: a warning in the log and a ``TruncationSkip`` in
``reader.truncation_skips``. Reading from the beginning of a truncated log starts at the point
without a warning (that is where the log now begins).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from ..errors import DlctlError, UsageError
from ..meta.records import SegmentRecord, SegmentState
from ..meta.store import MetaStore
from ..meta.truncation import TruncationStore
from .compression import WireStats
from .dlsn import DLSN
from .errors import AgentError
from .format import HEADER_SIZE, Entry, decode
from .pool import AgentPool
from .protocol import Seen
from .readpolicy import (
    AdaptiveTimeout,
    ReadAhead,
    ReadAheadWindow,
    bisect_first,
    entry_max_txid,
    live_segments,
    poll_targets,
    readable_end,
    segment_index_for_txid,
    start_for_dlsn,
    start_of_log,
)
from .records import CorruptRecords, Record, decode_records
from .recovery import append_time
from .segwatch import SegmentWatcher
from .speculative import EntryReadError, ReplicaReader
from .timeindex import iso, locate_time, to_ms

log = logging.getLogger(__name__)

# How long an entry already readable waits for the long poll on its way with it before it is
# read instead (the poll's replica is slow or gone).
POLL_GRACE = 0.2

__all__ = ["EntryReadError", "LogReader", "ReadAhead", "ReadRecord", "ReaderClosedError", "ReaderStats", "TruncationSkip", "WholeEntry"]


@dataclass(frozen=True, slots=True)
class TruncationSkip:
    """The reader was before the log's truncation point and continued at ``start``."""

    requested: str  # where it was, or was asked to start (a DLSN, or "txid N")
    start: DLSN  # where it continued: the min-active DLSN

    def __str__(self) -> str:
        return f"{self.requested} -> {self.start}"


@dataclass(frozen=True, slots=True)
class ReadRecord:
    dlsn: DLSN
    txid: int
    payload: bytes
    key: bytes = b""
    headers: Mapping[str, bytes] = field(default_factory=dict)
    append_ms: int | None = None  # when its entry was appended (ms since the epoch; None: unknown)


@dataclass(frozen=True, slots=True)
class WholeEntry:
    """An entry handed out whole (``LogReader.take_entry``): its records' layout is
    ``dlctl.log.records``; their DLSNs are (seq, entry_id, slot)."""

    seq: int
    entry_id: int
    payload: bytes


class ReaderClosedError(DlctlError):
    """The reader was closed (by ``close``, or it failed for good)."""


@dataclass
class ReaderStats:
    entries_fetched: int = 0  # read from replicas or taken from long polls
    entries_from_polls: int = 0
    long_polls: int = 0
    buffered_entries: int = 0  # requested ahead of the consumer (in flight included)
    buffered_bytes: int = 0  # of those already arrived
    max_buffered_entries: int = 0
    max_buffered_bytes: int = 0
    metadata_reads: int = 0


class _Fetch:
    """One entry requested ahead of the consumer."""

    __slots__ = ("seq", "entry_id", "future", "size", "dropped")

    def __init__(self, seq: int, entry_id: int, future: asyncio.Future[Entry]) -> None:
        self.seq, self.entry_id, self.future = seq, entry_id, future
        self.size = 0
        self.dropped = False


class LogReader:
    """Reads log ``name`` from ``start_dlsn``, ``start_txid`` or ``start_time`` (seconds since the
    epoch: the first record appended at or after it, ``dlctl.log.timeindex``; default: its
    beginning).

    ``region``/``rack`` say where the reader runs (closer replicas are asked first).
    ``read_ahead`` bounds the prefetch buffer; within the bounds the reader keeps as many entries
    requested as the consumer's pace needs (``self.window``, ``readpolicy.ReadAheadWindow``:
    grown while it waits on entries in flight, shrunk while entries wait for it; unless
    ``ReadAhead(adaptive=False)``). ``speculative_timeout`` tunes when a slow replica
    gets company; ``long_poll_timeout`` is how long one long poll may wait at an agent.
    ``poll_depth``: caught up with an in-progress segment, how many entries ahead it long-polls
    (DistributedLog's read-ahead with long-poll reads): besides one poll per replica for the
    next entry, one replica gets polls for the entries after it, so each new entry travels to
    the reader as soon as the agent learns it is committed instead of waiting for the next poll
    to reach the agent and a read after it (two more trips). ``poll_depth`` is where it starts;
    when an answer shows more entries committed since the poll left than half the polls
    ahead, it doubles (to 16 times that, at most 256): the polls must cover what the writer
    commits in one round trip. An entry a poll is on its way with is not read as well, unless
    the poll is still missing ``POLL_GRACE`` after the entry became readable (its replica is
    slow: read it elsewhere). 1: one poll per replica, as on a LAN, where a poll is cheap.
    Use ``async with LogReader(...) as reader`` or ``await reader.open()`` / ``await reader.close()``.
    """

    def __init__(
        self,
        meta: MetaStore,
        pool: AgentPool,
        name: str,
        *,
        start_dlsn: DLSN | None = None,
        start_txid: int | None = None,
        start_time: float | None = None,
        region: str | None = None,
        rack: str | None = None,
        read_ahead: ReadAhead | None = None,
        speculative_timeout: AdaptiveTimeout | None = None,
        suspect_seconds: float = 5.0,
        long_poll_timeout: float = 5.0,
        poll_depth: int = 1,
        seen: Callable[[], Seen | None] | None = None,
        wire: WireStats | None = None,
    ) -> None:
        """``seen``: asked at every read, the (location, version vector) of what the reading
        replication stream's sink holds: records in that causal past come as stubs
        (``dlctl.replication.seen``); None: every record whole. ``wire``: the answers' bytes
        are counted there, and when it asks, agents may send them compressed
        (``dlctl.log.compression``)."""
        if sum(x is not None for x in (start_dlsn, start_txid, start_time)) > 1:
            raise UsageError("give the reader one start: a DLSN, a txid or a time")
        if long_poll_timeout <= 0:
            raise ValueError(f"long_poll_timeout must be > 0 (got {long_poll_timeout})")
        if not 1 <= poll_depth <= 256:
            raise ValueError(f"poll_depth must be in 1..256 (got {poll_depth})")
        self.poll_depth = poll_depth
        self._poll_ahead = poll_depth  # grows with what one round trip brings (see above)
        self._poll_ahead_max = min(poll_depth * 16, 256) if poll_depth > 1 else 1
        self.meta, self.pool, self.name = meta, pool, name
        self._start_dlsn, self._start_txid, self._start_time = start_dlsn, start_txid, start_time
        self.read_ahead = read_ahead or ReadAhead()
        bound = self.read_ahead.max_entries
        self.window = ReadAheadWindow(bound, minimum=min(2, bound), initial=min(4, bound)) if self.read_ahead.adaptive else None
        self.replicas = ReplicaReader(pool, region=region, rack=rack, timeout=speculative_timeout, suspect_seconds=suspect_seconds)
        self.long_poll_timeout = long_poll_timeout
        self._seen = seen or (lambda: None)
        self._wire = wire
        self.stats = ReaderStats()
        self.log_id = 0
        self.truncation_point: DLSN | None = None  # as read at open (and after a skip)
        self.truncation_skips: list[TruncationSkip] = []
        self._opened = False
        self._closed = False
        self._failure: BaseException | None = None
        # Consumer side.
        self._skip_before: DLSN | None = None  # records before the start DLSN are not delivered
        self._min_txid: int | None = None  # nor, until the first delivery, those below the start txid
        self._records: list[Record] = []
        self._record_at = (0, 0)  # (seq, entry id) of self._records
        self._append_ms: int | None = None  # of self._records' entry
        self._slot = 0
        self.position = DLSN(1, 0, 0)  # of the next record to deliver
        # Fetcher side.
        self._segments: dict[int, SegmentRecord] = {}
        self._fetch_seq = 1
        self._next_entry = 0
        self._fetch_last: int | None = None  # last entry of segment _fetch_seq, once known closed
        self._lac = -1  # known LAC of segment _fetch_seq
        self._buffer: deque[_Fetch] = deque()
        self._in_flight = 0
        self._size_estimate = 0
        self._polls: dict[tuple[str, int], asyncio.Task[tuple[int, bytes | None]]] = {}  # (node, previous LAC) -> poll
        self._poll_backoff: dict[str, tuple[float, float]] = {}  # node -> (retry at, last delay)
        self._polled: dict[int, bytes] = {}  # entry id -> entry carried by a long poll
        self._carrying: dict[int, int] = {}  # entry id -> polls outstanding that will carry it
        self._readable_at: dict[int, float] = {}  # entry id -> when LAC showed it readable (awaited from a poll)
        self._poll_timer: asyncio.Handle | None = None  # wakes the fetcher to retry a failed poll
        self._poll_timer_at = 0.0  # when it fires (loop time)
        self._grace_timer: asyncio.TimerHandle | None = None  # wakes the fetcher when a poll's grace is over
        self._retry_paused = False  # an entry failed; fetch again when the consumer asks
        self._wake = asyncio.Event()
        self._arrived = asyncio.Event()
        self._fetcher: asyncio.Task[None] | None = None
        self._watcher: SegmentWatcher | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._refresh_again = False
        self._refresh_delay = 0.0  # backoff after a failed metadata read
        self._last_safety_refresh = 0.0

    def __repr__(self) -> str:
        return f"LogReader({self.name!r}, position={self.position}, lac={self._lac})"

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> LogReader:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> LogReader:
        """Find the start position (reading entries for a txid) and start prefetching."""
        if self._opened:
            return self
        self._opened = True
        loop = asyncio.get_running_loop()
        try:
            record = await loop.run_in_executor(None, self.meta.get_log, self.name)
            self.log_id = record.value.log_id
            await self.pool.refresh()
            self._watcher = SegmentWatcher(self.meta, self.name, self._metadata_changed)
            segments = await self._watcher.segments()
            self.stats.metadata_reads += 1
            live = live_segments(segments)
            truncation = await loop.run_in_executor(None, TruncationStore(self.meta).get, self.name)
            point = self.truncation_point = truncation.value.point if truncation is not None else None
            skipped: str | None = None  # what the caller asked for, when truncation moved it
            if self._start_dlsn is not None:
                start = start_for_dlsn(live, self._start_dlsn)
                self._skip_before = start
                if start > self._start_dlsn:  # it fell in what truncation removed
                    skipped = str(self._start_dlsn)
            elif self._start_txid is not None:
                start = await self._locate_txid(live, self._start_txid, record.value.max_segment_seq)
                self._min_txid = self._start_txid
                if truncation is not None and self._start_txid <= truncation.value.truncated_txid:
                    skipped = f"txid {self._start_txid}"
            elif self._start_time is not None:
                start, lac = await locate_time(self.replicas, self.log_id, live, to_ms(self._start_time), record.value.max_segment_seq)
                if lac is not None:
                    self._lac = max(self._lac, lac)
            else:
                start = start_of_log(live, record.value.max_segment_seq)
            if point is not None and start < point:
                # The point wins, to the slot (the boundary entry keeps the records after it; and
                # the segments may not all be marked yet).
                if self._start_dlsn is not None:
                    skipped = str(self._start_dlsn)
                elif self._start_txid is not None:
                    skipped = f"txid {self._start_txid}"
                elif self._start_time is not None:
                    skipped = f"time {iso(to_ms(self._start_time))}"
                start = start_for_dlsn(live, point)
                self._skip_before = point
            if skipped is not None:
                self._note_skip(skipped, max(start, self._skip_before or start))
            self._segments = {s.seq: s for s in segments if s.seq >= start.segment_seq}
            self.position = start
            self._fetch_seq, self._next_entry = start.segment_seq, start.entry_id
            self._fetcher = asyncio.ensure_future(self._run())
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        """Stop prefetching and polling; pending and later reads raise ``ReaderClosedError``."""
        if self._closed:
            return
        self._closed = True
        if self._watcher is not None:
            self._watcher.close()
        tasks: list[asyncio.Future] = [t for t in (self._fetcher, self._refresh_task) if t is not None]
        tasks += self._polls.values()
        tasks += [f.future for f in self._buffer]
        self._polls.clear()
        self._drop_buffer()
        for timer in (self._poll_timer, self._grace_timer):
            if timer is not None:
                timer.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._arrived.set()

    # -- consumer -------------------------------------------------------------------------------

    async def read_next(self, timeout: float | None = None) -> ReadRecord | None:
        """The next record, waiting up to ``timeout`` seconds (None: for ever); None on timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            record = self._next_record()
            if record is not None:
                return record
            try:
                fetched = await self._next_entry_from_buffer(deadline)
            except EntryReadError:
                # Every replica failed: if the entry was truncated meanwhile (its files may be
                # collected already), continue at the truncation point instead.
                if await self._skip_truncated():
                    continue
                raise
            if fetched is None:
                return None
            self._load(fetched)

    # -- truncation ---------------------------------------------------------------------------

    def _note_skip(self, requested: str, start: DLSN) -> None:
        skip = TruncationSkip(requested, start)
        if self.truncation_skips and self.truncation_skips[-1].start >= start:
            return  # already said (a jump noticed twice, by the fetcher and the consumer)
        self.truncation_skips.append(skip)
        log.warning("log %r is truncated: reading continues at %s (the min-active DLSN) instead of %s", self.name, start, requested)

    async def _skip_truncated(self) -> bool:
        """After an entry failed on every replica: was it truncated meanwhile? Then move to the
        truncation point (and say so) and return True; False leaves the error to the caller."""
        if self._watcher is None or self._closed:
            return False
        seq, entry_id = self._fetch_seq, self._next_entry  # where _reset_fetch left the fetcher
        here = DLSN(seq, entry_id, 0)
        loop = asyncio.get_running_loop()
        try:
            truncation = await loop.run_in_executor(None, TruncationStore(self.meta).get, self.name)
            segments = await self._watcher.segments(min(seq, self.position.segment_seq))
        except Exception:  # noqa: BLE001 - cannot tell: the read error stands
            return False
        self.stats.metadata_reads += 1
        self._segments = {s.seq: s for s in segments}
        point = truncation.value.point if truncation is not None else None
        if point is not None:
            self.truncation_point = point
        seg = self._segments.get(seq)
        gone = (
            (point is not None and here < DLSN(point.segment_seq, point.entry_id, 0))
            or (seg is None and any(s > seq for s in self._segments))
            or (seg is not None and (seg.state is SegmentState.TRUNCATED or entry_id < seg.min_active_entry))
        )
        if not gone:
            return False
        live = live_segments(segments)
        target = start_for_dlsn(live, max(here, point) if point is not None else here)
        if point is not None and point > here:
            self._skip_before = point  # to the slot: the boundary entry keeps what follows it
        self._note_skip(str(max(here, self.position)), max(target, self._skip_before or target))
        self._records, self._slot = [], 0
        self.position = target
        self._retry_paused = False
        self._move_to(target.segment_seq, target.entry_id)
        self._wake.set()
        return True

    async def tail(self) -> AsyncIterator[ReadRecord]:
        """Every record from the position on, waiting at the end for more; ends when closed."""
        while not self._closed:
            try:
                record = await self.read_next()
            except ReaderClosedError:
                return
            if record is not None:
                yield record

    def __aiter__(self) -> AsyncIterator[ReadRecord]:
        return self.tail()

    def _next_record(self) -> ReadRecord | None:
        records = self._records
        while self._slot < len(records):
            slot = self._slot
            record = records[slot]
            self._slot += 1
            if record.control:
                continue
            seq, entry_id = self._record_at
            dlsn = DLSN(seq, entry_id, slot)
            if self._skip_before is not None:
                if dlsn < self._skip_before:
                    continue
                self._skip_before = None
            if self._min_txid is not None:
                if record.txid < self._min_txid:
                    continue
                self._min_txid = None
            self.position = DLSN(seq, entry_id, slot + 1)
            return ReadRecord(dlsn, record.txid, record.payload, record.key, record.headers, self._append_ms)
        return None

    # -- whole entries --------------------------------------------------------------------------

    def take_entry(self) -> WholeEntry | None:
        """The next entry whole, if the consumer is between entries and it has arrived: for a
        consumer that handles an entry's records in one go (a stream worker's C loop,
        ``dlctl.replication.fastpath``). Never waits. None: go on with ``read_next`` (an entry's
        records are being handed out, the next entry is still on its way or failed, or the start
        position lies inside it). The consumer then says how far it got: ``entry_done`` (all of
        it) or ``records_from`` (the rest one by one through ``read_next``)."""
        if self._records_pending() or self._min_txid is not None:
            return None
        if self._failure is not None or self._closed or not self._opened or not self._buffer:
            return None
        head = self._buffer[0]
        if head.dropped or not head.future.done() or head.future.cancelled() or head.future.exception() is not None:
            return None  # (read_next waits for it, or retries it and says why it failed)
        if self._skip_before is not None:
            if self._skip_before > DLSN(head.seq, head.entry_id, 0):
                return None  # the start lies inside it: read_next skips the records before
            self._skip_before = None
        self._pop_head(waited=False)
        self._records, self._slot = [], 0
        self._record_at = (head.seq, head.entry_id)
        here = DLSN(head.seq, head.entry_id, 0)
        if self.position < here:
            self.position = here
        return WholeEntry(head.seq, head.entry_id, head.future.result().payload)

    async def wait_entry(self, timeout: float | None) -> bool:
        """For ``take_entry``'s consumer: wait up to ``timeout`` seconds (None: for ever) until
        the next entry has arrived, or there is something for ``read_next`` to hand out or raise
        (records pending, a failed entry, a retry to start, the reader stopped). False when the
        time ran out first."""
        if self._records_pending():
            return True
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        while not self._buffer:
            if self._failure is not None or self._closed or self._retry_paused:
                return True
            if not await self._next_arrival(deadline):
                return False
        return await self._arrived_by(self._buffer[0], deadline)

    async def _next_arrival(self, deadline: float | None) -> bool:
        """Wait until the fetcher says something arrived (an entry, a failure); False when
        ``deadline`` (loop time; None: never) passed first."""
        self._arrived.clear()
        try:
            async with asyncio.timeout_at(deadline):
                await self._arrived.wait()
        except TimeoutError:
            return False
        return True

    async def _arrived_by(self, fetched: _Fetch, deadline: float | None) -> bool:
        """Wait until ``fetched`` arrived (or failed); False when ``deadline`` passed first."""
        if not fetched.future.done():
            remaining = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
            await asyncio.wait((fetched.future,), timeout=remaining)
        return fetched.future.done()

    def _records_pending(self) -> bool:
        """Are records of the current entry still to be handed out? (Its last records are
        control records as a rule — the writer's totals — which are never handed out.)"""
        records, slot = self._records, self._slot
        return any(not records[i].control for i in range(slot, len(records)))

    def entry_done(self, entry: WholeEntry, slots: int) -> None:
        """Every record of ``entry`` was handled (``slots``: how many it has, control records
        included): the next record is the next entry's first."""
        self.position = DLSN(entry.seq, entry.entry_id, slots)

    def records_from(self, entry: WholeEntry, slot: int) -> None:
        """Hand out the records of ``entry`` from ``slot`` on through ``read_next`` (those before
        it were handled)."""
        self._records = self._decode(entry.payload, entry.seq, entry.entry_id)
        self._record_at = (entry.seq, entry.entry_id)
        self._append_ms = append_time(self._records)
        self._slot = slot
        self.position = DLSN(entry.seq, entry.entry_id, slot)

    def _decode(self, payload: bytes, seq: int, entry_id: int) -> list[Record]:
        try:
            return list(decode_records(payload))
        except CorruptRecords as exc:
            # The CRC matched, so the writer wrote this: no other replica can do better, and
            # skipping the entry would be a silent gap. The reader stops here for good.
            self._failure = CorruptRecords(f"entry {entry_id} of segment {seq} of log {self.name!r} does not parse as records: {exc}")
            raise self._failure from None

    def _load(self, fetched: _Fetch) -> None:
        entry = fetched.future.result()
        self._records = self._decode(entry.payload, fetched.seq, fetched.entry_id)
        self._record_at = (fetched.seq, fetched.entry_id)
        self._append_ms = append_time(self._records)
        self._slot = 0
        if self.position < DLSN(fetched.seq, fetched.entry_id, 0):
            self.position = DLSN(fetched.seq, fetched.entry_id, 0)

    async def _next_entry_from_buffer(self, deadline: float | None) -> _Fetch | None:
        while not self._buffer:
            self._check_usable()
            if self._retry_paused:
                self._retry_paused = False  # this read is the retry
                self._wake.set()
            if not await self._next_arrival(deadline):
                return None
        head = self._buffer[0]
        waited = not head.future.done()  # requested, not arrived: the window did not cover the latency
        if not await self._arrived_by(head, deadline):
            return None
        self._check_usable()
        if head.dropped:  # the buffer was reset while we waited
            return await self._next_entry_from_buffer(deadline)
        self._pop_head(waited)
        exc = head.future.exception()
        if exc is not None:
            # Start over at this entry: the next read_next retries it.
            self._reset_fetch(head.seq, head.entry_id)
            raise exc
        return head

    def _pop_head(self, waited: bool) -> None:
        head = self._buffer.popleft()
        self._buffered_bytes_sub(head)
        if self.window is not None:
            self.window.taken(waited=waited, ready=sum(1 for f in self._buffer if f.future.done()))
        self._wake.set()  # room for the fetcher

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise ReaderClosedError(f"reader of log {self.name!r} is closed")
        if not self._opened:
            raise UsageError("open the reader first (await reader.open() or async with)")

    # -- fetcher --------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                self._wake.clear()
                self._pump()
                await self._wake.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug or the log vanished: make it visible to the consumer
            log.exception("reader of log %r stopped", self.name)
            self._failure = exc
            self._arrived.set()

    def _pump(self) -> None:
        """Request what may be requested now; synchronous, so no state is seen half updated."""
        if self._retry_paused:
            return
        while True:
            seg = self._current_segment()
            if seg is None:
                return  # the next segment does not exist yet: a metadata watch wakes us
            end = readable_end(seg, self._lac)
            if self._next_entry <= end:
                # (A closed segment's last entries are readable by its metadata, not by a LAC
                # that a poll could bring: the writer's close publishes none. Read them now.)
                if seg.state is SegmentState.INPROGRESS and self._awaiting_poll(self._next_entry):
                    self._arm_polls(seg)  # keep the polls ahead rolling meanwhile
                    return
                if self.window is not None and len(self._buffer) >= self.window.size:
                    return
                if not self.read_ahead.allows(len(self._buffer), self.stats.buffered_bytes, self._in_flight, self._size_estimate):
                    return
                self._request(seg, self._next_entry)
                self._next_entry += 1
                continue
            if seg.state is SegmentState.INPROGRESS:
                self._arm_polls(seg)
                return
            self._move_to(seg.seq + 1, 0)  # closed and every entry requested

    def _awaiting_poll(self, entry_id: int) -> bool:
        """Is ``entry_id`` better left to the poll on its way with it (not in hand yet, and not
        overdue: then it is read like any entry)?"""
        if self.poll_depth == 1 or entry_id in self._polled or not self._carrying.get(entry_id):
            return False
        loop = asyncio.get_running_loop()
        now = loop.time()
        since = self._readable_at.setdefault(entry_id, now)
        if now - since >= POLL_GRACE:
            return False
        # Look again when the grace is over. Armed at every look, not once: the loop may run a
        # timer up to its clock resolution early, and a wake-up that finds the grace a hair short
        # must not leave the entry waiting for some other event (a poll timing out, seconds later).
        if self._grace_timer is not None:
            self._grace_timer.cancel()
        self._grace_timer = loop.call_at(since + POLL_GRACE, self._wake.set)
        return True

    def _current_segment(self) -> SegmentRecord | None:
        origin: DLSN | None = None  # where unread entries were truncated away under us
        while True:
            seg = self._segments.get(self._fetch_seq)
            if seg is not None and seg.state is not SegmentState.TRUNCATED:
                self._fetch_last = seg.last_entry_id if seg.state is not SegmentState.INPROGRESS else None
                if self._next_entry < seg.min_active_entry:
                    origin = origin or DLSN(seg.seq, self._next_entry, 0)
                    self._next_entry = seg.min_active_entry  # start where data is
                if origin is not None:
                    self._overtaken(origin, DLSN(seg.seq, self._next_entry, 0))
                return seg
            later = [s for s in self._segments if s > self._fetch_seq]
            if not later:
                return None
            # Sequence numbers are allocated one by one, so a missing one below an existing one
            # was truncated and deleted; nothing of it is left to read.
            last = seg.last_entry_id if seg is not None else self._fetch_last
            if origin is None and (last is None or self._next_entry <= last):  # entries were left unread
                origin = DLSN(self._fetch_seq, self._next_entry, 0)
            self._move_to(min(later), 0)

    def _overtaken(self, origin: DLSN, landing: DLSN) -> None:
        """A truncation passed the fetcher: records before the point must not be delivered (to
        the slot, when the point is inside the landing entry); say so once."""
        point = self.truncation_point
        if point is not None and landing <= point:
            if self._skip_before is None or self._skip_before < point:
                self._skip_before = point
            landing = point
        self._note_skip(str(origin), landing)

    def _move_to(self, seq: int, entry_id: int) -> None:
        if seq != self._fetch_seq:
            self._fetch_last = None
            self._cancel_polls()
            self._lac = -1
            self._polled.clear()
            self._readable_at.clear()
            self._poll_backoff.clear()
        self._fetch_seq, self._next_entry = seq, entry_id

    def _request(self, seg: SegmentRecord, entry_id: int) -> None:
        loop = asyncio.get_running_loop()
        self._readable_at.pop(entry_id, None)
        data = self._polled.pop(entry_id, None)
        if data is not None:
            future: asyncio.Future[Entry] = loop.create_future()
            future.set_result(decode(data))  # verified by the client already; cheap to redo
            self.stats.entries_from_polls += 1
        else:
            future = asyncio.ensure_future(self.replicas.read(self.log_id, seg, entry_id, self._seen(), wire=self._wire))
        fetched = _Fetch(seg.seq, entry_id, future)
        self._buffer.append(fetched)
        self._in_flight += 1
        self.stats.buffered_entries = len(self._buffer)
        self.stats.max_buffered_entries = max(self.stats.max_buffered_entries, len(self._buffer))
        if future.done():
            self._arrived_entry(fetched)
        else:
            future.add_done_callback(lambda _f, fetched=fetched: self._arrived_entry(fetched))
        self._arrived.set()

    def _arrived_entry(self, fetched: _Fetch) -> None:
        if fetched.dropped:
            return
        self._in_flight -= 1
        future = fetched.future
        if not future.cancelled() and future.exception() is None:
            entry = future.result()
            fetched.size = HEADER_SIZE + len(entry.payload)
            self._size_estimate = max(self._size_estimate, fetched.size)
            self.stats.entries_fetched += 1
            self.stats.buffered_bytes += fetched.size
            self.stats.max_buffered_bytes = max(self.stats.max_buffered_bytes, self.stats.buffered_bytes)
        self._arrived.set()
        self._wake.set()

    def _buffered_bytes_sub(self, fetched: _Fetch) -> None:
        self.stats.buffered_bytes -= fetched.size
        self.stats.buffered_entries = len(self._buffer)

    def _drop_buffer(self) -> None:
        for fetched in self._buffer:
            fetched.dropped = True
            if not fetched.future.done():
                fetched.future.cancel()
            elif not fetched.future.cancelled():
                fetched.future.exception()  # retrieved: a dropped failure is not worth a log line
        self._buffer.clear()
        self._in_flight = 0
        self.stats.buffered_entries = self.stats.buffered_bytes = 0

    def _reset_fetch(self, seq: int, entry_id: int) -> None:
        # Nothing is fetched again until the consumer reads again: that read is the retry, and
        # a consumer that gave up does not leave the fetcher hammering dead replicas.
        self._drop_buffer()
        self._move_to(seq, entry_id)
        self._retry_paused = True

    # -- LAC: long polls ------------------------------------------------------------------------

    def _arm_polls(self, seg: SegmentRecord) -> None:
        """One outstanding long poll per replica that may learn LAC > the known LAC first, and
        with ``poll_depth`` > 1 polls for the entries after it at one replica holding each."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        wanted = [(node, self._lac) for node in poll_targets(seg, self._lac)]
        for ahead in range(self._lac + 1, self._lac + self._poll_ahead):
            holders = seg.write_set(ahead + 1)
            if holders:
                wanted.append((holders[0], ahead))
        for node, previous in wanted:
            if (node, previous) in self._polls:
                continue
            retry_at = self._poll_backoff.get(node, (0.0, 0.0))[0]
            if retry_at > now:
                # The deadline is kept beside the handle: uvloop turns a timer due in under a
                # millisecond into a plain Handle, which has no when().
                if self._poll_timer is None or self._poll_timer_at > retry_at or self._poll_timer_at <= now:
                    if self._poll_timer is not None:
                        self._poll_timer.cancel()
                    self._poll_timer = loop.call_at(retry_at, self._wake.set)
                    self._poll_timer_at = retry_at
                continue
            task = asyncio.ensure_future(self._long_poll(node, seg.seq, previous))
            self._polls[(node, previous)] = task
            self._carrying[previous + 1] = self._carrying.get(previous + 1, 0) + 1
            self.stats.long_polls += 1
            task.add_done_callback(lambda t, node=node, seq=seg.seq, previous=previous: self._poll_done(t, node, seq, previous))

    async def _long_poll(self, node: str, seq: int, previous: int) -> tuple[int, bytes | None]:
        client = await self.pool.client(node)
        return await client.long_poll(self.log_id, seq, previous, self.long_poll_timeout, seen=self._seen(), wire=self._wire)

    def _poll_done(self, task: asyncio.Task[tuple[int, bytes | None]], node: str, seq: int, previous: int) -> None:
        if self._polls.get((node, previous)) is task:
            del self._polls[(node, previous)]
            self._carried_off(previous + 1)
        if task.cancelled() or self._closed or seq != self._fetch_seq:
            return
        loop = asyncio.get_running_loop()
        exc = task.exception()
        if exc is not None:
            if not isinstance(exc, AgentError):
                self._failure = exc
                self._arrived.set()
                return
            # Unreachable or in limbo: other replicas keep polling; retry this one later.
            delay = min(max(self._poll_backoff.get(node, (0.0, 0.05))[1] * 2, 0.1), 5.0)
            self._poll_backoff[node] = (loop.time() + delay, delay)
            log.debug("long poll of %s for segment %d failed (%s); retry in %.2fs", node, seq, exc, delay)
        else:
            self._poll_backoff.pop(node, None)
            lac, data = task.result()
            nxt = previous + 1
            # Keep the carried entry only if the fetcher has yet to request it and it lies
            # within the polled window (the buffer stays bounded), never past LAC (nxt <= lac).
            if data is not None and self._next_entry <= nxt < self._next_entry + self._poll_ahead and nxt <= lac:
                self._polled[nxt] = data
            if lac - previous > self._poll_ahead // 2 and self._poll_ahead < self._poll_ahead_max:
                # More was committed while the poll travelled than the polls ahead cover.
                self._poll_ahead = min(self._poll_ahead * 2, self._poll_ahead_max)
            if lac > self._lac:
                self._lac = lac
            elif lac <= previous and loop.time() - self._last_safety_refresh >= self.long_poll_timeout:
                # A poll ran out with nothing new: re-read the metadata in case a watch was lost
                # (at the latest, this is how a segment closed while idle is noticed).
                self._last_safety_refresh = loop.time()
                self._metadata_changed()
        self._wake.set()

    def _carried_off(self, entry_id: int) -> None:
        left = self._carrying.get(entry_id, 0) - 1
        if left > 0:
            self._carrying[entry_id] = left
        else:
            self._carrying.pop(entry_id, None)  # (its readable_at stays: a new poll does not reset the grace)

    def _cancel_polls(self) -> None:
        self._carrying.clear()
        polls, self._polls = list(self._polls.values()), {}
        for task in polls:
            task.cancel()

    # -- metadata -------------------------------------------------------------------------------

    def _metadata_changed(self) -> None:
        if self._closed:
            return
        if self._refresh_task is not None and not self._refresh_task.done():
            self._refresh_again = True
            return
        self._refresh_task = asyncio.ensure_future(self._refresh())

    async def _refresh(self) -> None:
        assert self._watcher is not None
        while True:
            self._refresh_again = False
            # From the consumer's segment: a retry after a failed entry may go back to it.
            since = min(self.position.segment_seq, self._fetch_seq)
            try:
                segments = await self._watcher.segments(since)
                if any(s.state in (SegmentState.TRUNCATED, SegmentState.PARTIALLY_TRUNCATED) for s in segments) or (segments and segments[0].seq > since):
                    # Truncation is under way or done: the point (read after the segments, so
                    # it is at least what their marks imply) gives slot precision to a jump.
                    truncation = await asyncio.get_running_loop().run_in_executor(None, TruncationStore(self.meta).get, self.name)
                    if truncation is not None:
                        self.truncation_point = truncation.value.point
            except DlctlError as exc:  # the log was deleted
                self._failure = exc
                self._arrived.set()
                return
            except Exception as exc:  # ZooKeeper unreachable or the session expired: retry later
                self._refresh_delay = min(max(self._refresh_delay * 2, 0.1), 5.0)
                log.warning("reader of log %r cannot re-read its segments (%r); retrying in %.1fs", self.name, exc, self._refresh_delay)
                asyncio.get_running_loop().call_later(self._refresh_delay, self._metadata_changed)
                return
            self._refresh_delay = 0.0
            self.stats.metadata_reads += 1
            self._segments = {s.seq: s for s in segments}
            self._wake.set()
            if not self._refresh_again or self._closed:
                return

    # -- positioning by txid ------------------------------------------------------------------

    async def _locate_txid(self, live: list[SegmentRecord], txid: int, max_segment_seq: int) -> DLSN:
        """The position of the first record with txid >= ``txid``: binary search over segments
        by their metadata, then over the chosen segment's entries by reading them."""
        index = segment_index_for_txid(live, txid)
        if index == len(live):
            nxt = live[-1].seq + 1 if live else max_segment_seq + 1
            return DLSN(nxt, 0, 0)
        seg = live[index]
        if seg.first_txid >= 0 and seg.first_txid >= txid:
            return DLSN(seg.seq, seg.min_active_entry, 0)
        end = seg.last_entry_id if seg.state is not SegmentState.INPROGRESS else await self.replicas.read_lac(self.log_id, seg)

        async def reaches(entry_id: int) -> bool:
            entry = await self.replicas.read(self.log_id, seg, entry_id)
            top = entry_max_txid(decode_records(entry.payload))
            return top is not None and top >= txid

        first = await bisect_first(seg.min_active_entry, end, reaches)
        if seg.state is SegmentState.INPROGRESS:
            self._lac = max(self._lac, end)
        return DLSN(seg.seq, first, 0)
