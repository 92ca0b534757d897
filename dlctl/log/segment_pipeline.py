"""One open segment's write pipeline: its entries in flight, each with its ack set, acknowledged
in entry order (DESIGN.md §5; BookKeeper's PendingAddOp and LedgerHandle's in-order drain).

The log writer (``dlctl.log.writer``) owns the log — ownership, batching, rolling. For the one
segment it writes it keeps a ``SegmentPipeline``, which turns each cut batch into the next
entry (the LAC so far, the segment's running totals and the append time the writer gives),
sends it to its write set less the members that failed, and counts the answers:

- **Ack sets.** A ``PendingEntry`` knows which members of its write set stored it and which
  have not answered, and decides itself when it reached ack quorum and whether it still can
  (the arithmetic is ``dlctl.log.quorum``'s).
- **In order.** An entry that reached quorum waits for every earlier one; the acknowledged
  prefix then moves the LAC (which every later entry carries), its records' futures get their
  DLSNs, and the writer hears how many records and bytes were acknowledged (``on_acknowledged``).
- **A failed member** is dropped from the write sets of this segment's later entries (no
  ensemble change: the writer rolls instead, asked through ``request_roll``, at once when an
  entry can no longer reach quorum). Entries are acknowledged by the remaining members while
  they make an ack quorum. What a dropped member holds at most is kept in ``short`` for the
  closed segment record. A member that does not answer the oldest unacknowledged entry, which
  others stored, within ``silent_after`` (or ``SILENT_FACTOR`` smoothed add latencies, if
  longer) is taken for failed (``check_silent``): a silent agent costs that, not a request
  timeout. A member outside the ack quorum that is merely slow holds nothing up and is left alone.
- **Fenced.** A fencing error means a newer writer took the segment over: the writer hears it
  (``on_fenced``) and stops.
- **Sealed.** Once sealed (completed, rolled away from, or the writer stopped — the writer seals
  its pipeline then), answers that arrive late count for nothing; the entries not acknowledged
  go back to the writer as batches, to be written into the next segment (their DLSNs are given
  there, so nothing acknowledged moves).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from ..meta.records import NO_ENTRY, NO_TXID, SegmentRecord, Versioned
from . import format as fmt
from .dlsn import DLSN
from .errors import AgentError, AgentUnavailableError, FencedError
from .quorum import can_still_ack, write_set_of
from .readpolicy import AdaptiveTimeout
from .records import encode_records
from .recovery import TOTALS_RECORD_SIZE, totals_record

log = logging.getLogger(__name__)

SILENT_FACTOR = 8.0  # a replica is silent after this many smoothed add latencies (at least silent_after)


class Batch:
    """Records cut (or being cut) into one entry; their futures resolve when it is acknowledged.
    One slot per record: None for a record submitted without a future of its own (all but the
    last of ``LogWriter.submit_encoded``'s)."""

    __slots__ = ("parts", "futures", "size", "first_txid", "last_txid", "control")

    def __init__(self, first_txid: int, control: bool = False) -> None:
        self.parts: list[bytes] = []
        self.futures: list[asyncio.Future[DLSN] | None] = []
        self.size = 0
        self.first_txid = first_txid
        self.last_txid = first_txid
        self.control = control


class PendingEntry:
    """An entry sent to its write set and not yet acknowledged, with its ack set: it counts the
    members that stored it, keeps those that have not answered (``waiting``), and knows when it
    reached ack quorum (``stored``) and whether it still can (``ackable``)."""

    __slots__ = ("batch", "entry_id", "encoded", "body_len", "ack_quorum", "acks", "acked", "sent_at", "waiting", "append_ms")

    def __init__(self, batch: Batch, entry_id: int, encoded: bytes, body_len: int, targets: Iterable[str], ack_quorum: int, sent_at: float, append_ms: int) -> None:
        self.batch = batch
        self.entry_id = entry_id
        self.encoded = encoded
        self.body_len = body_len  # its records' bytes, after the header (the totals record follows)
        self.ack_quorum = ack_quorum
        self.acks = 0
        self.acked = False
        self.sent_at = sent_at
        self.append_ms = append_ms
        self.waiting = set(targets)  # members that have not answered its add yet

    def stored(self, node: str) -> bool:
        """``node`` has the entry durably; True when that brought it to ack quorum. A member
        given up on (``failed``) that answers after all counts too: its copy is real."""
        self.waiting.discard(node)
        self.acks += 1
        if self.acks == self.ack_quorum:
            self.acked = True
            return True
        return False

    def failed(self, node: str) -> bool:
        """``node`` will not store the entry (its add failed, or it went silent); False when the
        entry was no longer waiting for it (it answered, or was given up on, already)."""
        if node not in self.waiting:
            return False
        self.waiting.discard(node)
        return True

    def ackable(self) -> bool:
        """Acknowledged, or enough members may still answer to acknowledge it."""
        return self.acked or can_still_ack(self.acks, len(self.waiting), self.ack_quorum)

    def overdue(self, now: float, silence: float) -> list[str]:
        """The members to give up on as silent at ``now``: those that have not answered an entry
        sent ``silence`` ago or longer, which still lacks its quorum and which another member
        stored (nobody answering is a stall of the writer's side or of every disk, not a silent
        member: giving up on every member would only stop the writer)."""
        if self.acked or not self.waiting or self.acks == 0 or now - self.sent_at < silence:
            return []
        return sorted(self.waiting)

    def records(self) -> bytes:
        """Its records as ``Batch.parts`` held them (for writing them again elsewhere)."""
        return self.encoded[fmt.HEADER_SIZE : fmt.HEADER_SIZE + self.body_len]


class Replica(Protocol):
    """What the pipeline needs of a member's connection (``dlctl.log.client.AgentClient``)."""

    def add_nowait(self, encoded: bytes, on_done: Callable[[BaseException | None], None], *, flush: bool = False) -> bool: ...

    async def add(self, encoded: bytes) -> Any: ...


class SegmentPipeline:
    """The in-progress segment being written: its ensemble, entries in flight, LAC and totals
    (see the module doc). ``on_acknowledged(pipeline, records, bytes, last_dlsn)`` after each
    advance of the LAC (records and bytes of data acknowledged by it; last_dlsn None when
    none); ``on_fenced(pipeline, node, error)``; ``request_roll(reason, failure=, urgent=)``."""

    def __init__(
        self,
        versioned: Versioned[SegmentRecord],
        clients: Mapping[str, Replica],
        failed: dict[str, str],
        *,
        log_name: str,
        log_id: int,
        add_latency: AdaptiveTimeout,
        on_acknowledged: Callable[[SegmentPipeline, int, int, DLSN | None], None],
        on_fenced: Callable[[SegmentPipeline, str, FencedError], None],
        request_roll: Callable[..., bool],
    ) -> None:
        rec = versioned.value
        self.versioned = versioned
        self.seq = rec.seq
        self.ensemble = rec.ensembles[-1].nodes
        self.w, self.a = rec.write_quorum, rec.ack_quorum
        self.log_name, self.log_id = log_name, log_id
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
        self.inflight: deque[PendingEntry] = deque()  # dispatched, not yet acknowledged, in entry order
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
        self.retry_at = 0.0  # degraded: when the writer looks for a fresh ensemble next (monotonic)
        self.closing = False  # no new entries: a roll or close is under way
        self.sealed = False  # done: late answers of its agents are ignored
        self.tasks: set[asyncio.Task] = set()
        self.waiter: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._add_latency = add_latency
        self._on_acknowledged = on_acknowledged
        self._on_fenced = on_fenced
        self._request_roll = request_roll

    # -- waiting for it ------------------------------------------------------------------------

    def notify(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def changed(self, timeout: float) -> None:
        """Until an entry is acknowledged or a member fails (or ``timeout``)."""
        self.waiter = self._loop.create_future()
        try:
            await asyncio.wait_for(self.waiter, timeout)
        except TimeoutError:
            pass
        finally:
            self.waiter = None

    def all_ackable(self) -> bool:
        return all(e.ackable() for e in self.inflight)

    async def drain(self, deadline: float) -> None:
        """Until no entry is in flight, one can no longer be acknowledged, it is sealed, or
        ``deadline`` (monotonic)."""
        while self.inflight and self.all_ackable() and time.monotonic() < deadline:
            await self.changed(deadline - time.monotonic())

    # -- sending ---------------------------------------------------------------------------------

    def dispatch(self, batch: Batch, append_ms: int) -> float:
        """Make ``batch`` the next entry, stamped ``append_ms``, and send it to its write set
        less the failed members; returns when it was sent (loop time)."""
        entry_id = self.next_entry_id
        self.next_entry_id += 1
        lac = self.published_lac = self.lac
        body = b"".join(batch.parts)
        count = len(batch.futures)
        self.sent_records += count
        self.sent_bytes += fmt.HEADER_SIZE + len(body) + TOTALS_RECORD_SIZE
        if count:
            self.sent_txid = batch.last_txid
        totals = encode_records([totals_record(self.sent_txid, self.sent_records, self.sent_bytes, append_ms)])
        encoded = fmt.encode(fmt.Entry(self.log_id, self.seq, entry_id, lac, body + totals, fmt.FLAG_CONTROL if batch.control else 0))
        batch.parts = []  # the entry's bytes hold them now
        targets = [n for n in write_set_of(self.ensemble, self.w, entry_id) if n not in self.failed]
        entry = PendingEntry(batch, entry_id, encoded, len(body), targets, self.a, self._loop.time(), append_ms)
        self.inflight.append(entry)
        # A lone entry (a synchronous writer) goes out now; entries dispatched together are
        # coalesced into one write per agent at the end of the loop turn.
        flush = len(self.inflight) == 1
        unanswered = self.unanswered
        for node in targets:
            if node in unanswered:
                unanswered[node].append(entry_id)
            else:
                unanswered[node] = deque((entry_id,))
            # The hot path has no task per replica: the reply is handled where it is parsed.
            if not self.clients[node].add_nowait(encoded, lambda exc, node=node: self.added(entry, node, exc), flush=flush):
                task = self._loop.create_task(self._send(entry, node))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        if not can_still_ack(0, len(targets), self.a):
            self._request_roll(f"entry {entry_id} of segment {self.seq} cannot reach ack quorum", failure=True, urgent=True)
        return entry.sent_at

    async def _send(self, entry: PendingEntry, node: str) -> None:
        """An add that must wait for its connection (being opened, or held by flow control)."""
        try:
            await self.clients[node].add(entry.encoded)
        except AgentError as exc:
            self.added(entry, node, exc)
            return
        self.added(entry, node, None)

    # -- answers ---------------------------------------------------------------------------------

    def added(self, entry: PendingEntry, node: str, exc: BaseException | None) -> None:
        """Member ``node`` answered the add of ``entry``: stored (``exc`` None) or not."""
        pending = self.unanswered.get(node)
        if pending:
            if pending[0] == entry.entry_id:
                pending.popleft()
            else:  # answers out of order (one connection keeps them in order; a reconnect may not)
                try:
                    pending.remove(entry.entry_id)
                except ValueError:
                    pass
        if exc is not None:
            if isinstance(exc, FencedError):
                if not self.sealed:
                    self._on_fenced(self, node, exc)
                return
            if not isinstance(exc, AgentError):  # not from the agent: the writer itself is broken
                raise exc
            self.replica_failed(entry, node, exc)
            return
        if self.sealed:
            return
        if node in entry.waiting:
            self._add_latency.observe(self._loop.time() - entry.sent_at)
        else:  # a replica given up on as silent answers after all: its ack is real, and it lives
            self.silent.discard(node)
        if entry.stored(node) and self.inflight and self.inflight[0] is entry:
            self._advance()

    def _advance(self) -> None:
        """Acknowledge the acked prefix of the entries in flight, in entry order."""
        q = self.inflight
        seq = self.seq
        records = freed = 0
        last: DLSN | None = None
        while q and q[0].acked:
            entry = q.popleft()
            self.lac = entry.entry_id
            self.bytes += fmt.HEADER_SIZE + entry.body_len + TOTALS_RECORD_SIZE
            batch = entry.batch
            futures = batch.futures
            if futures:  # the times of its first and last records
                if self.first_time is None:
                    self.first_time = entry.append_ms
                self.last_time = entry.append_ms
                eid = entry.entry_id
                for slot, fut in enumerate(futures):
                    if fut is not None and not fut.done():
                        fut.set_result(DLSN(seq, eid, slot))
                count = len(futures)
                self.records += count
                records += count
                self.last_txid = batch.last_txid
                self.last_data_entry = eid
                last = DLSN(seq, eid, count - 1)
                freed += batch.size
        self._on_acknowledged(self, records, freed, last)
        self.notify()

    def replica_failed(self, entry: PendingEntry, node: str, exc: AgentError) -> None:
        """``node`` will not store ``entry``: drop it from the segment's later write sets, and
        ask the writer to roll (at once when the entry can no longer reach quorum)."""
        if self.sealed or not entry.failed(node):
            return  # (no longer waited for: given up on as silent already, and counted then)
        self._mark_short(node, entry.entry_id - 1)
        new = node not in self.failed
        if new:
            self.failed[node] = str(exc)
            log.warning("log %r segment %d: agent %s failed (%s); continuing without it", self.log_name, self.seq, node, exc)
        if not entry.ackable():
            self._request_roll(f"entry {entry.entry_id} of segment {self.seq} cannot reach ack quorum", failure=True, urgent=True)
        elif new:
            self._request_roll(f"agent {node} failed", failure=True)
        self.notify()

    def check_silent(self, silent_after: float | None) -> None:
        """Give up on the members that have not answered the oldest unacknowledged entry for
        ``silent_after`` (at least; longer when adds are slow), as if their adds had failed
        (``PendingEntry.overdue``). None: never (wait for the request timeout)."""
        if silent_after is None or not self.inflight or self.sealed:
            return
        entry = self.inflight[0]
        now = self._loop.time()
        for node in entry.overdue(now, max(silent_after, SILENT_FACTOR * self._add_latency.current)):
            pending = self.unanswered.get(node)
            if pending:  # it may lack entries acknowledged without it, before this one
                self._mark_short(node, pending[0] - 1)
            self.silent.add(node)
            why = f"agent {node} has not answered the add of entry {entry.entry_id} for {now - entry.sent_at:.2f}s (silent)"
            self.replica_failed(entry, node, AgentUnavailableError(why))

    def _mark_short(self, node: str, holds_up_to: int) -> None:
        self.short[node] = min(self.short.get(node, holds_up_to), holds_up_to)

    # -- the end ---------------------------------------------------------------------------------

    def seal(self) -> list[Batch]:
        """Stop counting answers. Returns the batches of the entries not acknowledged, in entry
        order, each with its records back in ``parts`` (one part)."""
        self.sealed = True
        leftovers = list(self.inflight)
        self.inflight.clear()
        for entry in leftovers:
            entry.batch.parts = [entry.records()]
        return [e.batch for e in leftovers]

    def completed(self, when: float) -> SegmentRecord:
        """The segment's record, completed at its last acknowledged entry at ``when``."""
        # Members that failed before the segment was opened were never sent anything.
        short = {n: NO_ENTRY for n in self.failed} | self.short
        times = (self.first_time, self.last_time) if self.first_time is not None else None
        return self.versioned.value.completed_with(self.lac, self.last_txid, self.records, self.bytes, when, short=short, times=times)


__all__ = ["Batch", "PendingEntry", "Replica", "SegmentPipeline", "SILENT_FACTOR"]
