"""Waiting for a stream's workers to let go (``StreamStore.wait_released``, the one wait that
failover, switchover, dr recover and stream deletion share) against a real ZooKeeper: workers
are other ZooKeeper sessions holding ephemeral claims; one releases its claim, the other's
session ends."""

from __future__ import annotations

import threading

import pytest

from dlctl.meta.store import MetaStore
from dlctl.replication.records import StreamConfig
from dlctl.replication.store import StreamStore

pytestmark = [pytest.mark.zk]


def test_wait_released_returns_once_every_claim_is_gone_and_not_before(zk):
    operator = StreamStore(MetaStore(zk.client(), "b"))
    operator.create(StreamConfig("a-to-b", "a", "zk", "b", ("l1", "l2")))
    assert operator.wait_released("a-to-b", 0)  # no worker ever claimed a log of it

    workers = [StreamStore(MetaStore(zk.client(), "b")) for _ in range(2)]
    assert workers[0].claim("a-to-b", "l1", "b1") and workers[1].claim("a-to-b", "l2", "b2")
    assert not operator.wait_released("a-to-b", 0.2)  # held: it says so when the time is up

    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(operator.wait_released("a-to-b", 60)))
    waiter.start()
    workers[0].release("a-to-b", "l1")
    assert sorted(operator.claims("a-to-b")) == ["l2"]
    assert outcome != [True]  # l2 is still held: it must not have said "released"
    workers[1].client.stop()  # the second worker's session ends: its ephemeral claim goes
    workers[1].client.close()
    waiter.join(60)
    assert outcome == [True]
    assert operator.claims("a-to-b") == {}
