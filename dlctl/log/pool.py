"""Clients of a cluster's agents, by node id.

Addresses come from the agents' availability records in ZooKeeper; one ``AgentClient`` per
node is kept and shared (requests are pipelined over it), and refreshed when an agent
re-registers at another address.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from ..meta.store import MetaStore
from .client import AgentClient
from .errors import AgentUnavailableError
from .auth import Credentials


LOOKUP_TIMEOUT = 5.0  # seconds a lookup of an unknown node waits on ZooKeeper (kazoo holds requests while it reconnects)


@runtime_checkable
class ReplicaPool(Protocol):
    """What the log's readers, writers, recovery and repair need of a pool of agent clients:
    the agents as last known (node id -> availability record), a fresh look at them, and one
    client per agent. Three kinds serve it: ``AgentPool`` (addresses from ZooKeeper),
    ``dlctl.replication.source.RoutedAgentPool`` (another cluster's agents, at addresses
    configured for the route there) and ``dlctl.spark.task.StaticPool`` (the addresses a Spark
    task was given: executors read no ZooKeeper)."""

    @property
    def nodes(self) -> dict[str, dict]: ...

    async def refresh(self) -> dict[str, dict]: ...

    async def client(self, node_id: str) -> AgentClient: ...


class AgentPool:
    def __init__(self, meta: MetaStore, credentials: Credentials | bytes, *, request_timeout: float = 10.0) -> None:
        """``credentials``: the cluster secret and TLS files (bare bytes: a secret, plaintext)."""
        self.meta = meta
        self.credentials = Credentials.of(credentials)
        self.request_timeout = request_timeout
        self._clients: dict[str, AgentClient] = {}
        self._nodes: dict[str, dict] = {}

    def __repr__(self) -> str:
        return f"AgentPool(cluster={self.meta.cluster!r}, clients={len(self._clients)})"

    async def refresh(self) -> dict[str, dict]:
        """Re-read the availability records (kazoo blocks, so off the event loop)."""
        self._nodes = await asyncio.get_running_loop().run_in_executor(None, self.meta.available_nodes)
        return dict(self._nodes)

    @property
    def nodes(self) -> dict[str, dict]:
        """The availability records as of the last ``refresh``."""
        return dict(self._nodes)

    async def client(self, node_id: str) -> AgentClient:
        info = self._nodes.get(node_id)
        if info is None:
            try:
                await asyncio.wait_for(self.refresh(), LOOKUP_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - ZooKeeper out of reach: this agent is, as far as we can tell
                raise AgentUnavailableError(
                    f"agent {node_id!r} of cluster {self.meta.cluster!r}: not among the agents last read, and they cannot be read again now ({type(exc).__name__}: {exc})"
                ) from None
            info = self._nodes.get(node_id)
            if info is None:
                raise AgentUnavailableError(f"agent {node_id!r} is not available in cluster {self.meta.cluster!r}")
        host, port = self.connect_to(node_id, info)
        current = self._clients.get(node_id)
        if current is not None and current.address == f"{host}:{port}":
            return current
        if current is not None:
            await current.close()
        client = AgentClient(host, port, self.credentials.secret, tls=self.credentials.tls, request_timeout=self.request_timeout, name=node_id)
        self._clients[node_id] = client
        return client

    def forget_addresses(self) -> None:
        """Forget the agents as last read, keeping the connections: the next lookup re-reads
        them, as a fresh pool's first one does, and a client whose agent still registers the
        same address is reused (a session's steps share one pool this way)."""
        self._nodes = {}

    def connect_to(self, node_id: str, info: dict) -> tuple[str, int]:
        """Where to connect to reach agent ``node_id`` (``info``: its availability record): the
        address it registered. (Tests route through fault proxies by overriding this.)"""
        host, _, port = info["address"].rpartition(":")
        return host, int(port)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
