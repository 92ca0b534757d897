"""The three kinds of agent pool serve the one protocol the log's parts are written against
(``dlctl.log.pool.ReplicaPool``): the cluster's own, a route to another cluster's agents, and the
fixed addresses a Spark task carries. Something that is not a pool does not pass for one."""

from __future__ import annotations

from types import SimpleNamespace

from dlctl.log.pool import AgentPool, ReplicaPool
from dlctl.replication.source import RoutedAgentPool
from dlctl.spark.task import StaticPool


def test_every_pool_is_a_replica_pool_and_other_things_are_not():
    meta = SimpleNamespace(cluster="c")
    pools = [
        AgentPool(meta, b"s" * 32),  # type: ignore[arg-type]
        RoutedAgentPool(meta, b"s" * 32, addresses={"n1": "127.0.0.1:1"}),  # type: ignore[arg-type]
        StaticPool({"n1": {"address": "127.0.0.1:1"}}, b"s" * 32, 5.0),
    ]
    for pool in pools:
        assert isinstance(pool, ReplicaPool), pool
    assert not isinstance(SimpleNamespace(nodes={}), ReplicaPool)  # no client(), no refresh()
