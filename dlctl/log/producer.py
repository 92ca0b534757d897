# Over ~600 lines (about 640): LogProducer's submit, its in-flight requests, their resends to the
# owner wherever it moves and the exactly-once sequencing are one protocol with one state.
"""Appending to a log through write proxies (DESIGN.md §5): many producers, one owner.

``LogProducer`` is the client library applications, the CLI and replication workers use. It
never owns the log itself: it sends records to the agent that does, which batches the records
of all its clients into entries (``dlagent.proxy``).

Routing. The first candidate for a log is its cached owner; without one, agents are ranked by
rendezvous (highest-random-weight) hashing of the log name — a consistent hash: when agents come
and go only the logs mapped to them move — agents of the producer's own region first. An agent
either owns the log, claims it (fence + recover, then accept), or answers NOT_OWNER with the
owner's address; every answer updates the shared ownership cache (``ProxyRouter``). When the
owner is unreachable the producer backs off and asks the next candidate, telling it for
``forward_seconds`` to forward the requests to the owner (APPEND with FORWARD, dlagent.forward)
rather than answer NOT_OWNER: an owner that is alive but out of this producer's reach (a gray
partition) still gets its records; one that is dead loses its ZooKeeper session and a
candidate claims the log. A producer cut off from ZooKeeper keeps routing with the agents it
knew (appends never go through ZooKeeper).

Order and delivery. Records are sent in requests (up to ``max_request_bytes``), several in
flight, all on one connection to one agent: the agent hands them to the writer in arrival order,
so they land in submission order. A request is acknowledged or lost as a whole (its records
share an entry). After any failure the producer waits until every request in flight has
settled, then resends the failed ones, oldest first, with RESET_ORDER — the agent refuses a
producer's later requests after a failed one until then (ORDER_BARRIER), so no record ever lands
before one submitted earlier.

Delivery is **exactly once** by default (``ProducerOptions.idempotent``, dlctl.log.idempotence):
the producer has a random 63-bit id and an epoch, numbers its requests from 1 and resends a
failed request as it was (same records, same number); the owner applies each number once and
answers a resend with the positions its records got the first time, even after a failover (the
numbers travel with the records, so a new owner reads them back from the log's tail). When the
owner cannot tell a resend from a new request (it no longer knows the producer: idle longer
than ``[proxy] producer_id_ttl``, or its requests are older than the tail a new owner read), the
records of a request that failed ambiguously fail with ``ProducerError`` saying they may or may
not be in the log — never silently duplicated — and the producer starts a new epoch for the
rest. A request from an older epoch of the same id is refused (``ProducerFencedError``): a
zombie incarnation can no longer append.

With ``idempotent=False`` (``dlctl log append --no-idempotence``) delivery is at least once for
records whose acknowledgement was lost: a request that failed ambiguously (connection lost or
timed out after it was sent, owner died after the quorum wrote it) is resent, and may then be
in the log twice. Either way acknowledged records are never resent, and no acknowledged record
is lost (same durability as the library writer). Records that carry a replication stream's
source position (``dl.src`` or their origin) are deduplicated by the owner in both modes.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import DlctlError, NotFoundError
from .dlsn import DLSN
from .errors import (
    AgentError,
    AgentUnavailableError,
    BadRequestError,
    DuplicateTooOldError,
    NoSuchLogError,
    NotOwnerError,
    OrderBarrierError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    ProxyDisabledError,
    ReadOnlyLogError,
    UnknownProducerError,
)
from .idempotence import MAX_EPOCH
from .client import AgentClient
from .pool import AgentPool
from .records import Record, encode_record

log = logging.getLogger(__name__)


class ProducerError(DlctlError):
    """Records could not be appended through any agent within the retry timeout."""


class ProducerClosedError(ProducerError):
    """The producer was closed; create a new one to append."""


@dataclass(frozen=True)
class ProducerOptions:
    max_request_bytes: int = 128 * 1024  # below the owner's entry size, so a request fits one entry
    max_request_records: int = 8192
    max_in_flight: int = 4  # requests sent and not yet answered, once the route is confirmed
    max_pending_bytes: int = 16 * 1024 * 1024  # submit() back-pressure: see wait_writable()
    retry_timeout: float = 60.0  # how long records may keep failing over before their futures fail
    backoff_initial: float = 0.02
    backoff_max: float = 0.25
    suspect_seconds: float = 1.0  # an unreachable agent is not asked again for this long
    idempotent: bool = True  # requests numbered and deduplicated by the owner (exactly once)
    forward_seconds: float = 10.0  # after the owner could not be reached: send through other agents (FORWARD) this long

    def __post_init__(self) -> None:
        if self.max_request_bytes < 1 or self.max_request_records < 1 or self.max_in_flight < 1:
            raise ValueError("max_request_bytes, max_request_records and max_in_flight must be >= 1")


REFRESH_TIMEOUT = 2.0  # seconds a read of the availability records may take before the last ones are used


def _rank(name: str, node_id: str) -> bytes:
    return hashlib.blake2b(f"{name}\0{node_id}".encode(), digest_size=8).digest()


class ProxyRouter:
    """Where a log's appends go: the owner when known, else agents by rendezvous hashing.

    One router may be shared by every producer of a process (they then share the ownership
    cache and, through the pool, one connection per agent)."""

    def __init__(self, pool: AgentPool, region: str | None = None, *, suspect_seconds: float = 1.0) -> None:
        self.pool = pool
        self.region = region
        self.suspect_seconds = suspect_seconds
        self.owners: dict[str, str] = {}  # log name -> node id of its owner (last known)
        self._suspects: dict[str, float] = {}
        self._refreshed = float("-inf")
        self._reading: asyncio.Future[Any] | None = None  # a read of the availability records under way

    async def refresh(self, *, force: bool = False) -> None:
        if force or time.monotonic() - self._refreshed > 1.0:
            try:
                # kazoo may hold a request while it reconnects: wait for it only so long, and
                # never start a second one meanwhile (each would hold a thread).
                if self._reading is None or self._reading.done():
                    self._reading = asyncio.ensure_future(self.pool.refresh())
                    self._reading.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: reported below or moot
                await asyncio.wait_for(asyncio.shield(self._reading), REFRESH_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - cut off from ZooKeeper: route with what is known
                # Appends go to the agents, not to ZooKeeper: a producer that cannot read the
                # availability records keeps using the last ones it read (the agents themselves
                # tell it about ownership), rather than failing its records.
                if not self.pool.nodes:
                    raise
                log.info("could not re-read the agents of cluster %r (%s: %s); routing with the last known ones", self.pool.meta.cluster, type(exc).__name__, exc)
            self._refreshed = time.monotonic()

    def candidates(self, name: str) -> list[str]:
        """Agents in the order to try for ``name``: own region first, each group by rendezvous rank."""
        nodes = self.pool.nodes
        local = sorted((n for n, info in nodes.items() if info.get("region") == self.region), key=lambda n: _rank(name, n), reverse=True)
        other = sorted((n for n, info in nodes.items() if info.get("region") != self.region), key=lambda n: _rank(name, n), reverse=True)
        return local + other

    def node_at(self, address: str) -> str | None:
        for node_id, info in self.pool.nodes.items():
            if info.get("address") == address:
                return node_id
        return None

    def suspect(self, node_id: str) -> None:
        self._suspects[node_id] = time.monotonic() + self.suspect_seconds
        for name, owner in list(self.owners.items()):
            if owner == node_id:
                del self.owners[name]

    def is_suspect(self, node_id: str) -> bool:
        until = self._suspects.get(node_id)
        return until is not None and until > time.monotonic()

    def choose(self, name: str, hint: str | None = None, *, avoid: Collection[str] = ()) -> str | None:
        """The agent to ask next: the hinted owner, the cached owner, else the best candidate;
        one in ``avoid`` (the caller could not reach it lately) only when every other agent is
        suspect or avoided too. A suspicion is short (``suspect_seconds``) while finding out
        that an agent is out of reach can take a connect timeout, and the next choice may wait
        for a read of the availability records: without ``avoid`` an unreachable first choice
        is no longer suspect by then, and is chosen again and again."""
        usable = [
            node_id for node_id in ([hint] if hint else []) + ([self.owners[name]] if name in self.owners else []) + self.candidates(name)
            if node_id in self.pool.nodes and not self.is_suspect(node_id)
        ]
        return next((node_id for node_id in usable if node_id not in avoid), usable[0] if usable else None)


class _Item:
    """One queued record. ``group``/``group_bytes``: on the first record of a group
    (``submit_group``) the number of records and bytes of the group, which ``_take_request``
    keeps in one request; 0 on its other records; 1/its size on a lone record."""

    __slots__ = ("encoded", "future", "group", "group_bytes")

    def __init__(self, encoded: bytes, future: asyncio.Future[DLSN], group: int = 1, group_bytes: int | None = None) -> None:
        self.encoded = encoded
        self.future = future
        self.group = group
        self.group_bytes = len(encoded) if group_bytes is None else group_bytes


# Refusals that say the owner wrote nothing of the request; any other failure after it was
# sent leaves it ambiguous (it may be in the log).
_DEFINITE = (
    NotOwnerError, OrderBarrierError, BadRequestError, ProducerFencedError, OutOfOrderSequenceError,
    UnknownProducerError, DuplicateTooOldError, NoSuchLogError, ReadOnlyLogError, ProxyDisabledError,
)


class _Request:
    __slots__ = ("seq", "items", "size", "error", "ambiguous", "body")

    def __init__(self, seq: int, items: list[_Item], size: int) -> None:
        self.seq = seq
        self.items = items
        self.size = size
        self.error: BaseException | None = None
        self.ambiguous = False  # an attempt failed in a way that may have written it
        self.body: bytes | None = None  # the records as sent (a resend sends the very same)


class LogProducer:
    """Append to log ``name`` through its owning agent (see the module docstring)."""

    def __init__(
        self,
        meta: Any,
        pool: AgentPool,
        name: str,
        *,
        options: ProducerOptions | None = None,
        region: str | None = None,
        router: ProxyRouter | None = None,
        producer_id: int | None = None,
        epoch: int = 0,
    ) -> None:
        """``producer_id``/``epoch``: an identity that outlives this object (a restarted
        process taking over a producer's role with a higher epoch fences the older one); by
        default a random id, epoch 0."""
        self.meta = meta
        self.pool = pool
        self.name = name
        self.options = options or ProducerOptions()
        self.router = router or ProxyRouter(pool, region, suspect_seconds=self.options.suspect_seconds)
        self.producer_id = random.getrandbits(63) if producer_id is None else producer_id
        self.epoch = epoch  # bumped when the owner has to be told to start counting again
        if not 0 <= self.producer_id < 2**63 or not 0 <= epoch <= MAX_EPOCH:
            raise ValueError(f"producer id {self.producer_id} / epoch {epoch} out of range (0..2^63-1 / 0..2^32-1)")
        self.node: str | None = None  # the agent appends go to now
        self._token: object | None = None  # its connection (appends never switch connections mid-flight)
        self._client: AgentClient | None = None  # the client of self.node that opened it
        self._confirmed = False  # that agent accepted an append since the last failure
        self._needs_reset = False
        self._pending: deque[_Item] = deque()
        self._inflight: dict[int, _Request] = {}
        self._failed: list[_Request] = []
        self._resend: deque[_Request] = deque()  # failed requests going out again, oldest first
        self._seq = 0
        self._unsettled_bytes = 0
        self._writable = asyncio.Event()
        self._writable.set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self._failure: BaseException | None = None  # what stopped the sender (a bug), if anything
        self._failing_since: float | None = None
        self._backoff = self.options.backoff_initial
        self._forward_until = float("-inf")  # until then, requests ask the agent to forward them to the owner
        self._left: set[str] = set()  # agents appends moved away from, or could not reach, since one last accepted an append
        self.stats = {"requests": 0, "records": 0, "failovers": 0, "unreachable": 0, "resent_requests": 0, "new_epochs": 0, "ambiguous_failed": 0}

    # -- public ----------------------------------------------------------------------------------

    def submit(self, payload: bytes | Record, *, key: bytes = b"", headers: Mapping[str, bytes] | None = None) -> asyncio.Future[DLSN]:
        """Queue one record (never blocks; see ``wait_writable``); the future gets its DLSN once
        the owner's ack quorum has it. A ``Record`` brings its key and headers; its txid is
        ignored (the owner assigns txids)."""
        if self._closing:
            raise self._closed_error()
        if isinstance(payload, Record):
            payload, key, headers = payload.payload, payload.key, payload.headers
        encoded = encode_record(bytes(payload), 0, key, headers)
        if len(encoded) > self.options.max_request_bytes:
            raise ValueError(f"record of {len(encoded)} bytes exceeds the {self.options.max_request_bytes}-byte request limit")
        return self._enqueue([encoded])[0]

    def submit_group(self, records: list[Record]) -> list[asyncio.Future[DLSN]]:
        """Queue ``records`` to go out in one request (other records may share it, a group is
        never cut): the owner writes a request in one entry, so the group is acknowledged or
        lost as a whole, never in part. Txids are ignored, as in ``submit``. Raises
        ``ValueError``, queueing none of them, when together they exceed ``max_request_bytes``
        or ``max_request_records``."""
        if self._closing:
            raise self._closed_error()
        encoded = [encode_record(bytes(r.payload), 0, r.key, r.headers) for r in records]
        size = sum(len(e) for e in encoded)
        if size > self.options.max_request_bytes or len(encoded) > self.options.max_request_records:
            raise ValueError(
                f"a group of {len(encoded)} records and {size} bytes exceeds the request limit "
                f"({self.options.max_request_records} records, {self.options.max_request_bytes} bytes)"
            )
        return self._enqueue(encoded)

    def _closed_error(self) -> ProducerClosedError:
        failed = f" (its sender failed: {type(self._failure).__name__}: {self._failure})" if self._failure is not None else ""
        return ProducerClosedError(f"producer of log {self.name!r} is closed{failed}", hint="create a new producer to append")

    def _enqueue(self, encoded: list[bytes]) -> list[asyncio.Future[DLSN]]:
        """Queue records as one group (``_take_request`` never cuts a request inside it)."""
        if not encoded:
            return []
        loop = asyncio.get_running_loop()
        size = sum(len(e) for e in encoded)
        items = [_Item(e, loop.create_future(), 0) for e in encoded]
        items[0].group, items[0].group_bytes = len(items), size
        self._pending.extend(items)
        self._unsettled_bytes += size
        if self._unsettled_bytes > self.options.max_pending_bytes:
            self._writable.clear()
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        self._wake.set()
        return [i.future for i in items]

    async def append(self, payload: bytes | Record, *, key: bytes = b"", headers: Mapping[str, bytes] | None = None) -> DLSN:
        await self.wait_writable()
        return await self.submit(payload, key=key, headers=headers)

    async def wait_writable(self) -> None:
        """Wait while more than ``max_pending_bytes`` are submitted and not yet settled."""
        await self._writable.wait()

    async def flush(self) -> DLSN | None:
        """Wait until every record submitted so far is settled; raise the first failure.
        Returns the DLSN of the last record submitted."""
        futures = [i.future for r in sorted([*self._failed, *self._resend], key=lambda r: r.seq) for i in r.items]
        futures += [i.future for r in sorted(self._inflight.values(), key=lambda r: r.seq) for i in r.items]
        futures += [i.future for i in self._pending]
        if not futures:
            return None
        await asyncio.wait(futures)
        for future in futures:
            if not future.cancelled() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
        last = next((f for f in reversed(futures) if not f.cancelled()), None)
        return None if last is None else last.result()

    async def close(self) -> None:
        """Flush, then stop. The log's ownership stays with its agent. Idempotent."""
        if self._closed:
            return
        self._closing = True
        try:
            await self.flush()
        finally:
            self._closed = True
            self._wake.set()
            if self._task is not None:
                await asyncio.wait([self._task], timeout=1.0)
                if not self._task.done():
                    self._task.cancel()

    async def __aenter__(self) -> LogProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def confirmed_owner(self) -> str | None:
        """The agent that accepted this producer's last appends (None until one has)."""
        return self.node if self._confirmed else None

    # -- the sender ----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while not (self._closed and not self._pending and not self._inflight and not self._failed and not self._resend):
                if self._failed and not self._inflight:
                    await self._recover()
                elif (self._resend or self._pending) and not self._failed and len(self._inflight) < self._window():
                    await self._send_next()
                else:
                    self._wake.clear()
                    await self._wake.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - a bug must not leave futures hanging
            log.exception("producer of log %r failed", self.name)
            # Nothing sends any more: later submits must fail at once, not queue for ever.
            self._closing = True
            self._failure = exc
            stuck = sorted([*self._failed, *self._inflight.values(), *self._resend], key=lambda r: r.seq)
            self._failed, self._inflight = [], {}
            self._resend.clear()
            self._fail_all(ProducerError(f"producer of log {self.name!r} failed: {exc}"), stuck)

    def _window(self) -> int:
        # Until an agent accepted an append on this connection, one request at a time: a refusal
        # then costs one resend, and order holds even if a refusal and a claim race.
        return self.options.max_in_flight if self._confirmed else 1

    async def _send_next(self) -> None:
        if self.node is None or self._token is None:
            if not await self._connect():
                return
        request = self._resend.popleft() if self._resend else self._take_request()
        if request is None:
            return
        # The client _connect opened, not the pool's again: between the two, a read of the
        # availability records may have dropped this node, and looking it up anew would then
        # wait on ZooKeeper (blocked for as long as it is out of reach) or fail outside any
        # handler and stop this sender for good (CI: two producers never resent in a partition).
        client = self._client
        assert client is not None
        if request.body is None:
            request.body = b"".join(i.encoded for i in request.items)
        idempotent = self.options.idempotent
        try:
            reply = client.append_on(
                self._token, self.name, self.producer_id, len(request.items), request.body,
                reset_order=self._needs_reset, epoch=self.epoch if idempotent else None, seq=request.seq if idempotent else None,
                retry=request.ambiguous, forward=time.monotonic() < self._forward_until,
            )
        except AgentError as exc:  # the connection went away: nothing was sent
            request.error = exc
            self._failed.append(request)
            return
        self._needs_reset = False
        self.stats["requests"] += 1
        self._inflight[request.seq] = request
        reply.add_done_callback(lambda fut, request=request: self._on_reply(request, fut))

    def _take_request(self) -> _Request | None:
        items: list[_Item] = []
        size = 0
        limit_bytes, limit_records = self.options.max_request_bytes, self.options.max_request_records
        pending = self._pending
        while pending:
            # Whole groups only (a lone record is a group of one): a group submitted together
            # is never cut across requests (``submit_group`` made sure it fits in one).
            count, group_bytes = max(1, pending[0].group), pending[0].group_bytes
            if items and (len(items) + count > limit_records or size + group_bytes > limit_bytes):
                break
            for _ in range(min(count, len(pending))):
                item = pending.popleft()
                if item.future.cancelled():
                    self._settle_bytes(len(item.encoded))
                    continue
                items.append(item)
                size += len(item.encoded)
        if not items:  # only cancelled ones were waiting
            return None
        self._seq += 1
        return _Request(self._seq, items, size)

    async def _connect(self) -> bool:
        """Pick the agent to send to and open its connection; False to come back later."""
        if self.node is None:
            await self.router.refresh()
            self.node = self.router.choose(self.name, avoid=self._left)
            if self.node is None:
                await self.router.refresh(force=True)
                self.node = self.router.choose(self.name, avoid=self._left)
            if self.node is None:
                self._fail_waiting(AgentUnavailableError(f"no agent of cluster {self.pool.meta.cluster!r} is available"))
                await self._sleep_backoff()
                return False
        try:
            client = await self.pool.client(self.node)
            await client.connect()
        except AgentError as exc:
            self.router.suspect(self.node)
            self._left.add(self.node)  # the next choice tries the other agents first
            self.stats["unreachable"] += 1
            self._forward_until = time.monotonic() + self.options.forward_seconds
            log.info("agent %s unreachable for log %r: %s", self.node, self.name, exc)
            self.node = None
            self._fail_waiting(exc)
            await self._sleep_backoff()
            return False
        token = client.connection
        if token is None:
            # Lost as soon as it was made. connect() may not have suspended at all (another
            # caller's attempt had finished): coming back at once could then never yield.
            await self._sleep_backoff()
            return False
        self._client, self._token = client, token
        self._needs_reset = True
        return True

    def _on_reply(self, request: _Request, reply: asyncio.Future[list[tuple[int, int, int]]]) -> None:
        self._inflight.pop(request.seq, None)
        self._wake.set()
        error = reply.exception() if not reply.cancelled() else AgentUnavailableError("append cancelled")
        if error is None:
            positions = reply.result()
            if len(positions) != len(request.items):
                error = AgentUnavailableError(f"agent {self.node} answered {len(positions)} positions for {len(request.items)} records")
        if error is not None:
            request.error = error
            request.ambiguous = request.ambiguous or not isinstance(error, _DEFINITE)
            self._failed.append(request)
            return
        for item, (seg, entry, slot) in zip(request.items, positions):
            if not item.future.done():
                item.future.set_result(DLSN(seg, entry, slot))
        self.stats["records"] += len(request.items)
        self._settle_bytes(request.size)
        self._confirmed = True
        self._failing_since = None
        self._backoff = self.options.backoff_initial
        self._left.clear()
        if self.node is not None:
            self.router.owners[self.name] = self.node

    # -- failures --------------------------------------------------------------------------------

    async def _recover(self) -> None:
        """Every request in flight has settled and some failed: decide where to go next and
        put the failed records back at the head of the queue, oldest first."""
        failed = sorted([*self._failed, *self._resend], key=lambda r: r.seq)
        self._failed = []
        self._resend.clear()
        root = failed[0].error  # later failures are its consequences (order barrier, same cause)
        if isinstance(root, (NoSuchLogError, NotFoundError)):
            self._fail_all(NotFoundError(f"log {self.name!r} does not exist: {root}"), failed)
            return
        if isinstance(root, (ReadOnlyLogError, ProducerFencedError)):  # a standby or frozen log, a zombie: retrying cannot help
            self._fail_all(root, failed)
            return
        renumber = False
        if isinstance(root, (BadRequestError, DuplicateTooOldError)):  # this request can never succeed; the others can
            self._fail_request(failed.pop(0), root)
            renumber = isinstance(root, BadRequestError)  # it was not applied: its number is free again
        elif isinstance(root, (UnknownProducerError, OutOfOrderSequenceError)):
            # The owner cannot tell a resend from a new request: a request that may be in the
            # log already is reported so, never sent again; the others start a new epoch.
            for request in [r for r in failed if r.ambiguous]:
                self.stats["ambiguous_failed"] += 1
                self._fail_request(request, ProducerError(
                    f"records for log {self.name!r} may or may not have been appended: {root}",
                    hint="read the log's tail to see whether they are there before appending them again",
                ))
            failed = [r for r in failed if not r.ambiguous]
            renumber = True
        if renumber and self.options.idempotent:
            self._new_epoch(failed)
        self._resend.extend(failed)
        self.stats["resent_requests"] += len(failed)
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since > self.options.retry_timeout:
            self._failing_since = None
            self._fail_all(ProducerError(
                f"records for log {self.name!r} could not be appended within {self.options.retry_timeout:g}s: {root}",
                hint="check `dlctl log show` for the owner and `dlctl cluster status` for the agents",
            ))
            return
        previous = self.node
        hint = await self._hint(root)
        if isinstance(root, (AgentUnavailableError, ProxyDisabledError)) and previous is not None:
            self.router.suspect(previous)
            if isinstance(root, AgentUnavailableError):
                # Cut off from that agent (the owner, or the one forwarding for it): the next
                # agents are asked to forward to the owner rather than answer NOT_OWNER, in
                # case the owner is alive and only out of this producer's reach.
                self._forward_until = now + self.options.forward_seconds
        elif not isinstance(root, NotOwnerError):
            self.router.owners.pop(self.name, None)  # fenced, deposed, stalled: ask again
        self.node = self.router.choose(self.name, hint)
        self._token = self._client = None
        self._confirmed = False
        self._needs_reset = True
        if previous is not None:
            self._left.add(previous)
        if self.node != previous:
            self.stats["failovers"] += 1
            log.info("log %r: appends move from %s to %s (%s)", self.name, previous, self.node, root)
        if self.node is None or self.node in self._left:
            # No new information (an agent left since the last accepted append again, e.g. one
            # that answers for a dead owner until its session expires, a stale ownership of its
            # own previous incarnation, or two agents that name each other as the owner): do
            # not hammer it. Moving on to agents not tried yet needs no pause: there are few.
            await self._sleep_backoff()

    def _new_epoch(self, unsent: list[_Request]) -> None:
        """Start counting again: the next epoch, ``unsent`` (none of them in the log) numbered
        from 1 in their order, later requests after them."""
        if self.epoch >= MAX_EPOCH:
            raise ProducerError(f"producer {self.producer_id:#x} of log {self.name!r} ran out of epochs", hint="create a new producer")
        self.epoch += 1
        self.stats["new_epochs"] += 1
        for seq, request in enumerate(unsent, start=1):
            request.seq = seq
        self._seq = len(unsent)  # requests not cut yet are numbered after them

    async def _hint(self, error: BaseException | None) -> str | None:
        """The node id of the owner a NOT_OWNER answer named, if it is a live agent."""
        if not isinstance(error, NotOwnerError) or not error.owner:
            return None
        node = self.router.node_at(error.owner)
        if node is None:
            await self.router.refresh(force=True)
            node = self.router.node_at(error.owner)
        if node is not None and not self.router.is_suspect(node):
            self.router.owners[self.name] = node
            return node
        return None

    async def _sleep_backoff(self) -> None:
        await asyncio.sleep(self._backoff * random.uniform(0.5, 1.0))
        self._backoff = min(self._backoff * 2, self.options.backoff_max)
        await self.router.refresh()

    def _fail_waiting(self, error: BaseException) -> None:
        """Fail pending records only once the retry timeout has passed since failures began."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since > self.options.retry_timeout:
            self._failing_since = None
            self._fail_all(ProducerError(f"records for log {self.name!r} could not be appended within {self.options.retry_timeout:g}s: {error}"))

    def _fail_request(self, request: _Request, error: BaseException) -> None:
        for item in request.items:
            if not item.future.done():
                item.future.set_exception(error)
                item.future.exception()  # retrieved: a caller that dropped it gets no warning
        self._settle_bytes(request.size)

    def _fail_all(self, error: BaseException, failed: list[_Request] | None = None) -> None:
        for request in failed or []:
            self._fail_request(request, error)
        items = list(self._pending)
        self._pending.clear()
        self._fail_request(_Request(0, items, sum(len(i.encoded) for i in items)), error)

    def _settle_bytes(self, size: int) -> None:
        self._unsettled_bytes -= size
        if self._unsettled_bytes <= self.options.max_pending_bytes:
            self._writable.set()
