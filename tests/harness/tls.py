"""The harness's cluster CA: every agent, client and inventory of a test process uses it.

The suite runs the agent protocol over mutual TLS, as production does by default (``dlctl
cluster init`` creates a CA): the tested path is the default path. One CA is made per test
process, lazily, in a private temporary directory (removed at exit); like the harness ZooKeeper
credential (``zk.HARNESS_AUTH``) it is shared by every test cluster, i.e. all clusters of a test
trust each other (the "clusters sharing one CA" setup of replication sources).

    agent_tls(directory, host)      an agent certificate for ``host`` in ``directory`` -> TlsFiles
    client_tls()                    the harness operator's (client) TlsFiles
    credentials(secret)             Credentials(secret, client_tls()) for an AgentPool
    populate_tls_dir(path)          an inventory tls_dir holding the harness CA (cluster init keeps it)
    tls_dir_for(secret_file, name)  the inventory's default tls_dir of cluster ``name``, populated
    tls_table(files)                the agent.toml ``[tls]`` table for ``files``
    child_env(files) / from_env()   hand TlsFiles to a child process through its environment

Tests of plaintext behaviour opt out explicitly (``AgentNode(tls=False)``, ``tls=None``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from dlctl import pki
from dlctl import tomltext as toml
from dlctl.certdir import CA_CERT, CA_KEY, CLIENT_CERT, CLIENT_KEY
from dlctl.log.auth import Credentials
from dlctl.log.tls import TlsFiles
from dlctl.secrets import write_secret_file

CA_NAME = "harness"
AGENT_CA, AGENT_CERT, AGENT_KEY = "ca.pem", "agent.pem", "agent.key"


@dataclass(frozen=True)
class _HarnessCa:
    root: Path  # 0700: ca.pem, ca.key, client.pem, client.key
    ca: pki.Issued

    @property
    def ca_file(self) -> Path:
        return self.root / CA_CERT

    def client_files(self) -> TlsFiles:
        return TlsFiles(self.root / CA_CERT, self.root / CLIENT_CERT, self.root / CLIENT_KEY)


_lock = threading.Lock()
_state: _HarnessCa | None = None
_state_pid: int | None = None


def _write_operator_dir(path: Path, ca: pki.Issued, client: pki.Issued) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    write_secret_file(path / CA_KEY, ca.key_pem)
    write_secret_file(path / CA_CERT, ca.cert_pem)
    write_secret_file(path / CLIENT_KEY, client.key_pem)
    write_secret_file(path / CLIENT_CERT, client.cert_pem)


def harness_ca() -> _HarnessCa:
    """The CA of this test process (made on first use)."""
    global _state, _state_pid
    with _lock:
        if _state is None or _state_pid != os.getpid():
            root = Path(tempfile.mkdtemp(prefix="dlctl-harness-ca-"))
            atexit.register(_cleanup, root, os.getpid())
            ca = pki.new_ca(CA_NAME)
            _write_operator_dir(root, ca, pki.issue(ca, "dlctl harness operator", server=False))
            _state, _state_pid = _HarnessCa(root, ca), os.getpid()
        return _state


def _cleanup(root: Path, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child that inherited the handler
        shutil.rmtree(root, ignore_errors=True)


def ca_file() -> Path:
    """The harness CA certificate (PEM)."""
    return harness_ca().ca_file


def client_tls() -> TlsFiles:
    """The harness operator's client certificate, key and the CA: what test clients present.

    A fresh ``TlsFiles`` each call (its cached contexts are per object), over the same files."""
    return harness_ca().client_files()


def credentials(secret: bytes) -> Credentials:
    """What a test's ``AgentPool`` presents: ``secret`` and the harness client certificate."""
    return Credentials(secret, client_tls())


def issue(common_name: str, names: list[str], *, server: bool = True) -> pki.Issued:
    """A certificate of the harness CA (``server``: an agent's; else client-only)."""
    return pki.issue(harness_ca().ca, common_name, names, server=server)


def agent_tls(directory: Path, host: str, node_id: str = "agent", names: tuple[str, ...] = ()) -> TlsFiles:
    """An agent certificate of the harness CA valid for ``host`` (and ``node_id``, ``names``),
    written with the CA into ``directory`` (0700) as ``ca.pem``, ``agent.pem``, ``agent.key``."""
    state = harness_ca()
    issued = pki.issue(state.ca, f"dlagent {node_id}", [node_id, host, *names])
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_secret_file(directory / AGENT_CA, state.ca.cert_pem)
    write_secret_file(directory / AGENT_KEY, issued.key_pem)
    write_secret_file(directory / AGENT_CERT, issued.cert_pem)
    return TlsFiles(directory / AGENT_CA, directory / AGENT_CERT, directory / AGENT_KEY)


def populate_tls_dir(path: Path) -> Path:
    """An inventory ``tls_dir`` (0700) holding the harness CA and operator certificate, all 0600:
    ``dlctl cluster init`` keeps it, ``agent install`` issues agent certificates from it, and
    every test client trusts what it issues."""
    state = harness_ca()
    files = {name: (state.root / name).read_bytes() for name in (CA_CERT, CA_KEY, CLIENT_CERT, CLIENT_KEY)}
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    for name, data in files.items():
        write_secret_file(path / name, data)
    return path


def tls_dir_for(secret_file: Path, cluster: str) -> Path:
    """The inventory's default ``tls_dir`` of ``cluster`` (``<cluster>.tls`` beside its
    ``secret_file``), populated with the harness CA: one line for a test writing an inventory."""
    return populate_tls_dir(Path(secret_file).with_name(f"{cluster}.tls"))


CHILD_ENV = "HARNESS_CLIENT_TLS"  # "<ca_file>:<cert_file>:<key_file>" (os.pathsep-separated)


def child_env(files: TlsFiles | None) -> dict[str, str]:
    """The environment that hands ``files`` to a test's child process (``procs.start(env=...)``),
    read back there with ``from_env()``; ``{}`` for None (a plaintext child)."""
    return {CHILD_ENV: os.pathsep.join(str(p) for p in files.paths)} if files is not None else {}


def from_env() -> TlsFiles | None:
    """In a child process: the TlsFiles ``child_env`` passed, or None (plaintext)."""
    value = os.environ.get(CHILD_ENV)
    return TlsFiles(*(Path(p) for p in value.split(os.pathsep))) if value else None


def tls_table(files: TlsFiles) -> str:
    """The agent.toml ``[tls]`` table for ``files``."""
    return "\n".join(
        [
            "[tls]",
            toml.line("ca_file", files.ca_file),
            toml.line("cert_file", files.cert_file),
            toml.line("key_file", files.key_file),
            "",
        ]
    )


__all__ = [
    "CHILD_ENV", "agent_tls", "ca_file", "child_env", "client_tls", "from_env", "credentials", "harness_ca", "issue", "populate_tls_dir", "tls_dir_for", "tls_table",
]
