"""The ZooKeeper fixtures run real servers: sessions really expire, quorums really break."""

from __future__ import annotations

import threading

import pytest
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NodeExistsError
from kazoo.handlers.threading import KazooTimeoutError

from harness.procs import wait_until
from harness.zk import ZkNamespace, close_client, make_client

pytestmark = pytest.mark.zk

WRITE_FAILURES = (KazooException, KazooTimeoutError)


def try_write(client: KazooClient, path: str, timeout: float = 2.0) -> bool:
    """Whether a create of ``path`` succeeds within ``timeout`` (no quorum: it cannot)."""
    try:
        client.create_async(path, b"x").get(timeout=timeout)
        return True
    except NodeExistsError:
        return True  # an earlier attempt that timed out stayed queued and went through
    except WRITE_FAILURES:
        return False


def test_expired_session_is_lost_and_its_ephemerals_vanish(zk: ZkNamespace) -> None:
    client = zk.client(timeout=5.0)
    states: list[KazooState] = []
    lost = threading.Event()

    def on_state(state: KazooState) -> None:
        states.append(state)
        if state == KazooState.LOST:
            lost.set()

    client.add_listener(on_state)
    client.create("/owner", b"me", ephemeral=True)
    observer = zk.client()
    assert observer.exists("/owner") is not None
    old_session = client.client_id[0]

    zk.expire(client)

    assert lost.wait(5), f"listener saw {states}"
    wait_until(lambda: observer.exists("/owner") is None, 5, message="ephemeral /owner to vanish")
    # kazoo opens a fresh session by itself after LOST.
    wait_until(lambda: client.connected, 10, message="client to reconnect with a new session")
    assert client.client_id[0] != old_session


def test_each_test_gets_its_own_chroot(zk: ZkNamespace) -> None:
    client = zk.client()
    assert client.get_children("/") == []
    client.create("/logs/a", b"1", makepath=True)

    admin = make_client(zk.hosts, superuser=True)
    try:
        assert admin.get(f"{zk.path}/logs/a")[0] == b"1"
        assert zk.path.startswith("/t-test_each_test_gets_its_own_chroot-")
    finally:
        close_client(admin)


def test_private_server_keeps_data_across_a_restart(zk_private_server: ZkNamespace) -> None:
    client = zk_private_server.client()
    client.create("/durable", b"v1")

    zk_private_server.server.kill()
    assert not zk_private_server.server.serving()
    zk_private_server.server.start()

    wait_until(lambda: client.connected, 15, message="client to reconnect after the restart")
    assert client.get("/durable")[0] == b"v1"


@pytest.mark.slow
def test_ensemble_without_quorum_refuses_writes_until_restarted(zk_ensemble: ZkNamespace) -> None:
    ensemble = zk_ensemble.ensemble
    client = zk_ensemble.client()
    assert try_write(client, "/before")

    ensemble.kill(0)
    ensemble.kill(1)

    assert not try_write(client, "/during")
    # The survivor notices the lost quorum within a few ticks; await it rather than race it.
    wait_until(lambda: not ensemble[2].serving(), 15, message="the lone survivor to stop serving")

    ensemble.restart(0)  # two of three: a quorum again

    wait_until(
        lambda: try_write(client, "/after"),
        30,
        message="a write to succeed once two servers are back",
        logs=[s.log_path for s in ensemble.servers],
    )


@pytest.mark.slow
def test_ensemble_with_two_members_paused_refuses_writes_until_resumed(
    zk_ensemble: ZkNamespace,
) -> None:
    ensemble = zk_ensemble.ensemble
    # Pinned to the member that stays up: a client on a paused member would only notice after
    # its read timeout, which is slow, not wrong.
    client = zk_ensemble.client(only=ensemble[0])
    assert try_write(client, "/before")

    ensemble.pause(1)
    ensemble.pause(2)

    assert not try_write(client, "/during")

    ensemble.resume(1)
    ensemble.resume(2)

    wait_until(
        lambda: try_write(client, "/after"),
        30,
        message="a write to succeed once the paused servers resume",
        logs=[s.log_path for s in ensemble.servers],
    )
    ensemble.wait_quorum()
