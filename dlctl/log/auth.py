"""Mutual challenge/response authentication of agent connections with the cluster secret.

Both ends prove knowledge of the secret without sending it::

    agent  -> client   server nonce Ns (32 random bytes, fresh per connection)
    client -> agent    client nonce Nc, proof_c = HMAC-SHA256(secret, "client" ‖ Ns ‖ Nc ‖ context)
    agent  -> client   proof_s = HMAC-SHA256(secret, "server" ‖ Ns ‖ Nc ‖ context)

Ns makes a recorded client proof useless on another connection (replay); Nc does the same for
the agent's proof; the role labels keep one side's proof from being reflected as the other's;
``context`` binds the exchange to the protocol (and, if a caller wishes, the cluster id), so a
proof made for another purpose with the same secret does not verify. Proofs are compared with
``hmac.compare_digest``. The secret comes from a 0600 file (``load_secret``); it is never
logged, put in argv, or included in an error message.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from ..errors import ConfigError
from .errors import UnauthorizedError
from .tls import TlsFiles

NONCE_SIZE = 32
PROOF_SIZE = 32
MIN_SECRET_BYTES = 16
DEFAULT_CONTEXT = b"dlctl agent protocol v1"
_LABEL = b"dlctl-auth-v1"


def _proof(secret: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes, context: bytes) -> bytes:
    # Every variable-length part is length-prefixed so that no two inputs concatenate alike.
    msg = b"".join(
        (_LABEL, b"\0", role, b"\0", server_nonce, client_nonce, len(context).to_bytes(4, "big"), context)
    )
    return hmac.new(secret, msg, hashlib.sha256).digest()


def _check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError("the cluster secret must be bytes")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the cluster secret is shorter than {MIN_SECRET_BYTES} bytes")
    return bytes(secret)


def _check_nonce(nonce: bytes, what: str) -> None:
    if len(nonce) != NONCE_SIZE:
        raise UnauthorizedError(f"{what} is {len(nonce)} bytes, expected {NONCE_SIZE}")


class ServerHandshake:
    """The agent's side: issue a challenge, verify the client's proof once, prove itself back."""

    __slots__ = ("_secret", "_context", "challenge", "state")

    def __init__(self, secret: bytes, context: bytes = DEFAULT_CONTEXT, *, nonce: bytes | None = None) -> None:
        self._secret = _check_secret(secret)
        self._context = context
        self.challenge = nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE)
        _check_nonce(self.challenge, "server nonce")
        self.state = "challenged"  # -> "authenticated" | "failed"

    def __repr__(self) -> str:  # never show the secret
        return f"ServerHandshake(state={self.state!r})"

    def verify(self, client_nonce: bytes, proof: bytes) -> bytes:
        """Check the client's proof; return the agent's proof. Any failure is final for this handshake."""
        if self.state != "challenged":
            self.state = "failed"
            raise UnauthorizedError("authentication already attempted on this connection")
        self.state = "failed"
        _check_nonce(client_nonce, "client nonce")
        if hmac.compare_digest(client_nonce, self.challenge):
            raise UnauthorizedError("client nonce equals the server nonce (reflected challenge)")
        expected = _proof(self._secret, b"client", self.challenge, client_nonce, self._context)
        if len(proof) != PROOF_SIZE or not hmac.compare_digest(proof, expected):
            raise UnauthorizedError("wrong cluster secret: the client's proof does not verify")
        self.state = "authenticated"
        return _proof(self._secret, b"server", self.challenge, client_nonce, self._context)


class ClientHandshake:
    """The client's side: answer the agent's challenge, then check the agent's proof."""

    __slots__ = ("_secret", "_context", "_server_nonce", "client_nonce", "state")

    def __init__(self, secret: bytes, context: bytes = DEFAULT_CONTEXT, *, nonce: bytes | None = None) -> None:
        self._secret = _check_secret(secret)
        self._context = context
        self._server_nonce = b""
        self.client_nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE)
        _check_nonce(self.client_nonce, "client nonce")
        self.state = "new"  # -> "responded" -> "authenticated" | "failed"

    def __repr__(self) -> str:
        return f"ClientHandshake(state={self.state!r})"

    def respond(self, server_nonce: bytes) -> tuple[bytes, bytes]:
        """Return (client nonce, client proof) for the agent's challenge."""
        if self.state != "new":
            raise UnauthorizedError(f"handshake already {self.state}")
        _check_nonce(server_nonce, "server nonce")
        self._server_nonce = bytes(server_nonce)
        self.state = "responded"
        return self.client_nonce, _proof(self._secret, b"client", self._server_nonce, self.client_nonce, self._context)

    def verify_server(self, proof: bytes) -> None:
        """Raise UnauthorizedError unless the agent proved it knows the secret for this exchange."""
        if self.state != "responded":
            raise UnauthorizedError(f"cannot verify the agent's proof in handshake state {self.state}")
        self.state = "failed"
        expected = _proof(self._secret, b"server", self._server_nonce, self.client_nonce, self._context)
        if len(proof) != PROOF_SIZE or not hmac.compare_digest(proof, expected):
            raise UnauthorizedError("the agent's proof does not verify: it does not know the cluster secret")
        self.state = "authenticated"


def generate_secret() -> bytes:
    """A new cluster secret: 64 hex characters (text, so it survives editors and config tools)."""
    return secrets.token_hex(32).encode("ascii")


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """Read the cluster secret from a file that only its owner can read (mode 0600 or stricter).

    Trailing ASCII whitespace is dropped so ``echo ... > file`` works; secrets are text.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"cannot open the cluster secret file {p}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"the cluster secret file {p} is not a regular file")
        if st.st_mode & 0o077:
            raise ConfigError(
                f"the cluster secret file {p} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o})",
                hint=f"chmod 600 {p}",
            )
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(64 * 1024 + 1)
    finally:
        os.close(fd)
    secret = data.rstrip(b" \t\r\n")
    if len(data) > 64 * 1024:
        raise ConfigError(f"the cluster secret file {p} is larger than 64 KiB")
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"the cluster secret in {p} is shorter than {MIN_SECRET_BYTES} bytes")
    return secret


class Credentials:
    """What a client of a cluster's agents presents: the cluster secret (the HMAC handshake)
    and, when the cluster runs TLS, its ``TlsFiles`` (mutual TLS, the handshake bound to it)."""

    __slots__ = ("secret", "tls")

    def __init__(self, secret: bytes, tls: TlsFiles | None = None) -> None:
        self.secret = _check_secret(secret)
        self.tls = tls

    @classmethod
    def of(cls, value: Credentials | bytes) -> Credentials:
        """``value`` as Credentials: bare bytes are a secret without TLS."""
        return value if isinstance(value, Credentials) else cls(value)

    def __repr__(self) -> str:  # never show the secret
        return f"Credentials(tls={'on' if self.tls else 'off'})"
