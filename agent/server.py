"""The agent's protocol server: authenticated, pipelined access to the segment store over TCP/TLS.

Per connection: the agent sends HELLO with a challenge; the first request must be AUTH
(anything else, or a wrong proof, gets UNAUTHORIZED and the connection is closed). After that
requests are handled concurrently: reads that the store answers synchronously are answered
inline, everything that waits (adds behind group commit, fences, long polls, deletes) runs in a
task of its own, so a slow fsync or a long poll never holds up later requests. Responses are
written as they complete, coalesced into one write per event-loop turn. Requests in flight per
connection are bounded (count and bytes); past the bound the server stops reading from that
socket, which pushes back on the client through TCP.

Answers count too: a connection whose answers the client has not taken yet (queued here or in
the transport) reach ``max_response_bytes`` is not read from until they drain, and reads that
wait (long polls, fencing reads) read their entry only when there is room, so a few bytes of
pipelined requests cannot make the agent buffer hundreds of MiB of answers.

Before authentication a connection is worth little and costs little (issue 19): frames are
limited to a few KiB (a larger length prefix closes the connection before its body is read),
unauthenticated connections have a budget of their own apart from the authenticated ones (so a
flood of them never takes a slot an authenticated client needs) and a smaller one per source
address (a new connection over it closes that address's oldest unauthenticated one, so a
flooding address mostly evicts itself), every source address has a cap on all its connections,
and the handshake has a deadline. Refusals are logged at most once a second per reason, with
the number held back (``dlctl.logthrottle``).

Hostile input costs a typed error or a closed connection: frames are bounds-checked before
anything is buffered, ids are validated before the store sees them, partial frames, silent
handshakes and idle connections are timed out. When the store reports a failed fsync the server
stops accepting and drops every connection — it never acknowledges what may be lost — and
``failure`` / ``wait_stopped`` let the caller exit non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any

from dlctl.errors import ConfigError
from dlctl.log import protocol as p
from dlctl.log.auth import DEFAULT_CONTEXT, ServerHandshake
from dlctl.log.compression import Compressor
from dlctl.log.errors import (
    AgentError,
    AgentIOError,
    AgentUnavailableError,
    BadRequestError,
    NoSuchEntryError,
    ProxyDisabledError,
    UnauthorizedError,
)
from dlctl.log.format import HEADER_SIZE as ENTRY_HEADER_SIZE
from dlctl.log.format import NO_ENTRY, CorruptEntry, decode_header, validate_ids
from dlctl.log.tls import TlsFiles, bound_context
from dlctl.logthrottle import LogThrottle
from dlctl.replication.seen import stub_seen, summary_only

from .fdlimit import descriptor_usage
from .limits import ServerLimits
from .metrics import AgentMetrics
from .proxy import Barrier, Hold

log = logging.getLogger(__name__)

_I64_MAX = 2**63 - 1


def _bad(exc: ValueError) -> BadRequestError:
    return BadRequestError(exc.reason if isinstance(exc, CorruptEntry) else str(exc))


_ENTRY_FIELDS = struct.Struct(">4sBBHQQqqI")


def _check_entry(entry: bytes) -> None:
    """Ids and length of an entry to add, before the store sees it (the store verifies the CRC)."""
    _, _, _, _, log_id, seg, entry_id, lac, length = _ENTRY_FIELDS.unpack_from(entry, 0)
    # Inline fast path for the hottest request; decode_header gives the precise complaint.
    ok_ids = log_id > 0 and seg > 0 and 0 <= entry_id and NO_ENTRY <= lac < entry_id
    if not (ok_ids and length == len(entry) - ENTRY_HEADER_SIZE):
        try:
            header = decode_header(entry)
        except CorruptEntry as exc:
            raise BadRequestError(f"ADD_ENTRY: {exc.reason}") from None
        raise BadRequestError(f"ADD_ENTRY body is {len(entry)} bytes, entry header says {header.total_size}")


MAX_TLS_REFUSALS = 16  # refused connections told why inside TLS at once (each costs a handshake)
REFUSAL_HANDSHAKE_SECONDS = 2.0
PRE_AUTH_CLOSE_GRACE = 0.2  # seconds an unauthenticated TLS connection has to take its error


def trim_entry(entry: bytes, seen: p.Seen | None, summary: bool = False) -> bytes | memoryview:
    """``entry`` with the records the reading stream's sink holds as stubs (FLAG_SKIP_SEEN), or
    every data record (FLAG_SUMMARY; ``dlctl.replication.seen``); whole when its records cannot
    be parsed (the reader's own checks then name what is wrong)."""
    try:
        return summary_only(entry) if summary else stub_seen(entry, *seen) if seen is not None else entry
    except ValueError:
        return entry


class AgentServer:
    """Serves one ``SegmentStore`` (``dlagent.storage``) on ``host:port`` (port 0: any free port)."""

    def __init__(
        self,
        store: Any,
        secret: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: TlsFiles | None = None,
        limits: ServerLimits = ServerLimits(),
        *,
        auth_context: bytes = DEFAULT_CONTEXT,
        proxy: Any = None,
        metrics: AgentMetrics | None = None,
    ) -> None:
        ServerHandshake(secret, auth_context)  # fail at construction on an unusable secret
        self.store = store
        # Each request's duration, by op (dlagent.metrics); a registry of its own when not given.
        self.metrics = metrics if metrics is not None else AgentMetrics()
        self.metrics_address: str | None = None  # where the agent's metrics are served (stat: "metrics")
        self.proxy = proxy  # dlagent.proxy.WriteProxy once ZooKeeper is up; None: APPEND is refused
        self.puller: Any = None  # dlagent.pull.RangePuller once ZooKeeper is up; None: PULL_RANGE is refused
        self._secret = secret
        self._auth_context = auth_context
        self.host = host
        self.port = port
        # Mutual TLS (dlctl.log.tls): every connection is admitted as plain TCP first and only
        # then upgraded, so a TLS handshake counts in the pre-authentication budgets like any
        # other unauthenticated connection (asyncio's create_server(ssl=) would run it first).
        self.tls = tls
        self.limits = limits
        self.failure: BaseException | None = None
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: set[_Conn] = set()
        # Admission bookkeeping (_admit/_promote/_forget): authenticated connections are counted,
        # unauthenticated ones kept in arrival order (globally and per source address) so the
        # oldest can be found; connections of each source address are counted.
        self._authenticated = 0
        self._refusing = 0  # TLS handshakes under way only to tell a refused client why
        self._unauthenticated: dict[_Conn, None] = {}
        self._peer_unauthenticated: dict[str, dict[_Conn, None]] = {}
        self._peer_connections: dict[str, int] = {}
        self._throttle = LogThrottle(log)
        self._reaper: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._prev_on_failure: Callable[[BaseException], None] | None = None
        self.counters = {
            "connections": 0,
            "requests": 0,
            "auth_failures": 0,
            "bad_requests": 0,
            "internal_errors": 0,
            "refused_connections": 0,  # over a connection limit
            "evicted_unauthenticated": 0,  # closed to make room for a newer unauthenticated one
            "handshake_timeouts": 0,
            "tls_failures": 0,  # TLS handshakes that failed (no, or a foreign, certificate; plaintext)
            "unauthenticated_bytes": 0,  # received on connections before they authenticated
            "response_bytes_peak": 0,  # most answer bytes one connection held queued at once
            "compressed_answers": 0,  # answers to FLAG_COMPRESS reads sent zstd-compressed
            "compressed_saved_bytes": 0,  # what compressing them kept off the wire
        }

    def __repr__(self) -> str:
        return f"AgentServer({self.host}:{self.port}, connections={len(self._conns)})"

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); valid after ``start``."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the agent server is not listening")
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def start(self) -> None:
        if self.store.failed:
            raise AgentIOError("the segment store has failed; refusing to serve it")
        self._loop = asyncio.get_running_loop()
        self._stopped.clear()
        self._prev_on_failure = self.store.on_failure
        self.store.on_failure = self._on_store_failure
        if self.tls is not None:
            self.tls.server()  # unreadable or mismatched files fail the start, not the first client
        self._server = await self._loop.create_server(self._new_conn, self.host, self.port, reuse_address=True, backlog=512)
        self._reaper = self._loop.create_task(self._reap(), name="agent-server-reaper")
        log.info("agent protocol server listening on %s:%d%s", *self.address, " (mutual TLS)" if self.tls else " (plaintext: no [tls] in agent.toml)")

    async def stop(self) -> None:
        """Stop accepting, close every connection, and wait for the requests in flight to end."""
        if self._server is None:
            return
        # Adds in flight are callbacks in the store rather than tasks: wait for each connection
        # to drain (tasks included).
        drained = [c.drained() for c in self._conns]
        self._shutdown(reason="agent shutting down")
        if drained:
            await asyncio.wait(drained, timeout=5.0)
        server, self._server = self._server, None
        await server.wait_closed()
        if self.store.on_failure == self._on_store_failure:
            self.store.on_failure = self._prev_on_failure

    async def wait_stopped(self) -> BaseException | None:
        """Wait until the server stopped (``stop`` or a store failure); returns the failure, if any."""
        await self._stopped.wait()
        return self.failure

    def _shutdown(self, reason: str, *, abort: bool = False) -> None:
        if self._server is not None:
            self._server.close()
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for conn in list(self._conns):
            conn.close(reason, abort=abort)
        self._stopped.set()

    def _on_store_failure(self, exc: BaseException) -> None:
        # The store may report from a worker thread; act on the loop's thread.
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._fail, exc)
        if self._prev_on_failure is not None:
            self._prev_on_failure(exc)

    def _fail(self, exc: BaseException) -> None:
        if self.failure is not None:
            return
        self.failure = exc
        log.critical("segment store failed (%s); the agent stops serving", exc)
        # abort, not close: nothing still buffered may reach a client once durability is in doubt
        self._shutdown(reason="segment store failed", abort=True)

    def _new_conn(self) -> asyncio.Protocol:
        return _Conn(self)

    async def _reap(self) -> None:
        lim = self.limits
        interval = max(0.05, min(1.0, lim.handshake_timeout / 4, lim.frame_timeout / 4, lim.idle_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self._conns):
                conn.check_deadlines(now)
            self._throttle.flush()

    def stat(self) -> dict[str, Any]:
        return {
            **self.counters,
            "open_connections": len(self._conns),
            "authenticated_connections": self._authenticated,
            "unauthenticated_connections": len(self._unauthenticated),
            "log_lines_suppressed": self._throttle.suppressed,
            **descriptor_usage(),
        }

    # Admission --------------------------------------------------------------------------------

    def _admit(self, conn: _Conn) -> str | None:
        """Take a new connection in as unauthenticated, making room by closing an older
        unauthenticated one if a budget is full; the reason it is refused instead, if it is."""
        lim, ip = self.limits, conn.peer_ip
        if self._authenticated >= lim.max_connections:
            return f"too many connections ({self._authenticated} authenticated, at most {lim.max_connections})"
        if self._peer_connections.get(ip, 0) >= lim.max_connections_per_peer:
            return f"too many connections from {ip} (at most {lim.max_connections_per_peer} from one address)"
        mine = self._peer_unauthenticated.get(ip)
        if mine is not None and len(mine) >= lim.max_unauthenticated_per_peer:
            self._evict(next(iter(mine)), f"{ip} has {len(mine)} unauthenticated connections, at most {lim.max_unauthenticated_per_peer}")
        elif len(self._unauthenticated) >= lim.max_unauthenticated:
            busiest = max(self._peer_unauthenticated.values(), key=len)
            self._evict(next(iter(busiest)), f"{len(self._unauthenticated)} unauthenticated connections, at most {lim.max_unauthenticated}")
        conn.registered = True
        self._conns.add(conn)
        self._unauthenticated[conn] = None
        self._peer_unauthenticated.setdefault(ip, {})[conn] = None
        self._peer_connections[ip] = self._peer_connections.get(ip, 0) + 1
        return None

    def _evict(self, victim: _Conn, why: str) -> None:
        self.counters["evicted_unauthenticated"] += 1
        self._throttle.warning(
            "unauthenticated connections closed to make room", "closing unauthenticated connection from %s to make room: %s", victim.peer, why
        )
        error = p.error_response(p.Op.HELLO, 0, AgentUnavailableError.status, "too many unauthenticated connections; closed to make room")
        victim.close("evicted", error=error)

    def _refused(self, conn: _Conn, why: str) -> None:
        self.counters["refused_connections"] += 1
        self._throttle.warning("refused connections", "refusing connection from %s: %s", conn.peer, why)

    def _promote(self, conn: _Conn) -> bool:
        """``conn`` proved the secret: move it to the authenticated connections, if one is free."""
        if self._authenticated >= self.limits.max_connections:
            return False
        self._drop_unauthenticated(conn)
        conn.authed = True
        self._authenticated += 1
        return True

    def _drop_unauthenticated(self, conn: _Conn) -> None:
        self._unauthenticated.pop(conn, None)
        mine = self._peer_unauthenticated.get(conn.peer_ip)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self._peer_unauthenticated[conn.peer_ip]

    def _forget(self, conn: _Conn) -> None:
        """``conn`` is closing or closed: free its slots (once)."""
        if not conn.registered:
            return
        conn.registered = False
        self._conns.discard(conn)
        if conn.authed:
            self._authenticated -= 1
        else:
            self._drop_unauthenticated(conn)
        left = self._peer_connections.get(conn.peer_ip, 1) - 1
        if left > 0:
            self._peer_connections[conn.peer_ip] = left
        else:
            self._peer_connections.pop(conn.peer_ip, None)

    # Request handlers -------------------------------------------------------------------------
    # Each returns the result body; typed AgentErrors become error responses.

    def read_entry(self, log_id: int, seg: int, entry_id: int) -> bytes:
        self._ids(log_id, seg, entry_id)
        return self.store.read(log_id, seg, entry_id)

    def read_range(self, log_id: int, seg: int, first: int, last: int, max_bytes: int) -> bytes:
        self._ids(log_id, seg, first)
        return self.store.read_range(log_id, seg, first, last, min(max_bytes, p.MAX_RANGE_BYTES))

    async def read_entry_fencing(self, log_id: int, seg: int, entry_id: int, room: Callable[[], Awaitable[None]] | None = None) -> bytes:
        self._ids(log_id, seg, entry_id)
        await self.store.fence(log_id, seg)  # durable before the read is answered
        if room is not None:
            await room()  # read the entry only when its answer can be queued
        return self.store.read(log_id, seg, entry_id)

    def read_lac(self, log_id: int, seg: int) -> bytes:
        self._ids(log_id, seg)
        return p.encode_lac(self.store.lac(log_id, seg))

    async def long_poll(
        self, log_id: int, seg: int, previous: int, timeout_ms: int, room: Callable[[], Awaitable[None]] | None = None
    ) -> bytes:
        self._ids(log_id, seg)
        if not NO_ENTRY <= previous < _I64_MAX:
            raise BadRequestError(f"previous LAC {previous} out of range (-1..2^63-2)")
        timeout = min(timeout_ms / 1000.0, self.limits.max_long_poll)
        lac = await self.store.wait_lac(log_id, seg, previous, timeout)
        entry = None
        if lac > previous:
            if room is not None:
                await room()  # read the entry only when its answer can be queued
            try:
                entry = self.store.read(log_id, seg, previous + 1)
            except NoSuchEntryError:
                pass  # striped ensembles: this replica need not hold every entry
        return p.encode_long_poll_result(lac, entry)

    async def fence(self, log_id: int, seg: int) -> bytes:
        self._ids(log_id, seg)
        result = await self.store.fence(log_id, seg)
        return p.encode_fence_result(result.last_entry_id, result.lac)

    def digest(self, log_id: int, seg: int, first: int, last: int | None) -> bytes:
        self._ids(log_id, seg, first)
        if last is not None and last < first:
            raise BadRequestError(f"digest range {first}..{last} is empty")
        return p.encode_digest(self.store.digest(log_id, seg, first, last))

    def list_segments(self) -> bytes:
        return p.encode_segments(self.store.list_segments())

    async def delete_segment(self, log_id: int, seg: int) -> bytes:
        self._ids(log_id, seg)
        return p.encode_deleted(await self.store.delete(log_id, seg))

    def stat_all(self) -> bytes:
        extra: dict[str, Any] = {"proxy": self.proxy.stat()} if self.proxy is not None else {}
        if self.puller is not None:
            extra["pull"] = dict(self.puller.counters)
        if self.metrics_address is not None:
            extra["metrics"] = self.metrics_address
        return p.encode_stat({**self.store.stat(), "server": self.stat(), **extra})

    async def pull_range(self, log_id: int, seg: int, first: int, last: int, max_bytes: int, source: str, uncached: bool) -> bytes:
        self._ids(log_id, seg, first)
        if self.puller is None:
            raise AgentUnavailableError("this agent cannot pull yet (it is not connected to its cluster's metadata)")
        return await self.puller.pull(log_id, seg, first, last, max_bytes, source, uncached)

    async def release(self, name: str) -> bytes:
        if self.proxy is None:
            raise ProxyDisabledError("this agent is not a write proxy")
        return b"\x01" if await self.proxy.release(name) else b"\x00"

    @staticmethod
    def _ids(log_id: int, seg: int, entry_id: int | None = None) -> None:
        try:
            validate_ids(log_id, seg, entry_id)
        except ValueError as exc:
            raise BadRequestError(str(exc)) from None


class _Conn(asyncio.Protocol):
    """One client connection: handshake, frame parsing, dispatch, coalesced responses."""

    def __init__(self, server: AgentServer) -> None:
        self.server = server
        self.store = server.store
        self.limits = server.limits
        self.loop = server._loop
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_ip = "?"
        self.registered = False  # counted in the server's admission bookkeeping
        # Until AUTH succeeds a frame may be only a few KiB: a larger length prefix is refused
        # before its body is read (_Conn._authenticate raises it to max_frame).
        self.decoder = p.FrameDecoder(min(server.limits.max_unauthenticated_frame, server.limits.max_frame))
        self.handshake: ServerHandshake | None = None
        self.tls_pending = False  # admitted, TLS handshake under way: nothing of ours is sent yet
        self.close_reason: str | None = None  # set when the agent itself closes the connection
        self._raw: asyncio.BaseTransport | None = None  # under TLS: the TCP transport beneath
        self._early: list[bytes] = []  # bytes that arrived before start_tls took the transport over
        self.authed = False
        self.closing = False
        self.eof = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.in_flight = 0
        self.in_flight_bytes = 0
        self.long_polls = 0  # of in_flight: long polls waiting (counted apart, see ServerLimits)
        self.write_paused = False
        self.read_paused = False
        self._out = p.OutQueue()
        self._out_bytes = 0  # bytes in _out (the answers of this loop turn, not yet written)
        self._room_waiters: list[asyncio.Future[None]] = []  # reads waiting for answers to drain
        self._add_nowait = getattr(self.store, "add_nowait", None)
        self._observe = server.metrics.request  # (op, seconds): once per request, when answered
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.barrier = Barrier()  # write proxy: (producer, log) pairs whose appends failed
        self.hold = Hold(self._unhold)  # write proxy: held while a log it writes to is full
        # FLAG_COMPRESS: refused as unknown when switched off ([server] compression = false), as
        # by an agent that predates it; the zstd context is made on the first compressed answer.
        self._refuse = 0 if self.limits.compression else p.FLAG_COMPRESS
        self._compressor: Compressor | None = None
        now = time.monotonic()
        self.created = now
        self.last_activity = now
        self.partial_since: float | None = None

    # asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.peer_ip = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        server = self.server
        if server.failure is not None or server._server is None:
            transport.abort()
            return
        refusal = server._admit(self)
        if refusal is not None:
            server._refused(self, refusal)
            error = p.error_response(p.Op.HELLO, 0, AgentUnavailableError.status, refusal)
            if server.tls is None:
                self.closing = True
                transport.write(error)
                transport.close()
            elif server._refusing < MAX_TLS_REFUSALS:
                # A TLS client cannot read a plaintext frame: say why inside TLS. Bounded, as
                # each costs a handshake; past the bound a refused connection is just reset.
                self._spawn_tls(self._refuse_in_tls(transport, error))
            else:
                self.closing = True
                transport.abort()
            return
        server.counters["connections"] += 1
        if server.tls is None:
            self._challenge(transport, None)
            return
        self._spawn_tls(self._start_tls(transport))

    def _spawn_tls(self, work: Awaitable[None]) -> None:
        self.tls_pending = True
        self.transport.pause_reading()  # type: ignore[union-attr] # start_tls takes the bytes from here on
        task = self.loop.create_task(work, name="tls-handshake")  # type: ignore[union-attr, arg-type]
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _tls_handshake(self, raw: asyncio.BaseTransport, timeout: float) -> tuple[asyncio.BaseTransport, bytes]:
        """Upgrade ``raw`` to TLS as the agent; the TLS transport and the certificate presented."""
        assert self.server.tls is not None
        context, der = self.server.tls.server()
        handshake = asyncio.ensure_future(
            self.loop.start_tls(raw, self, context, server_side=True, ssl_handshake_timeout=timeout)  # type: ignore[union-attr, arg-type]
        )
        # uvloop starts reading right after connection_made whatever it asked, so the
        # ClientHello may already have reached data_received (which kept it). Once start_tls's
        # first step has put its TLS protocol on the transport, and after the callbacks it
        # queued (connection_made, resume_reading) but before any new read, hand those bytes on.
        await asyncio.sleep(0)
        self.loop.call_soon(self._replay_early, raw)  # type: ignore[union-attr]
        return await handshake, der

    async def _refuse_in_tls(self, raw: asyncio.BaseTransport, error: bytes) -> None:
        server = self.server
        server._refusing += 1
        try:
            transport, _ = await self._tls_handshake(raw, min(self.limits.handshake_timeout, REFUSAL_HANDSHAKE_SECONDS))
        except (ssl.SSLError, OSError, ConnectionError, TimeoutError, ConfigError, RuntimeError):
            self.closing = True
            raw.abort()
            return
        finally:
            server._refusing -= 1
        self.tls_pending = False
        self.transport = transport  # type: ignore[assignment]
        self.close("refused", error=error)

    def _replay_early(self, raw: asyncio.BaseTransport) -> None:
        early, self._early = b"".join(self._early), []
        if not early or self.closing:
            return
        proto = raw.get_protocol()
        if proto is self:  # start_tls has not taken over: never read TLS bytes as frames
            self.close("TLS handshake did not start", abort=True)
            return
        if hasattr(proto, "buffer_updated"):  # asyncio's and uvloop's TLS protocols are buffered
            view = memoryview(early)
            while view:
                buf = proto.get_buffer(len(view))  # type: ignore[attr-defined]
                n = min(len(buf), len(view))
                buf[:n] = view[:n]
                proto.buffer_updated(n)  # type: ignore[attr-defined]
                view = view[n:]
        else:
            proto.data_received(early)  # type: ignore[attr-defined]

    def _challenge(self, transport: asyncio.BaseTransport, server_cert_der: bytes | None) -> None:
        """Send HELLO; under TLS the proofs are bound to the certificate this session presented."""
        server = self.server
        self.handshake = ServerHandshake(server._secret, bound_context(server._auth_context, server_cert_der))
        transport.write(p.hello_frame(self.handshake.challenge))  # type: ignore[attr-defined]

    async def _start_tls(self, raw: asyncio.BaseTransport) -> None:
        server = self.server
        self._raw = raw
        try:
            transport, der = await self._tls_handshake(raw, self.limits.handshake_timeout)
        except (ssl.SSLError, OSError, ConnectionError, TimeoutError, ConfigError, RuntimeError) as exc:
            if self.close_reason is None:  # not one the agent closed itself (eviction, timeout)
                server.counters["tls_failures"] += 1
                if isinstance(exc, ConnectionError) and not self._early:
                    # A TCP probe (a health check, a port scan) that left without a ClientHello.
                    log.debug("TLS handshake with %s: the peer closed before any TLS: %r", self.peer, exc)
                else:
                    server._throttle.warning("TLS handshake failures", "TLS handshake with %s failed: %s", self.peer, str(exc) or type(exc).__name__)
            self.closing = True
            server._forget(self)
            raw.abort()
            return
        if self.closing or transport is None:
            if transport is not None:
                transport.abort()
            return
        self.tls_pending = False
        self.transport = transport  # type: ignore[assignment]
        self._challenge(transport, der)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.barrier.closed = True
        self.server._forget(self)
        self._out.clear()
        self._out_bytes = 0
        self._wake_room()
        for task in self.tasks:
            # Long polls are pure waits; adds, fences and deletes run to completion so the store
            # never sees an operation abandoned half-way.
            if task.get_name() == "long-poll":
                task.cancel()

    def eof_received(self) -> bool:
        # A half-close still gets the answers to what it sent; the connection ends after them.
        # Long polls are answered at once with the current state (a long poll may end before
        # its timeout): otherwise a half-closed connection could linger for max_long_poll.
        self.eof = True
        self.loop.call_soon(self._hurry_long_polls)  # type: ignore[union-attr] # after tasks' first steps
        self._finish_if_done()
        # Under TLS a half-close cannot be kept (the ssl transport closes itself): say so.
        return self.server.tls is None

    def _hurry_long_polls(self) -> None:
        for task in self.tasks:
            if task.get_name() == "long-poll":
                task.cancel()

    def _finish_if_done(self) -> None:
        if self.eof and not self.in_flight and not self.closing:
            self.close("the client closed its side")

    def pause_writing(self) -> None:
        self.write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_room()
        self._update_reading()
        self._process()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if self.tls_pending:  # before start_tls took over (uvloop): keep it for the TLS layer
            self._early.append(data)
            if sum(map(len, self._early)) > self.limits.max_unauthenticated_frame * 4:
                self.close("too many bytes before the TLS handshake", abort=True)
            elif self.transport is not None:
                self.transport.pause_reading()
            return
        if not self.authed:
            self.server.counters["unauthenticated_bytes"] += len(data)
        now = time.monotonic()
        self.last_activity = now
        try:
            self.decoder.feed(data)
        except p.ProtocolError as exc:  # pragma: no cover - feed does not validate
            self._protocol_failure(exc)
            return
        self._process()

    # Parsing and dispatch ------------------------------------------------------------------------
    @property
    def blocked(self) -> bool:
        return (
            self.write_paused
            or self.hold.count > 0
            or self.in_flight - self.long_polls >= self.limits.max_in_flight
            or self.long_polls >= self.limits.max_long_polls
            or self.in_flight_bytes >= self.limits.max_in_flight_bytes
            or self._out_bytes >= self.limits.max_response_bytes
        )

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or self.closing:
            return
        if self.blocked and not self.read_paused:
            self.read_paused = True
            transport.pause_reading()
        elif not self.blocked and self.read_paused:
            self.read_paused = False
            transport.resume_reading()

    def _process(self) -> None:
        decoder = self.decoder
        progressed = False
        while not self.closing and not self.blocked:
            try:
                frame = decoder.next_frame()
            except p.ProtocolError as exc:
                self._protocol_failure(exc)
                return
            if frame is None:
                break
            progressed = True
            self._handle(frame)
        # The slowloris clock runs from the first byte of the oldest incomplete frame; trickling
        # more bytes of the same frame does not reset it, completing a frame does.
        if not decoder.buffered:
            self.partial_since = None
        elif progressed or self.partial_since is None:
            self.partial_since = time.monotonic()
        self._update_reading()

    def _protocol_failure(self, exc: p.ProtocolError) -> None:
        server = self.server
        server.counters["bad_requests"] += 1
        if self.authed:
            log.info("closing connection from %s: %s", self.peer, exc)
        else:
            # Typically a length prefix over max_unauthenticated_frame: refused before its body is read.
            server.counters["auth_failures"] += 1
            if str(exc).startswith("frame length"):
                exc = p.ProtocolError(f"{exc}: until AUTH succeeds a frame may have at most {self.decoder.max_frame} bytes", fatal=True)
            server._throttle.warning("bad frames before authentication", "closing connection from %s before authentication: %s", self.peer, exc)
        self.close(str(exc), error=p.error_response(p.Op.HELLO, 0, BadRequestError.status, str(exc)))

    def _handle(self, frame: p.Frame) -> None:
        server = self.server
        server.counters["requests"] += 1
        started = perf_counter()
        try:
            req = p.decode_request(frame, self._refuse)
        except p.ProtocolError as exc:
            if not self.authed:
                self._reject_unauthenticated(frame.opcode & 0x7F, frame.request_id, f"bad frame before authentication: {exc}")
                return
            server.counters["bad_requests"] += 1
            self.send(p.error_response(frame.opcode & 0x7F, frame.request_id, BadRequestError.status, str(exc)))
            self._observe(-1, perf_counter() - started)  # "other": not a request the agent could read
            return
        op, flags, rid, args = req
        if not self.authed:
            if op is p.Op.AUTH:
                self._authenticate(rid, *args)
            else:
                self._reject_unauthenticated(op, rid, f"{op.name} before authentication")
            return
        if op is p.Op.ADD_ENTRY:
            self._add_now(rid, args[0], flags, started)
        elif op is p.Op.ADD_BATCH:
            self._add_batch(rid, args[0], args[1], flags, started)
        elif op is p.Op.READ_ENTRY:
            if flags & p.FLAG_FENCE:
                self._spawn(self._run_async(op, rid, server.read_entry_fencing(*args, room=self.room), started), 0)
            elif flags & (p.FLAG_SKIP_SEEN | p.FLAG_SUMMARY):
                seen = args[3] if flags & p.FLAG_SKIP_SEEN else None
                self._run_sync(
                    op, rid, lambda log_id, seg, entry_id, *_: trim_entry(server.read_entry(log_id, seg, entry_id), seen, bool(flags & p.FLAG_SUMMARY)), args, started,
                    compress=bool(flags & p.FLAG_COMPRESS),
                )
            else:
                self._run_sync(op, rid, server.read_entry, args, started, compress=bool(flags & p.FLAG_COMPRESS))
        elif op is p.Op.READ_RANGE:
            self._run_sync(op, rid, server.read_range, args, started)
        elif op is p.Op.READ_LAC:
            self._run_sync(op, rid, server.read_lac, args, started)
        elif op is p.Op.LONG_POLL:
            self.long_polls += 1
            self._spawn(self._long_poll(rid, started, *args, compress=bool(flags & p.FLAG_COMPRESS)), 0, name="long-poll")
        elif op is p.Op.FENCE:
            self._spawn(self._run_async(op, rid, server.fence(*args), started), 0)
        elif op is p.Op.DIGEST:
            self._run_sync(op, rid, server.digest, args, started)
        elif op is p.Op.LIST_SEGMENTS:
            self._run_sync(op, rid, server.list_segments, args, started)
        elif op is p.Op.DELETE_SEGMENT:
            self._spawn(self._run_async(op, rid, server.delete_segment(*args), started), 0)
        elif op is p.Op.STAT:
            self._run_sync(op, rid, server.stat_all, args, started)
        elif op is p.Op.APPEND:
            self._append(rid, flags, args, started)
        elif op is p.Op.RELEASE:
            self._spawn(self._run_async(op, rid, server.release(*args), started), 0)
        elif op is p.Op.PULL_RANGE:
            # Counted at the two answers it may hold at once (dlagent.pull).
            held = 2 * min(args[4], p.MAX_RANGE_BYTES)
            self._spawn(self._run_async(op, rid, server.pull_range(*args, uncached=bool(flags & p.FLAG_UNCACHED)), started), held, name="pull-range")
        else:  # AUTH again
            self.send(p.error_response(op, rid, BadRequestError.status, "already authenticated"))
            self._observe(op, perf_counter() - started)

    def _authenticate(self, rid: int, client_nonce: bytes, proof: bytes) -> None:
        assert self.handshake is not None
        try:
            server_proof = self.handshake.verify(client_nonce, proof)
        except UnauthorizedError as exc:
            self.server.counters["auth_failures"] += 1
            self.server._throttle.warning("failed authentications", "authentication of %s failed: %s", self.peer, exc.message)
            self.close("authentication failed", error=p.error_response(p.Op.AUTH, rid, exc.status, exc.message))
            return
        server = self.server
        if not server._promote(self):
            why = f"too many connections ({server._authenticated} authenticated, at most {self.limits.max_connections})"
            server._refused(self, why)
            self.close(why, error=p.error_response(p.Op.AUTH, rid, AgentUnavailableError.status, why))
            return
        self.handshake = None
        self.decoder.max_frame = self.limits.max_frame
        self.send(p.ok_response(p.Op.AUTH, rid, server_proof))

    def _reject_unauthenticated(self, op: int, rid: int, why: str) -> None:
        self.server.counters["auth_failures"] += 1
        self.server._throttle.warning("requests before authentication", "closing connection from %s: %s", self.peer, why)
        self.close(why, error=p.error_response(op, rid, UnauthorizedError.status, f"authenticate first ({why})"))

    # Execution ------------------------------------------------------------------------------------
    def _run_sync(self, op: int, rid: int, handler: Callable[..., bytes], args: tuple[Any, ...], started: float, compress: bool = False) -> None:
        try:
            result = handler(*args)
            self.send(self._ok_compressed(op, rid, result) if compress else p.ok_response_parts(op, rid, result))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a response
            self.send(self._error(op, rid, exc))
        self._observe(op, perf_counter() - started)

    def _ok_compressed(self, op: int, rid: int, result: p.Buffer) -> p.Outgoing:
        """The answer to a FLAG_COMPRESS request: the result zstd-compressed and flagged when
        that pays, else plain (``dlctl.log.compression``)."""
        if self._compressor is None:
            self._compressor = Compressor()
        packed = self._compressor.compress(result)
        if packed is None:
            return p.ok_response_parts(op, rid, result)
        counters = self.server.counters
        counters["compressed_answers"] += 1
        counters["compressed_saved_bytes"] += len(result) - len(packed)
        return p.ok_response_parts(op, rid, packed, p.FLAG_COMPRESSED)

    def _spawn(self, coro: Awaitable[None], size: int, name: str | None = None) -> None:
        self.in_flight += 1
        self.in_flight_bytes += size
        task = self.loop.create_task(coro, name=name)  # type: ignore[union-attr, arg-type]
        self.tasks.add(task)
        task.add_done_callback(lambda t, size=size: self._task_done(t, size))

    def drained(self) -> asyncio.Future[None]:
        """Resolved once no request of this connection is in flight."""
        fut = self.loop.create_future()  # type: ignore[union-attr]
        if self.in_flight:
            self._drain_waiters.append(fut)
        else:
            fut.set_result(None)
        return fut

    def _check_drained(self) -> None:
        if not self.in_flight and self._drain_waiters:
            waiters, self._drain_waiters = self._drain_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def _task_done(self, task: asyncio.Task[None], size: int) -> None:
        self.tasks.discard(task)
        self.in_flight -= 1
        self.in_flight_bytes -= size
        self._check_drained()
        if not self.closing and (self.read_paused or self.decoder.buffered):
            self._process()
        if self.eof:
            self._finish_if_done()

    def _add_now(self, rid: int, entry: bytes, flags: int, started: float) -> None:
        """The hot path: no task per add. The store queues the entry at once and calls back when
        it is durable, and the response goes out with the others of that batch; only an add
        that must wait for its segment to be created takes the task path."""
        add_nowait = self._add_nowait
        if add_nowait is None:
            self._spawn(self._add(rid, entry, flags, started), len(entry))
            return
        size = len(entry)
        self.in_flight += 1
        self.in_flight_bytes += size
        try:
            _check_entry(entry)
            queued = add_nowait(
                entry, lambda exc: self._add_done(rid, size, exc, started), recovery=bool(flags & p.FLAG_RECOVERY), uncached=bool(flags & p.FLAG_UNCACHED)
            )
        except Exception as exc:  # noqa: BLE001 - every failure becomes a response
            self._add_done(rid, size, exc, started)
            return
        if not queued:
            self.in_flight -= 1
            self.in_flight_bytes -= size
            self._spawn(self._add(rid, entry, flags, started), size)

    def _add_done(
        self, rid: int, size: int, exc: BaseException | None, started: float, op: int = p.Op.ADD_ENTRY, answer: bytes | None = None
    ) -> None:
        self.in_flight -= 1
        self.in_flight_bytes -= size
        self._check_drained()
        if exc is None:
            self.send(p.add_ok_response(rid) if answer is None else answer)
        else:
            self.send(self._error(op, rid, exc))  # type: ignore[arg-type]
        self._observe(op, perf_counter() - started)
        if not self.closing and (self.read_paused or self.decoder.buffered):
            # Not from inside the store's callback: parsing more requests re-enters the store.
            self.loop.call_soon(self._resume)  # type: ignore[union-attr]
        if self.eof:
            self._finish_if_done()

    def _resume(self) -> None:
        if not self.closing:
            self._process()

    async def _add(self, rid: int, entry: bytes, flags: int, started: float) -> None:
        try:
            _check_entry(entry)
            await self.store.add(entry, recovery=bool(flags & p.FLAG_RECOVERY), uncached=bool(flags & p.FLAG_UNCACHED))
        except Exception as exc:  # noqa: BLE001
            self.send(self._error(p.Op.ADD_ENTRY, rid, exc))
        else:
            self.send(p.add_ok_response(rid))
        self._observe(p.Op.ADD_ENTRY, perf_counter() - started)

    def _add_batch(self, rid: int, body: bytes, spans: list[tuple[int, int]], flags: int, started: float) -> None:
        """ADD_BATCH: the entries (views of ``body``, not copies) are checked and queued all or
        none, as ``_add_now`` does one entry, and answered once all are durable. The batch is one
        request of ``len(body)`` bytes in the in-flight limits until then."""
        size, count = len(body), len(spans)
        self.in_flight += 1
        self.in_flight_bytes += size
        recovery, uncached = bool(flags & p.FLAG_RECOVERY), bool(flags & p.FLAG_UNCACHED)
        answer = p.ok_response(p.Op.ADD_BATCH, rid, p.encode_added(count))
        try:
            view = memoryview(body)
            entries = [view[a:b] for a, b in spans]
            for k, entry in enumerate(entries):
                try:
                    _check_entry(entry)  # the ids, as for ADD_ENTRY (the store checks the rest)
                except BadRequestError as exc:
                    why = exc.message.removeprefix("ADD_ENTRY: ")
                    raise BadRequestError(f"batch entry {k + 1} of {count}: {why}; nothing of the batch stored") from None
            queued = self.store.add_batch_nowait(
                entries, lambda exc: self._add_done(rid, size, exc, started, p.Op.ADD_BATCH, answer), recovery=recovery, uncached=uncached
            )
        except Exception as exc:  # noqa: BLE001 - every failure becomes a response
            self._add_done(rid, size, exc, started, p.Op.ADD_BATCH)
            return
        if not queued:  # a new segment: created first, on the task path
            self.in_flight -= 1
            self.in_flight_bytes -= size
            self._spawn(self._run_async(p.Op.ADD_BATCH, rid, self._store_batch(entries, recovery, uncached), started), size)

    async def _store_batch(self, entries: list[memoryview], recovery: bool, uncached: bool) -> bytes:
        return p.encode_added(await self.store.add_batch(entries, recovery=recovery, uncached=uncached))

    def _append(self, rid: int, flags: int, args: tuple[Any, ...], started: float) -> None:
        proxy = self.server.proxy
        if proxy is None:
            self.send(p.error_response(p.Op.APPEND, rid, ProxyDisabledError.status, "this agent is not a write proxy ([proxy] enabled = false)"))
            self._observe(p.Op.APPEND, perf_counter() - started)
            return
        name, producer, count, records, epoch, seq = args
        # Handed to the proxy now, in arrival order; only the wait for the acknowledgement is a task.
        result = proxy.append(
            name, producer, count, records, barrier=self.barrier, hold=self.hold, reset=bool(flags & p.FLAG_RESET_ORDER), epoch=epoch, seq=seq,
            retry=bool(flags & p.FLAG_RETRY), forward=bool(flags & p.FLAG_FORWARD),
        )
        self._spawn(self._answer_append(rid, result, started), len(records))

    async def _answer_append(self, rid: int, result: asyncio.Future[Any], started: float) -> None:
        try:
            positions = await result
        except Exception as exc:  # noqa: BLE001
            self.send(self._error(p.Op.APPEND, rid, exc))
        else:
            self.send(p.ok_response(p.Op.APPEND, rid, p.encode_dlsns(positions)))
        self._observe(p.Op.APPEND, perf_counter() - started)

    def _unhold(self) -> None:
        if not self.closing:
            self._update_reading()
            self._process()

    async def _long_poll(
        self, rid: int, started: float, log_id: int, seg: int, previous: int, timeout_ms: int, seen: p.Seen | None = None, *, compress: bool = False,
    ) -> None:
        server = self.server
        try:
            try:
                result = await server.long_poll(log_id, seg, previous, 0 if self.eof else timeout_ms, room=self.room)
            except asyncio.CancelledError:
                if not self.eof or self.closing:
                    raise
                result = await server.long_poll(log_id, seg, previous, 0, room=self.room)  # hurried by a half-close
            finally:
                self.long_polls -= 1  # answered (or given up): it counts as any request from here
            if seen is not None:
                lac, entry = p.decode_long_poll_result(result)
                if entry is not None:
                    result = p.encode_long_poll_result(lac, bytes(trim_entry(entry, seen)))
        except Exception as exc:  # noqa: BLE001
            self.send(self._error(p.Op.LONG_POLL, rid, exc))
        else:
            self.send(self._ok_compressed(p.Op.LONG_POLL, rid, result) if compress else p.ok_response_parts(p.Op.LONG_POLL, rid, result))
        self._observe(p.Op.LONG_POLL, perf_counter() - started)

    async def _run_async(self, op: int, rid: int, work: Awaitable[bytes], started: float) -> None:
        try:
            result = await work
        except Exception as exc:  # noqa: BLE001
            self.send(self._error(op, rid, exc))
        else:
            self.send(p.ok_response_parts(op, rid, result))
        self._observe(op, perf_counter() - started)

    def _error(self, op: int, rid: int, exc: Exception) -> bytes:
        if isinstance(exc, CorruptEntry):
            exc = _bad(exc)
        if isinstance(exc, AgentError):
            if isinstance(exc, BadRequestError):
                self.server.counters["bad_requests"] += 1
            elif isinstance(exc, AgentIOError) and self.store.failed:
                self.server._fail(exc)
            return p.response_for_error(op, rid, exc)
        self.server.counters["internal_errors"] += 1
        log.error("internal error in %s request %d from %s", p.Op(op).name, rid, self.peer, exc_info=exc)
        return p.error_response(op, rid, p.STATUS_INTERNAL, f"internal error in the agent: {type(exc).__name__}")

    # Output -------------------------------------------------------------------------------------
    def send(self, frame: p.Outgoing) -> None:
        if self.closing:
            return
        self._out_bytes += len(frame) if type(frame) is bytes else sum(map(len, frame))  # type: ignore[arg-type]
        if self._out.push(frame):
            # Responses finishing in the same loop turn (a group commit releases many) go out in one write.
            self.loop.call_soon(self._flush)  # type: ignore[union-attr]

    def _flush(self) -> None:
        held_back = self._out_bytes >= self.limits.max_response_bytes
        self._write_out()
        if held_back and not self.closing:
            # Reading stopped for this turn's answers; the transport has them now (and pauses
            # writing, which keeps reading stopped, if the client does not take them).
            self._update_reading()
            self._process()

    def _write_out(self) -> None:
        transport = None if self.closing else self.transport
        if transport is not None:
            queued = self._out_bytes + transport.get_write_buffer_size()
            if queued > self.server.counters["response_bytes_peak"]:
                self.server.counters["response_bytes_peak"] = queued
        self._out.write(transport)
        self._out_bytes = 0
        self._wake_room()

    def _queued_bytes(self) -> int:
        transport = self.transport
        return self._out_bytes + (transport.get_write_buffer_size() if transport is not None else 0)

    async def room(self) -> None:
        """Wait until this connection's queued answers are under ``max_response_bytes``. The
        caller produces and sends its answer in the same step, so it counts before anyone else
        gets room: at most one answer beyond the limit."""
        while not self.closing and self._queued_bytes() >= self.limits.max_response_bytes:
            fut = self.loop.create_future()  # type: ignore[union-attr]
            self._room_waiters.append(fut)
            await fut

    def _wake_room(self) -> None:
        if self._room_waiters and (self.closing or self._queued_bytes() < self.limits.max_response_bytes):
            waiters, self._room_waiters = self._room_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def close(self, reason: str, *, error: bytes | None = None, abort: bool = False) -> None:
        if self.closing:
            return
        self.close_reason = reason
        transport = self.transport
        if transport is None:
            return
        if abort:
            self._out.clear()
            self._out_bytes = 0
        else:
            self._write_out()
        self.closing = True
        self.server._forget(self)
        self._wake_room()
        log.debug("closing connection from %s: %s", self.peer, reason)
        if abort or self.tls_pending:  # mid-TLS-handshake: a plaintext error frame would be noise
            transport.abort()
            return
        if error is not None:
            transport.write(error)
        if self._raw is not None and not self.authed:
            # A graceful TLS close would go on reading (and decrypting) whatever an
            # unauthenticated peer sends until it answers close_notify: read nothing more, and
            # drop the connection once the error and close_notify had a moment to go out.
            transport.close()
            raw = self._raw
            raw.pause_reading()
            self.loop.call_later(PRE_AUTH_CLOSE_GRACE, raw.abort)  # type: ignore[union-attr]
            return
        if self.read_paused:
            transport.resume_reading()  # let close() see EOF/RST normally
        transport.close()

    def check_deadlines(self, now: float) -> None:
        lim = self.limits
        if not self.authed and now - self.created > lim.handshake_timeout:
            server = self.server
            server.counters["handshake_timeouts"] += 1
            server._throttle.warning(
                "handshake timeouts", "closing connection from %s: no authentication within %gs", self.peer, lim.handshake_timeout
            )
            error = p.error_response(p.Op.AUTH, 0, UnauthorizedError.status, "handshake timed out")
            self.close("handshake timeout", error=error)
        elif self.partial_since is not None and not self.blocked and now - self.partial_since > lim.frame_timeout:
            error = p.error_response(p.Op.HELLO, 0, BadRequestError.status, "incomplete frame timed out")
            self.close("frame timeout", error=error)
        elif not self.in_flight and now - self.last_activity > lim.idle_timeout:
            self.close("idle timeout")
