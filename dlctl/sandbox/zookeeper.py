"""Run a standalone ZooKeeper server from the jars that ship inside the pyspark wheel.

The sandbox needs a real ZooKeeper without an extra download: pyspark carries the server
jars, and the machine's Java runs them. The process is detached (its own session) so it
outlives the ``dlctl sandbox up`` that started it; its pid is kept in the sandbox state.

With ``ServerTls`` it also serves TLS on a ``secureClientPort`` (Netty, PEM key and trust stores,
client certificates required): clients use that port, while the plain ``clientPort`` stays on
loopback for the ``srvr`` health check. ``write_tls`` makes the CA and certificates for it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DlctlError

if TYPE_CHECKING:
    from ..meta.zk import ZkTls

_LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:zookeeper.log.file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
"""


def java_executable() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def zookeeper_jars_dir() -> Path | None:
    """``<pyspark>/jars`` if it holds the ZooKeeper server jar (found without importing pyspark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    jars = Path(list(spec.submodule_search_locations)[0]) / "jars"
    return jars if any(jars.glob("zookeeper-3*.jar")) else None


def missing_prerequisites() -> list[str]:
    missing = []
    if java_executable() is None:
        missing.append("java (a JRE >= 11), e.g. apt-get install -y openjdk-17-jre-headless")
    if zookeeper_jars_dir() is None:
        missing.append("the ZooKeeper jars inside pyspark: pip install 'dlctl[spark]'")
    return missing


def four_letter(host: str, port: int, command: str, timeout: float = 1.0) -> str:
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(command.encode())
        chunks = []
        while data := s.recv(4096):
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def serving(host: str, port: int) -> bool:
    try:
        return "Mode:" in four_letter(host, port, "srvr")
    except OSError:
        return False


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1.0).close()
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class TlsFiles:
    """A ZooKeeper's TLS material: its CA, its key and certificate in one PEM file (the form
    ZooKeeper's PEM key store reads), and one client certificate with its key."""

    ca_file: Path
    server_pem: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def under(cls, directory: Path) -> TlsFiles:
        return cls(directory / "ca.pem", directory / "server.pem", directory / "client.pem", directory / "client.key")

    def client(self) -> ZkTls:
        from ..meta.zk import ZkTls

        return ZkTls(self.ca_file, self.client_cert, self.client_key)


def write_tls(directory: Path, hosts: list[str], *, name: str = "sandbox ZooKeeper") -> TlsFiles:
    """A new CA for a ZooKeeper, its server certificate (valid for ``hosts``) and a client
    certificate, written 0600 into ``directory``."""
    from .. import pki
    from ..secrets import write_secret_file

    files = TlsFiles.under(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = pki.new_ca(name)
    server = pki.issue(ca, f"{name} server", hosts, server=True)
    client = pki.issue(ca, f"{name} client", [], server=False)
    write_secret_file(files.ca_file, ca.cert_pem)
    write_secret_file(files.server_pem, server.key_pem + server.cert_pem)
    write_secret_file(files.client_cert, client.cert_pem)
    write_secret_file(files.client_key, client.key_pem)
    return files


@dataclass(frozen=True)
class ServerTls:
    """The server side of TLS: a secureClientPort on the server's host."""

    port: int
    keystore: Path  # PEM: the server's private key and certificate (chain), in one file
    truststore: Path  # PEM: the CA certificate(s) client certificates must chain to
    client_auth: str = "need"  # "need": no client certificate, no connection; "want"; "none"

    @classmethod
    def of(cls, files: TlsFiles, port: int, client_auth: str = "need") -> ServerTls:
        return cls(port, files.server_pem, files.ca_file, client_auth)


@dataclass(frozen=True)
class ZooKeeperConfig:
    workdir: Path
    host: str
    port: int
    tick_ms: int = 500
    heap: str = "256m"
    tls: ServerTls | None = None

    @property
    def config_path(self) -> Path:
        return self.workdir / "zoo.cfg"

    @property
    def log_path(self) -> Path:
        return self.workdir / "zookeeper.log"

    def write(self) -> None:
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        lines = {
            "tickTime": self.tick_ms,
            "dataDir": self.workdir / "data",
            "clientPort": self.port,
            "clientPortAddress": self.host,
            "maxClientCnxns": 0,
            "minSessionTimeout": 2 * self.tick_ms,
            "maxSessionTimeout": 60_000,
            "4lw.commands.whitelist": "ruok,srvr,stat",
            "admin.enableServer": "false",
        }
        if self.tls is not None:
            lines.update(
                {
                    "secureClientPort": self.tls.port,
                    "secureClientPortAddress": self.host,
                    # Only the Netty connection factory speaks TLS; it serves the plain port too.
                    "serverCnxnFactory": "org.apache.zookeeper.server.NettyServerCnxnFactory",
                    "ssl.keyStore.location": self.tls.keystore,
                    "ssl.keyStore.type": "PEM",
                    "ssl.trustStore.location": self.tls.truststore,
                    "ssl.trustStore.type": "PEM",
                    "ssl.clientAuth": self.tls.client_auth,
                }
            )
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)

    def argv(self) -> list[str]:
        java, jars = java_executable(), zookeeper_jars_dir()
        if java is None or jars is None:
            raise DlctlError("cannot start the embedded ZooKeeper: missing " + "; ".join(missing_prerequisites()))
        return [
            java,
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:-UsePerfData",
            "-Djava.net.preferIPv4Stack=true",
            "-Dzookeeper.admin.enableServer=false",
            "-Dzookeeper.jmx.log4j.disable=true",
            f"-Dzookeeper.log.file={self.log_path}",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp",
            f"{jars}/*",
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(self.config_path),
        ]


def start(config: ZooKeeperConfig, timeout: float = 60.0) -> int:
    """Start the server detached and wait until it serves; returns its pid."""
    config.write()
    with open(config.workdir / "zookeeper.out", "ab") as out:
        proc = subprocess.Popen(config.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DlctlError(f"ZooKeeper exited with code {proc.returncode} while starting", hint=f"see {config.log_path} and {config.workdir / 'zookeeper.out'}")
        if serving(config.host, config.port) and (config.tls is None or _listening(config.host, config.tls.port)):
            return proc.pid
        time.sleep(0.1)
    proc.kill()
    raise DlctlError(f"ZooKeeper did not serve on {config.host}:{config.port} within {timeout:g}s", hint=f"see {config.log_path}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own unreaped child) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def stop(pid: int, timeout: float = 15.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout``; True if it had to be killed."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return False
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True
