"""TLS for the agent protocol: contexts from a cluster's PEM files, and the channel binding.

Both ends present a certificate of the cluster CA (mutual TLS 1.3): a client without one, or with
one of another CA, is refused in the TLS handshake, before it can send a frame. The HMAC
handshake of ``auth`` still runs inside the TLS channel, and is *bound* to it: both proofs cover
``tls-server-end-point`` (RFC 5929: SHA-256 of the certificate the agent presented in this TLS
session) in their context. A relay that terminates TLS itself, with any other certificate,
cannot forward a client's proof (the agent expects its own certificate's hash in it); and inside
one TLS session every record is authenticated, so a frame injected into it is dropped by TLS
before the protocol sees it. (Python's ssl module has no TLS 1.3 exporter, which would be the
stronger binding; the end-point binding suffices because the certificate is the cluster's.)

Files are re-read when they change (size, mtime or inode of any of them), so ``dlctl cluster
rotate-certs`` only has to replace them: new connections use the new certificate, connections
already open keep theirs.
"""

from __future__ import annotations

import hashlib
import os
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

BINDING_LABEL = b"tls-server-end-point:"


def channel_binding(server_cert_der: bytes) -> bytes:
    """The bytes both ends add to the handshake's context (RFC 5929 ``tls-server-end-point``)."""
    return BINDING_LABEL + hashlib.sha256(server_cert_der).digest()


def bound_context(context: bytes, server_cert_der: bytes | None) -> bytes:
    """The HMAC handshake's context for a connection: ``context`` plus, under TLS, the binding."""
    if server_cert_der is None:
        return context
    return context + b"\0" + channel_binding(server_cert_der)


def peer_cert_der(transport: object) -> bytes | None:
    """The certificate the other end presented on ``transport`` (DER), None without TLS."""
    ssl_object = transport.get_extra_info("ssl_object")  # type: ignore[attr-defined]
    if ssl_object is None:
        return None
    return ssl_object.getpeercert(binary_form=True)


def _pem_to_der(pem: bytes, where: Path) -> bytes:
    text = pem.decode("ascii", "replace")
    start = text.find("-----BEGIN CERTIFICATE-----")
    if start < 0:
        raise ConfigError(f"{where} holds no PEM certificate")
    end = text.find("-----END CERTIFICATE-----", start)
    return ssl.PEM_cert_to_DER_cert(text[start : end + len("-----END CERTIFICATE-----")] + "\n")


@dataclass
class TlsFiles:
    """A cluster member's TLS material: the CA bundle it trusts, its certificate and key (0600)."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _stamp: tuple | None = field(default=None, repr=False, compare=False)
    _server: tuple[ssl.SSLContext, bytes] | None = field(default=None, repr=False, compare=False)
    _client: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    @property
    def paths(self) -> tuple[Path, Path, Path]:
        return (self.ca_file, self.cert_file, self.key_file)

    def _current_stamp(self) -> tuple:
        stamp = []
        for path in self.paths:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise ConfigError(f"TLS file {path} does not exist", hint="`dlctl agent install` (or `dlctl cluster rotate-certs`) delivers it") from None
            except OSError as exc:
                raise ConfigError(f"TLS file {path}: {exc.strerror or exc}") from None
            stamp.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode))
        return tuple(stamp)

    def _changed(self) -> tuple | None:
        """The files' new stamp when any changed since the cached contexts were built, else None."""
        stamp = self._current_stamp()
        if stamp == self._stamp:
            return None
        mode = os.stat(self.key_file).st_mode
        if mode & 0o077:
            raise ConfigError(f"TLS key {self.key_file} is accessible by group or others (mode {mode & 0o777:04o})", hint=f"chmod 600 {self.key_file}")
        return stamp

    def _load(self, context: ssl.SSLContext) -> ssl.SSLContext:
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            context.load_verify_locations(cafile=str(self.ca_file))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"TLS CA bundle {self.ca_file} cannot be loaded: {exc}") from None
        try:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"TLS certificate {self.cert_file} with key {self.key_file} cannot be loaded: {exc}", hint="the two must be a pair issued by the cluster CA") from None
        return context

    def server(self) -> tuple[ssl.SSLContext, bytes]:
        """The agent's context (clients must present a cluster certificate) and the DER of the
        certificate it presents (for the channel binding)."""
        return self._contexts()[0]

    def client(self) -> ssl.SSLContext:
        """A client's context: the agent must present a cluster certificate naming the host dialled."""
        return self._contexts()[1]

    def _build(self) -> tuple[tuple[ssl.SSLContext, bytes], ssl.SSLContext]:
        server = self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = True
        return (server, _pem_to_der(self.cert_file.read_bytes(), self.cert_file)), self._load(client)

    def _contexts(self) -> tuple[tuple[ssl.SSLContext, bytes], ssl.SSLContext]:
        # Both contexts are built together, so once one worked neither is ever missing: a
        # rotation caught half-way (a new key beside the old certificate) keeps the previous
        # pair in service until the files match again.
        with self._lock:
            try:
                stamp = self._changed()
                if stamp is not None:
                    self._server, self._client = self._build()
                    self._stamp = stamp
            except ConfigError:
                if self._server is None or self._client is None:
                    raise
            assert self._server is not None and self._client is not None
            return self._server, self._client


__all__ = ["BINDING_LABEL", "TlsFiles", "bound_context", "channel_binding", "peer_cert_der"]
