"""The producer's sender (``LogProducer._run``) never cycles without yielding to the event loop.

A test process once sat at 100% CPU for 40 minutes in ``LogProducer._connect``: the sender
awaited only finished futures, so no timer (not even the harness's own timeout) and no I/O
callback ever ran again. Each scenario here runs on its own loop in a thread, under a hard
deadline: a sender that spins fails the test (the fake pool then breaks the spin) rather than
hanging the run.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from dlctl.log import protocol as p
from dlctl.log.client import AgentClient
from dlctl.log.dlsn import DLSN
from dlctl.log.errors import NotOwnerError
from dlctl.log.producer import LogProducer, ProducerOptions

DEADLINE = 10.0  # seconds a scenario may take before its loop is taken to be spinning


class Spinning(Exception):
    """Raised into a spinning sender by the fake pool, once the deadline has passed."""


class FakePool:
    """The pool the producer asks for a node's client: ``clients`` by node id, no I/O."""

    def __init__(self, clients: dict[str, Any]) -> None:
        self.clients = clients
        self.meta = SimpleNamespace(cluster="c")
        self.stop = threading.Event()  # set from the test's thread: the next lookup breaks the spin

    @property
    def nodes(self) -> dict[str, dict]:
        return {n: {"address": c.address} for n, c in self.clients.items()}

    async def refresh(self) -> dict[str, dict]:
        return self.nodes

    async def client(self, node_id: str) -> Any:
        if self.stop.is_set():
            raise Spinning("the sender did not yield to the event loop")
        return self.clients[node_id]


def run_within_deadline(pool: FakePool, scenario: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """``scenario()`` on a new loop in a thread; fails the test if the loop is still busy after
    ``DEADLINE`` seconds (its timers never fired)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = asyncio.run(scenario())
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="producer-scenario", daemon=True)
    thread.start()
    thread.join(DEADLINE)
    if thread.is_alive():
        pool.stop.set()
        thread.join(DEADLINE)
        pytest.fail(f"the producer's sender kept the event loop busy for {DEADLINE:g}s without yielding (its timers never fired)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


class AnsweringConnection:
    """What ``AgentClient.append_on`` needs of a ``dlctl.log.connection.Connection``: every
    APPEND is answered with a position on the next loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ready, self.lost, self.transport = True, False, None
        self.pending: dict[int, asyncio.Future[p.Frame]] = {}

    def track(self, rid: int, fut: asyncio.Future[p.Frame], limit: float) -> None:
        self.pending[rid] = fut

    def forget(self, rid: int) -> None:
        self.pending.pop(rid, None)

    def send(self, frame: object) -> None:
        for rid, fut in list(self.pending.items()):
            body = p.OK_PREAMBLE + p.encode_dlsns([DLSN(1, rid, 0)])
            self.loop.call_soon(fut.set_result, p.Frame(p.Op.APPEND | p.RESPONSE, 0, rid, body))
        self.pending.clear()


def test_a_connection_another_caller_just_opened_is_waited_for_not_spun_on():
    # Producers share the pool's client of an agent. When one's connection attempt finishes,
    # AgentClient._connect_done (which installs the connection) is queued behind whatever task
    # runs next: another producer then gets the attempt's result from connect() without
    # suspending, and no connection from ``client.connection``.
    client = AgentClient("127.0.0.1", 9, b"s" * 32, name="a")
    pool = FakePool({"a": client})

    async def scenario() -> tuple[DLSN, bool]:
        loop = asyncio.get_running_loop()
        producer = LogProducer(pool.meta, pool, "orders")
        producer.router._refreshed = time.monotonic()  # the agents were just read: routing awaits nothing
        attempt: asyncio.Future[Any] = loop.create_future()  # another producer's, under way
        client._connecting = attempt
        attempt.add_done_callback(client._connect_done)
        acknowledged = producer.submit(b"x")  # the sender's first step is queued ...
        attempt.set_result(AnsweringConnection(loop))  # ... and _connect_done behind it
        ticked = asyncio.Event()
        loop.call_later(0.01, ticked.set)
        dlsn = await asyncio.wait_for(acknowledged, 2.0)
        await asyncio.wait_for(ticked.wait(), 1.0)
        await producer.close()
        await client.close()
        return dlsn, ticked.is_set()

    dlsn, ticked = run_within_deadline(pool, scenario)
    assert dlsn == DLSN(1, 1, 0) and ticked


class NamingTheOther:
    """An agent that answers every APPEND with NOT_OWNER naming ``other`` as the owner, either
    as an answer (a failed future) or, as no real client does, raised at once."""

    def __init__(self, address: str, other: str, *, raised: bool) -> None:
        self.address, self.other, self.raised = address, other, raised
        self.connection = object()
        self.appends = 0

    async def connect(self) -> None:
        pass

    def append_on(self, connection: object, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        self.appends += 1
        error = NotOwnerError(f"agent {self.address} does not own the log", owner=self.other)
        if self.raised:
            raise error
        reply = asyncio.get_running_loop().create_future()
        reply.set_exception(error)
        return reply


@pytest.mark.parametrize("raised", [False, True], ids=["answered", "raised"])
def test_two_agents_naming_each_other_as_owner_are_asked_at_a_backed_off_rate(raised):
    # No new information after the first hop: each agent names the one the producer just
    # left. Without a backoff the sender asks them in a tight loop (one that never yields when
    # the refusal needs no loop turn), for the whole retry timeout.
    a = NamingTheOther("10.0.0.1:3181", "10.0.0.2:3181", raised=raised)
    b = NamingTheOther("10.0.0.2:3181", "10.0.0.1:3181", raised=raised)
    pool = FakePool({"a": a, "b": b})

    async def scenario() -> int:
        producer = LogProducer(pool.meta, pool, "orders", options=ProducerOptions(retry_timeout=60))
        producer.router._refreshed = time.monotonic()
        acknowledged = producer.submit(b"x")
        await asyncio.sleep(0.5)
        assert producer._task is not None and not acknowledged.done()
        producer._task.cancel()
        await asyncio.gather(producer._task, return_exceptions=True)
        return a.appends + b.appends

    asked = run_within_deadline(pool, scenario)
    # backoff_initial 0.02 doubling to backoff_max 0.25 (x 0.5..1): about 7 asks in 0.5 s.
    assert 2 <= asked <= 20, f"{asked} APPENDs in 0.5 s to two agents naming each other as the owner"
