"""Exactly-once appends through write proxies against real agents and ZooKeeper.

Idempotent APPENDs, request by request (dlctl.log.idempotence):
a resend is answered with the positions its records got the first time and stored once; zombie
epochs, gaps and unknown producers are refused with nothing written; the deduplication state
survives two owner changes in a row (a SIGKILLed owner, then a graceful handoff), rebuilt from
the log each time; a resend from a producer idle past ``producer_id_ttl`` is refused, not stored
twice. The log is read back from the agents (``read_back``), not from the proxy's answers.

Forwarding (dlagent.forward): producers cut off from a live owner (a gray partition: the owner
keeps its ZooKeeper session, so nobody takes the log over) keep appending through another
agent, which forwards their requests to the owner — exactly once and in order. Only the
producers' view of the owner is cut: they reach every agent through a fault proxy of its own
(``CutOffPool``), and the test blackholes the owner's. The control runs the same cut with
forwarding off: no acknowledgement during the cut, which shows the test can tell."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from dlctl.log.client import AgentClient
from dlctl.log.errors import AgentUnavailableError, NotOwnerError, OutOfOrderSequenceError, ProducerFencedError, UnknownProducerError
from dlctl.log.ownership import owner_info
from dlctl.log.pool import AgentPool
from dlctl.log.producer import LogProducer, ProducerOptions
from dlctl.log.records import encode_record
from dlctl.meta.records import LogConfig
from dlctl.meta.store import MetaStore
from harness.agents import DEFAULT_SECRET, AgentNode, harness_credentials
from harness.faultproxy import FaultNetwork, FaultProxy
from harness.logcluster import agent_cluster, eventually, healed_env, read_back, run, solo_agent

pytestmark = [pytest.mark.zk, pytest.mark.agent]

PRODUCER = 0x5EED
PRODUCERS = 4
CUT_SECONDS = 6.0


class CutOffPool(AgentPool):
    """An ``AgentPool`` that reaches each agent through a fault proxy of its own (the producers'
    links only: the agents talk to each other directly)."""

    def __init__(self, meta, net: FaultNetwork) -> None:
        super().__init__(meta, harness_credentials(), request_timeout=1.5)
        self.net = net
        self.proxies: dict[str, FaultProxy] = {}

    def connect_to(self, node_id: str, info: dict) -> tuple[str, int]:
        target = super().connect_to(node_id, info)
        proxy = self.proxies.get(node_id)
        if proxy is None or proxy.target != target:
            proxy = self.proxies[node_id] = self.net.proxy(target, node=node_id, client_node=f"producers-{id(self)}")
        return proxy.host, proxy.port


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    yield from agent_cluster(zk_server, tmp_path_factory.mktemp("idempotent-agents"), "idempotent", nodes=("n1", "n2", "n3", "n4"))


@pytest.fixture
def env(cluster, request):
    yield from healed_env(cluster, request.node.name)


def records(tag: str, count: int) -> bytes:
    return b"".join(encode_record(f"{tag}-{i}".encode()) for i in range(count))


def client_of(node: AgentNode, **options) -> AgentClient:
    return AgentClient(node.host, node.port, DEFAULT_SECRET, tls=node.client_tls, **options)


def owner_of(meta: MetaStore, name: str) -> str | None:
    current = meta.owner_of(name)
    return owner_info(current[0]).get("node") if current else None


async def payloads(env, meta: MetaStore | None = None) -> list[bytes]:
    meta = meta or env.meta()
    pool = env.pool(meta)
    try:
        return [r.payload for _, r in await read_back(meta, pool, env.name)]
    finally:
        await pool.close()


async def duplicates_answered(cluster, node: str) -> int:
    async with client_of(cluster.agents[node]) as client:
        return (await client.stat())["proxy"]["duplicate_requests"]


def test_a_resent_request_is_answered_with_its_first_positions_and_stored_once(env, cluster):
    env.create_log()

    async def scenario():
        async with client_of(cluster.agents["n1"]) as client:
            first = await client.append(env.name, PRODUCER, 3, records("a", 3), epoch=0, seq=1)
            owner = owner_of(env.meta(), env.name)
            before = await duplicates_answered(cluster, owner)
            again = await client.append(env.name, PRODUCER, 3, records("a", 3), epoch=0, seq=1, retry=True)
            after = await duplicates_answered(cluster, owner)
            following = await client.append(env.name, PRODUCER, 1, records("b", 1), epoch=0, seq=2)
        return first, again, following, after - before

    first, again, following, answered = run(scenario())
    assert again == first, "a resend gets the positions of the first copy"
    assert answered == 1
    assert following[0] > first[-1]
    assert run(payloads(env)) == [b"a-0", b"a-1", b"a-2", b"b-0"], "each record exactly once"


def test_a_zombie_epoch_a_gap_and_an_unknown_producer_are_refused_and_write_nothing(env, cluster):
    env.create_log()

    async def scenario():
        refusals = []
        async with client_of(cluster.agents["n2"]) as client:

            async def refused(expected, tag: str, **mark) -> None:
                with pytest.raises(expected) as err:
                    await client.append(env.name, mark.pop("producer", PRODUCER), 1, records(tag, 1), reset_order=True, **mark)
                refusals.append(err.value.message)

            await client.append(env.name, PRODUCER, 1, records("e0", 1), epoch=0, seq=1)
            await client.append(env.name, PRODUCER, 1, records("e0-second", 1), epoch=0, seq=2)
            await client.append(env.name, PRODUCER, 1, records("e1", 1), epoch=1, seq=1, reset_order=True)  # the new incarnation
            await refused(ProducerFencedError, "zombie", epoch=0, seq=3)
            await refused(OutOfOrderSequenceError, "gap", epoch=1, seq=3)
            await refused(UnknownProducerError, "unknown", producer=PRODUCER + 1, epoch=0, seq=2)
            await refused(UnknownProducerError, "unknown-retry", producer=PRODUCER + 1, epoch=0, seq=1, retry=True)
        return refusals

    refusals = run(scenario())
    assert all("nothing written" in message for message in refusals), refusals
    assert run(payloads(env)) == [b"e0-0", b"e0-second-0", b"e1-0"], "no refused request left a record"


def test_a_zombie_producer_paused_then_resumed_cannot_append(env, cluster):
    """Two incarnations of one producer id (``LogProducer(producer_id=, epoch=)``): the older
    one is paused (sends nothing) while the newer one appends; resumed, the older one's
    records fail with ProducerFencedError and none of them is stored."""
    env.create_log()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta)
        try:
            zombie = LogProducer(meta, pool, env.name, producer_id=PRODUCER, epoch=3)
            await zombie.append(b"zombie-before")
            successor = LogProducer(meta, pool, env.name, producer_id=PRODUCER, epoch=4)  # takes the role over
            await successor.append(b"successor")
            late = [zombie.submit(f"zombie-after-{i}".encode()) for i in range(5)]  # resumed
            outcomes = await asyncio.gather(*late, return_exceptions=True)
            await successor.append(b"successor-again")
            await successor.close()
            await zombie.close()
            return outcomes
        finally:
            await pool.close()

    outcomes = run(scenario())
    assert all(isinstance(o, ProducerFencedError) for o in outcomes), outcomes
    assert run(payloads(env)) == [b"zombie-before", b"successor", b"successor-again"]


def test_dedup_state_survives_two_owner_changes_in_a_row(env, cluster):
    """Owner A applies requests 1..3 of a producer and is SIGKILLed (as if the answer to 3 were
    lost with it); B takes the log over, rebuilding the state from the log after recovering A's
    segment, and answers the resend of 3 with its first positions; B then hands the log over
    gracefully and C, rebuilding it again, does the same, and applies 4 once."""
    env.create_log(LogConfig(3, 3, 2))

    async def scenario():
        meta = env.meta()
        first_node = cluster.agents["n1"]
        async with client_of(first_node) as client:
            sent = [await client.append(env.name, PRODUCER, 2, records(f"r{seq}", 2), epoch=0, seq=seq) for seq in (1, 2, 3)]
        owner_a = owner_of(meta, env.name)
        cluster.agents[owner_a].proc.kill()
        others = [n for n in cluster.agents if n != owner_a]

        async def resend_through(node: str) -> list | None:
            async with client_of(cluster.agents[node], request_timeout=30) as client:
                try:
                    return await client.append(env.name, PRODUCER, 2, records("r3", 2), epoch=0, seq=3, retry=True, reset_order=True)
                except NotOwnerError:
                    return None  # the dead owner's session has not expired yet

        via_b = await eventually(lambda: resend_through(others[0]), timeout=20, message="another agent to take the log over")
        owner_b = owner_of(meta, env.name)
        async with client_of(cluster.agents[owner_b]) as client:
            assert await client.release(env.name), "B hands the log over"
        owner_c = next(n for n in others if n != owner_b)
        via_c = await resend_through(owner_c)
        async with client_of(cluster.agents[owner_c]) as client:
            fourth = await client.append(env.name, PRODUCER, 1, records("r4", 1), epoch=0, seq=4)
            fourth_again = await client.append(env.name, PRODUCER, 1, records("r4", 1), epoch=0, seq=4, retry=True)
        return sent, via_b, via_c, fourth, fourth_again, (owner_a, owner_b, owner_of(meta, env.name))

    sent, via_b, via_c, fourth, fourth_again, owners = run(scenario(), timeout=90)
    assert len(set(owners)) == 3, f"three owners in a row: {owners}"
    assert via_b == sent[2] and via_c == sent[2], "both new owners answer the resend with its first positions"
    assert fourth_again == fourth and fourth[0] > sent[2][-1]
    found = run(payloads(env))
    assert Counter(found) == Counter([f"r{seq}-{i}".encode() for seq in (1, 2, 3) for i in range(2)] + [b"r4-0"]), found
    assert found == sorted(found, key=lambda p: (int(p.split(b"-")[0][1:]), p)), "in request order"


def test_an_agent_answers_appends_as_a_write_proxy_from_its_first_connection(zk, procs, tmp_path):
    """The write proxy started after the agent listened and registered: a producer that chose
    the agent at once was told "not a write proxy ([proxy] enabled = false)" (seen in CI, on the
    TTL test below). Here a client connects the moment the port accepts and appends at once."""
    admin = zk.client()
    meta = MetaStore(admin, "c1")
    meta.create_log("first", LogConfig(1, 1, 1))
    node = AgentNode(procs, tmp_path, zk.connect_string, cluster="c1", node_id="solo")
    node.start(wait=False)

    async def first_append() -> list:
        deadline = time.monotonic() + 30
        while True:
            client = client_of(node, connect_timeout=1.0)
            try:
                await client.connect()
            except AgentUnavailableError:
                await client.close()
                assert time.monotonic() < deadline and node.proc.running, "the agent never listened"
                await asyncio.sleep(0.005)
                continue
            try:
                return await client.append("first", PRODUCER, 1, records("first", 1), epoch=0, seq=1)
            finally:
                await client.close()

    assert len(run(first_append())) == 1


def test_a_resend_after_the_producer_id_ttl_is_refused_not_stored_twice(zk, procs, tmp_path):
    node, meta = solo_agent(zk, procs, tmp_path, "ttl", "[proxy]\nproducer_id_ttl = 1\n")

    async def scenario():
        async with client_of(node) as client:
            first = await client.append("ttl", PRODUCER, 1, records("once", 1), epoch=0, seq=1)
            assert await client.append("ttl", PRODUCER, 1, records("once", 1), epoch=0, seq=1, retry=True) == first  # within the TTL

            touched = time.monotonic()  # the producer's last request: its state expires 1 s later
            # The condition is time itself (any request would refresh the state), so wait it out.
            await asyncio.sleep(touched + 1.2 - time.monotonic())
            with pytest.raises(UnknownProducerError) as err:
                await client.append("ttl", PRODUCER, 1, records("once", 1), epoch=0, seq=1, retry=True, reset_order=True)
            return err.value.message

    message = run(scenario())
    assert "producer_id_ttl = 1s" in message and "nothing written" in message
    async def stored() -> list[bytes]:
        pool = AgentPool(meta, harness_credentials())
        try:
            return [r.payload for _, r in await read_back(meta, pool, "ttl")]
        finally:
            await pool.close()

    assert run(stored()) == [b"once-0"]


# -- forwarding through another agent ------------------------------------------------------------


async def forwarded_by(cluster) -> int:
    """Requests the agents forwarded so far (their STAT counters)."""
    total = 0
    for node in cluster.agents.values():
        async with AgentClient(node.host, node.port, harness_credentials().secret, tls=node.client_tls) as client:
            total += (await client.stat())["proxy"]["forwarded"]
    return total


async def cut_owner_off(env, cluster, fault_network: FaultNetwork, *, forward: bool) -> dict:
    """Producers write; the owner is blackholed for CUT_SECONDS (for them only); then healed."""
    meta = env.meta()
    pool = CutOffPool(meta, fault_network)
    options = ProducerOptions(retry_timeout=60, forward_seconds=30 if forward else 0)
    producers = [LogProducer(meta, pool, env.name, options=options) for _ in range(PRODUCERS)]
    acks: dict[int, list] = {c: [] for c in range(PRODUCERS)}  # (seq, dlsn, when acknowledged)
    stop = asyncio.Event()

    async def write(c: int, producer: LogProducer) -> None:
        seq, pending = 0, []
        while not stop.is_set():
            await producer.wait_writable()
            fut = producer.submit(f"p{c}-{seq:06d}".encode())
            fut.add_done_callback(lambda f, s=seq: f.exception() is None and acks[c].append((s, f.result(), time.monotonic())))
            pending.append(fut)
            seq += 1
            if len(pending) > 32:
                await asyncio.wait(pending[:16])
                pending = pending[16:]
        if pending:
            await asyncio.wait(pending)

    forwarded_before = await forwarded_by(cluster)
    tasks = [asyncio.ensure_future(write(c, p)) for c, p in enumerate(producers)]
    try:
        await eventually(lambda: sum(map(len, acks.values())) > 500, timeout=30, message="acks before the cut")
        owner = owner_of(env.meta(), env.name)
        await pool.client(owner)  # its proxy exists
        cut_at = time.monotonic()
        pool.proxies[owner].blackhole(True)
        try:
            await asyncio.sleep(CUT_SECONDS)  # the fault's duration: nothing to wait for but time
        finally:
            pool.proxies[owner].blackhole(False)
        healed_at = time.monotonic()
        await eventually(lambda: any(t > healed_at for a in acks.values() for _, _, t in a), timeout=30, message="acks after healing")
        stop.set()
        await asyncio.gather(*tasks)
        for producer in producers:
            await producer.close()
        forwarded = await forwarded_by(cluster) - forwarded_before
        return {
            "owner": owner,
            "owner_after": owner_of(env.meta(), env.name),
            # Acknowledged while cut off, once the requests in flight at the cut had timed out.
            "during_cut": sum(1 for a in acks.values() for _, _, t in a if cut_at + 3.0 < t < healed_at),
            "acks": acks,
            "forwarded": forwarded,
            "resent": sum(p.stats["resent_requests"] for p in producers),
        }
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await pool.close()


def assert_exactly_once_in_order(env, acks: dict[int, list]) -> int:
    async def stored():
        meta = env.meta()
        pool = env.pool(meta)
        try:
            return await read_back(meta, pool, env.name)
        finally:
            await pool.close()

    records = run(stored())
    where = {r.payload: dlsn for dlsn, r in records}
    counts = Counter(r.payload for _, r in records)
    assert not [p for p, n in counts.items() if n > 1], "a record stored twice"
    total = 0
    for c, acked in acks.items():
        for seq, dlsn, _ in acked:
            key = f"p{c}-{seq:06d}".encode()
            assert where.get(key) == dlsn, f"acknowledged record {key!r} at {dlsn} is at {where.get(key)}"
            total += 1
        mine = [dlsn for dlsn, r in records if r.payload.startswith(f"p{c}-".encode())]
        assert mine == sorted(mine) and [int(r.payload[3:]) for _, r in records if r.payload.startswith(f"p{c}-".encode())] == sorted(
            int(r.payload[3:]) for _, r in records if r.payload.startswith(f"p{c}-".encode())
        ), f"producer {c}'s records are out of order"
    return total


def test_producers_cut_off_from_a_live_owner_keep_appending_through_another_agent_exactly_once(env, cluster, fault_network):
    env.create_log()
    outcome = run(cut_owner_off(env, cluster, fault_network, forward=True), timeout=120)
    assert outcome["owner_after"] == outcome["owner"], "the owner kept the log: a gray partition, not a failover"
    assert outcome["forwarded"] > 0
    assert outcome["during_cut"] > 100, f"only {outcome['during_cut']} acknowledgements while the owner was out of reach"
    total = assert_exactly_once_in_order(env, outcome["acks"])
    print(f"{total} acknowledged, {outcome['during_cut']} during the {CUT_SECONDS:g}s cut; {outcome['forwarded']} forwarded; {outcome['resent']} resent")


def test_control_without_forwarding_the_same_cut_stops_every_acknowledgement(env, cluster, fault_network):
    env.create_log()
    outcome = run(cut_owner_off(env, cluster, fault_network, forward=False), timeout=120)
    assert outcome["owner_after"] == outcome["owner"]
    assert (outcome["during_cut"], outcome["forwarded"]) == (0, 0)
    assert_exactly_once_in_order(env, outcome["acks"])
