"""The write proxy (DESIGN.md §5): the agent that owns a log writes it for any number of clients.

A client sends APPEND (a group of records) for a log to any agent. This agent either owns the
log (a ``LogWriter`` it opened with ownership published as its address), claims it — opening a
writer fences and recovers what the previous owner left in progress before anything is
accepted — or answers NOT_OWNER with the current owner's address. Records of every client go
into the same writer and so share entries (batching across clients); each request's records
land in one entry whenever they fit, so a request is acknowledged or lost as a whole, and the
client gets one DLSN per record once the ack quorum has the entry: the same durability as the
library writer, region invariant included (the writer places its ensembles).

Order. Requests of one connection are handed to the writer in arrival order (requests waiting
for a claim or for room queue in a per-log FIFO). Once a request of a producer fails for a log,
later requests of that producer on that connection for that log fail with ORDER_BARRIER until
the producer resends with RESET_ORDER (producers sharing a connection do not disturb each other); requests handed to the writer before the failure fail with it (a writer
acknowledges in order and fails everything pending when it stops). So a client that resends its
failed requests in order can never see a later record land before an earlier one.

Replication streams. A worker's records carry their origin and vector time; per origin location
its events are numbered (its own component) and reach every log in order. The owner remembers
the highest number held per origin (on claiming: from every stream's checkpoint plus the log's
last entries) and answers a record at or below it — a worker's resend, or the same event brought
by a second stream in a mesh of locations — with the DLSN of the copy already in the log instead
of writing it again. So streams appending through proxies apply each event exactly once (what
the log holds already, and how it is read back on claiming: dedup.py).

Memory. Per log, unacknowledged plus queued bytes are bounded by ``max_log_bytes``: past it,
the connections that keep sending are held (the server stops reading them: TCP pushes back)
until the writer drains below half of it. Per connection the server bounds in-flight requests.

Failure. When the writer stops (fenced by a newer owner, ZooKeeper session lost, too few
agents) every pending request fails with the writer's error — a fencing error for a deposed
owner, whose records never become visible — and the log is forgotten; the next request claims
it afresh or is told who owns it now.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from dlctl.errors import NotFoundError
from dlctl.log.dlsn import DLSN
from dlctl.log.errors import (
    AgentError,
    BadRequestError,
    DuplicateTooOldError,
    FencedError,
    NoSuchLogError,
    NotOwnerError,
    OrderBarrierError,
    ReadOnlyLogError,
)
from dlctl.log.idempotence import ProducerTable
from dlctl.log.ownership import OwnershipError, owner_info
from dlctl.log.records import CorruptRecords, Record, decode_records
from dlctl.log.writer import LogWriter, WriterDeposedError, WriterError, WriterOptions
from dlctl.meta.access import AccessStore, LogReadOnlyError
from dlctl.meta.store import MetaStore
from dlctl.names import validate_name

from .dedup import Applied, needs_tail, read_back, replicated, submit_once
from .forward import Forwarder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProxyOptions:
    max_log_bytes: int = 32 * 1024 * 1024
    batch_delay: float = 0.002
    claim_timeout: float = 30.0  # bound on fencing + recovering the previous owner's segment
    close_timeout: float = 10.0  # per log, when the agent shuts down or an operator releases it
    idle_release: float = 600.0  # release a log nobody appended to for this long (0: never)
    tail_scan_entries: int = 1024  # after taking over from a dead owner: entries read back for stream positions and producers
    handoff_scan_entries: int = 256  # after a graceful handoff: what the previous owner flushed (max_log_bytes) and then some
    producer_id_ttl: float = 3600.0  # an idempotent producer idle this long is forgotten (its next request: UNKNOWN_PRODUCER)
    max_producers_per_log: int = 10_000  # past this, the least recently seen producer is forgotten


class Hold:
    """A connection's handle for back-pressure: the proxy holds it while a log it writes to is full."""

    __slots__ = ("count", "resume")

    def __init__(self, resume: Callable[[], None]) -> None:
        self.count = 0
        self.resume = resume


class Barrier:
    """A connection's failed (producer, log) pairs: their later appends are refused until reset."""

    __slots__ = ("failed", "closed")

    def __init__(self) -> None:
        self.failed: set[tuple[int, str]] = set()
        self.closed = False  # the connection is gone: its queued requests are dropped, not written


class _Request:
    __slots__ = ("records", "size", "barrier", "key", "hold", "result", "mark", "retry", "wire")

    def __init__(
        self, records: list[Record], size: int, barrier: Barrier, key: tuple[int, str], hold: Hold, result: asyncio.Future[list[DLSN]], mark: tuple[int, int, int] | None = None
    ) -> None:
        self.mark = mark  # (producer id, epoch, sequence) of an idempotent request
        self.retry = False  # an earlier attempt of it may have been written
        self.wire: tuple[bytes, int, bool] | None = None  # (records, count, reset order) of a request to forward
        self.records = records
        self.size = size
        self.barrier = barrier
        self.key = key  # (producer id, log name)
        self.hold = hold
        self.result = result

    def fail(self, error: AgentError) -> None:
        self.barrier.failed.add(self.key)
        if not self.result.done():
            self.result.set_exception(error)


class _OwnedLog:
    """A log this agent owns (or is claiming): its writer and the FIFO of waiting requests."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.writer: LogWriter | None = None
        self.queue: deque[_Request] = deque()
        self.queued_bytes = 0
        self.held: list[Hold] = []
        self.waiting = False  # a task waits for the writer to become writable
        self.peak_bytes = 0  # high-water mark of queued + unacknowledged bytes (for operators and tests)
        self.last_append = time.monotonic()
        self.applied: Applied = {}  # origin locations' highest events held here (dedup.py)
        self.task: asyncio.Task[None] | None = None  # the claim
        self.failed = False
        self.producers: ProducerTable | None = None  # idempotent producers' requests (set once claimed)


def _error_for(exc: BaseException, name: str) -> AgentError:
    """The typed wire error a client acts on."""
    if isinstance(exc, AgentError):
        return exc
    if isinstance(exc, LogReadOnlyError):  # a standby or frozen log: no agent will take it
        return ReadOnlyLogError(str(exc), hint=exc.hint)
    if isinstance(exc, WriterDeposedError):
        return FencedError(f"log {name!r}: {exc}", hint="another writer owns the log now: retry through the new owner")
    if isinstance(exc, OwnershipError):
        return NotOwnerError(f"log {name!r} is owned by {exc.owner}", owner=exc.address)
    if isinstance(exc, NotFoundError):
        return NoSuchLogError(str(exc))
    if isinstance(exc, (ValueError, CorruptRecords)):
        return BadRequestError(f"APPEND to {name!r}: {exc}")
    if isinstance(exc, WriterError):
        return AgentError(f"log {name!r}: {exc}")
    return AgentError(f"log {name!r}: {type(exc).__name__}: {exc}")


class WriteProxy:
    def __init__(self, meta: MetaStore, pool: Any, node_id: str, address: str, options: ProxyOptions = ProxyOptions()) -> None:
        self.meta = meta
        self.pool = pool
        self.node_id = node_id
        self.address = address
        self.options = options
        self.owner_id = f"{node_id}/{uuid.uuid4().hex[:8]}"  # this incarnation of the agent
        self._logs: dict[str, _OwnedLog] = {}
        self._forwards: dict[str, Forwarder] = {}  # logs another agent owns, for clients that cannot reach it
        self._closing = False
        self._reaper: asyncio.Task[None] | None = None
        # Tasks nothing else holds: the event loop keeps only a weak reference to a task, so one
        # started and forgotten may be collected mid-flight (a log left waiting for ever).
        self._background: set[asyncio.Task[None]] = set()
        self.counters = {
            "appends": 0, "records": 0, "claims": 0, "not_owner": 0, "failed": 0, "idle_releases": 0, "duplicates_dropped": 0,
            "duplicate_requests": 0,  # idempotent resends answered with their first positions
            "producers_restored": 0,  # producers' last requests found in the log tail when claiming
            "forwarded": 0,  # requests sent on to the owner for clients that could not reach it
        }

    # -- entry points (called by the protocol server, on the event loop) -------------------------

    def append(
        self, name: str, producer: int, count: int, body: memoryview, *, barrier: Barrier, hold: Hold, reset: bool,
        epoch: int | None = None, seq: int | None = None, retry: bool = False, forward: bool = False,
    ) -> asyncio.Future[list[DLSN]]:
        """Hand a request to the log's writer now (or queue it in order); the future gets the
        records' DLSNs once acknowledged, or the typed error to send back. With ``epoch`` and
        ``seq`` the request is idempotent (dlctl.log.idempotence). ``forward``: the client
        cannot reach the owner; unless this agent owns or is claiming the log, the request goes
        to the owner through this agent (dlagent.forward)."""
        loop = asyncio.get_running_loop()
        mark = (producer, epoch, seq) if seq is not None and epoch is not None else None
        request = _Request([], len(body), barrier, (producer, name), hold, loop.create_future(), mark)
        request.retry = retry
        self.counters["appends"] += 1
        try:
            validate_name("log", name)
            records = list(decode_records(body))
            if len(records) != count:
                raise ValueError(f"the request says {count} record(s) but carries {len(records)}")
            if self._closing:
                raise NotOwnerError(f"agent {self.node_id} is shutting down", owner=None)
        except (ValueError, AgentError) as exc:
            self._fail(request, _error_for(exc, name))
            return request.result
        request.records = records
        if reset:
            barrier.failed.discard(request.key)
        elif request.key in barrier.failed:
            self._fail(request, self._barrier_error(name))
            return request.result
        if forward and name not in self._logs:
            request.wire = (bytes(body), count, reset)
            forwarder = self._forwards.get(name)
            if forwarder is None:
                forwarder = self._forwards[name] = Forwarder(self, name)
            forwarder.put(request)
            return request.result
        self.enqueue(name, request)
        return request.result

    def enqueue(self, name: str, request: _Request) -> None:
        """Queue a decoded request for the log's writer here, claiming the log if need be."""
        owned = self._logs.get(name)
        hold = request.hold
        if owned is None:
            owned = self._logs[name] = _OwnedLog(name)
            owned.task = asyncio.ensure_future(self._claim(owned))
        owned.queue.append(request)
        owned.queued_bytes += request.size
        owned.last_append = time.monotonic()
        self._pump(owned)
        held = owned.queued_bytes + self._pending(owned)
        owned.peak_bytes = max(owned.peak_bytes, held)
        if held > self.options.max_log_bytes and self._logs.get(name) is owned:
            hold.count += 1
            owned.held.append(hold)

    async def release(self, name: str) -> bool:
        """Give log ``name`` up gracefully (flush, complete the segment, drop ownership)."""
        owned = self._logs.get(name)
        if owned is None:
            return False
        if owned.task is not None and not owned.task.done():
            await asyncio.wait([owned.task], timeout=self.options.claim_timeout)
        self._forget(owned)
        writer = owned.writer
        if writer is None:
            return False
        await self._close_writer(writer)
        log.info("released log %r on request", name)
        return True

    def start(self) -> WriteProxy:
        """Begin releasing idle logs (a writer per log costs a timer and a segment in progress)."""
        if self.options.idle_release > 0:
            self._reaper = asyncio.ensure_future(self._release_idle())
        return self

    async def _release_idle(self) -> None:
        period = min(5.0, self.options.idle_release / 2)
        while True:
            await asyncio.sleep(period)
            cutoff = time.monotonic() - self.options.idle_release
            for name, owned in list(self._logs.items()):
                writer = owned.writer
                if writer is not None and owned.last_append < cutoff and not owned.queue and not writer.pending_bytes:
                    self.counters["idle_releases"] += 1
                    log.info("releasing log %r: no append for %.0fs", name, self.options.idle_release)
                    await self.release(name)

    async def close(self) -> None:
        """Shutting down: stop taking appends and release every log so clients move at once."""
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
        for forwarder in list(self._forwards.values()):
            forwarder.close()
        await asyncio.gather(*(self.release(name) for name in list(self._logs)), return_exceptions=True)

    def stat(self) -> dict[str, Any]:
        return {
            **self.counters,
            "max_log_bytes": self.options.max_log_bytes,
            "owned": sorted(n for n, o in self._logs.items() if o.writer is not None),
            "claiming": sorted(n for n, o in self._logs.items() if o.writer is None),
            "logs": {
                n: {
                    "queued_bytes": o.queued_bytes, "pending_bytes": self._pending(o), "peak_bytes": o.peak_bytes, "held_connections": len(o.held),
                    "producers": len(o.producers) if o.producers is not None else 0,  # idempotent producers remembered
                }
                for n, o in self._logs.items()
            },
        }

    def owns(self, name: str) -> bool:
        owned = self._logs.get(name)
        return owned is not None and owned.writer is not None and owned.writer.error is None

    # -- claiming ---------------------------------------------------------------------------------

    async def _claim(self, owned: _OwnedLog) -> None:
        name = owned.name
        try:
            loop = asyncio.get_running_loop()
            current = await loop.run_in_executor(None, self.meta.owner_of, name)
            if current is not None:
                # A standby's log is owned by its stream's worker, which takes no application
                # appends: refuse them now (READ_ONLY), rather than send clients after it until
                # their retry timeout.
                await loop.run_in_executor(None, AccessStore(self.meta).check, name, "application")
                info = owner_info(current[0])
                raise NotOwnerError(f"log {name!r} is owned by {info['owner']}", owner=info.get("address"))
            self.counters["claims"] += 1
            writer = await LogWriter.open(
                self.meta,
                self.pool,
                name,
                owner_id=self.owner_id,
                owner_info={"address": self.address, "node": self.node_id},
                options=WriterOptions(
                    batch_delay=self.options.batch_delay,
                    max_pending_bytes=self.options.max_log_bytes,
                    recovery_timeout=self.options.claim_timeout,
                ),
            )
        except BaseException as exc:  # noqa: BLE001 - every failure is answered to the waiting requests
            error = _error_for(exc, name)
            if isinstance(error, NotOwnerError):
                self.counters["not_owner"] += 1
            else:
                log.warning("could not claim log %r: %s", name, error.message)
            self._abandon(owned, error)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if self._logs.get(name) is not owned or self._closing:
            await self._close_writer(writer)  # released or shutting down meanwhile
            return
        # Requests that need no memory of the log's tail go at once, while the previous owner's
        # segment may still be in recovery (a fast takeover); the others wait in order until
        # the tail is read back (_pump holds them while owned.producers is None).
        owned.writer = writer
        self._pump(owned)
        try:
            recovered = await writer.recovery_done()
            owned.applied, owned.producers, restored = await read_back(
                self.meta, self.pool, name, self.options, recovered=bool(recovered), through=writer.taken_over_seq
            )
            self.counters["producers_restored"] += restored
        except WriterError as exc:
            self._abandon(owned, _error_for(exc, name))
            return
        except Exception as exc:  # noqa: BLE001 - without it a resend could be applied twice: give the log up
            log.warning("could not read the tail of log %r after claiming it: %s", name, exc)
            self._abandon(owned, AgentError(f"log {name!r}: reading its tail after the claim failed: {exc}"))
            return
        log.info("claimed log %r%s", name, f" (recovered {[r.to_dict() for r in recovered]})" if recovered else "")
        self._pump(owned)

    # -- moving requests into the writer -----------------------------------------------------------

    def _pump(self, owned: _OwnedLog) -> None:
        writer = owned.writer
        if writer is None or owned.failed:
            return
        while owned.queue:
            if writer.error is not None:
                self._abandon(owned, _error_for(writer.error, owned.name))
                return
            if owned.producers is None and needs_tail(owned.queue[0].records, owned.queue[0].mark):
                break  # until the tail is read back (_claim pumps again)
            if writer.pending_bytes > self.options.max_log_bytes:
                if not owned.waiting:
                    owned.waiting = True
                    self._in_background(self._wait_writable(owned, writer))
                break
            request = owned.queue.popleft()
            owned.queued_bytes -= request.size
            if self.held_back(request, owned.name):
                continue
            if request.mark is not None:
                try:
                    duplicate = self._check_producer(owned, request)
                except AgentError as exc:
                    self._fail(request, exc)
                    continue
                if duplicate is not None:
                    self.counters["duplicate_requests"] += 1
                    self._chain(owned, writer, request, duplicate)
                    continue
            try:
                futures = self._submit_once(owned, writer, request.records, request.mark)
            except (ValueError, WriterError) as exc:
                self._fail(request, _error_for(exc, owned.name))
                if isinstance(exc, WriterError):
                    self._abandon(owned, _error_for(exc, owned.name))
                    return
                continue
            if request.mark is not None:
                owned.producers.applied(*request.mark, futures, time.monotonic())  # type: ignore[union-attr]
            self.counters["records"] += len(futures)
            self._chain(owned, writer, request, futures)
        self._release_holds(owned)

    async def _wait_writable(self, owned: _OwnedLog, writer: LogWriter) -> None:
        try:
            await writer.wait_writable()
        except WriterError:
            pass  # _pump sees the error
        finally:
            owned.waiting = False
        self._pump(owned)

    def _chain(self, owned: _OwnedLog, writer: LogWriter, request: _Request, results: list[asyncio.Future[DLSN]]) -> None:
        """Answer ``request`` once every record's future is done (a duplicate's future is the
        earlier copy's, already done or acknowledged before the new ones: the writer acks in order)."""
        waiting = {f for f in results if not f.done()}

        def finish() -> None:
            if request.result.done():
                return
            failed = next((f for f in results if f.cancelled() or f.exception() is not None), None)
            if failed is not None:
                exc = failed.exception() if not failed.cancelled() else WriterError("cancelled")
                self._fail(request, _error_for(exc, owned.name))
                if writer.error is not None:
                    self._abandon(owned, _error_for(writer.error, owned.name))
                return
            request.result.set_result([f.result() for f in results])
            if owned.held:
                self._release_holds(owned)

        def done(fut: asyncio.Future[DLSN]) -> None:
            waiting.discard(fut)
            if not waiting:
                finish()

        if not waiting:
            finish()
        for fut in list(waiting):
            fut.add_done_callback(done)

    def _check_producer(self, owned: _OwnedLog, request: _Request) -> list[asyncio.Future[DLSN]] | None:
        """None: a new request of its producer; else the positions of its first copy (a resend).
        Raises the refusal of a request that must not be written (dlctl.log.idempotence)."""
        assert owned.producers is not None and request.mark is not None
        duplicate = owned.producers.check(*request.mark, time.monotonic(), retry=request.retry)
        if duplicate is None:
            return None
        first = duplicate.results
        if len(first) == len(request.records):
            return first
        # Found in the log tail after a replicated record of it had been dropped as already
        # held (the mark counts the records written): if every record is replicated, origin
        # deduplication answers each of them; otherwise the positions are not known.
        if all(replicated(r) for r in request.records):
            return self._submit_once(owned, owned.writer, request.records, None)  # type: ignore[arg-type]
        raise DuplicateTooOldError(
            f"log {owned.name!r}: request {request.mark[2]} of producer {request.mark[0]:#x} was applied with "
            f"{len(first)} of its {len(request.records)} records written; their positions are not known; nothing written"
        )

    def _submit_once(self, owned: _OwnedLog, writer: LogWriter, records: list[Record], mark: tuple[int, int, int] | None = None) -> list[asyncio.Future[DLSN]]:
        """``records`` to the writer but for the replicated ones the log holds already (dedup.py)."""
        results, dropped = submit_once(owned.applied, writer, records, mark)
        self.counters["duplicates_dropped"] += dropped
        return results

    def _pending(self, owned: _OwnedLog) -> int:
        return owned.writer.pending_bytes if owned.writer is not None else 0

    def _release_holds(self, owned: _OwnedLog) -> None:
        if not owned.held or owned.queued_bytes + self._pending(owned) > self.options.max_log_bytes // 2:
            return
        held, owned.held = owned.held, []
        for hold in held:
            hold.count -= 1
            if hold.count == 0:
                hold.resume()

    # -- failure -----------------------------------------------------------------------------------

    def held_back(self, request: _Request, name: str) -> bool:
        """Fail ``request`` if it must not go on now: its client has given up on it (and may
        resend elsewhere: writing it now could only duplicate it, late), or an earlier request
        of its producer failed (order barrier). True when it was failed."""
        if request.barrier.closed:
            self._fail(request, OrderBarrierError(f"the connection that sent this append to {name!r} is closed"))
            return True
        if request.key in request.barrier.failed:
            self._fail(request, self._barrier_error(name))
            return True
        return False

    @staticmethod
    def _barrier_error(name: str) -> OrderBarrierError:
        return OrderBarrierError(f"an earlier append of this producer to {name!r} failed; resend from it with RESET_ORDER")

    def _fail(self, request: _Request, error: AgentError) -> None:
        self.counters["failed"] += 1
        request.fail(error)

    def _abandon(self, owned: _OwnedLog, error: AgentError) -> None:
        """The log is lost to this agent (claim refused or writer stopped): fail what waits, forget it."""
        owned.failed = True
        while owned.queue:
            self._fail(owned.queue.popleft(), error)
        owned.queued_bytes = 0
        self._forget(owned)
        held, owned.held = owned.held, []
        for hold in held:
            hold.count -= 1
            if hold.count == 0:
                hold.resume()
        writer, owned.writer = owned.writer, None
        if writer is not None:
            self._in_background(self._close_writer(writer))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _forget(self, owned: _OwnedLog) -> None:
        if self._logs.get(owned.name) is owned:
            del self._logs[owned.name]

    async def _close_writer(self, writer: LogWriter) -> None:
        try:
            await asyncio.wait_for(writer.close(), self.options.close_timeout)
        except Exception as exc:  # noqa: BLE001 - a failed writer closes quietly; anything else is logged
            log.warning("closing the writer of log %r: %s", writer.name, exc)
