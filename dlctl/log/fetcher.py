"""The reader's fetcher: read-ahead of entries and long polls for the LAC, up to the readable end.

One task (``EntryFetcher._run``), whose decisions (``_pump``) are synchronous so its state is
never seen half updated, walks the segments in order and keeps up to ``ReadAhead`` entries
requested ahead of the consumer, each a speculative read (``ReplicaReader``). It never requests
an entry past the readable end: a closed segment's ``last_entry_id``, or an in-progress
segment's LAC as learned from the replicas. Caught up with an in-progress segment, it
long-polls the replicas for LAC > the LAC it knows, one outstanding poll per replica, re-armed
as each returns; a poll that returns carries the next entry, which then needs no read. A
segment moves on only once the metadata says it is closed (ZooKeeper watches tell, re-read by
``_refresh``), so a roll leaves no gap.

``EntryFetcher`` is the base of ``dlctl.log.reader.LogReader``, which adds the consumer:
positioning (by DLSN, txid, time; truncation) and record decoding. A base class rather than an
object of its own because the two halves act on each other's state within one loop turn, with
no await between: the consumer takes the head of the buffer and wakes the fetcher, resets it at
a failed entry (``_reset_fetch``) or moves it past a truncation (``_move_to``); the fetcher,
overtaken by a truncation, tells the consumer what to skip (``_overtaken``, the consumer's) and
re-reads the segments from the consumer's ``position``. Behind an interface those would be as
many calls, over the same state.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import DlctlError
from ..meta.records import SegmentRecord, SegmentState
from ..meta.store import MetaStore
from ..meta.truncation import TruncationStore
from .compression import WireStats
from .dlsn import DLSN
from .errors import AgentError
from .format import HEADER_SIZE, Entry, decode
from .pool import AgentPool
from .protocol import Seen
from .readpolicy import AdaptiveTimeout, ReadAhead, ReadAheadWindow, poll_targets, readable_end
from .segwatch import SegmentWatcher
from .speculative import ReplicaReader

log = logging.getLogger(__name__)


# How long an entry already readable waits for the long poll on its way with it before it is
# read instead (the poll's replica is slow or gone).
POLL_GRACE = 0.2


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


class Fetch:
    """One entry requested ahead of the consumer."""

    __slots__ = ("seq", "entry_id", "future", "size", "dropped")

    def __init__(self, seq: int, entry_id: int, future: asyncio.Future[Entry]) -> None:
        self.seq, self.entry_id, self.future = seq, entry_id, future
        self.size = 0
        self.dropped = False


class EntryFetcher:
    """The fetcher half of a ``LogReader`` (see the module docstring); the options are the
    reader's."""

    position: DLSN  # the consumer's: of the next record it delivers (``LogReader``)

    def __init__(
        self,
        meta: MetaStore,
        pool: AgentPool,
        name: str,
        *,
        region: str | None,
        rack: str | None,
        read_ahead: ReadAhead | None,
        speculative_timeout: AdaptiveTimeout | None,
        suspect_seconds: float,
        long_poll_timeout: float,
        poll_depth: int,
        seen: Callable[[], Seen | None] | None,
        wire: WireStats | None,
    ) -> None:
        if long_poll_timeout <= 0:
            raise ValueError(f"long_poll_timeout must be > 0 (got {long_poll_timeout})")
        if not 1 <= poll_depth <= 256:
            raise ValueError(f"poll_depth must be in 1..256 (got {poll_depth})")
        self.poll_depth = poll_depth
        self._poll_ahead = poll_depth  # grows with what one round trip brings (LogReader's docstring)
        self._poll_ahead_max = min(poll_depth * 16, 256) if poll_depth > 1 else 1
        self.meta, self.pool, self.name = meta, pool, name
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
        self._closed = False
        self._failure: BaseException | None = None
        # Fetcher side.
        self._segments: dict[int, SegmentRecord] = {}
        self._fetch_seq = 1
        self._next_entry = 0
        self._fetch_last: int | None = None  # last entry of segment _fetch_seq, once known closed
        self._lac = -1  # known LAC of segment _fetch_seq
        self._buffer: deque[Fetch] = deque()
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

    # -- requesting entries -------------------------------------------------------------------

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
        if now >= since + POLL_GRACE:  # the very sum the wake-up below is armed at (no rounding between the two)
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
        """A truncation passed the fetcher: entries from ``origin`` on are gone and it goes on
        at ``landing``. What the consumer then skips, and saying so, is the consumer's."""
        raise NotImplementedError


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
        fetched = Fetch(seg.seq, entry_id, future)
        self._buffer.append(fetched)
        self._in_flight += 1
        self.stats.buffered_entries = len(self._buffer)
        self.stats.max_buffered_entries = max(self.stats.max_buffered_entries, len(self._buffer))
        if future.done():
            self._arrived_entry(fetched)
        else:
            future.add_done_callback(lambda _f, fetched=fetched: self._arrived_entry(fetched))
        self._arrived.set()

    def _arrived_entry(self, fetched: Fetch) -> None:
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

    def _buffered_bytes_sub(self, fetched: Fetch) -> None:
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

    def _stop_fetching(self) -> list[asyncio.Future]:
        """Stop the watcher, the timers, the polls and the requests in flight (for ``close``);
        returns the tasks to cancel and wait for."""
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
        return tasks
