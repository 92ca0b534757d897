"""Client of one agent: an authenticated, pipelined connection with per-request timeouts.

Any number of coroutines may issue requests concurrently on one ``AgentClient``; they share one
connection, their frames are coalesced into few writes, and a reader (the protocol callback)
hands each response to its request by id. When the connection drops, every request in flight
fails with ``AgentUnavailableError`` and the next call reconnects. Entries read back are
verified with their writer's CRC-32C and checked to be the entry asked for (end to end).

Here are the requests (what each means, how its answer is checked) and the connecting and
handshake; the connection itself (frames, dispatch by id, deadlines) is
``dlctl.log.connection``. ``SyncAgentClient`` is the same requests, blocking.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import ssl
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..errors import ConfigError
from . import protocol as p
from .auth import DEFAULT_CONTEXT, ClientHandshake
from .compression import CorruptCompressed, Decompressor, WireStats
from .connection import Callback, Connection, RequestTimeout
from .errors import AgentError, AgentIOError, AgentUnavailableError, BadRequestError
from .format import HEADER_SIZE, CorruptEntry, Entry, crc32c, decode, decode_header
from .tls import TlsFiles, bound_context, peer_cert_der


T = TypeVar("T")
log = logging.getLogger(__name__)


class AgentClient:
    """An asyncio client of one agent (see the module docstring).

    ``secret`` is the cluster secret (bytes); ``tls`` (the cluster's ``TlsFiles``) enables mutual
    TLS, with the agent's certificate checked against ``server_hostname`` (default ``host``) and
    the HMAC handshake bound to the session (``dlctl.log.tls``). ``request_timeout`` bounds
    every request except long polls, which get their own timeout plus ``request_timeout``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        *,
        tls: TlsFiles | None = None,
        server_hostname: str | None = None,
        connect_timeout: float = 5.0,
        request_timeout: float = 30.0,
        auth_context: bytes = DEFAULT_CONTEXT,
        name: str | None = None,
    ) -> None:
        ClientHandshake(secret, auth_context)  # fail early on an unusable secret
        self.host = host
        self.port = port
        self.name = name or f"{host}:{port}"  # the agent as WireStats names it (a pool's: its node id)
        self._secret = secret
        self._tls = tls
        self._server_hostname = server_hostname
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._auth_context = auth_context
        self._conn: Connection | None = None
        self._connecting: asyncio.Future[Connection] | None = None
        self._ids = itertools.count(1)
        self._closed = False
        self._plain_reads = False  # the agent predates FLAG_SKIP_SEEN / FLAG_SUMMARY: whole entries
        # The connection on which the agent refused FLAG_COMPRESS: plain reads on it; a new
        # connection asks again (the agent may have been upgraded, or its switch turned on).
        self._plain_conn: Connection | None = None
        self._inflater: Decompressor | None = None  # made on the first compressed answer

    def __repr__(self) -> str:  # the secret stays out of reprs and logs
        return f"AgentClient({self.host}:{self.port}, connected={self.connected})"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.ready

    async def __aenter__(self) -> AgentClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # Connection ---------------------------------------------------------------------------------
    async def connect(self) -> None:
        """Connect and authenticate now (otherwise the first request does it)."""
        await self._connection()

    async def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and conn.ready:
            return conn
        if self._closed:
            raise AgentUnavailableError(f"client of agent {self.address} is closed")
        # Concurrent callers share one attempt instead of racing to open several connections.
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
            self._connecting.add_done_callback(self._connect_done)
        conn = await asyncio.shield(self._connecting)
        if not self._closed and self._conn is not conn:
            # An attempt that had finished already returns without suspending, before its
            # callback installed it: ``connection`` must show it now, not a loop turn later.
            self._conn = conn
        return conn

    def _connect_done(self, fut: asyncio.Future[Connection]) -> None:
        self._connecting = None
        if not fut.cancelled() and fut.exception() is None:
            conn = fut.result()
            if self._closed:  # close() ran while the handshake was under way
                conn.abort(f"client of agent {self.address} closed")
            else:
                self._conn = conn

    async def _open(self) -> Connection:
        loop = asyncio.get_running_loop()
        where = self.address
        conn: Connection | None = None
        try:
            async with asyncio.timeout(self.connect_timeout):
                try:
                    context = self._tls.client() if self._tls is not None else None
                except ConfigError as exc:  # unreadable TLS files: this agent cannot be reached now
                    raise AgentUnavailableError(f"cannot connect to agent {where}: {exc.message}") from None
                transport, conn = await loop.create_connection(
                    lambda: Connection(loop, where),
                    self.host,
                    self.port,
                    ssl=context,
                    server_hostname=(self._server_hostname or self.host) if context else None,
                )
                hello = await conn.hello
                if hello.opcode != p.Op.HELLO | p.RESPONSE:
                    raise p.ProtocolError(f"the first frame has opcode {hello.opcode}, not HELLO")
                server_nonce = p.decode_response(hello)
                handshake = ClientHandshake(self._secret, bound_context(self._auth_context, peer_cert_der(transport)))
                nonce, proof = handshake.respond(server_nonce)
                rid = next(self._ids)
                fut: asyncio.Future[p.Frame] = loop.create_future()
                conn.pending[rid] = fut
                conn.send(p.auth_request(rid, nonce, proof))
                reply = await fut
                handshake.verify_server(p.decode_response(reply))
        except TimeoutError:
            if conn is not None:
                conn.abort("handshake timed out")
            raise AgentUnavailableError(f"connecting to agent {where} timed out after {self.connect_timeout:g}s") from None
        except OSError as exc:
            if conn is not None:
                conn.abort(f"connection failed: {exc}")
            why = exc.strerror or str(exc) or type(exc).__name__
            if isinstance(exc, ssl.SSLError) or (self._tls is not None and conn is not None):
                why += " (TLS: does the agent trust this client's certificate, and this client the agent's CA?)"
            raise AgentUnavailableError(f"cannot connect to agent {where}: {why}") from None
        except BaseException as exc:
            if conn is not None:
                conn.abort(f"handshake failed: {exc}")
            if isinstance(exc, p.ProtocolError):
                raise AgentUnavailableError(f"agent {where} answered the handshake with an invalid frame: {exc}") from None
            if isinstance(exc, AgentError) and not isinstance(exc, AgentUnavailableError):
                exc.message = f"agent {where}: {exc.message}"
                exc.args = (exc.message,)
            raise
        conn.ready = not conn.lost
        if not conn.ready:
            raise AgentUnavailableError(f"connection to agent {where} lost during the handshake")
        return conn

    async def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.fail_all(f"client of agent {self.address} closed")
            conn.transport.close()

    # Requests -----------------------------------------------------------------------------------
    async def _call(
        self, op: int, build: Any, *args: Any, timeout: float | None = None, whole: bool = False, in_place: bool = False, into: bytearray | None = None,
        wire: WireStats | None = None,
    ) -> bytes:
        conn = self._conn
        if conn is None or not conn.ready:
            conn = await self._connection()
        await conn.writable()
        if conn.lost:
            raise AgentUnavailableError(f"connection to agent {self.address} lost")
        rid = next(self._ids)
        try:
            frame = build(rid, *args)
        except ValueError as exc:  # ids that do not even fit the wire format
            raise BadRequestError(f"{p.Op(op).name} request not sent: {exc}") from None
        loop = conn.loop
        fut: asyncio.Future[p.Frame] = loop.create_future()
        limit = self.request_timeout if timeout is None else timeout
        conn.track(rid, fut, limit)
        if into is not None:
            conn.into[rid] = into
        conn.send(frame)
        return await self._reply(conn, rid, op, fut, limit, whole, in_place, wire)

    def _verify_entry(self, data: bytes, log_id: int, segment_seq: int, entry_id: int) -> Entry:
        where = f"entry {log_id}/{segment_seq}/{entry_id} from agent {self.address}"
        try:
            entry = decode(data)
        except CorruptEntry as exc:
            raise AgentIOError(f"{where} is corrupt: {exc.reason}") from None
        if (entry.log_id, entry.segment_seq, entry.entry_id) != (log_id, segment_seq, entry_id):
            raise AgentIOError(
                f"{where}: the agent returned entry {entry.log_id}/{entry.segment_seq}/{entry.entry_id} instead"
            )
        return entry

    async def add(self, encoded: bytes, recovery: bool = False, *, uncached: bool = False) -> None:
        """Store an encoded entry durably on the agent; ``recovery`` is accepted on a fenced replica.
        ``uncached``: a bulk copy's write, which the agent keeps out of its page cache once durable."""
        await self._call(p.Op.ADD_ENTRY, p.add_entry_request_parts, encoded, recovery, uncached)

    async def add_batch(self, entries: list[p.Buffer], recovery: bool = False, *, uncached: bool = False) -> int:
        """ADD_BATCH: store several encoded entries of one segment (ids increasing; each buffer
        one entry or several back to back, e.g. slices of a ``read_range`` answer, sent without
        a copy) durably, all or nothing; returns how many entries the agent stored. At most
        ``p.MAX_BATCH_BYTES`` in all (else ``BadRequestError``, nothing sent). An agent that
        predates ADD_BATCH answers ``BadRequestError`` naming the unknown opcode."""
        return p.decode_added(await self._call(p.Op.ADD_BATCH, p.add_batch_request_parts, entries, recovery, uncached))

    async def pull_range(
        self, log_id: int, segment_seq: int, first: int, last: int, source: str, max_bytes: int, *, uncached: bool = True, timeout: float | None = None
    ) -> p.PullResult:
        """PULL_RANGE: have this agent copy entries ``first``..``last`` of the segment from the
        agent ``source`` (a node id) and store them durably as recovery adds; the answer says how
        many consecutive entries from ``first`` it now holds and why it stopped short, if it did.
        An agent that predates PULL_RANGE answers ``BadRequestError`` naming the unknown opcode."""
        result = p.decode_pulled(
            await self._call(p.Op.PULL_RANGE, p.pull_range_request, log_id, segment_seq, first, last, max_bytes, source, uncached, timeout=timeout)
        )
        if result.entries > last - first + 1:
            raise AgentIOError(f"PULL_RANGE of {log_id}/{segment_seq}/{first}..{last} from agent {self.address}: it claims {result.entries} entries")
        return result

    async def pull_segment(self, body: bytes, *, uncached: bool = True, timeout: float | None = None) -> dict[str, Any]:
        """PULL_SEGMENT: have this agent copy a bootstrap segment from a source cluster itself
        (``body``: a ``dlctl.spark.segment_pull.PullRequest`` as JSON); the answer is the copy's
        result. ``PullRefusedError``: the agent does not read that cluster (nothing stored). An
        agent that predates PULL_SEGMENT answers ``BadRequestError`` naming the unknown opcode."""
        return p.decode_pulled_segment(await self._call(p.Op.PULL_SEGMENT, p.pull_segment_request, body, uncached, timeout=timeout))

    def add_nowait(self, encoded: bytes, on_done: Callable[[BaseException | None], None], *, flush: bool = False) -> bool:
        """``add`` without a task, for the writer's hot path: ``on_done(None)`` once the entry is
        durable on the agent, ``on_done(error)`` (the error ``add`` would raise) otherwise,
        called from the connection's reader. ``flush``: write the frame now rather than at the
        end of this loop turn. Returns False, having sent nothing, when the connection is not
        ready or is held back by flow control: use ``add`` then."""
        conn = self._conn
        if conn is None or not conn.ready or conn.lost or conn.held_back:
            return False
        rid = next(self._ids)
        frame = p.add_entry_request_parts(rid, encoded, False)
        limit = self.request_timeout

        def finished(reply: p.Frame | None, exc: BaseException | None) -> None:
            if reply is not None:
                try:
                    self._result(conn, rid, p.Op.ADD_ENTRY, reply)
                except AgentError as error:
                    exc = error
            elif isinstance(exc, RequestTimeout):
                exc = self._timed_out(p.Op.ADD_ENTRY, limit)
            on_done(exc)

        conn.track(rid, Callback(finished), limit)
        conn.send(frame)
        if flush:
            conn.flush_now()
        return True

    async def read(self, log_id: int, segment_seq: int, entry_id: int, fence: bool = False) -> bytes:
        """The encoded entry, CRC-verified. ``fence``: a recovery read that fences the replica first."""
        data = await self._call(p.Op.READ_ENTRY, p.read_entry_request, log_id, segment_seq, entry_id, fence)
        self._check_entry(data, log_id, segment_seq, entry_id)
        return data

    async def read_range(
        self, log_id: int, segment_seq: int, first: int, last: int, max_bytes: int, *, in_place: bool = False, into: bytearray | None = None
    ) -> tuple[bytes, list[tuple[int, int]]]:
        """Consecutive entries from ``first`` (READ_RANGE: up to ``last``, the replica's first
        gap or about ``max_bytes``) as one buffer and each entry's (start, end) in it; every
        entry CRC-verified and its ids checked, as ``read`` does. ``in_place``: the buffer may
        be the ``bytearray`` the answer was received into (no copy), for a caller that only
        forwards slices of it (a copy's ADD_BATCH, a store's write). ``into`` (implies
        ``in_place``): receive a large answer into this buffer when it fits (the result is
        then a memoryview of it); the caller may reuse it once it no longer needs the result,
        and only if this call returned (after a failure the connection may still write into it)."""
        data = await self._call(
            p.Op.READ_RANGE, p.read_range_request, log_id, segment_seq, first, last, max_bytes, whole=True, in_place=in_place or into is not None, into=into
        )
        where = f"entries {log_id}/{segment_seq}/{first}..{last} from agent {self.address}"
        skip = p.OK_RESULT_OFFSET  # ``whole``: the entries follow the response preamble
        try:
            spans = [(start + skip, end + skip) for start, end in p.split_entries(memoryview(data)[skip:])]
        except p.ProtocolError as exc:
            raise AgentIOError(f"{where}: {exc}") from None
        if not spans or len(spans) > last - first + 1:
            raise AgentIOError(f"{where}: the agent returned {len(spans)} entries")
        view = memoryview(data)
        for i, (start, end) in enumerate(spans):
            self._check_entry(view[start:end], log_id, segment_seq, first + i)
        return data, spans

    def _check_entry(self, data: bytes | memoryview, log_id: int, segment_seq: int, entry_id: int) -> None:
        """``_verify_entry`` without building the Entry (no copy of the payload): the same
        checks as ``format.decode``, then the ids."""
        where = f"entry {log_id}/{segment_seq}/{entry_id} from agent {self.address}"
        try:
            header = decode_header(data)
        except CorruptEntry as exc:
            raise AgentIOError(f"{where} is corrupt: {exc.reason}") from None
        if len(data) != header.total_size:
            raise AgentIOError(f"{where} is corrupt: entry is {len(data)} bytes, header says {header.total_size}")
        view = memoryview(data)
        if crc32c(view[HEADER_SIZE:], crc32c(view[: HEADER_SIZE - 4])) != header.crc:
            raise AgentIOError(
                f"{where} is corrupt: CRC-32C mismatch in entry {header.segment_seq}/{header.entry_id} of log {header.log_id}"
            )
        if (header.log_id, header.segment_seq, header.entry_id) != (log_id, segment_seq, entry_id):
            raise AgentIOError(
                f"{where}: the agent returned entry {header.log_id}/{header.segment_seq}/{header.entry_id} instead"
            )

    async def read_entry(
        self, log_id: int, segment_seq: int, entry_id: int, fence: bool = False, seen: p.Seen | None = None, summary: bool = False,
        wire: WireStats | None = None,
    ) -> Entry:
        """Like ``read`` but decoded. ``seen``: a replication stream's sink (location, version
        vector): its records in that causal past come as stubs (``dlctl.replication.seen``);
        ``summary``: every data record does (a probe that counts). An agent that predates them
        answers whole entries (asked again without, and from then on). ``wire``: the answer's
        bytes are counted there and, when it asks, the agent may compress the answer
        (FLAG_COMPRESS; one that refuses the flag is asked again without it, and no more on
        that connection)."""
        trimmed = not self._plain_reads and (seen is not None or summary)
        compress = wire is not None and wire.ask and not fence and self._compressing()
        if trimmed or compress:
            build = functools.partial(p.read_entry_request, seen=seen if trimmed else None, summary=summary and trimmed, compress=compress)
        else:
            build = p.read_entry_request
        try:
            data = await self._call(p.Op.READ_ENTRY, build, log_id, segment_seq, entry_id, fence, wire=wire)
        except BadRequestError as exc:
            if not (trimmed or compress) or "unknown flags" not in exc.message:
                raise
            self._refused_flags(compress)
            return await self.read_entry(log_id, segment_seq, entry_id, fence, seen, summary, wire)
        if wire is not None and wire.ask:
            wire.agents[self.name] = compress
        return self._verify_entry(data, log_id, segment_seq, entry_id)

    def _compressing(self) -> bool:
        """Whether to ask for compressed answers now: unless the agent refused on this connection."""
        return self._plain_conn is None or self._plain_conn is not self._conn

    def _refused_flags(self, compress: bool) -> None:
        """The agent refused the flags of a read as unknown: it predates the newest one sent
        (or has it switched off), which is dropped: FLAG_COMPRESS while this connection lasts,
        else the trimmed reads for good (an agent that lacks those lacks COMPRESS too)."""
        if compress:
            self._plain_conn = self._conn
            log.info("agent %s (%s) does not compress answers (it predates FLAG_COMPRESS or has [server] compression = false): reading plain", self.name, self.address)
        else:
            self._plain_reads = True

    async def read_lac(self, log_id: int, segment_seq: int) -> int:
        return p.decode_lac(await self._call(p.Op.READ_LAC, p.read_lac_request, log_id, segment_seq))

    async def long_poll(
        self, log_id: int, segment_seq: int, previous_lac: int, timeout: float, seen: p.Seen | None = None, wire: WireStats | None = None,
    ) -> tuple[int, bytes | None]:
        """Wait up to ``timeout`` s for LAC > ``previous_lac``; returns (LAC, entry previous+1 or
        None). ``seen``, ``wire``: as for ``read_entry``."""
        timeout_ms = max(0, int(timeout * 1000))
        trimmed = seen is not None and not self._plain_reads
        compress = wire is not None and wire.ask and self._compressing()
        build = functools.partial(p.long_poll_request, seen=seen if trimmed else None, compress=compress)
        try:
            result = await self._call(
                p.Op.LONG_POLL, build, log_id, segment_seq, previous_lac, timeout_ms,
                timeout=timeout + self.request_timeout, wire=wire,
            )
        except BadRequestError as exc:
            if not (trimmed or compress) or "unknown flags" not in exc.message:
                raise
            self._refused_flags(compress)
            return await self.long_poll(log_id, segment_seq, previous_lac, timeout, seen, wire)
        if wire is not None and wire.ask:
            wire.agents[self.name] = compress
        lac, entry = p.decode_long_poll_result(result)
        if entry is not None:
            self._verify_entry(entry, log_id, segment_seq, previous_lac + 1)
        return lac, entry

    async def fence(self, log_id: int, segment_seq: int) -> p.FenceResult:
        """Fence the replica (durable before this returns); returns (last entry id, LAC)."""
        return p.decode_fence_result(await self._call(p.Op.FENCE, p.fence_request, log_id, segment_seq))

    async def digest(self, log_id: int, segment_seq: int, first: int = 0, last: int | None = None) -> p.SegmentDigest:
        return p.decode_digest(await self._call(p.Op.DIGEST, p.digest_request, log_id, segment_seq, first, last))

    async def list_segments(self) -> list[p.SegmentInfo]:
        return p.decode_segments(await self._call(p.Op.LIST_SEGMENTS, p.list_segments_request))

    async def delete_segment(self, log_id: int, segment_seq: int) -> bool:
        return p.decode_deleted(await self._call(p.Op.DELETE_SEGMENT, p.delete_segment_request, log_id, segment_seq))

    async def stat(self) -> dict[str, Any]:
        return p.decode_stat(await self._call(p.Op.STAT, p.stat_request))

    # Write proxy -------------------------------------------------------------------------------
    async def append(
        self, name: str, producer: int, count: int, records: bytes, *, reset_order: bool = False,
        epoch: int | None = None, seq: int | None = None, retry: bool = False, forward: bool = False,
    ) -> list[tuple[int, int, int]]:
        """Append ``count`` encoded records to log ``name`` through this agent (the owner, or one
        that claims the log); returns each record's (segment, entry, slot). With ``epoch`` and
        ``seq`` the request is idempotent (see dlctl.log.idempotence)."""
        build = functools.partial(p.append_request, epoch=epoch, seq=seq, retry=retry, forward=forward)
        return p.decode_dlsns(await self._call(p.Op.APPEND, build, name, producer, count, records, reset_order))

    async def release(self, name: str) -> bool:
        """Ask the agent to give log ``name`` up gracefully; False when it did not own it."""
        return p.decode_released(await self._call(p.Op.RELEASE, p.release_request, name))

    @property
    def connection(self) -> object | None:
        """The current authenticated connection, as a token for ``append_on``; None if there is none."""
        conn = self._conn
        return conn if conn is not None and conn.ready and not conn.lost else None

    def append_on(
        self, connection: object, name: str, producer: int, count: int, records: bytes | memoryview, *, reset_order: bool = False,
        epoch: int | None = None, seq: int | None = None, retry: bool = False, forward: bool = False,
    ) -> asyncio.Future[list[tuple[int, int, int]]]:
        """Send an APPEND now, on ``connection`` only (a token from ``connection``), never on a
        new one: appends a producer sends this way reach the agent in the order they were sent,
        on one connection, or fail (``AgentUnavailableError``) without being sent."""
        conn = self._conn
        if conn is not connection or conn is None or not conn.ready or conn.lost:
            raise AgentUnavailableError(f"connection to agent {self.address} was replaced or lost")
        rid = next(self._ids)
        frame = p.append_request(rid, name, producer, count, records, reset_order, epoch=epoch, seq=seq, retry=retry, forward=forward)
        fut: asyncio.Future[p.Frame] = conn.loop.create_future()
        conn.track(rid, fut, self.request_timeout)
        conn.send(frame)
        return asyncio.ensure_future(self._appended(conn, rid, fut))

    async def _appended(self, conn: Connection, rid: int, fut: asyncio.Future[p.Frame]) -> list[tuple[int, int, int]]:
        return p.decode_dlsns(await self._reply(conn, rid, p.Op.APPEND, fut, self.request_timeout))

    async def _reply(
        self, conn: Connection, rid: int, op: int, fut: asyncio.Future[p.Frame], limit: float, whole: bool = False, in_place: bool = False,
        wire: WireStats | None = None,
    ) -> bytes:
        """Wait for the response to request ``rid``; its result body, or its typed error.
        ``whole``: the response body itself, the result from ``p.OK_RESULT_OFFSET`` on (a
        large result is not copied once more); ``in_place`` too: a large one as the bytearray
        it was received into (not copied at all). ``wire``: a read's answer, perhaps
        compressed (``_counted``)."""
        try:
            reply = await fut
        except RequestTimeout:
            raise self._timed_out(op, limit) from None
        except BaseException:
            conn.forget(rid)  # cancelled: a late response is dropped
            raise
        if wire is not None:
            return self._counted(conn, rid, op, reply, wire)
        return self._result(conn, rid, op, reply, whole, in_place)

    def _counted(self, conn: Connection, rid: int, op: int, reply: p.Frame, wire: WireStats) -> bytes:
        """The result of ``reply``, decompressed when the agent compressed it (FLAG_COMPRESSED),
        its bytes counted in ``wire`` as received and as decoded. A compressed result that
        claims too much or does not decompress closes the connection, as any invalid response."""
        compressed = reply.flags & p.FLAG_COMPRESSED
        result = self._result(conn, rid, op, reply._replace(flags=0) if compressed else reply)
        if not compressed:
            wire.count(len(result), len(result))
            return result
        if self._inflater is None:
            self._inflater = Decompressor()
        try:
            plain = self._inflater.decompress(result, p.MAX_FRAME, f"{p.Op(op).name} answer to request {rid}")
        except CorruptCompressed as exc:
            conn.abort(f"agent {self.address} sent an invalid response: {exc}")
            raise AgentUnavailableError(f"agent {self.name} ({self.address}) sent an invalid response: {exc}") from None
        wire.count(len(result), len(plain))
        return plain

    def _timed_out(self, op: int, limit: float) -> AgentUnavailableError:
        return AgentUnavailableError(f"{p.Op(op).name} request to agent {self.address} timed out after {limit:g}s")

    def _result(self, conn: Connection, rid: int, op: int, reply: p.Frame, whole: bool = False, in_place: bool = False) -> bytes:
        """The result body of response ``reply`` to request ``rid``, or its typed error (``whole``,
        ``in_place``: as ``_reply``)."""
        try:
            if reply.opcode != op | p.RESPONSE:
                raise p.ProtocolError(f"response to request {rid} has opcode {reply.opcode}, expected {op | p.RESPONSE}")
            if reply.flags:  # (a compressed answer is ``_counted``'s, for a read that allowed it)
                raise p.ProtocolError(f"response to request {rid} has flags {reply.flags:#x} it did not ask for")
            body = reply.body
            if body[: p.OK_RESULT_OFFSET] == p.OK_PREAMBLE:
                # A large body arrives as the bytearray it was received into: bytes for the
                # caller (one copy, of the result only), unless it takes the buffer in place.
                if whole:
                    return body if in_place or type(body) is bytes else bytes(body)
                if type(body) is not bytes:
                    return bytes(memoryview(body)[p.OK_RESULT_OFFSET :])
            elif type(body) is not bytes:
                reply = reply._replace(body=bytes(body))
            return p.decode_response(reply)
        except p.ProtocolError as exc:
            conn.abort(f"agent {self.address} sent an invalid response: {exc}")
            raise AgentUnavailableError(f"agent {self.address} sent an invalid response: {exc}") from None


class SyncAgentClient:
    """A blocking facade over ``AgentClient`` for the CLI and synchronous tests.

    It runs a private event loop in a daemon thread; each method blocks until its request ends.
    """

    def __init__(self, host: str, port: int, secret: bytes, **options: Any) -> None:
        self._client = AgentClient(host, port, secret, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"agent-client-{host}:{port}", daemon=True)
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # the private loop is closed: so is this client
            coro.close()  # never to run (left alone, it would warn "never awaited" when collected)
            raise AgentUnavailableError(f"client of agent {self._client.address} is closed") from None
        return future.result()

    def __enter__(self) -> SyncAgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        # Exactly the request methods of AgentClient, each run to completion on the private loop.
        if name not in _SYNC_METHODS:
            raise AttributeError(name)
        method = getattr(self._client, name)
        return lambda *args, **kwargs: self._run(method(*args, **kwargs))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            # A connection attempt a timed-out request left running would otherwise be dropped
            # with the closed loop, half-way through its handshake (and complain when collected).
            self._run(_cancel_the_others())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()


async def _cancel_the_others() -> None:
    """Cancel every other task of the running loop and wait for them to finish."""
    me = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


_SYNC_METHODS = frozenset(
    {
        "connect", "add", "add_batch", "read", "read_entry", "read_range", "read_lac", "long_poll",
        "fence", "digest", "list_segments", "delete_segment", "stat",
    }
)
