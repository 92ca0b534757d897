"""The availability record: waiting out a crashed predecessor, surviving our own session loss."""

from __future__ import annotations

import threading

import pytest
from harness.procs import wait_until

from dlagent.registry import Registration
from dlctl.errors import RefusedError
from dlctl.meta import paths

pytestmark = pytest.mark.zk


def test_registration_waits_for_a_stale_record_and_survives_its_own_session_expiring(zk):
    predecessor = zk.client(timeout=10.0)
    predecessor.create(paths.available_node("c1", "n1"), b"{}", ephemeral=True, makepath=True)
    agent = zk.client(timeout=10.0)
    registration = Registration(agent, "c1", "n1", {"address": "127.0.0.1:1"}, None)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            registration.start(wait_for_stale=30)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: registration.registrations == 0 and thread.is_alive(), 5, message="registration to wait for the stale record")
    zk.expire(agent)  # our own session ends while we wait
    predecessor.stop()  # ... and then the predecessor's record goes away
    predecessor.close()
    thread.join(30)
    assert not failure, failure
    stat = agent.exists(paths.available_node("c1", "n1"))
    assert stat is not None and stat.ephemeralOwner == agent.client_id[0]
    registration.stop()
    assert agent.exists(paths.available_node("c1", "n1")) is None


def test_a_live_duplicate_node_id_is_refused(zk):
    other = zk.client()
    other.create(paths.available_node("c1", "n1"), b"{}", ephemeral=True, makepath=True)
    registration = Registration(zk.client(), "c1", "n1", {"address": "127.0.0.1:1"}, None)
    with pytest.raises(RefusedError, match="already registered"):
        registration.start(wait_for_stale=0.5)
