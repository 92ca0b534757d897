"""A stream's state and claims in a real ZooKeeper (``dlctl.replication.store``): the moves of
its state (``TRANSITIONS``, every change through ``set_state``), and waiting for its workers to
let go (``wait_released``, the one wait failover, switchover, dr recover and stream deletion
share) — workers are other ZooKeeper sessions holding ephemeral claims; one releases its claim,
the other's session ends."""

from __future__ import annotations

import threading

import pytest

from dlctl.errors import RefusedError
from dlctl.meta.store import MetaStore
from dlctl.replication.records import StreamConfig, StreamState
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


def test_a_stream_moves_between_states_as_the_table_says_and_a_failed_over_one_never_runs_again(zk):
    streams = StreamStore(MetaStore(zk.client(), "b"))
    streams.create(StreamConfig("a-to-b", "a", "zk", "b", ("l1",)))
    state = streams.get_state("a-to-b")
    assert state.value.state is StreamState.SETTING_UP
    epochs = [state.value.epoch]
    for target in (StreamState.RUNNING, StreamState.PAUSED, StreamState.RUNNING, StreamState.FAILED_OVER):
        state = streams.set_state("a-to-b", state, target, reason="test")
        assert streams.get_state("a-to-b").value.state is target
        epochs.append(state.value.epoch)
    assert epochs == list(range(epochs[0], epochs[0] + 5))  # one up per change
    with pytest.raises(RefusedError, match="failed over"):
        streams.set_state("a-to-b", state, StreamState.RUNNING)
    with pytest.raises(RefusedError, match="failed over"):
        streams.set_state("a-to-b", state, StreamState.PAUSED)
    assert streams.get_state("a-to-b").value.state is StreamState.FAILED_OVER  # nothing written
    # Back to setting-up: never (a stream is created in it).
    other = StreamStore(MetaStore(zk.client(), "c"))
    other.create(StreamConfig("a-to-c", "a", "zk", "c", ("l1",)))
    running = other.set_state("a-to-c", other.get_state("a-to-c"), StreamState.RUNNING)
    with pytest.raises(RefusedError, match="cannot go from running to setting-up"):
        other.set_state("a-to-c", running, StreamState.SETTING_UP)
