"""A connection to one cluster: its metadata store, secrets and agent pool, opened lazily."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import cached_property
from types import TracebackType
from typing import Any

from ..errors import ConfigError
from ..inventory import Cluster
from ..meta.store import MetaStore
from ..meta.zk import ZkAuth, connect
from ..secrets import read_secret_file

log = logging.getLogger(__name__)


class ClusterSession:
    def __init__(self, cluster: Cluster, *, zk_timeout: float = 10.0) -> None:
        self.cluster = cluster
        self.zk_timeout = zk_timeout
        self._client = None

    @cached_property
    def zk_auth(self) -> ZkAuth | None:
        path = self.cluster.zk_auth_file
        if path is None:
            # Only an explicit insecure_zookeeper = true gets here (the inventory defaults a path).
            log.warning(
                "cluster %s: ZooKeeper without ACLs (insecure_zookeeper = true): anyone who reaches the ensemble "
                "can rewrite this cluster's metadata", self.cluster.name,
            )
            return None
        if not path.exists():
            raise ConfigError(
                f"cluster {self.cluster.name!r}: ZooKeeper credentials file {path} does not exist",
                hint="`dlctl cluster init` creates it (and the cluster's layout with ACLs); or copy it from where the cluster was initialised",
            )
        return ZkAuth.from_file(path)

    @cached_property
    def meta(self) -> MetaStore:
        self._client = connect(self.cluster.zookeeper, self.zk_auth, timeout=self.zk_timeout)
        return MetaStore(self._client, self.cluster.name, self.zk_auth)

    @cached_property
    def secret(self) -> bytes:
        if self.cluster.secret_file is None:
            raise ConfigError(f"cluster {self.cluster.name!r} has no secret_file; it is needed to talk to agents")
        return read_secret_file(self.cluster.secret_file)

    def with_pool(self, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run ``fn(pool)`` (a coroutine function) to completion with a fresh agent pool of this
        cluster, closed afterwards; for synchronous callers."""
        from ..log.pool import AgentPool

        async def go() -> Any:
            pool = AgentPool(self.meta, self.secret)
            try:
                return await fn(pool)
            finally:
                await pool.close()

        return asyncio.run(go())

    def close(self) -> None:
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None

    def __enter__(self) -> ClusterSession:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
