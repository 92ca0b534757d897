"""The operator's TLS directory of one cluster (inventory ``tls_dir``, 0700).

    ca.pem       the CA bundle everyone trusts (one CA; two while ``rotate-certs --new-ca`` runs)
    ca.key       the current CA's private key (0600): it never leaves this directory
    client.pem   this operator's client certificate, and client.key (0600)

An agent's files (``ca.pem``, ``agent.pem``, ``agent.key``) are issued from here and delivered
by SFTP into ``<home>/tls/`` (``dlctl agent install``, ``dlctl cluster rotate-certs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import pki
from .errors import ConfigError
from .log.tls import TlsFiles
from .secrets import write_secret_file

CA_CERT, CA_KEY, CLIENT_CERT, CLIENT_KEY = "ca.pem", "ca.key", "client.pem", "client.key"
AGENT_DIR = "tls"  # under an agent's home
AGENT_CA, AGENT_CERT, AGENT_KEY = "ca.pem", "agent.pem", "agent.key"


# Certificates are public, but are written like the keys beside them (atomically, 0600):
# nothing in this directory needs to be readable by anyone else.
write_public = write_secret_file


@dataclass(frozen=True)
class CertDir:
    path: Path
    cluster: str

    @property
    def ca_file(self) -> Path:
        return self.path / CA_CERT

    def exists(self) -> bool:
        return all((self.path / n).exists() for n in (CA_CERT, CLIENT_CERT, CLIENT_KEY))

    def client_files(self) -> TlsFiles:
        return TlsFiles(self.path / CA_CERT, self.path / CLIENT_CERT, self.path / CLIENT_KEY)

    def ca(self) -> pki.Issued:
        """The current CA (the last certificate of the bundle is the one ``ca.key`` signs with)."""
        try:
            key = (self.path / CA_KEY).read_bytes()
            bundle = (self.path / CA_CERT).read_bytes()
        except FileNotFoundError as exc:
            raise ConfigError(
                f"cluster {self.cluster!r}: the CA file {exc.filename} does not exist",
                hint="certificates are issued on the host that ran `dlctl cluster init --tls` (its tls_dir holds the CA key)",
            ) from None
        try:
            return pki.Issued(pki.signer_of(bundle, key), key)
        except ValueError as exc:
            raise ConfigError(f"cluster {self.cluster!r}: {exc}", hint="restore ca.pem and ca.key of the same CA (from a backup of the tls_dir)") from None

    def ensure(self) -> str:
        """Create the CA and the operator's certificate when missing; "created" or "kept"."""
        if self.exists():
            return "kept"
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        ca = pki.new_ca(self.cluster)
        write_secret_file(self.path / CA_KEY, ca.key_pem)
        write_public(self.path / CA_CERT, ca.cert_pem)
        self.renew_client(ca)
        return "created"

    def renew_client(self, ca: pki.Issued | None = None) -> pki.CertInfo:
        ca = ca or self.ca()
        mine = pki.issue(ca, f"dlctl operator of {self.cluster}", server=False)
        write_secret_file(self.path / CLIENT_KEY, mine.key_pem)
        write_public(self.path / CLIENT_CERT, mine.cert_pem)
        return pki.describe(mine.cert_pem)

    def issue_agent(self, node_id: str, hosts: list[str]) -> pki.Issued:
        """A certificate for agent ``node_id``, valid for its id and every host it is reached at."""
        return pki.issue(self.ca(), f"dlagent {node_id}", [node_id, *hosts])

    def bundle(self) -> bytes:
        return self.ca_file.read_bytes()


__all__ = ["AGENT_CA", "AGENT_CERT", "AGENT_DIR", "AGENT_KEY", "CA_CERT", "CA_KEY", "CLIENT_CERT", "CLIENT_KEY", "CertDir"]
