"""The one compare-and-set primitive of the metadata (``dlctl.meta.cas``) against a real
ZooKeeper: create when absent, write only at the version read, a conflict when someone else
wrote first — even when they wrote the very bytes we meant to (two allocators of the same next
id), which must never pass for our own success. The update loop re-reads and retries after a
conflict, building on the other writer's change. A write whose answer is really lost (the
connection reset with ZooKeeper's reply held back by a one-way partition, after the write was
applied) is settled as done for an idempotent change, and reported as of unknown outcome — never
applied twice — for any other."""

from __future__ import annotations

import pytest

import threading

from dlctl.errors import ConflictError, NotFoundError, OutcomeUnknownError
from dlctl.meta import cas
from dlctl.meta.records import Versioned
from harness.faultproxy import FaultNetwork
from harness.procs import wait_until
from harness.zk import close_client, make_client

pytestmark = [pytest.mark.zk]


def test_put_creates_writes_at_the_version_read_and_refuses_what_moved(zk):
    client = zk.client()
    path = "/doc"
    assert cas.put(client, path, b"one", cas.ABSENT) == 0
    with pytest.raises(ConflictError, match="changed concurrently"):
        cas.put(client, path, b"other", cas.ABSENT)  # created by someone else meanwhile
    assert cas.put(client, path, b"two", 0) == 1
    with pytest.raises(ConflictError, match="expected version 0"):
        cas.put(client, path, b"three", 0)  # stale: it is at version 1 now
    assert client.get(path)[0] == b"two", "a refused write changed the znode"
    with pytest.raises(NotFoundError, match="gone"):
        cas.put(client, "/missing", b"x", 3, missing=lambda: NotFoundError("gone"))


def test_another_writers_identical_bytes_are_a_conflict_never_our_success(zk):
    client = zk.client()
    path = "/counter"
    client.create(path, b"2")
    # Two allocators read version 0 ("2") and both write "3": the second must not get id 3 too.
    assert cas.put(client, path, b"3", 0) == 1
    with pytest.raises(ConflictError):
        cas.put(client, path, b"3", 0)
    # The same for two creators of one znode with the same bytes.
    assert cas.put(client, "/made", b"same", cas.ABSENT) == 0
    with pytest.raises(ConflictError):
        cas.put(client, "/made", b"same", cas.ABSENT)


def test_the_update_loop_reads_again_after_a_conflict(zk):
    client = zk.client()
    path = "/counter"
    client.create(path, b"0")
    reads = []

    def read() -> Versioned[int]:
        data, stat = client.get(path)
        reads.append(int(data))
        if len(reads) == 1:
            client.set(path, b"10", version=stat.version)  # another writer, between our read and write
        return Versioned(int(data), stat.version)

    def write(value: int, version: int) -> Versioned[int]:
        return Versioned(value, cas.put(client, path, str(value).encode(), version))

    result = cas.update(read, lambda n: n + 1, write, what=path)
    assert result.value == 11 and client.get(path)[0] == b"11", "the other writer's increment was lost"
    assert reads == [0, 10]
    # Nothing to change: no write at all.
    assert cas.update(read, lambda n: None, write, what=path).version == result.version


def _lose_the_answer(zk, network: FaultNetwork, path: str, update) -> tuple[object, int]:
    """Run ``update(client, cut)`` on a client behind a proxy to ZooKeeper; ``cut()`` (called by
    its first read, after the answer came) holds every reply back from then on. Once ZooKeeper
    applied the write (seen from a direct client), the connection is reset with the reply still
    held, and healed. Returns (what ``update`` returned or raised, the znode's version now)."""
    backend = zk.backend
    proxy = network.proxy((backend.host, backend.client_port), node="zk", client_node="client", name="client->zk")
    client = make_client(f"{proxy.host}:{proxy.port}{zk.path}", timeout=20.0)
    direct = zk.client()
    before = direct.get(path)[1].version
    outcome: list[object] = []
    cuts: list[bool] = []

    def cut() -> None:
        if not cuts:
            cuts.append(True)
            network.partition_nodes("zk", "client", one_way=True)  # replies stop; requests still go

    try:
        worker = threading.Thread(target=lambda: outcome.append(_outcome(update, client, cut)), daemon=True)
        worker.start()
        wait_until(lambda: direct.get(path)[1].version > before, 10.0, message="ZooKeeper applied the write")
        proxy.drop_connections()  # the reply held in the partition goes with the connection
        network.heal()
        worker.join(40)
        assert not worker.is_alive(), "the update never returned"
        return outcome[0], direct.get(path)[1].version
    finally:
        close_client(client)


def _znode(client, path: str, cut, decode, encode):
    """``cas.update``'s read (which calls ``cut`` once it has its answer) and write of ``path``."""

    def read() -> Versioned:
        data, stat = client.get(path)
        cut()
        return Versioned(decode(data), stat.version)

    def write(value, version: int) -> Versioned:
        return Versioned(value, cas.put(client, path, encode(value), version))

    return read, write


def _outcome(update, client, cut) -> object:
    try:
        return update(client, cut)
    except Exception as exc:  # noqa: BLE001 - returned to the test, which asserts on it
        return exc


def test_a_lost_answer_to_an_idempotent_change_is_settled_as_done(zk, fault_network):
    zk.client().create("/flag", b"off")

    def update(client, cut) -> Versioned[bytes]:
        read, write = _znode(client, "/flag", cut, bytes, bytes)
        return cas.update(read, lambda _v: b"on", write, what="/flag", idempotent=True)

    result, version = _lose_the_answer(zk, fault_network, "/flag", update)
    assert isinstance(result, Versioned), f"the lost answer was not settled: {result!r}"
    assert (result.value, result.version) == (b"on", 1) and version == 1  # applied once, seen as done


def test_a_lost_answer_to_an_increment_is_reported_unknown_and_never_applied_twice(zk, fault_network):
    zk.client().create("/next-id", b"7")

    def update(client, cut) -> Versioned[int]:
        read, write = _znode(client, "/next-id", cut, int, lambda n: str(n).encode())
        return cas.update(read, lambda n: n + 1, write, what="/next-id")

    result, version = _lose_the_answer(zk, fault_network, "/next-id", update)
    assert isinstance(result, OutcomeUnknownError) and "/next-id" in str(result), result
    assert zk.client().get("/next-id")[0] == b"8" and version == 1  # once, not twice
