"""Real ZooKeeper (3.9, from the jars inside the pyspark wheel) for tests: one server or three.

Timing is chosen so failure tests are fast but nothing expires by accident on a loaded
2-core machine:

* ``tickTime=200`` ms, so the negotiable session timeout is 0.4 s (2 ticks) to 10 s
  (``maxSessionTimeout``). A client that asks for kazoo's default 10 s gets 10 s; a test that
  wants a session to die quickly of silence (a killed or paused owner) asks for ~1 s.
  ``expire_session`` expires a session at once, whatever its timeout.
* Ensembles: ``syncLimit=10`` (2 s) bounds how long a leader keeps a dead or paused follower;
  ``initLimit=50`` (10 s) because three JVMs starting on two cores sync slowly;
  ``-Dzookeeper.cnxTimeout=1000`` so leader election does not wait 5 s on a paused peer (the
  kernel still accepts TCP connections for a stopped process).
* ``forceSync=no``: tests kill JVMs, not machines, so fsync buys nothing and costs seconds.
* ``maxClientCnxns=0``: every test connects from 127.0.0.1; the default cap is 60 per address.

Each server has a superuser (``SUPER_AUTH``) so the harness can read nodes whatever their ACLs.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import ConnectionLoss, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from dlctl.meta import paths
from dlctl.sandbox.zookeeper import java_executable, zookeeper_jars_dir

from .procs import ManagedProcess, ProcessBacked, ProcessRegistry, free_port, wait_until

T = TypeVar("T")

TICK_MS = 200
MIN_SESSION_TIMEOUT_MS = 2 * TICK_MS
MAX_SESSION_TIMEOUT_MS = 10_000

SUPER_USER = "super"
SUPER_PASSWORD = "harness-super"
SUPER_AUTH = ("digest", f"{SUPER_USER}:{SUPER_PASSWORD}")

# The credentials of every test cluster (agents, CLIs and test clients alike), so the suite runs
# with ZooKeeper ACLs on as production does: what a test creates carries this digest ACL and an
# anonymous client (``make_client(..., anonymous=True)``) can change none of it.
HARNESS_USER = "dlctl-harness"
HARNESS_PASSWORD = "harness-cluster-zk-password"
HARNESS_AUTH = ("digest", f"{HARNESS_USER}:{HARNESS_PASSWORD}")


def harness_acl() -> list:
    from kazoo.security import make_digest_acl

    return [make_digest_acl(HARNESS_USER, HARNESS_PASSWORD, all=True)]


def write_harness_zk_auth(path: Path) -> Path:
    """The harness credentials as a 0600 ``zk_auth_file`` (agent.toml, inventories)."""
    from dlctl.secrets import write_secret_file

    write_secret_file(path, f"{HARNESS_USER}:{HARNESS_PASSWORD}".encode())
    return path

START_TIMEOUT = 60.0  # generous: a cold JVM on a busy 2-core machine

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = %d{HH:mm:ss.SSS} [%t] %-5p %c{1} - %m%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
"""


class HarnessSetupError(RuntimeError):
    """A prerequisite of the harness (Java, jars, sshd...) is missing."""


def missing_prerequisites() -> list[str]:
    """What ZooKeeper tests need but this machine lacks, each with how to install it."""
    missing = []
    if java_executable() is None:
        missing.append("java (a JRE >= 11): apt-get install -y openjdk-17-jre-headless")
    if zookeeper_jars_dir() is None:
        missing.append(
            "the ZooKeeper jars in <pyspark>/jars: pip install -e '.[spark,test]' (pyspark>=3.5)"
        )
    return missing


def _super_digest() -> str:
    raw = hashlib.sha1(f"{SUPER_USER}:{SUPER_PASSWORD}".encode()).digest()
    return f"{SUPER_USER}:{base64.b64encode(raw).decode()}"


def four_letter(host: str, port: int, command: str, timeout: float = 1.0) -> str:
    """Send a whitelisted four-letter command (ruok, srvr, stat, mntr...) and return the reply."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(command.encode())
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks).decode("utf-8", "replace")


@dataclass(frozen=True)
class _Peer:
    myid: int
    host: str
    client_port: int
    quorum_port: int
    election_port: int

    def server_line(self) -> str:
        return (
            f"server.{self.myid}={self.host}:{self.quorum_port}:{self.election_port}"
            f";{self.host}:{self.client_port}"
        )


class ZooKeeperServer(ProcessBacked):
    """One ZooKeeper JVM: standalone (``ZooKeeperServerMain``) or an ensemble member.

    Data and logs live in ``workdir``; ``restart()`` keeps both and the ports, so znodes and
    sessions survive it the way they survive a real server restart.
    """

    def __init__(
        self,
        workdir: Path,
        registry: ProcessRegistry,
        *,
        name: str = "zk",
        host: str = "127.0.0.1",
        client_port: int | None = None,
        peer: _Peer | None = None,
        peers: Sequence[_Peer] = (),
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.workdir = workdir
        self.registry = registry
        self.name = name
        self.host = host
        self.peer = peer
        self.peers = list(peers)
        self.client_port = peer.client_port if peer else (client_port or free_port(host))
        self.extra_config = dict(config or {})
        self.data_dir = workdir / "data"
        self.config_path = workdir / "zoo.cfg"
        self.log_path = workdir / f"{name}.log"
        self.proc: ManagedProcess | None = None

    # -- configuration -----------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "tickTime": TICK_MS,
            "dataDir": self.data_dir,
            "minSessionTimeout": MIN_SESSION_TIMEOUT_MS,
            "maxSessionTimeout": MAX_SESSION_TIMEOUT_MS,
            "maxClientCnxns": 0,
            "4lw.commands.whitelist": "ruok,srvr,stat,mntr,cons,conf,wchs,dump",
            "admin.enableServer": "false",
        }
        if self.peer is None:
            cfg["clientPort"] = self.client_port
            cfg["clientPortAddress"] = self.host
        else:
            # Members take their client address from their own `server.N=...;host:port` line.
            cfg.update(initLimit=50, syncLimit=10)
        cfg.update(self.extra_config)
        return cfg

    def _write_files(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{k}={v}" for k, v in self._config().items()]
        if self.peer is not None:
            (self.data_dir / "myid").write_text(f"{self.peer.myid}\n")
            lines += [p.server_line() for p in self.peers]
        self.config_path.write_text("\n".join(lines) + "\n")
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)

    def _argv(self) -> list[str]:
        java = java_executable()
        jars = zookeeper_jars_dir()
        if java is None or jars is None:
            raise HarnessSetupError("cannot start ZooKeeper: " + "; ".join(missing_prerequisites()))
        main = (
            "org.apache.zookeeper.server.quorum.QuorumPeerMain"
            if self.peer is not None
            else "org.apache.zookeeper.server.ZooKeeperServerMain"
        )
        return [
            java,
            "-Xmx256m",
            "-Xms32m",
            # Short-lived test servers: C1 only and the serial collector start faster and
            # leave the second core to the test.
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",
            "-Djava.net.preferIPv4Stack=true",
            "-Dzookeeper.admin.enableServer=false",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dzookeeper.cnxTimeout=1000",
            "-Dzookeeper.forceSync=no",
            "-Dzookeeper.preAllocSize=1024",  # KiB; the default 64 MiB per txn log is waste here
            f"-Dzookeeper.DigestAuthenticationProvider.superDigest={_super_digest()}",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp",
            f"{jars}/*",
            main,
            str(self.config_path),
        ]

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def connect_string(self) -> str:
        return self.address

    def start(self, *, wait: bool = True, timeout: float = START_TIMEOUT) -> None:
        """Start (or start again, same ports and data); ``wait``: until it serves.

        A standalone server's first start moves to a new port if its port was taken between
        choosing it and binding (another test run on this machine may be choosing too).
        """
        first = self.proc is None
        for attempt in range(3):
            self._write_files()
            if self.proc is None:
                self.proc = self.registry.start(
                    self._argv(), name=self.name, log_path=self.log_path
                )
            else:
                self.proc.start()
            if not wait:
                return
            try:
                self.wait_serving(timeout)
                return
            except AssertionError:
                log = self.proc.tail(200)
                port_taken = not self.proc.running and "Address already in use" in log
                if first and self.peer is None and port_taken and attempt < 2:
                    self.client_port = free_port(self.host)
                    continue
                raise

    def srvr(self, timeout: float = 1.0) -> str:
        return four_letter(self.host, self.client_port, "srvr", timeout)

    def mode(self) -> str | None:
        """leader / follower / standalone, or None when not serving (down, paused, no quorum)."""
        try:
            reply = self.srvr()
        except OSError:
            return None
        for line in reply.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def serving(self) -> bool:
        return self.mode() is not None

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        assert self.proc is not None
        wait_until(
            self.serving,
            timeout,
            interval=0.1,
            message=f"ZooKeeper {self.name} at {self.address} to serve requests (4lw srvr)",
            watch=self.proc,
        )
        # Make sure the server answering is this one, not another that took the port first.
        conf = four_letter(self.host, self.client_port, "conf")
        if str(self.data_dir) not in conf:
            raise AssertionError(
                f"{self.address} is served by another ZooKeeper (its conf: {conf[:300]!r});"
                f" ours is {self.proc.describe()}"
            )

    def restart(self, *, wait: bool = True, timeout: float = START_TIMEOUT) -> None:
        self.stop()
        self.start(wait=wait, timeout=timeout)

    def ensure_running(self) -> None:
        """Undo whatever a previous test did to this server (pause, kill)."""
        if self.paused:
            self.resume()
        if not self.running:
            self.start()
        else:
            self.wait_serving()

    def __repr__(self) -> str:
        return f"<ZooKeeperServer {self.name} {self.address} log={self.log_path}>"


class ZooKeeperEnsemble:
    """Three (or ``size``) QuorumPeerMain JVMs on 127.0.0.1, each with its own ports and log."""

    def __init__(
        self, workdir: Path, registry: ProcessRegistry, *, size: int = 3, host: str = "127.0.0.1"
    ) -> None:
        peers = [
            _Peer(i + 1, host, free_port(host), free_port(host), free_port(host))
            for i in range(size)
        ]
        self.servers = [
            ZooKeeperServer(
                workdir / f"zk{p.myid}",
                registry,
                name=f"zk-ensemble-{p.myid}",
                host=host,
                peer=p,
                peers=peers,
            )
            for p in peers
        ]

    @property
    def connect_string(self) -> str:
        return ",".join(s.address for s in self.servers)

    def __getitem__(self, index: int) -> ZooKeeperServer:
        return self.servers[index]

    def __len__(self) -> int:
        return len(self.servers)

    def start(self, timeout: float = START_TIMEOUT) -> None:
        for s in self.servers:
            s.start(wait=False)
        self.wait_quorum(timeout)

    def wait_quorum(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until every running, unpaused member serves (has joined a quorum)."""

        def all_live_serving() -> bool:
            live = [s for s in self.servers if s.running and not s.paused]
            return 2 * len(live) > len(self.servers) and all(s.serving() for s in live)

        wait_until(
            all_live_serving,
            timeout,
            interval=0.1,
            message=f"a ZooKeeper quorum on {self.connect_string}",
            watch=[s.proc for s in self.servers if s.running and s.proc is not None],
        )

    def leader(self) -> int | None:
        for i, s in enumerate(self.servers):
            if s.mode() == "leader":
                return i
        return None

    def kill(self, index: int) -> None:
        self.servers[index].kill()

    def pause(self, index: int) -> None:
        self.servers[index].pause()

    def resume(self, index: int) -> None:
        self.servers[index].resume()

    def restart(self, index: int, *, wait: bool = True) -> None:
        """Restart one member; ``wait`` waits for it to serve, which needs a live majority."""
        self.servers[index].restart(wait=wait)

    def heal(self, timeout: float = START_TIMEOUT) -> None:
        """Resume paused and restart dead members, then wait for all of them to serve."""
        for s in self.servers:
            if s.paused:
                s.resume()
            if not s.running:
                s.start(wait=False)
        self.wait_quorum(timeout)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble {self.connect_string}>"


# -- clients -----------------------------------------------------------------------------------


def make_client(
    connect_string: str,
    *,
    timeout: float = 10.0,
    superuser: bool = False,
    anonymous: bool = False,
    start: bool = True,
    start_timeout: float = 15.0,
    **kwargs: Any,
) -> KazooClient:
    """A kazoo client that keeps reconnecting forever (kazoo's default gives up after one try),
    authenticated as the test clusters (``HARNESS_AUTH``, creating with their ACL) unless
    ``anonymous``; ``superuser`` may read and change anything."""
    kwargs.setdefault("connection_retry", {"max_tries": -1, "delay": 0.05, "max_delay": 0.5})
    if not anonymous:
        kwargs["auth_data"] = [*kwargs.get("auth_data", []), HARNESS_AUTH]
        kwargs.setdefault("default_acl", harness_acl())
    if superuser:
        kwargs["auth_data"] = [*kwargs.get("auth_data", []), SUPER_AUTH]
    client = KazooClient(hosts=connect_string, timeout=timeout, **kwargs)
    if start:
        client.start(timeout=start_timeout)
    return client


def close_client(client: KazooClient) -> None:
    try:
        client.stop()
    finally:
        client.close()


def close_all(clients: Iterable[KazooClient]) -> None:
    """Close every client, going on past one that fails: teardown closes what it can."""
    for client in clients:
        try:
            close_client(client)
        except Exception:  # noqa: BLE001 - teardown goes on
            pass


class ZkClients:
    """The ZooKeeper sessions a test opens as it goes (``new()``: one more, each its own
    session), closed together by ``close()`` or at the end of a ``with`` block."""

    def __init__(self, connect_string: str, **options: Any) -> None:
        self.connect_string = connect_string
        self.options = options
        self.opened: list[KazooClient] = []

    def new(self) -> KazooClient:
        client = make_client(self.connect_string, **self.options)
        self.opened.append(client)
        return client

    def close(self) -> None:
        close_all(self.opened)

    def __enter__(self) -> ZkClients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def zk_retry(fn: Callable[[], T], seconds: float = 10.0) -> T:
    """``fn()``, a test's own ZooKeeper read, retried through a connection blip of the test's
    client on a loaded machine (every 0.25 s for up to ``seconds``): the property under test is
    the system's, not the test client's. A session expiry is not retried."""
    return KazooRetry(max_tries=-1, delay=0.25, backoff=1, max_jitter=0.0, deadline=seconds, ignore_expire=False)(fn)


def expire_session(client: KazooClient, connect_string: str, timeout: float = 15.0) -> None:
    """Really expire ``client``'s session, and return once ``client`` has seen it (LOST).

    The classic technique: a second connection attaches to the same session (id + password)
    and closes it. The server then ends the session exactly as on a timeout: ephemerals are
    deleted, watches fire, and the original client learns SESSION_EXPIRED when it reconnects.
    kazoo then starts a fresh session on its own.
    """
    if client.client_id is None:
        raise AssertionError("expire_session: the client is not connected, it has no session")
    session_id, _ = client.client_id
    lost = threading.Event()

    def on_state(state: KazooState) -> None:
        if state == KazooState.LOST:
            lost.set()

    def gone() -> bool:
        current = client.client_id
        return lost.is_set() or (current is not None and current[0] != session_id)

    client.add_listener(on_state)
    try:
        # When the original client reconnects while the intruder is attached, it takes the
        # session back and the intruder's close never reaches the server (kazoo's stop halts a
        # reconnecting client without closing its session): try again while the session lives.
        attempts = 3
        for attempt in range(attempts):
            intruder = make_client(connect_string, client_id=(session_id, client.client_id[1] if client.client_id else b""), start=False)
            try:
                intruder.start(timeout=timeout / attempts)
            except (ConnectionLoss, SessionExpiredError, KazooTimeoutError):
                pass  # the original took the session back under it (its chroot check failed): see below
            finally:
                close_client(intruder)  # never left running, even when its start failed
            try:
                wait_until(gone, timeout / attempts, message=f"client {client} to observe the expiry of session 0x{session_id:x}")
                return
            except AssertionError:
                if attempt == attempts - 1:
                    raise
    finally:
        client.remove_listener(on_state)


class ZkNamespace:
    """A per-test chroot (``/t-<unique>``) on a server or ensemble, and the test's clients.

    ``connect_string`` includes the chroot, so code under test sees an empty tree. Clients from
    ``client()`` are closed at teardown. ``backend`` is the server or ensemble behind it (for
    fixtures that allow killing it; never kill the session-wide ``zk`` server).
    """

    def __init__(self, backend: ZooKeeperServer | ZooKeeperEnsemble, label: str = "t") -> None:
        self.backend = backend
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in label)[:60]
        self.path = f"/t-{safe}-{uuid.uuid4().hex[:8]}"
        self._clients: list[KazooClient] = []
        self._lock = threading.Lock()
        admin = make_client(backend.connect_string, superuser=True)
        try:
            # Open, as the root of a real ensemble is: inside, what gets created carries the
            # ACL of whoever creates it (the harness's, or a test's own credentials).
            from kazoo.security import OPEN_ACL_UNSAFE

            admin.create(self.path, acl=OPEN_ACL_UNSAFE)
        finally:
            close_client(admin)

    @property
    def hosts(self) -> str:
        """The connect string without the chroot (for admin views across namespaces)."""
        return self.backend.connect_string

    @property
    def connect_string(self) -> str:
        # kazoo and the Java client take the chroot once, after the last host.
        return f"{self.backend.connect_string}{self.path}"

    @property
    def server(self) -> ZooKeeperServer:
        assert isinstance(self.backend, ZooKeeperServer), "this namespace is on an ensemble"
        return self.backend

    @property
    def ensemble(self) -> ZooKeeperEnsemble:
        assert isinstance(self.backend, ZooKeeperEnsemble), "this namespace is on one server"
        return self.backend

    def client(
        self,
        *,
        timeout: float = 10.0,
        start: bool = True,
        only: ZooKeeperServer | None = None,
        **kwargs: Any,
    ) -> KazooClient:
        """A kazoo client inside the chroot, closed at teardown. ``timeout``: session, seconds.

        ``only``: connect to that ensemble member alone. A client connected to a *paused*
        server notices only after its read timeout (2/3 of the session timeout), so pause
        tests either pin clients to live members or use short session timeouts.
        """
        hosts = f"{only.address}{self.path}" if only is not None else self.connect_string
        c = make_client(hosts, timeout=timeout, start=start, **kwargs)
        with self._lock:
            self._clients.append(c)
        return c

    def expire(self, client: KazooClient, timeout: float = 15.0) -> None:
        expire_session(client, self.connect_string, timeout)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, []
        close_all(clients)

    def __repr__(self) -> str:
        return f"<ZkNamespace {self.connect_string}>"


def bench_zookeeper(prefix: str) -> tuple[Path, ProcessRegistry, ZooKeeperServer]:
    """For a benchmark script: a fresh work directory, its process registry (close it at the
    end: it stops everything started), and a started ZooKeeper server."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    procs = ProcessRegistry(work / "procs")
    zk = ZooKeeperServer(work / "zk", procs, name=f"zk-{prefix.strip('-')}")
    zk.start()
    return work, procs, zk


SCRIBBLE = b'{"seq": "one"}'  # JSON, but no record dlctl writes: what a hand edit or another tool may leave


def segment_record(client: Any, cluster: str, log: str, index: int = 0) -> str:
    """The znode path of LOG's segment record at ``index`` in sequence order (-1: the last)."""
    parent = paths.log_segments(cluster, log)
    return f"{parent}/{sorted(client.get_children(parent))[index]}"


@contextlib.contextmanager
def acl_refused(connect_string: str, path: str) -> Iterator[str]:
    """Inside the block, znode ``path``'s ACL admits someone else only, so the cluster's own
    credentials are refused (as with a znode made by hand); its ACL is put back after."""
    from kazoo.security import make_digest_acl

    admin = make_client(connect_string, superuser=True)
    try:
        acl, _ = admin.get_acls(path)
        admin.set_acls(path, [make_digest_acl("someone", "else", all=True)])
        try:
            yield path
        finally:
            admin.set_acls(path, acl)
    finally:
        close_client(admin)


@contextlib.contextmanager
def scribbled(client: Any, path: str, data: bytes = SCRIBBLE) -> Iterator[str]:
    """Inside the block, znode ``path`` holds ``data`` instead of its record; its bytes are put back after."""
    good, _ = client.get(path)
    client.set(path, data)
    try:
        yield path
    finally:
        client.set(path, good)

