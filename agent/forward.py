"""Forwarding appends to a log's owner for clients that cannot reach it (APPEND with FORWARD).

A gray partition cuts producers off from a log's owner while the owner keeps its ZooKeeper
session, so no other agent takes the log over: producers would get no acknowledgement for the
whole cut. A producer that cannot reach the owner sends its requests to another agent of its
region with FORWARD instead (DistributedLog's "redirect through direct TCP connections"); that
agent, neither owning nor claiming the log, sends them on to the owner over its own connection
and relays each answer, errors included.

Order. Requests arrive here in the producer's order and are sent on, in that order, on one
connection to the owner. When that connection is lost, nothing more is sent until every request
in flight on it has been answered (failed): a failed request sets its producer's order barrier
(as at an owner), so a later request of that producer can never overtake it on a new
connection. Exactly once: an idempotent request carries its producer id, epoch and sequence
number to the owner, which deduplicates it however it came.

The owner is looked up in ZooKeeper when forwarding starts and again after the owner answers
NOT_OWNER or cannot be reached. When no other agent owns the log, the queued requests are
handed to this agent's own write path (which claims the log).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from typing import Any

from dlctl.log.dlsn import DLSN
from dlctl.log.errors import AgentError, AgentUnavailableError, NotOwnerError
from dlctl.log.ownership import owner_info

log = logging.getLogger(__name__)

IDLE_SECONDS = 10.0  # a forwarder with nothing to send for this long ends (the next request looks the owner up again)


class Forwarder:
    """The requests of one log being forwarded from this agent (``proxy``: its WriteProxy)."""

    def __init__(self, proxy: Any, name: str) -> None:
        self.proxy = proxy
        self.name = name
        self.queue: deque[Any] = deque()
        self.owner: str | None = None  # node id of the owner, once looked up
        self.client: Any = None
        self.connection: object | None = None  # the connection requests go out on (None: open one first)
        self.in_flight = 0
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def put(self, request: Any) -> None:
        self.queue.append(request)
        self._wake.set()

    def close(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        try:
            while True:
                if not self.queue or (self.connection is None and self.in_flight):
                    # Nothing to send, or a lost connection whose requests are still settling.
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), IDLE_SECONDS)
                    except TimeoutError:
                        if not self.queue and not self.in_flight:
                            return
                    continue
                if self.connection is None and not await self._connect():
                    if self.owner is None:
                        return  # handed to the local write path
                    continue
                self._send(self.queue.popleft())
        except asyncio.CancelledError:
            pass
        finally:
            if self.proxy._forwards.get(self.name) is self:
                del self.proxy._forwards[self.name]
            self._fail_queued(AgentUnavailableError(f"agent {self.proxy.node_id} stopped forwarding appends to log {self.name!r}"))

    async def _connect(self) -> bool:
        """Find the owner and open a connection to it. False: no connection (the queued requests
        were failed, or handed to the local write path when no other agent owns the log)."""
        loop = asyncio.get_running_loop()
        try:
            current = await loop.run_in_executor(None, self.proxy.meta.owner_of, self.name)
        except Exception as exc:  # noqa: BLE001 - ZooKeeper out of reach: the client retries
            self._fail_queued(AgentUnavailableError(f"agent {self.proxy.node_id} cannot look up the owner of log {self.name!r}: {exc}"))
            return False
        node = owner_info(current[0]).get("node") if current else None
        if node is None or node == self.proxy.node_id:
            # Nobody else owns it (any more): this agent serves the requests itself.
            self.owner = None
            if self.proxy._forwards.get(self.name) is self:
                del self.proxy._forwards[self.name]
            while self.queue:
                self.proxy.enqueue(self.name, self.queue.popleft())
            return False
        self.owner = node
        try:
            self.client = await self.proxy.pool.client(node)
            await self.client.connect()
            self.connection = self.client.connection
            if self.connection is None:
                raise AgentUnavailableError("the connection was lost at once")
        except AgentError as exc:
            # Nothing was sent: as definite as a NOT_OWNER answer (the client keeps this agent,
            # waits, and retries, until the owner is reachable again or its session ends).
            address = owner_info(current[0]).get("address")  # type: ignore[index]
            self._fail_queued(NotOwnerError(f"log {self.name!r} is owned by {node}, which agent {self.proxy.node_id} cannot reach either: {exc.message}", owner=address))
            return False
        log.info("forwarding appends to log %r to its owner %s", self.name, node)
        return True

    def _send(self, request: Any) -> None:
        proxy = self.proxy
        if proxy.held_back(request, self.name):
            return
        body, count, reset = request.wire
        producer, epoch, seq = request.mark if request.mark is not None else (request.key[0], None, None)
        try:
            reply = self.client.append_on(
                self.connection, self.name, producer, count, body, reset_order=reset, epoch=epoch, seq=seq, retry=request.retry
            )
        except AgentError:  # the connection went away: nothing was sent; retry it on the next one
            self.queue.appendleft(request)
            self.connection = None
            return
        self.in_flight += 1
        proxy.counters["forwarded"] += 1
        reply.add_done_callback(functools.partial(self._answered, request))

    def _answered(self, request: Any, reply: asyncio.Future[list[tuple[int, int, int]]]) -> None:
        self.in_flight -= 1
        self._wake.set()
        error = AgentUnavailableError("forwarded append cancelled") if reply.cancelled() else reply.exception()
        if error is None:
            if not request.result.done():
                request.result.set_result([DLSN(*position) for position in reply.result()])
            return
        if isinstance(error, (AgentUnavailableError, NotOwnerError)):
            self.connection = None  # look the owner up again before sending more
        self.proxy._fail(request, error if isinstance(error, AgentError) else AgentError(f"forwarding to {self.owner}: {error}"))

    def _fail_queued(self, error: AgentError) -> None:
        while self.queue:
            self.proxy._fail(self.queue.popleft(), error)
