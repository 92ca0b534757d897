"""The agent's protocol server: authenticated, pipelined access to the segment store over TCP/TLS.

This module is the listening server and its life: start, stop, the deadlines' reaper, the
counters, and what a failed store means. The rest lives in rooms of its own: which connections
are taken in (admission.py), one connection's handshake, frames, back-pressure and answers
(connection.py), how each request runs (dispatch.py) and what it does (handlers.py); the limits
are limits.py's.

When the store reports a failed fsync the server stops accepting and drops every connection —
it never acknowledges what may be lost — and ``failure`` / ``wait_stopped`` let the caller exit
non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from dlctl.log.auth import DEFAULT_CONTEXT, ServerHandshake
from dlctl.log.errors import AgentIOError
from dlctl.log.tls import TlsFiles, bound_context
from dlctl.logthrottle import LogThrottle

from .admission import Admission
from .connection import Connection
from .dispatch import ServingConnection
from .fdlimit import descriptor_usage
from .handlers import RequestHandlers
from .limits import ServerLimits
from .metrics import AgentMetrics

log = logging.getLogger(__name__)

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
        self.segment_puller: Any = None  # dlagent.segment_pull.SegmentPuller once ZooKeeper is up; None: PULL_SEGMENT is refused
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
        self.loop: asyncio.AbstractEventLoop | None = None
        self._conns: set[Connection] = set()
        self.throttle = LogThrottle(log)  # refusals, failed handshakes, bad frames: at most once a second per reason
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
        self.admission = Admission(limits, self.counters, self.throttle, self._conns)
        self.handlers = RequestHandlers(self)

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
        self.loop = asyncio.get_running_loop()
        self._stopped.clear()
        self._prev_on_failure = self.store.on_failure
        self.store.on_failure = self._on_store_failure
        if self.tls is not None:
            self.tls.server()  # unreadable or mismatched files fail the start, not the first client
        self._server = await self.loop.create_server(self._new_conn, self.host, self.port, reuse_address=True, backlog=512)
        self._reaper = self.loop.create_task(self._reap(), name="agent-server-reaper")
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
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.fail, exc)
        if self._prev_on_failure is not None:
            self._prev_on_failure(exc)

    def fail(self, exc: BaseException) -> None:
        """The store failed (``exc``): stop serving at once."""
        if self.failure is not None:
            return
        self.failure = exc
        log.critical("segment store failed (%s); the agent stops serving", exc)
        # abort, not close: nothing still buffered may reach a client once durability is in doubt
        self._shutdown(reason="segment store failed", abort=True)

    @property
    def accepting(self) -> bool:
        """Whether a new connection may be served (listening, and the store has not failed)."""
        return self.failure is None and self._server is not None

    def handshake(self, server_cert_der: bytes | None) -> ServerHandshake:
        """A new connection's HELLO/AUTH handshake; under TLS its proofs are bound to the
        certificate this session presented (``server_cert_der``)."""
        return ServerHandshake(self._secret, bound_context(self._auth_context, server_cert_der))

    def _new_conn(self) -> asyncio.Protocol:
        return ServingConnection(self)

    async def _reap(self) -> None:
        lim = self.limits
        interval = max(0.05, min(1.0, lim.handshake_timeout / 4, lim.frame_timeout / 4, lim.idle_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self._conns):
                conn.check_deadlines(now)
            self.throttle.flush()

    def stat(self) -> dict[str, Any]:
        return {
            **self.counters,
            "open_connections": len(self._conns),
            "authenticated_connections": self.admission.authenticated,
            "unauthenticated_connections": len(self.admission.unauthenticated),
            "log_lines_suppressed": self.throttle.suppressed,
            **descriptor_usage(),
        }

