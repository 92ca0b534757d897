"""A connection to one cluster: its metadata store, secrets and agent pool, opened lazily. The
library's (operations, the Spark driver and the command line all hold one).

The agent pool lives on the command loop (``dlctl.loop``) and is kept for the session's life:
every step of a command shares its authenticated connections."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from functools import cached_property
from types import TracebackType
from typing import Any, TypeVar

from . import loop
from .errors import ConfigError
from .certdir import CertDir
from .inventory import Cluster
from .log.auth import Credentials
from .log.pool import AgentPool
from .log.tls import TlsFiles
from .meta.store import MetaStore
from .meta.zk import ZkAuth, check_credentials, connect, loopback_only
from .secrets import read_secret_file

log = logging.getLogger(__name__)

T = TypeVar("T")


class ClusterSession:
    def __init__(self, cluster: Cluster, *, zk_timeout: float = 10.0) -> None:
        self.cluster = cluster
        self.zk_timeout = zk_timeout
        self._client = None
        self._pool: AgentPool | None = None

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
        if self.zk_auth is not None and self.cluster.zookeeper_tls is None and not loopback_only(self.cluster.zookeeper):
            log.warning("cluster %s: no zookeeper_tls: the ZooKeeper password crosses the network in plain text", self.cluster.name)
        self._client = connect(self.cluster.zookeeper, self.zk_auth, timeout=self.zk_timeout, tls=self.cluster.zookeeper_tls)
        check_credentials(self._client, self.cluster.name, self.zk_auth, self.cluster.zk_auth_file)
        return MetaStore(self._client, self.cluster.name, self.zk_auth)

    @cached_property
    def secret(self) -> bytes:
        if self.cluster.secret_file is None:
            raise ConfigError(f"cluster {self.cluster.name!r} has no secret_file; it is needed to talk to agents")
        return read_secret_file(self.cluster.secret_file)

    @cached_property
    def credentials(self) -> Credentials:
        """The secret and, when this cluster runs TLS, the operator's certificate (tls_dir)."""
        return Credentials(self.secret, self.tls)

    @cached_property
    def tls(self) -> TlsFiles | None:
        """The operator's TLS files; None for a cluster initialised with --no-tls (warned about).
        A cluster whose config says TLS but whose files are missing here is refused: falling
        back to plaintext would only fail later, less clearly."""
        certs = self.certdir
        config = self.meta.cluster_config()
        if config.get("tls") is not False and certs is not None and certs.exists():
            return certs.client_files()
        if config.get("tls", False):
            raise ConfigError(
                f"cluster {self.cluster.name!r} runs TLS, but this host has no certificate for it in {certs.path if certs else 'tls_dir'}",
                hint="copy the cluster's tls_dir from the host that ran `dlctl cluster init` (or set tls_dir in the inventory)",
            )
        log.warning("cluster %s: agent traffic is not encrypted (no TLS certificates in %s)", self.cluster.name, certs.path if certs else "tls_dir")
        return None

    @property
    def certdir(self) -> CertDir | None:
        return CertDir(self.cluster.tls_dir, self.cluster.name) if self.cluster.tls_dir is not None else None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the command loop (where ``pool()`` lives) for a synchronous caller."""
        return loop.run(coro)

    async def pool(self) -> AgentPool:
        """This cluster's agent pool, shared by every step of the command (await it on the
        command loop: its connections are bound there). Its next lookup re-reads the agents, as a
        fresh pool's first one would: one may have re-registered elsewhere since the last step."""
        if not loop.on_command_loop():
            raise RuntimeError("ClusterSession.pool() must be awaited on the command loop (use session.run)")
        if self._pool is None:
            self._pool = AgentPool(self.meta, self.credentials)
        self._pool.forget_addresses()
        return self._pool

    def with_pool(self, fn: Callable[[AgentPool], Awaitable[T]]) -> T:
        """Run ``fn(pool)`` (a coroutine function) to completion with this cluster's agent pool;
        for synchronous callers."""

        async def go() -> T:
            return await fn(await self.pool())

        return self.run(go())

    def connect(self) -> None:
        """Connect to the cluster's ZooKeeper now (a cluster out of reach fails here, not later)."""
        self.meta  # noqa: B018 - the property connects

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            if loop.on_command_loop():  # a session opened and closed inside a step's coroutine
                loop.close_soon(pool.close())
            else:
                loop.run(pool.close())
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None

    def __enter__(self) -> ClusterSession:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
