"""Real ``dlagent serve`` processes for integration tests.

Each ``AgentNode`` has its own config file, 0600 secret file and data dir, listens on its own
loopback address, and registers in the test's ZooKeeper chroot. Readiness means both: the
protocol port accepts connections and the availability znode exists.

TLS is on by default, as in production: each node serves mutual TLS with a certificate of the
harness CA (``harness.tls``) issued for its host, and ``node.client()`` presents the harness
client certificate. ``AgentNode(tls=False)`` runs a plaintext agent (tests of that path).

Metrics endpoints bind port 0 on the node's host (``metrics=``: another ``[metrics] listen``, or
"off"): agents of tests on parallel workers never collide, and tests find an endpoint by the
address the agent publishes (``metrics_address``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError

from dlctl import tomltext as toml
from dlctl.log.auth import Credentials
from dlctl.log.client import SyncAgentClient
from dlctl.log.tls import TlsFiles
from dlctl.meta import paths
from dlctl.secrets import write_secret_file

from . import tls as harness_tls
from .procs import ManagedProcess, ProcessRegistry, free_port, tcp_connectable, wait_until
from .zk import write_harness_zk_auth

DEFAULT_SECRET = b"test-cluster-secret-0123456789abcdef"


def harness_credentials(secret: bytes = DEFAULT_SECRET) -> Credentials:
    """What a test's ``AgentPool`` presents to harness agents: ``secret`` and the harness client
    certificate (``AgentPool(meta, harness_credentials())``)."""
    return harness_tls.credentials(secret)


class AgentNode:
    def __init__(
        self,
        procs: ProcessRegistry,
        base_dir: Path,
        zk_connect: str,
        *,
        cluster: str = "c1",
        node_id: str = "n1",
        region: str = "r1",
        rack: str = "rack1",
        host: str = "127.0.0.1",
        secret: bytes = DEFAULT_SECRET,
        session_timeout: float = 2.0,
        sync: str = "always",
        extra_config: str = "",
        tls: bool = True,
        metrics: str | None = None,
    ) -> None:
        self.procs = procs
        self.dir = base_dir / node_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cluster, self.node_id, self.region, self.rack = cluster, node_id, region, rack
        self.host = host
        self.port = free_port(host)
        self.secret = secret
        self.data_dir = self.dir / "data"
        self.secret_file = self.dir / "secret"
        write_secret_file(self.secret_file, secret)
        self.zk_auth_file = write_harness_zk_auth(self.dir / "zk-auth")  # ZooKeeper ACLs on, as in production
        # The agent's own certificate (server and client of other agents); None: plaintext.
        self.tls: TlsFiles | None = harness_tls.agent_tls(self.dir / "tls", host, node_id) if tls else None
        self.config_path = self.dir / "agent.toml"
        self.config_path.write_text(
            "\n".join(
                [
                    toml.line("node_id", node_id),
                    toml.line("cluster", cluster),
                    toml.line("region", region),
                    toml.line("rack", rack),
                    toml.line("data_dir", self.data_dir),
                    toml.line("listen", f"{host}:{self.port}"),
                    toml.line("zookeeper", zk_connect),
                    toml.line("secret_file", self.secret_file),
                    toml.line("zk_auth_file", self.zk_auth_file),
                    toml.line("session_timeout", session_timeout),
                    harness_tls.tls_table(self.tls) if self.tls is not None else "",
                    "[metrics]",
                    toml.line("listen", metrics if metrics is not None else f"{host}:0"),
                    "",
                    "[storage]",
                    toml.line("sync", sync),
                    "",
                ]
            )
            # Appended TOML (e.g. an [auditor] table); it follows [storage], so start a table.
            + extra_config
        )
        self.proc: ManagedProcess | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, *, wait: bool = True, zk: KazooClient | None = None) -> AgentNode:
        argv = [sys.executable, "-m", "dlagent", "serve", "--config", str(self.config_path), "-v"]
        if self.proc is None:
            self.proc = self.procs.start(argv, name=f"dlagent-{self.node_id}")
        else:
            self.proc.start()
        if wait:
            self.wait_ready(zk)
        return self

    def wait_ready(self, zk: KazooClient | None = None, timeout: float = 20.0) -> None:
        assert self.proc is not None
        wait_until(lambda: tcp_connectable(self.host, self.port), timeout, message=f"{self.node_id} listening on {self.address}", watch=self.proc)
        if zk is not None:
            # The record must be this process's: a SIGKILLed predecessor's lingers until its
            # session expires.
            wait_until(
                lambda: (self.registration(zk) or {}).get("pid") == self.proc.pid,
                timeout,
                message=f"{self.node_id} (pid {self.proc.pid}) registered in ZooKeeper",
                watch=self.proc,
            )

    def registration(self, zk: KazooClient) -> dict | None:
        """The availability record as the agent wrote it, or None when it is not registered."""
        try:
            data, _ = zk.get(paths.available_node(self.cluster, self.node_id))
        except NoNodeError:  # not registered (or a predecessor's record just expired)
            return None
        except (ConnectionLoss, SessionExpiredError):
            # ``zk`` is reconnecting: its server was restarted (a whole location revived), and
            # a session that outlived the outage is replaced by a new one. Not known yet.
            return None
        return json.loads(data)

    @property
    def client_tls(self) -> TlsFiles | None:
        """What a client of this node presents: the harness client certificate under TLS."""
        return harness_tls.client_tls() if self.tls is not None else None

    @property
    def credentials(self) -> Credentials:
        """This node's secret and, under TLS, the harness client certificate (for an AgentPool)."""
        return Credentials(self.secret, self.client_tls)

    def client(self, **options) -> SyncAgentClient:
        """A client of this node; ``tls=`` defaults to the node's mode (``tls=None``: plaintext)."""
        options.setdefault("tls", self.client_tls)
        return SyncAgentClient(self.host, self.port, self.secret, **options)

    def metrics_address(self, zk: KazooClient) -> str | None:
        """Where the running agent serves its metrics, as its availability record says."""
        return (self.registration(zk) or {}).get("metrics")

    def segment_files(self) -> list[Path]:
        return sorted(p for p in (self.data_dir / "segments").rglob("*") if p.is_file())


def heal_agents(agents: Iterable[AgentNode], admin: KazooClient) -> None:
    """Undo what a test did to ``agents``: resume paused ones, restart dead ones; then wait until
    each is registered by its current process (a killed predecessor's record lingers until its
    session expires)."""
    agents = list(agents)
    for node in agents:
        if node.proc is not None and node.proc.paused:
            node.proc.resume()
        if node.proc is None or not node.proc.running:
            node.start(wait=False)
    for node in agents:
        node.wait_ready(admin)
