"""ZooKeeper over TLS (issue 19 item 2), against a real ZooKeeper serving a secureClientPort with
client certificates required (``dlctl.sandbox.zookeeper``, as the sandbox runs it): dlctl's
sessions and clients work over it with their digest ACLs; a plaintext client, a client trusting
another CA and a client without a certificate are refused, each with an error that says TLS; and
the digest password, which a plaintext connection carries as is, never crosses the wire in clear
text (a byte-recording relay between client and server shows it)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.handlers.threading import KazooTimeoutError

from dlctl import pki
from dlctl.cli.main import main
from dlctl.errors import DlctlError
from dlctl.meta import paths
from dlctl.meta.zk import ZkAuth, ZkTls, acl_for, connect
from dlctl.sandbox import zookeeper
from dlctl.secrets import write_secret_file
from harness.procs import free_port

pytestmark = pytest.mark.zk

HOST = "127.0.0.1"


@dataclass(frozen=True)
class TlsZooKeeper:
    config: zookeeper.ZooKeeperConfig
    files: zookeeper.TlsFiles

    @property
    def secure(self) -> str:
        assert self.config.tls is not None
        return f"{HOST}:{self.config.tls.port}"

    @property
    def plain(self) -> str:
        return f"{HOST}:{self.config.port}"

    @property
    def client_tls(self) -> ZkTls:
        return self.files.client()


@pytest.fixture(scope="module")
def tls_zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsZooKeeper]:
    """A ZooKeeper as the sandbox runs it: TLS with client certificates on one port, plain
    (loopback) on the other."""
    work = tmp_path_factory.mktemp("tls-zk")
    files = zookeeper.write_tls(work / "tls", [HOST, "localhost"], name="test ZooKeeper")
    config = zookeeper.ZooKeeperConfig(work / "zk", HOST, free_port(HOST), tick_ms=200, tls=zookeeper.ServerTls.of(files, free_port(HOST)))
    pid = zookeeper.start(config)
    try:
        yield TlsZooKeeper(config, files)
    finally:
        zookeeper.stop(pid)


@pytest.fixture
def auth() -> ZkAuth:
    return ZkAuth(f"tls-test-{uuid.uuid4().hex[:6]}", f"zk-password-{secrets.token_hex(12)}")


def close(client: KazooClient) -> None:
    client.stop()
    client.close()


def other_ca_files(directory: Path) -> ZkTls:
    """A CA and client certificate that have nothing to do with the ensemble's."""
    ca = pki.new_ca("stranger")
    client = pki.issue(ca, "stranger client", server=False)
    files = ZkTls(directory / "other-ca.pem", directory / "other-client.pem", directory / "other-client.key")
    for path, data in ((files.ca_file, ca.cert_pem), (files.cert_file, client.cert_pem), (files.key_file, client.key_pem)):
        write_secret_file(path, data)
    return files


# -- (a) it works, ACLs included ----------------------------------------------------------------


def assert_never_connects(hosts: str, options: dict) -> None:
    """A raw kazoo client with ``options`` (TLS or not) never gets a session: its start times out."""
    raw = KazooClient(hosts=hosts, timeout=4, connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 0.5}, **options)
    try:
        with pytest.raises(KazooTimeoutError):
            raw.start(timeout=3)
    finally:
        close(raw)


def test_connect_over_tls_reads_and_writes_under_the_digest_acl(tls_zk, auth):
    client = connect(tls_zk.secure, auth, tls=tls_zk.client_tls, timeout=15)
    anonymous = connect(tls_zk.secure, None, tls=tls_zk.client_tls, timeout=15)
    try:
        path = f"/acl-{uuid.uuid4().hex[:8]}"
        client.create(path, b"one")  # the client's default ACL: the cluster's digest
        client.set(path, b"two")
        assert client.get(path)[0] == b"two"
        acls, _ = client.get_acls(path)
        assert [str(a) for a in acls] == [str(a) for a in acl_for(auth)]
        # A TLS certificate is not a ZooKeeper identity: without the digest, nothing changes.
        with pytest.raises(NoAuthError):
            anonymous.set(path, b"mine")
        with pytest.raises(NoAuthError):
            anonymous.get(path)
    finally:
        close(client)
        close(anonymous)


def test_the_cli_runs_cluster_init_and_status_over_tls_from_the_inventory(tls_zk, tmp_path, monkeypatch, capsys):
    name = f"tls{uuid.uuid4().hex[:6]}"
    write_secret_file(tmp_path / f"{name}.secret", b"cluster-secret-for-zk-tls-tests-0001")
    ca, cert, key = (Path(p) for p in tls_zk.client_tls.to_dict().values())
    inventory = tmp_path / "config.toml"
    inventory.write_text(
        f"""
[clusters.{name}]
zookeeper = "{tls_zk.secure}"
secret_file = "{name}.secret"

[clusters.{name}.zookeeper_tls]
ca_file = "{ca}"
cert_file = "{cert}"
key_file = "{key}"

[[clusters.{name}.regions.r1.racks.a.nodes]]
id = "n1"
host = "127.0.0.1"
"""
    )
    monkeypatch.setenv("DLCTL_CONFIG", str(inventory))
    assert main(["-o", "json", "--yes", "cluster", "init"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["-o", "json", "config", "show"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["clusters"][0]["zookeeper_tls"] == {"ca_file": str(ca), "cert_file": str(cert), "key_file": str(key)}
    assert main(["-o", "json", "cluster", "status"]) == 0
    [node] = json.loads(capsys.readouterr().out)
    assert node["node"] == "n1"
    # What init made carries the cluster's digest ACL, read back over TLS.
    credentials = ZkAuth.from_file(tmp_path / f"{name}.zk-auth")
    client = connect(tls_zk.secure, credentials, tls=tls_zk.client_tls)
    try:
        acls, _ = client.get_acls(paths.cluster_root(name))
        assert [str(a) for a in acls] == [str(a) for a in acl_for(credentials)]
    finally:
        close(client)


# -- (b)-(d) refusals ---------------------------------------------------------------------------


def test_a_plaintext_client_gets_nowhere_on_the_secure_port(tls_zk, auth):
    assert_never_connects(tls_zk.secure, {})
    with pytest.raises(DlctlError) as info:
        connect(tls_zk.secure, auth, timeout=3)
    assert tls_zk.secure in str(info.value) and "speaks TLS" in str(info.value) and "zookeeper_tls" in info.value.hint


def test_a_tls_client_gets_nowhere_on_the_plain_port(tls_zk, auth):
    with pytest.raises(DlctlError) as info:
        connect(tls_zk.plain, auth, tls=tls_zk.client_tls, timeout=3)
    assert f"ZooKeeper at {tls_zk.plain} over TLS" in str(info.value) and "does not speak TLS" in str(info.value)


def test_a_client_trusting_another_ca_refuses_the_server(tls_zk, auth, tmp_path):
    stranger = other_ca_files(tmp_path)
    assert_never_connects(tls_zk.secure, stranger.kazoo_options())
    # Its own CA with our (valid) client certificate: still the server's certificate is refused.
    with pytest.raises(DlctlError) as info:
        connect(tls_zk.secure, auth, tls=ZkTls(stranger.ca_file, tls_zk.client_tls.cert_file, tls_zk.client_tls.key_file), timeout=3)
    message = str(info.value)
    assert f"ZooKeeper at {tls_zk.secure} over TLS" in message and "not accepted with CA file" in message and str(stranger.ca_file) in message, message


def test_the_server_refuses_a_client_certificate_of_another_ca(tls_zk, auth, tmp_path):
    stranger = other_ca_files(tmp_path)
    with pytest.raises(DlctlError) as info:
        connect(tls_zk.secure, auth, tls=ZkTls(tls_zk.client_tls.ca_file, stranger.cert_file, stranger.key_file), timeout=3)
    assert "refused this client's certificate" in str(info.value), str(info.value)


def test_a_client_without_a_certificate_is_refused_when_client_auth_is_need(tls_zk, auth):
    assert tls_zk.config.tls is not None and tls_zk.config.tls.client_auth == "need"
    no_cert = ZkTls(tls_zk.client_tls.ca_file)
    assert_never_connects(tls_zk.secure, no_cert.kazoo_options())
    with pytest.raises(DlctlError) as info:
        connect(tls_zk.secure, auth, tls=no_cert, timeout=3)
    message = str(info.value)
    assert "over TLS" in message and "refused this client's certificate" in message and "requires one" in message, message


# -- (e) the password on the wire ---------------------------------------------------------------


class RecordingRelay:
    """A loopback TCP relay to ``target`` that keeps every byte it forwards, both ways."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server((HOST, 0))
        self.address = f"{HOST}:{self.listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._recorded = bytearray()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def recorded(self) -> bytes:
        with self._lock:
            return bytes(self._recorded)

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [downstream, upstream]
            for a, b in ((downstream, upstream), (upstream, downstream)):
                thread = threading.Thread(target=self._pump, args=(a, b), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    self._recorded += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            s.close()
        for thread in self._threads:
            thread.join(timeout=5)


def exercise(client: KazooClient) -> None:
    path = f"/wire-{uuid.uuid4().hex[:8]}"
    client.create(path, b"payload")
    client.set(path, b"payload-2")
    assert client.get(path)[0] == b"payload-2"
    client.get_acls(path)
    client.delete(path)


@pytest.fixture
def relay_to():
    relays: list[RecordingRelay] = []

    def make(target: str) -> RecordingRelay:
        relays.append(RecordingRelay(target))
        return relays[-1]

    yield make
    for relay in relays:
        relay.close()


def test_the_digest_password_never_crosses_the_wire_in_clear_over_tls(tls_zk, auth, relay_to):
    relay = relay_to(tls_zk.secure)
    client = connect(relay.address, auth, tls=tls_zk.client_tls, timeout=15)
    try:
        exercise(client)
    finally:
        close(client)
    recorded = relay.recorded
    assert len(recorded) > 1000 and recorded[:1] == b"\x16"  # a TLS handshake record went through
    assert auth.password.encode() not in recorded
    assert auth.user.encode() not in recorded  # nor the user, nor the data
    assert b"payload" not in recorded


def test_control_over_the_plain_port_the_same_relay_records_the_password(tls_zk, auth, relay_to):
    relay = relay_to(tls_zk.plain)
    client = connect(relay.address, auth, timeout=15)
    try:
        exercise(client)
    finally:
        close(client)
    recorded = relay.recorded
    assert f"{auth.user}:{auth.password}".encode() in recorded  # ZooKeeper's digest scheme: as is
    assert b"payload" in recorded


# -- the sandbox runs it by default -------------------------------------------------------------


def established_to(port: int) -> int:
    """Established TCP connections (IPv4, this machine) whose remote end is ``port``."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:
            count += 1
    return count


@pytest.mark.agent
@pytest.mark.slow
def test_the_sandbox_serves_zookeeper_over_tls_to_its_agents_and_the_cli(tmp_path, auth):
    env = {**os.environ, "DLCTL_SANDBOX_DIR": str(tmp_path / "sbx"), "DLCTL_CONFIG": str(tmp_path / "sbx" / "config.toml")}

    def dlctl(*argv: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([sys.executable, "-m", "dlctl.cli", *argv], capture_output=True, text=True, timeout=180, env=env)
        assert result.returncode == 0, f"dlctl {' '.join(argv)} exited {result.returncode}:\n{result.stderr}"
        return result

    dlctl("--yes", "sandbox", "up", "--regions", "1", "--nodes-per-region", "2")
    try:
        state = json.loads(dlctl("-o", "json", "sandbox", "status").stdout)["zookeeper"]
        assert state["tls"] and state["address"] != state["plain_address"]
        nodes = json.loads(dlctl("-o", "json", "cluster", "status").stdout)
        assert [n["state"] for n in nodes] == ["up", "up"]  # registered over TLS: no other address given
        shown = json.loads(dlctl("-o", "json", "config", "show").stdout)
        assert shown["clusters"][0]["zookeeper"] == state["address"] and shown["clusters"][0]["zookeeper_tls"]["cert_file"]
        secure_port, plain_port = (int(a.rsplit(":", 1)[1]) for a in (state["address"], state["plain_address"]))
        assert established_to(secure_port) >= 2 and established_to(plain_port) == 0
        with pytest.raises(DlctlError, match="speaks TLS"):
            connect(state["address"], auth, timeout=3)
    finally:
        dlctl("--yes", "sandbox", "down", "--purge")
