"""One connection of a client to an agent: frame parsing, dispatch of each response to its
request by id, coalesced writes, flow control and the sweep of request deadlines.

``dlctl.log.client.AgentClient`` opens and authenticates these and builds its requests on
them; this module knows frames, request ids and deadlines, never what a request means. A
request waits on an ``asyncio.Future`` or, on the writer's hot path, a ``Callback``: either is
completed by the response, by its deadline, or by the connection's loss.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from . import protocol as p
from .errors import AgentError, AgentUnavailableError
from .frame_reader import FrameReader

log = logging.getLogger(__name__)


class RequestTimeout(AgentUnavailableError):
    """A request's deadline passed (the public error names the op and the timeout)."""


class Callback:
    """A request completed by a plain function, called right where its response is parsed (or
    its deadline swept, or the connection lost): no task, no future, no loop turn. Stands in
    for the Future in ``Connection.pending``, so it has the three methods used there."""

    __slots__ = ("_fn", "_done")

    def __init__(self, fn: Callable[[p.Frame | None, BaseException | None], None]) -> None:
        self._fn = fn
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, frame: p.Frame) -> None:
        self._finish(frame, None)

    def set_exception(self, exc: BaseException) -> None:
        self._finish(None, exc)

    def _finish(self, frame: p.Frame | None, exc: BaseException | None) -> None:
        self._done = True
        try:
            self._fn(frame, exc)
        except Exception:  # noqa: BLE001 - a broken caller must not break the connection's reader
            log.exception("request completion callback failed")


class Connection(asyncio.BufferedProtocol):
    """One TCP/TLS connection: frame parsing, response dispatch, coalesced writes. The transport
    writes what it receives into the reader's buffers (``dlctl.log.frame_reader``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, where: str) -> None:
        self.loop = loop
        self.where = where
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader(self._dispatch, body_for=self._body_for)
        self.into: dict[int, bytearray] = {}  # buffers lent for the answers to these requests (``_call``)
        self.pending: dict[int, asyncio.Future[p.Frame] | Callback] = {}
        # Deadlines are swept by one timer per connection rather than one timer per request:
        # arming and cancelling a TimerHandle per request costs more than the request itself.
        self.deadlines: dict[int, float] = {}
        self._sweep_at: float | None = None
        self._sweep_handle: asyncio.TimerHandle | None = None
        self.hello: asyncio.Future[p.Frame] = loop.create_future()
        self.ready = False  # authenticated and not lost
        self.lost = False
        self._out = p.OutQueue()
        self._writable: asyncio.Future[None] | None = None

    # asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self.reader.received(nbytes)
        except p.ProtocolError as exc:
            self.abort(f"agent {self.where} sent an invalid frame: {exc}")

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection to agent {self.where} lost" + (f": {exc}" if exc else "")
        self.fail_all(reason)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None:
            if not self._writable.done():
                self._writable.set_result(None)
            self._writable = None

    # -------------------------------------------------------------------------------------------
    def _body_for(self, request_id: int, size: int) -> memoryview | None:
        """Where the large answer to ``request_id`` is received: the buffer lent for it, if it fits."""
        if self.into:
            buf = self.into.pop(request_id, None)
            if buf is not None and len(buf) >= size:
                return memoryview(buf)[:size]
        return None

    def _dispatch(self, frame: p.Frame) -> None:
        if not frame.opcode & p.RESPONSE:
            raise p.ProtocolError(f"request frame (opcode {frame.opcode}) from the agent", fatal=True)
        if frame.request_id == 0:
            if not self.hello.done():
                self.hello.set_result(frame)
                return
            # A connection-level error (the agent could not frame our bytes, or is shutting down).
            try:
                p.decode_response(frame)
                message = "unexpected frame with request id 0"
            except AgentError as exc:
                message = exc.message
            self.abort(f"agent {self.where} closed the connection: {message}")
            return
        fut = self.pending.pop(frame.request_id, None)
        if self.into:
            self.into.pop(frame.request_id, None)  # a small answer (an error): the buffer was not used
        if fut is not None:  # absent: it timed out or was cancelled
            self.deadlines.pop(frame.request_id, None)
            if not fut.done():
                fut.set_result(frame)

    def fail_all(self, reason: str) -> None:
        self.ready = False
        self.lost = True
        pending, self.pending = self.pending, {}
        self.deadlines.clear()
        self.into.clear()
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        for fut in itertools.chain(pending.values(), (self.hello,)):
            if not fut.done():
                fut.set_exception(AgentUnavailableError(reason))
        self.resume_writing()

    def abort(self, reason: str) -> None:
        self.fail_all(reason)
        if self.transport is not None:
            self.transport.abort()

    def send(self, frame: p.Outgoing) -> None:
        if self._out.push(frame):
            # Coalesce every frame queued in this loop iteration into one write.
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        transport = self.transport
        if self.lost or transport is None or transport.is_closing():
            transport = None  # going: connection_lost fails what was waiting for these frames
        self._out.write(transport)

    def flush_now(self) -> None:
        """Write what is queued now rather than at the end of this loop turn (the call_soon
        scheduled by ``send`` then finds nothing left)."""
        if self._out:
            self._flush()

    @property
    def held_back(self) -> bool:
        """Whether flow control holds writes back (the transport's buffer is full)."""
        return self._writable is not None

    async def writable(self) -> None:
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def track(self, request_id: int, fut: asyncio.Future[p.Frame] | Callback, timeout: float) -> None:
        deadline = self.loop.time() + timeout
        self.pending[request_id] = fut
        self.deadlines[request_id] = deadline
        if self._sweep_at is None or deadline < self._sweep_at:
            self._arm(deadline)

    def forget(self, request_id: int) -> None:
        self.pending.pop(request_id, None)
        self.deadlines.pop(request_id, None)
        self.into.pop(request_id, None)

    def _arm(self, when: float) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        self._sweep_at = when
        self._sweep_handle = self.loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        self._sweep_at = self._sweep_handle = None
        now = self.loop.time()
        later = None
        for rid, deadline in list(self.deadlines.items()):
            if deadline <= now:
                del self.deadlines[rid]
                fut = self.pending.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_exception(RequestTimeout(f"request {rid} to agent {self.where} timed out"))
            elif later is None or deadline < later:
                later = deadline
        if later is not None and not self.lost:
            self._arm(later)
