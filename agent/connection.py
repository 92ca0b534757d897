"""One client connection of the protocol server: admission, TLS, the HELLO/AUTH handshake,
frames in, back-pressure, answers out, closing and deadlines. What a request does and how it
runs is ``ServingConnection``'s (dispatch.py), the class the server builds.

The agent sends HELLO with a challenge; the first request must be AUTH (anything else, or a
wrong proof, gets UNAUTHORIZED and the connection is closed). Until then a frame may be only a
few KiB (a larger length prefix closes the connection before its body is read), and the
handshake has a deadline. Under mutual TLS the connection is admitted as plain TCP first and
upgraded only then, so a TLS handshake counts in the pre-authentication budgets (admission.py)
like any other unauthenticated connection.

Requests in flight per connection are bounded (count and bytes); past the bound the connection
stops reading from its socket, which pushes back on the client through TCP. Answers count too:
a connection whose answers the client has not taken yet (queued here or in the transport) reach
``max_response_bytes`` is not read from until they drain, and reads that wait (long polls,
fencing reads) read their entry only when there is ``room``, so a few bytes of pipelined
requests cannot make the agent buffer hundreds of MiB of answers. Answers finishing in the same
event-loop turn go out in one write.

Hostile input costs a typed error or a closed connection: frames are bounds-checked before
anything is buffered; partial frames, silent handshakes and idle connections are timed out.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from dlctl.errors import ConfigError
from dlctl.log import protocol as p
from dlctl.log.auth import ServerHandshake
from dlctl.log.errors import AgentUnavailableError, BadRequestError, UnauthorizedError

from .proxy import Barrier, Hold

if TYPE_CHECKING:
    from .server import AgentServer

log = logging.getLogger("dlagent.server")  # the server's logger, as before the split: log filters name it

MAX_TLS_REFUSALS = 16  # refused connections told why inside TLS at once (each costs a handshake)
REFUSAL_HANDSHAKE_SECONDS = 2.0
PRE_AUTH_CLOSE_GRACE = 0.2  # seconds an unauthenticated TLS connection has to take its error


class Connection(asyncio.Protocol):
    """One client connection: handshake, frame parsing, back-pressure, coalesced answers.
    Subclasses say what an authenticated request does (``dispatch``)."""

    def __init__(self, server: AgentServer) -> None:
        self.server = server
        self.store = server.store
        self.limits = server.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_ip = "?"
        self.registered = False  # counted in the server's admission bookkeeping
        # Until AUTH succeeds a frame may be only a few KiB: a larger length prefix is refused
        # before its body is read (_authenticate raises it to max_frame).
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
        self._observe = server.metrics.request  # (op, seconds): once per request, when answered
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.barrier = Barrier()  # write proxy: (producer, log) pairs whose appends failed
        self.hold = Hold(self._unhold)  # write proxy: held while a log it writes to is full
        # FLAG_COMPRESS: refused as unknown when switched off ([server] compression = false), as
        # by an agent that predates it.
        self._refuse = 0 if self.limits.compression else p.FLAG_COMPRESS
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
        if not server.accepting:
            transport.abort()
            return
        refusal = server.admission.admit(self)
        if refusal is not None:
            server.admission.refused(self, refusal)
            error = p.error_response(p.Op.HELLO, 0, AgentUnavailableError.status, refusal)
            if server.tls is None:
                self.closing = True
                transport.write(error)
                transport.close()
            elif server.admission.refusing < MAX_TLS_REFUSALS:
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
        server.admission.refusing += 1
        try:
            transport, _ = await self._tls_handshake(raw, min(self.limits.handshake_timeout, REFUSAL_HANDSHAKE_SECONDS))
        except (ssl.SSLError, OSError, ConnectionError, TimeoutError, ConfigError, RuntimeError):
            self.closing = True
            raw.abort()
            return
        finally:
            server.admission.refusing -= 1
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
        self.handshake = self.server.handshake(server_cert_der)
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
                    server.throttle.warning("TLS handshake failures", "TLS handshake with %s failed: %s", self.peer, str(exc) or type(exc).__name__)
            self.closing = True
            server.admission.forget(self)
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
        self.server.admission.forget(self)
        self._out.clear()
        self._out_bytes = 0
        self._wake_room()
        for task in self.tasks:
            # Long polls are pure waits; adds, fences and deletes run to completion so the store
            # never sees an operation abandoned half-way. A segment pull stops between batches
            # (a batch already handed to the store is still written): whoever asked for it is
            # gone and will not verify it, and a re-run clears the segment before copying again.
            if task.get_name() in ("long-poll", "pull-segment"):
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

    # Reading frames, back-pressure and the handshake's requests ---------------------------------
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
            server.throttle.warning("bad frames before authentication", "closing connection from %s before authentication: %s", self.peer, exc)
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
        self.dispatch(op, flags, rid, args, started)

    def dispatch(self, op: p.Op, flags: int, rid: int, args: tuple[Any, ...], started: float) -> None:
        """Run an authenticated request (``started``: its perf_counter when it was read)."""
        raise NotImplementedError

    def _authenticate(self, rid: int, client_nonce: bytes, proof: bytes) -> None:
        assert self.handshake is not None
        try:
            server_proof = self.handshake.verify(client_nonce, proof)
        except UnauthorizedError as exc:
            self.server.counters["auth_failures"] += 1
            self.server.throttle.warning("failed authentications", "authentication of %s failed: %s", self.peer, exc.message)
            self.close("authentication failed", error=p.error_response(p.Op.AUTH, rid, exc.status, exc.message))
            return
        server = self.server
        if not server.admission.promote(self):
            why = server.admission.full()
            server.admission.refused(self, why)
            self.close(why, error=p.error_response(p.Op.AUTH, rid, AgentUnavailableError.status, why))
            return
        self.handshake = None
        self.decoder.max_frame = self.limits.max_frame
        self.send(p.ok_response(p.Op.AUTH, rid, server_proof))

    def _reject_unauthenticated(self, op: int, rid: int, why: str) -> None:
        self.server.counters["auth_failures"] += 1
        self.server.throttle.warning("requests before authentication", "closing connection from %s: %s", self.peer, why)
        self.close(why, error=p.error_response(op, rid, UnauthorizedError.status, f"authenticate first ({why})"))

    # In flight ----------------------------------------------------------------------------------
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

    def _unhold(self) -> None:
        if not self.closing:
            self._update_reading()
            self._process()

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
        self.server.admission.forget(self)
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
            server.throttle.warning(
                "handshake timeouts", "closing connection from %s: no authentication within %gs", self.peer, lim.handshake_timeout
            )
            error = p.error_response(p.Op.AUTH, 0, UnauthorizedError.status, "handshake timed out")
            self.close("handshake timeout", error=error)
        elif self.partial_since is not None and not self.blocked and now - self.partial_since > lim.frame_timeout:
            error = p.error_response(p.Op.HELLO, 0, BadRequestError.status, "incomplete frame timed out")
            self.close("frame timeout", error=error)
        elif not self.in_flight and now - self.last_activity > lim.idle_timeout:
            self.close("idle timeout")
