"""A sink's connection to a source cluster: its metadata store and agent pool.

The agent address map lets an operator (or a test) route the worker's traffic to source agents
through something else (a tunnel, a proxy): node id -> host:port to use instead of the address
the agent registered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..log.auth import Credentials
from ..log.pool import AgentPool
from ..log.tls import TlsFiles
from ..meta.store import MetaStore
from ..meta.zk import ZkAuth, ZkTls, check_credentials, connect
from ..secrets import read_secret_file


class RoutedAgentPool(AgentPool):
    """An ``AgentPool`` whose agents' addresses may be overridden per node id."""

    def __init__(self, meta: MetaStore, secret: bytes, *, addresses: Mapping[str, str] | None = None, **options) -> None:
        super().__init__(meta, secret, **options)
        self.addresses = dict(addresses or {})

    async def refresh(self) -> dict[str, dict]:
        nodes = await super().refresh()
        if self.addresses:
            self._nodes = {n: ({**info, "address": self.addresses[n]} if n in self.addresses else info) for n, info in nodes.items()}
        return dict(self._nodes)


@dataclass(frozen=True)
class SourceSettings:
    """How a sink agent reaches one source cluster (``[replication.sources.<cluster>]``)."""

    cluster: str
    zookeeper: str | None = None  # None: the connect string recorded in the stream config
    secret_file: Path | None = None  # None: the agent's own secret (clusters sharing one)
    zk_auth_file: Path | None = None  # None: the agent's own ZooKeeper credentials
    region: str | None = None  # the source region nearest to this agent (None: the agent's own)
    addresses: Mapping[str, str] = field(default_factory=dict)
    tls: TlsFiles | None = None  # None: the agent's own [tls] (clusters sharing one CA)
    zookeeper_tls: ZkTls | None = None  # None: the agent's own [zookeeper_tls] (None there: plaintext)


class SourceLink:
    """An open connection to a source cluster, shared by every worker reading from it."""

    def __init__(
        self, settings: SourceSettings, connect_string: str, secret: Credentials | bytes, auth: ZkAuth | None, session_timeout: float = 10.0,
        zookeeper_tls: ZkTls | None = None,
    ) -> None:
        self.settings = settings
        self.client = connect(settings.zookeeper or connect_string, auth, session_timeout=session_timeout, tls=zookeeper_tls or settings.zookeeper_tls)
        try:
            check_credentials(self.client, settings.cluster, auth, settings.zk_auth_file or "this agent's own zk_auth_file")
        except BaseException:
            self.client.stop()
            self.client.close()
            raise
        self.meta = MetaStore(self.client, settings.cluster, auth)
        self.pool = RoutedAgentPool(self.meta, secret, addresses=settings.addresses)

    @classmethod
    def open(
        cls, settings: SourceSettings, connect_string: str, *, default_secret_file: Path, default_zk_auth_file: Path | None,
        default_tls: TlsFiles | None = None, default_zookeeper_tls: ZkTls | None = None, session_timeout: float = 10.0,
    ) -> SourceLink:
        secret = Credentials(read_secret_file(settings.secret_file or default_secret_file), settings.tls or default_tls)
        auth_file = settings.zk_auth_file or default_zk_auth_file
        auth = ZkAuth.from_file(auth_file) if auth_file else None
        return cls(settings, connect_string, secret, auth, session_timeout, zookeeper_tls=settings.zookeeper_tls or default_zookeeper_tls)

    async def close(self) -> None:
        await self.pool.close()
        try:
            self.client.stop()
            self.client.close()
        except Exception:  # noqa: BLE001 - closing anyway
            pass
