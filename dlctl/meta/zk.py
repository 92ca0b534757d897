"""ZooKeeper connections and ACLs.

ACLs are on whenever credentials are configured: ZooKeeper does not inherit ACLs, so every
create must pass ``acl_for(auth)``. Credentials are read from a 0600 file, never from argv.

With ``ZkTls`` (inventory ``[clusters.<c>.zookeeper_tls]``, agent.toml ``[zookeeper_tls]``) the
client speaks TLS to the ensemble's ``secureClientPort``: it checks the servers' certificates
against ``ca_file`` and the host names of the connect string, and presents ``cert_file`` when
the ensemble asks for client certificates (``ssl.clientAuth=need``). Without TLS, the digest
credential crosses the network in plain text at every (re)connection: ZooKeeper's digest scheme
sends ``user:password`` as is.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.hosts import collect_hosts
from kazoo.protocol.serialization import Auth, Connect
from kazoo.security import OPEN_ACL_UNSAFE, ACL, make_digest_acl

from ..errors import ConfigError, DlctlError
from . import paths
from ..secrets import read_secret_file

log = logging.getLogger(__name__)


class HideZkCredentials(logging.Filter):
    """kazoo logs every request it sends at DEBUG (`dlctl -vv`, `dlagent -vv`) with its fields:
    the digest ``user:password`` of an Auth request and the session password of a Connect (and
    the session password in hex again at its BLATHER level). The session password lets anyone
    who reads the log take over the session with its ephemeral znodes and locks. These records
    keep their message with the secret replaced."""

    HIDDEN = "<hidden>"

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or not args:
            return True
        if "session_passwd" in str(record.msg):
            record.args = tuple(self.HIDDEN if isinstance(a, bytes | bytearray) else a for a in args)
        elif any(isinstance(a, Auth | Connect) for a in args):
            record.args = tuple(
                a._replace(auth=self.HIDDEN) if isinstance(a, Auth) else a._replace(passwd=self.HIDDEN) if isinstance(a, Connect) else a
                for a in args
            )
        return True


# kazoo's connection logs through its client's logger, this one unless told otherwise: the
# filter is on the logger, so it holds whatever handlers the process (dlctl, dlagent, a test) sets up.
KAZOO_LOG = logging.getLogger("kazoo.client")
if not any(isinstance(f, HideZkCredentials) for f in KAZOO_LOG.filters):
    KAZOO_LOG.addFilter(HideZkCredentials())


@dataclass(frozen=True)
class ZkAuth:
    user: str
    password: str = ""

    def __repr__(self) -> str:  # never show the password in logs or tracebacks
        return f"ZkAuth(user={self.user!r}, password=***)"

    @classmethod
    def from_file(cls, path: Path) -> ZkAuth:
        text = read_secret_file(path).decode().strip()
        user, sep, password = text.partition(":")
        if not sep or not user or not password:
            raise ConfigError(f"{path}: expected one line 'user:password'")
        return cls(user, password)


def acl_for(auth: ZkAuth | None) -> list[ACL]:
    if auth is None:
        return list(OPEN_ACL_UNSAFE)
    return [make_digest_acl(auth.user, auth.password, all=True)]


ZK_TLS_KEYS = ("ca_file", "cert_file", "key_file")


@dataclass(frozen=True)
class ZkTls:
    """TLS to a ZooKeeper ensemble: the CA its servers' certificates chain to, and this client's
    certificate and key (both or neither; an ensemble with ``ssl.clientAuth=need`` wants them)."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("ZkTls: give cert_file and key_file together, or neither")

    def to_dict(self) -> dict[str, str | None]:
        return {k: (str(getattr(self, k)) if getattr(self, k) is not None else None) for k in ZK_TLS_KEYS}

    def context(self) -> ssl.SSLContext:
        """The client context kazoo will build from the same files (here: to check them, and to
        diagnose a failed connection); ConfigError naming the file that is wrong."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = True
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            context.load_verify_locations(cafile=str(self.ca_file))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"ZooKeeper TLS CA file {self.ca_file} cannot be loaded: {getattr(exc, 'strerror', None) or exc}") from None
        if self.cert_file is not None and self.key_file is not None:
            try:
                mode = os.stat(self.key_file).st_mode
            except OSError as exc:
                raise ConfigError(f"ZooKeeper TLS key {self.key_file} cannot be read: {exc.strerror or exc}") from None
            if mode & 0o077:
                raise ConfigError(f"ZooKeeper TLS key {self.key_file} is accessible by group or others (mode {mode & 0o777:04o})", hint=f"chmod 600 {self.key_file}")
            try:
                context.load_cert_chain(str(self.cert_file), str(self.key_file))
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(
                    f"ZooKeeper TLS certificate {self.cert_file} with key {self.key_file} cannot be loaded: {getattr(exc, 'strerror', None) or exc}",
                    hint="the two must be a pair (the key unencrypted)",
                ) from None
        return context

    def kazoo_options(self) -> dict[str, Any]:
        return {
            "use_ssl": True,
            "ca": str(self.ca_file),
            "certfile": str(self.cert_file) if self.cert_file else None,
            "keyfile": str(self.key_file) if self.key_file else None,
            "verify_certs": True,
            # The servers' certificates must name the hosts of the connect string.
            "check_hostname": True,
        }


def parse_tls(raw: Mapping[str, Any] | Any, where: str, base: Path, *, prefix: str = "") -> ZkTls | None:
    """ZooKeeper TLS settings from a configuration table, paths relative to ``base``.

    ``prefix=""``: ``raw`` is the ``zookeeper_tls`` table itself (None when absent), whose keys
    are exactly ``ca_file`` and optionally ``cert_file`` with ``key_file``. Otherwise ``raw`` is
    an enclosing table with keys ``<prefix>ca_file`` etc. (the caller checks its other keys).
    ``where`` names the file and table in errors (``"<file>: [zookeeper_tls]"``)."""
    if prefix:
        if not isinstance(raw, Mapping) or not any(prefix + k in raw for k in ZK_TLS_KEYS):
            return None
        table = {k: raw[prefix + k] for k in ZK_TLS_KEYS if prefix + k in raw}
    else:
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where} must be a table (with {', '.join(ZK_TLS_KEYS)})")
        extra = sorted(set(raw) - set(ZK_TLS_KEYS))
        if extra:
            raise ConfigError(f"{where}: unknown key(s): {', '.join(extra)}", hint=f"known keys: {', '.join(ZK_TLS_KEYS)}")
        table = dict(raw)
    for key, value in table.items():
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: key '{prefix}{key}' must be a file path, got {value!r}")
    if "ca_file" not in table:
        raise ConfigError(f"{where}: key '{prefix}ca_file' is required (the CA the ensemble's certificates chain to)")
    if ("cert_file" in table) != ("key_file" in table):
        given, missing = ("cert_file", "key_file") if "cert_file" in table else ("key_file", "cert_file")
        raise ConfigError(f"{where}: key '{prefix}{given}' without '{prefix}{missing}'", hint="give the client certificate and its key together, or neither")

    def path(key: str) -> Path | None:
        if key not in table:
            return None
        p = Path(table[key]).expanduser()
        return (p if p.is_absolute() else base / p).absolute()  # a daemon may change directory

    return ZkTls(path("ca_file"), path("cert_file"), path("key_file"))  # type: ignore[arg-type]


def check_connect_string(text: str, where: str) -> str:
    """``text`` if kazoo can parse it as a connect string (host[:port],... with an optional
    /chroot), else a ConfigError naming ``where``: kazoo's own ValueError would surface as an
    internal error at the first connection."""
    try:
        collect_hosts(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not a ZooKeeper connect string (host:port,host:port/chroot): {exc}, in {text!r}") from None
    return text


def _hosts(connect_string: str) -> list[tuple[str, int]]:
    hosts = connect_string.split("/", 1)[0]
    out = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep:
            host, port = item.strip(), "2181"
        if host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


def loopback_only(connect_string: str) -> bool:
    """True when every server of the connect string is on this machine's loopback: a credential
    sent to it in plain text does not cross a network."""
    hosts = _hosts(connect_string)
    return bool(hosts) and all(h == "localhost" or h.startswith("127.") or h == "::1" for h, _ in hosts)


def _tls_problem(connect_string: str, tls: ZkTls | None, timeout: float = 3.0) -> str | None:
    """Why the ensemble's first answering server refuses this client's TLS (or its absence), or
    None when that is not the trouble. A TLS handshake of our own, with the same files."""
    deadline = time.monotonic() + timeout
    for host, port in _hosts(connect_string):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            sock = socket.create_connection((host, port), timeout=left)
        except OSError:
            continue  # not listening: not a TLS problem
        with sock:
            if tls is None:
                # Does this port speak TLS? A plaintext ZooKeeper closes on a ClientHello.
                probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                probe.check_hostname, probe.verify_mode = False, ssl.CERT_NONE
                try:
                    with probe.wrap_socket(sock, server_hostname=host):
                        return f"{host}:{port} speaks TLS (a secureClientPort), and this client is configured without zookeeper_tls"
                except (OSError, ssl.SSLError):
                    return None
            try:
                conn = tls.context().wrap_socket(sock, server_hostname=host)
            except ssl.SSLCertVerificationError as exc:
                return f"the certificate of {host}:{port} is not accepted with CA file {tls.ca_file}: {exc.verify_message}"
            except (ConnectionError, ssl.SSLEOFError):
                return f"{host}:{port} closed the connection in the TLS handshake: it does not speak TLS (a plaintext clientPort?)"
            except ssl.SSLError as exc:
                if exc.reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
                    return f"{host}:{port} does not speak TLS (a plaintext clientPort?)"
                return f"the TLS handshake with {host}:{port} failed: {exc.reason or exc}"
            except OSError:
                continue  # a timeout: a server too busy to answer, not a TLS problem
            with conn:
                # TLS 1.3: the server judges our certificate after the client's handshake ends;
                # a refusal arrives as an alert on the first read. Silence: it accepted us.
                conn.settimeout(min(timeout, 1.0))
                try:
                    data = conn.recv(1)
                except ssl.SSLError as exc:
                    return f"{host}:{port} refused this client's certificate ({exc.reason or exc})" + ("" if tls.cert_file else ": the ensemble requires one (cert_file, key_file)")
                except (TimeoutError, socket.timeout):
                    return None
                except OSError as exc:
                    return f"{host}:{port} closed the TLS connection ({exc.strerror or exc}): does it accept this client's certificate?"
                if data == b"":
                    return f"{host}:{port} closed the TLS connection at once: does it accept this client's certificate?"
                return None
    return None


def connect(connect_string: str, auth: ZkAuth | None = None, timeout: float = 10.0, session_timeout: float = 10.0, tls: ZkTls | None = None) -> KazooClient:
    """Start a kazoo client (authenticated when ``auth`` is given, over TLS with ``tls``) or
    raise naming the ensemble."""
    if tls is not None:
        tls.context()  # a missing or mismatched file: a ConfigError naming it, not a timeout
    client = KazooClient(
        hosts=connect_string,
        timeout=session_timeout,
        auth_data=[("digest", f"{auth.user}:{auth.password}")] if auth else None,
        # Every create without an explicit ACL — kazoo's recipes (elections, locks, parties)
        # included — gets the cluster's: ZooKeeper does not inherit ACLs.
        default_acl=acl_for(auth) if auth else None,
        connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 2},
        command_retry={"max_tries": 3, "delay": 0.1, "backoff": 2, "max_delay": 1},
        logger=KAZOO_LOG,
        **(tls.kazoo_options() if tls is not None else {}),
    )
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError as exc:
        client.close()
        problem = _tls_problem(connect_string, tls)
        if problem is not None:
            raise DlctlError(
                f"cannot connect to ZooKeeper at {connect_string} over TLS: {problem}" if tls is not None
                else f"cannot connect to ZooKeeper at {connect_string}: {problem}",
                hint="point zookeeper_tls at the CA that issued the ensemble's certificates, a client certificate it accepts, and the connect string at its secureClientPort"
                if tls is not None
                else "add a zookeeper_tls table (ca_file, cert_file, key_file) to the configuration, or use the ensemble's plaintext clientPort",
            ) from exc
        raise DlctlError(
            f"cannot reach ZooKeeper at {connect_string}{' over TLS' if tls is not None else ''} within {timeout:g}s",
            hint="check the connect string in the configuration and that the ensemble is up",
        ) from exc
    return client


def check_credentials(client: KazooClient, cluster: str, auth: ZkAuth | None, auth_file: Path | str | None) -> None:
    """ZooKeeper's digest scheme accepts any password at connection: wrong credentials show only
    as a refusal (NoAuthError, with no message) at the first read, deep in whatever made it. One
    read of the cluster's root znode (every znode of a cluster carries its ACL) says it at once,
    naming the file. A cluster not initialised yet passes (``cluster init`` says what it finds),
    and so does a client without credentials (``insecure_zookeeper``: no ACLs to refuse it)."""
    if auth is None:
        return
    try:
        client.get(paths.cluster_root(cluster))
    except NoNodeError:
        return
    except NoAuthError:
        raise ConfigError(
            f"cluster {cluster!r}: ZooKeeper refuses its metadata to user {auth.user!r} of {auth_file}: "
            "not the credentials the cluster was initialised with",
            hint="copy the zk-auth file from the host that ran `dlctl cluster init` (mode 0600)",
        ) from None


# A record that exists and cannot be used: damaged (CorruptMetadata is a ValueError) or refused
# by its ACL. A report names it and goes on; it is never taken for a record that is not there.
UNREADABLE = (ValueError, NoAuthError)


def why_unreadable(exc: BaseException) -> str:
    """What to say of a record that raised one of ``UNREADABLE``."""
    return refused(exc).message if isinstance(exc, NoAuthError) else str(exc)


def refused(exc: NoAuthError) -> DlctlError:
    """A ZooKeeper refusal (NoAuthError, which carries no message) as the error it is, naming the
    znode: the ``path`` argument of the innermost kazoo client call in its traceback (a call made
    through an async result has none there: the error then names no znode)."""
    path = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename.endswith(os.path.join("kazoo", "client.py")) and isinstance(frame.f_locals.get("path"), str):
            path = frame.f_locals["path"]
        tb = tb.tb_next
    what = f"znode {path}" if path else "a znode"
    return DlctlError(
        f"ZooKeeper refused access to {what}: its ACL does not admit this configuration's ZooKeeper credentials",
        hint="a znode created by hand or by another tool under the cluster's root keeps its own ACL: give it the cluster's ACL (zkCli setAcl) or remove it; if every znode is refused, the credentials file is not the cluster's",
    )


def connect_once(connect_string: str, auth: ZkAuth | None = None, timeout: float = 1.0, tls: ZkTls | None = None) -> KazooClient | None:
    """One bounded attempt, no retries and no diagnosis: for callers that must answer at once or
    not at all (shell completion). None when no server of the ensemble answers within ``timeout``
    seconds in all; the caller stops and closes the client it gets."""
    deadline = time.monotonic() + timeout
    # kazoo waits the whole timeout for a port nobody listens on; a refused TCP connect says so
    # at once (and bounds an unroutable host by what is left of the timeout).
    for host, port in _hosts(connect_string):
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            socket.create_connection((host, port), timeout=left).close()
            break
        except OSError:
            continue
    else:
        return None
    no_retry = {"max_tries": 0, "delay": 0.05, "max_delay": 0.05}
    client = KazooClient(
        hosts=connect_string,
        timeout=max(timeout, 1.0),  # the session timeout kazoo derives its connect timeout from
        auth_data=[("digest", f"{auth.user}:{auth.password}")] if auth else None,
        connection_retry=no_retry,
        command_retry=no_retry,
        logger=KAZOO_LOG,
        **(tls.kazoo_options() if tls is not None else {}),
    )
    try:
        client.start(timeout=max(0.05, deadline - time.monotonic()))
    except KazooTimeoutError:
        client.stop()
        client.close()
        return None
    return client
