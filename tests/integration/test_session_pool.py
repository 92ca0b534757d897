"""A session's steps share one agent pool on the command loop (issue 26 item 4), against real
agents: the second step reuses the first one's authenticated connection; an agent killed and
restarted between two steps is reached again by the next step (the loop ran on meanwhile and saw
the old connection close); a second session has connections of its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dlctl.inventory import Cluster
from dlctl.session import ClusterSession
from harness.logcluster import CLUSTER, AgentCluster, agent_cluster
from harness.procs import wait_until

pytestmark = [pytest.mark.zk, pytest.mark.agent]


@pytest.fixture(scope="module")
def agents(zk_server, tmp_path_factory) -> Iterator[AgentCluster]:
    zk_server.ensure_running()
    yield from agent_cluster(zk_server, tmp_path_factory.mktemp("session-pool"), "test_session_pool", ("n1", "n2"))


def _session(agents: AgentCluster) -> ClusterSession:
    node = agents.agents["n1"]
    session = ClusterSession(Cluster(CLUSTER, agents.ns.connect_string, node.secret_file, node.zk_auth_file))
    # The harness agents trust the harness client certificate, which no inventory's tls_dir holds.
    session.__dict__["credentials"] = node.credentials
    return session


def _connection_of(session: ClusterSession, node: str) -> tuple[object, object]:
    """(client, its authenticated connection) to ``node`` after a request through the session."""

    async def step(pool):
        client = await pool.client(node)
        await client.stat()
        return client, client.connection

    return session.with_pool(step)


def test_steps_of_one_session_share_its_authenticated_connections(agents):
    with _session(agents) as session, _session(agents) as other:
        client, connection = _connection_of(session, "n1")
        again, connection_again = _connection_of(session, "n1")
        assert again is client and connection_again is connection, "the second step opened a connection of its own"
        # What the check above tells apart: another session's step does connect afresh.
        _, theirs = _connection_of(other, "n1")
        assert theirs is not connection


def test_an_agent_restarted_between_steps_is_reached_by_the_next_step(agents):
    node = agents.agents["n2"]
    with _session(agents) as session:
        client, _ = _connection_of(session, "n2")
        node.proc.kill()
        # No step runs now, yet the command loop sees the connection go (a loop that ran only
        # during steps would hand the next step a dead connection).
        wait_until(lambda: not client.connected, 10.0, message="the session's client of n2 notices the agent's death")
        node.start(zk=agents.admin)
        again, connection = _connection_of(session, "n2")
        assert again is client and connection is not None  # same client, reconnected on first use
