"""A producer that cannot reach the agent it chose moves on to the others (``LogProducer._connect``).

Found in CI (test_exactly_once, a partition of the producers from the owner and from ZooKeeper):
a connect that times out takes seconds, the read of the availability records after it waits
too while ZooKeeper is out of reach, and the unreachable agent's suspicion (one second) has run
out by the time the next agent is chosen. The same agent, first by rank, was chosen again and
again; the records waited for the whole retry timeout though another agent could take them (and
forward them to the owner). Here time is scaled down: a suspicion shorter than the backoff.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from dlctl.log.dlsn import DLSN
from dlctl.log.errors import AgentUnavailableError
from dlctl.log.producer import LogProducer, ProducerOptions
from test_producer_no_spin import FakePool  # the pool the producer asks for a node's client, no I/O


class Unreachable:
    """An agent behind a partition: every connect fails after a while."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.connection = None
        self.connects = 0

    async def connect(self) -> None:
        self.connects += 1
        await asyncio.sleep(0.01)  # the connect timeout, scaled down
        raise AgentUnavailableError(f"connecting to agent {self.address} timed out")


class Accepting:
    """A reachable agent (the owner, or one that forwards to it): every APPEND is stored."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.connection = object()
        self.appends = 0

    async def connect(self) -> None:
        pass

    def append_on(self, connection: object, name: str, producer_id: int, count: int, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        self.appends += 1
        reply = asyncio.get_running_loop().create_future()
        reply.set_result([(7, self.appends, slot) for slot in range(count)])
        return reply


def test_an_agent_that_cannot_be_reached_is_not_chosen_again_before_the_others_are_tried():
    names = ["a", "b", "c"]
    options = ProducerOptions(retry_timeout=60, suspect_seconds=0.001)  # runs out before the next choice
    first = LogProducer(SimpleNamespace(cluster="c"), FakePool({n: Accepting(n) for n in names}), "orders", options=options).router.choose("orders")
    clients: dict[str, Any] = {n: (Unreachable(n) if n == first else Accepting(n)) for n in names}

    async def scenario() -> tuple[DLSN, dict[str, int]]:
        producer = LogProducer(SimpleNamespace(cluster="c"), FakePool(clients), "orders", options=options)
        try:
            return await asyncio.wait_for(producer.submit(b"x"), 5.0), producer.stats
        finally:
            await producer.close()

    dlsn, stats = asyncio.run(scenario())
    assert dlsn.segment_seq == 7
    assert stats["unreachable"] == 1
    assert clients[first].connects == 1, f"the unreachable first choice was tried {clients[first].connects} times before the others"
    assert sum(c.appends for n, c in clients.items() if n != first) == 1
