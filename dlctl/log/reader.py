"""The log reader: records in DLSN order, never past LAC, from whichever replica answers first.

Two halves share one event loop (and one object: ``LogReader`` extends the fetcher):

- A **fetcher** (``dlctl.log.fetcher``, whose docstring tells how) keeps entries requested
  ahead of the consumer, never past the readable end (a closed segment's last entry, an
  in-progress segment's LAC, which it long-polls the replicas for), and moves to the next
  segment only once the metadata says this one is closed, so a roll leaves no gap.
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
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from ..errors import DlctlError, UsageError
from ..meta.records import SegmentRecord, SegmentState
from ..meta.store import MetaStore
from ..meta.truncation import TruncationStore
from .compression import WireStats
from .dlsn import DLSN
from .fetcher import EntryFetcher, Fetch
from .pool import AgentPool
from .protocol import Seen
from .readpolicy import (
    AdaptiveTimeout,
    ReadAhead,
    bisect_first,
    entry_max_txid,
    live_segments,
    segment_index_for_txid,
    start_for_dlsn,
    start_of_log,
)
from .records import CorruptRecords, Record, decode_records
from .recovery import append_time
from .segwatch import SegmentWatcher
from .speculative import EntryReadError
from .timeindex import iso, locate_time, to_ms

log = logging.getLogger(__name__)

__all__ = ["EntryReadError", "LogReader", "ReadAhead", "ReadRecord", "ReaderClosedError", "TruncationSkip", "WholeEntry"]


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


class LogReader(EntryFetcher):
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
    the poll is still missing ``fetcher.POLL_GRACE`` after the entry became readable (its replica is
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
        super().__init__(
            meta, pool, name, region=region, rack=rack, read_ahead=read_ahead, speculative_timeout=speculative_timeout,
            suspect_seconds=suspect_seconds, long_poll_timeout=long_poll_timeout, poll_depth=poll_depth, seen=seen, wire=wire,
        )
        self._start_dlsn, self._start_txid, self._start_time = start_dlsn, start_txid, start_time
        self.truncation_skips: list[TruncationSkip] = []
        self._opened = False
        # Consumer side.
        self._skip_before: DLSN | None = None  # records before the start DLSN are not delivered
        self._min_txid: int | None = None  # nor, until the first delivery, those below the start txid
        self._records: list[Record] = []
        self._record_at = (0, 0)  # (seq, entry id) of self._records
        self._append_ms: int | None = None  # of self._records' entry
        self._slot = 0
        self.position = DLSN(1, 0, 0)  # of the next record to deliver

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
        tasks = self._stop_fetching()
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

    async def _arrived_by(self, fetched: Fetch, deadline: float | None) -> bool:
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
            self._failure = CorruptRecords(
                f"entry {entry_id} of segment {seq} of log {self.name!r} does not parse as records: {exc}",
                hint=f"its CRC matched, so its writer stored these bytes and no replica holds better; the records after it start at {seq}/{entry_id + 1}/0 (`log read --from-dlsn`)",
            )
            raise self._failure from None

    def _load(self, fetched: Fetch) -> None:
        entry = fetched.future.result()
        self._records = self._decode(entry.payload, fetched.seq, fetched.entry_id)
        self._record_at = (fetched.seq, fetched.entry_id)
        self._append_ms = append_time(self._records)
        self._slot = 0
        if self.position < DLSN(fetched.seq, fetched.entry_id, 0):
            self.position = DLSN(fetched.seq, fetched.entry_id, 0)

    async def _next_entry_from_buffer(self, deadline: float | None) -> Fetch | None:
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

    # -- truncation passing the fetcher ---------------------------------------------------------

    def _overtaken(self, origin: DLSN, landing: DLSN) -> None:
        """A truncation passed the fetcher: records before the point must not be delivered (to
        the slot, when the point is inside the landing entry); say so once."""
        point = self.truncation_point
        if point is not None and landing <= point:
            if self._skip_before is None or self._skip_before < point:
                self._skip_before = point
            landing = point
        self._note_skip(str(origin), landing)

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
