"""Real sshd processes on loopback addresses, one per simulated node.

Node ``i`` of region ``r`` listens on ``127.0.<r>.<i>`` (region numbers start at 1, so
127.0.0.x stays free for ZooKeeper and the test itself). Each node has its own ed25519 host
key, kept across restarts so ``known_hosts`` stays valid; the test client's key is generated
once and authorized on every node. Tests run as root, hence ``PermitRootLogin
prohibit-password``; ``StrictModes no`` because the key files live in pytest's tmp dirs.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import paramiko

from .procs import TAG_VAR, ManagedProcess, ProcessBacked, ProcessRegistry, free_port, new_tag, wait_until

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself, so it must be started by absolute path
START_TIMEOUT = 15.0


def missing_prerequisites() -> list[str]:
    missing = []
    if not os.access(SSHD, os.X_OK):
        missing.append(f"{SSHD}: apt-get install -y openssh-server")
    for tool in ("ssh-keygen", "ssh"):
        if shutil.which(tool) is None:
            missing.append(f"{tool}: apt-get install -y openssh-client")
    return missing


@lru_cache(maxsize=1)
def _openssh_version() -> tuple[int, int]:
    out = subprocess.run([SSHD, "-V"], capture_output=True, text=True, check=False)
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stdout + out.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def generate_key(path: Path, comment: str) -> Path:
    """An unencrypted ed25519 key pair at ``path`` / ``path.pub``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def node_address(region: int, index: int) -> str:
    if not (1 <= region <= 254 and 1 <= index <= 254):
        raise ValueError(f"region {region} / node {index} out of range 1..254")
    return f"127.0.{region}.{index}"


@dataclass(frozen=True)
class ClientIdentity:
    """The test's SSH user and key (authorized on every node)."""

    user: str
    key_path: Path

    @property
    def public_key(self) -> str:
        return Path(f"{self.key_path}.pub").read_text().strip()

    @classmethod
    def generate(cls, directory: Path) -> ClientIdentity:
        key = generate_key(directory / "id_ed25519", "dlctl-test-client")
        return cls(user=getpass.getuser(), key_path=key)


class SshdNode(ProcessBacked):
    """One ``sshd -D -e`` on ``address:port``; log at ``log_path``."""

    def __init__(
        self,
        workdir: Path,
        registry: ProcessRegistry,
        *,
        name: str,
        region: str,
        address: str,
        identity: ClientIdentity,
        session_env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.registry = registry
        self.name = name
        self.region = region
        self.address = address
        self.identity = identity
        self.session_env = dict(session_env or {})
        self.port = free_port(address)
        self.host_key_path = workdir / "ssh_host_ed25519_key"
        self.config_path = workdir / "sshd_config"
        self.authorized_keys_path = workdir / "authorized_keys"
        self.known_hosts_path = workdir / "known_hosts"
        self.log_path = workdir / f"sshd-{name}.log"
        self.proc: ManagedProcess | None = None
        # Sessions get this tag too, so kill/pause reach everything started over SSH on this
        # node, even daemons that detached from sshd.
        self.tag = new_tag()

    # -- files -------------------------------------------------------------------------------

    @property
    def host_key_line(self) -> str:
        """This node's line for a known_hosts file: ``[addr]:port ssh-ed25519 AAAA...``."""
        keytype, blob = Path(f"{self.host_key_path}.pub").read_text().split()[:2]
        return f"[{self.address}]:{self.port} {keytype} {blob}"

    @property
    def host_key(self) -> paramiko.PKey:
        return paramiko.Ed25519Key.from_private_key_file(str(self.host_key_path))

    def _write_files(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.host_key_path.exists():
            generate_key(self.host_key_path, f"host-{self.name}")
        self.authorized_keys_path.write_text(self.identity.public_key + "\n")
        self.known_hosts_path.write_text(self.host_key_line + "\n")
        lines = [
            f"ListenAddress {self.address}:{self.port}",
            f"HostKey {self.host_key_path}",
            f"PidFile {self.workdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.authorized_keys_path}",
            "UsePAM no",
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "AllowTcpForwarding yes",
            "LogLevel VERBOSE",
            # Tests open many connections at once; the default 10:30:100 drops some at random.
            "MaxStartups 200",
            "MaxSessions 100",
            "Subsystem sftp internal-sftp",
        ]
        if _openssh_version() >= (9, 8):
            # Tests fail logins on purpose; penalties would then refuse the good ones too.
            lines.append("PerSourcePenalties no")
        session_env = {**self.session_env, TAG_VAR: self.tag}
        if any('"' in v for v in session_env.values()):
            raise ValueError(f"session_env values cannot hold double quotes: {session_env}")
        lines.append("SetEnv " + " ".join(f'"{k}={v}"' for k, v in session_env.items()))
        self.config_path.write_text("\n".join(lines) + "\n")

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start sshd; on a first start whose port was taken meanwhile, retry on a new port."""
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        first = self.proc is None
        for attempt in range(3):
            self._write_files()
            argv = [SSHD, "-D", "-e", "-f", str(self.config_path)]
            if self.proc is None:
                self.proc = self.registry.start(
                    argv, name=f"sshd-{self.name}", log_path=self.log_path, tag=self.tag
                )
            else:
                self.proc.start()
            try:
                self.wait_ready(timeout)
                return
            except AssertionError:
                port_taken = not self.proc.running and "Address already in use" in self.proc.tail()
                if first and attempt < 2 and port_taken:
                    self.port = free_port(self.address)
                    continue
                raise

    def banner(self, timeout: float = 1.0) -> bytes:
        with socket.create_connection((self.address, self.port), timeout=timeout) as s:
            return s.recv(256)

    def ready(self) -> bool:
        return self.banner().startswith(b"SSH-2.0-")

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        assert self.proc is not None
        wait_until(
            self.ready,
            timeout,
            message=f"sshd {self.name} at {self.address}:{self.port} to send its SSH banner",
            watch=self.proc,
            ignore=(OSError,),
        )

    def restart(self, timeout: float = START_TIMEOUT) -> None:
        self.stop()
        self.start(timeout)

    def ensure_running(self) -> None:
        if self.paused:
            self.resume()
        if not self.running:
            self.start()

    # -- clients -----------------------------------------------------------------------------

    def connect(
        self, *, known_hosts: Path | None = None, timeout: float = 10.0
    ) -> paramiko.SSHClient:
        """A paramiko client that trusts only ``known_hosts`` (default: this node's own line).

        Unknown host keys are rejected (``RejectPolicy``), as dlctl must do by default.
        """
        client = paramiko.SSHClient()
        client.load_host_keys(str(known_hosts or self.known_hosts_path))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                self.address,
                port=self.port,
                username=self.identity.user,
                key_filename=str(self.identity.key_path),
                look_for_keys=False,
                allow_agent=False,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
            )
        except BaseException:
            client.close()
            raise
        return client

    def __repr__(self) -> str:
        return (
            f"<SshdNode {self.name} region={self.region} {self.address}:{self.port}"
            f" log={self.log_path}>"
        )


class SshCluster:
    """Nodes over regions, plus one known_hosts and one ssh_config covering all of them."""

    def __init__(self, nodes: Sequence[SshdNode], workdir: Path, identity: ClientIdentity) -> None:
        self.nodes = list(nodes)
        self.identity = identity
        self.known_hosts_path = workdir / "known_hosts"
        self.ssh_config_path = workdir / "ssh_config"
        self.write_client_files()

    def write_client_files(self) -> None:
        """(Re)write known_hosts and ssh_config (ports may change if a first start retried)."""
        self.known_hosts_path.parent.mkdir(parents=True, exist_ok=True)
        self.known_hosts_path.write_text("".join(n.host_key_line + "\n" for n in self.nodes))
        blocks = []
        for n in self.nodes:
            blocks.append(
                f"Host {n.name}\n"
                f"  HostName {n.address}\n"
                f"  Port {n.port}\n"
                f"  User {self.identity.user}\n"
                f"  IdentityFile {self.identity.key_path}\n"
                "  IdentitiesOnly yes\n"
                f"  UserKnownHostsFile {self.known_hosts_path}\n"
                "  GlobalKnownHostsFile /dev/null\n"
                "  StrictHostKeyChecking yes\n"
                "  BatchMode yes\n"
                "  ConnectTimeout 10\n"
                "  LogLevel ERROR\n"
            )
        self.ssh_config_path.write_text("\n".join(blocks))

    def __iter__(self) -> Iterator[SshdNode]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: int) -> SshdNode:
        return self.nodes[index]

    def node(self, name: str) -> SshdNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r}; nodes: {[n.name for n in self.nodes]}")

    @property
    def regions(self) -> dict[str, list[SshdNode]]:
        out: dict[str, list[SshdNode]] = {}
        for n in self.nodes:
            out.setdefault(n.region, []).append(n)
        return out

    def connect(self, node: SshdNode | str, *, timeout: float = 10.0) -> paramiko.SSHClient:
        n = self.node(node) if isinstance(node, str) else node
        return n.connect(known_hosts=self.known_hosts_path, timeout=timeout)

    def ssh_argv(self, node: SshdNode | str, *command: str) -> list[str]:
        """argv for the OpenSSH client to run ``command`` on ``node`` (strict host keys)."""
        name = node if isinstance(node, str) else node.name
        return ["ssh", "-F", str(self.ssh_config_path), name, *command]

    def heal(self) -> None:
        """Resume paused and restart stopped nodes (same addresses, ports and host keys)."""
        for n in self.nodes:
            n.ensure_running()

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


class SshNodeFactory:
    """Makes clusters of sshd nodes; same-shaped requests share one (healed) cluster.

    ``factory(nodes=3, regions=1)`` spreads nodes over regions ``r1..rR`` as evenly as
    possible (earlier regions get the remainder). Addresses are unique for the whole session,
    so a FaultNetwork can tell every node apart by source address. ``fresh=True`` gives a new,
    unshared cluster (for tests that change node files).
    """

    def __init__(self, workdir: Path, registry: ProcessRegistry, identity: ClientIdentity) -> None:
        self.workdir = workdir
        self.registry = registry
        self.identity = identity
        self._next_index: dict[int, int] = {}
        self._shared: dict[tuple[int, int, tuple[tuple[str, str], ...]], SshCluster] = {}
        self._count = 0

    def _new_cluster(self, nodes: int, regions: int, session_env: Mapping[str, str]) -> SshCluster:
        if nodes < 1 or not (1 <= regions <= nodes):
            raise ValueError(f"need 1 <= regions <= nodes, got nodes={nodes} regions={regions}")
        self._count += 1
        cdir = self.workdir / f"cluster{self._count}"
        made: list[SshdNode] = []
        for r in range(1, regions + 1):
            in_region = nodes // regions + (1 if r <= nodes % regions else 0)
            for _ in range(in_region):
                i = self._next_index.get(r, 0) + 1
                self._next_index[r] = i
                made.append(
                    SshdNode(
                        cdir / f"r{r}n{i}",
                        self.registry,
                        name=f"r{r}n{i}",
                        region=f"r{r}",
                        address=node_address(r, i),
                        identity=self.identity,
                        session_env=session_env,
                    )
                )
        for n in made:
            n.start()
        return SshCluster(made, cdir, self.identity)

    def __call__(
        self,
        nodes: int = 3,
        regions: int = 1,
        *,
        fresh: bool = False,
        session_env: Mapping[str, str] | None = None,
    ) -> SshCluster:
        env = dict(session_env or {})
        if fresh:
            return self._new_cluster(nodes, regions, env)
        key = (nodes, regions, tuple(sorted(env.items())))
        cluster = self._shared.get(key)
        if cluster is None:
            cluster = self._shared[key] = self._new_cluster(nodes, regions, env)
        else:
            cluster.heal()
        return cluster
