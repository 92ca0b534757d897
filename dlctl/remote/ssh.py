"""``SshTransport``: the ``Transport`` interface over SSH (paramiko), as an operator's ssh would do it.

What it takes from the operator's OpenSSH setup
  * ``~/.ssh/config`` (or ``SshOptions.config_path``): ``HostName``, ``User``, ``Port``,
    ``IdentityFile``, ``IdentitiesOnly``, ``ProxyJump``, ``ConnectTimeout``,
    ``UserKnownHostsFile``, ``GlobalKnownHostsFile``. ``ProxyCommand`` is refused (we would
    silently connect somewhere else). ``StrictHostKeyChecking`` is deliberately ignored: only
    ``SshOptions.accept_new`` (the CLI's ``--ssh-accept-new``) can relax host key checking, and
    never for a changed key. ``HostKeyAlias`` is not supported (lookups use ``[host]:port``).
  * known_hosts: ``/etc/ssh/ssh_known_hosts`` and ``~/.ssh/known_hosts`` (or the files the ssh
    config or ``SshOptions`` name), parsed once per process and re-read when they change.
    Hashed names, ``*``/``?`` patterns and ``!`` negations work; ``@revoked`` keys are refused;
    ``@cert-authority`` lines are ignored (such hosts count as unknown).

Host keys (the reason this module exists rather than "just paramiko")
  * Unknown host → ``UnknownHostKey`` (a ``RefusedError``: exit 4) naming host, port, key type,
    SHA256 fingerprint and how to verify and add it. The policy is a ``paramiko.RejectPolicy``.
  * ``accept_new=True``: a host never seen before is trusted on first use and appended to the
    user's known_hosts (OpenSSH's ``StrictHostKeyChecking accept-new``).
  * Changed key → ``HostKeyChanged`` (also ``RefusedError``, exit 4), always, ``accept_new`` or
    not: it is what a man-in-the-middle looks like.

Connections and commands
  * One SSH connection per host, opened on first use and reused by every later command (several
    at once from several threads); a connection found dead is reopened before the next command.
  * ``run(timeout=...)`` bounds everything including connecting. On timeout the remote command's
    process group gets SIGTERM, then SIGKILL after ``kill_grace``, and the channel is closed, so
    nothing keeps running unseen. (Each command runs under a one-line ``sh`` wrapper that reports
    its process group and then ``exec``s the argv unchanged; see ``_WRAPPER``.)
  * ``ProxyJump`` hops are SSH connections of their own (their host keys checked the same way);
    the target is reached through a ``direct-tcpip`` channel of the last hop. ``SshPool`` shares
    one connection per jump host between all targets behind it.
  * Each command runs through the remote user's login shell (that is what sshd does), so
    the node needs a POSIX ``sh``; argv is quoted with ``shlex.join`` for it.
  * Authentication is by key only: identity files (inventory, then ssh config) and the ssh-agent.
    There is no password parameter anywhere; an encrypted key must be loaded into the agent.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import getpass
import hashlib
import hmac
import logging
import os
import re
import secrets as _random
import select
import shlex
import socket
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import paramiko

from ..errors import ConfigError, DlctlError, RefusedError
from ..inventory import Node
from .transport import (
    AuthenticationFailed,
    CommandResult,
    CommandTimeout,
    HostUnreachable,
    Transport,
    check_argv,
    check_env,
    check_remote_path,
    check_timeout,
    describe,
)

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path("~/.ssh/config")
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
DEFAULT_GLOBAL_KNOWN_HOSTS = (Path("/etc/ssh/ssh_known_hosts"),)
DEFAULT_CONNECT_TIMEOUT = 10.0
# After SIGTERM on timeout, how long the remote command may take to exit before SIGKILL.
DEFAULT_KILL_GRACE = 1.0
# Uploads are bounded too: a hung node must not hang `agent install` forever.
DEFAULT_PUT_TIMEOUT = 600.0
_MAX_JUMP_DEPTH = 8
_READ_CHUNK = 1 << 16
# Stdin this small fits the channel window (2 MiB for OpenSSH), so sendall cannot block on a
# command that is not reading yet; anything larger is written from a helper thread.
_INLINE_STDIN = 32 * 1024
_PUT_CHUNK = 1 << 15

# One lock for appending to known_hosts from this process (fan-out connects in parallel);
# flock() covers other processes.
_KNOWN_HOSTS_LOCK = threading.Lock()


# -- errors --------------------------------------------------------------------------------------


class HostKeyError(RefusedError):
    """A host key could not be trusted; nothing was sent to the host. Exit code 4 (refused)."""


class UnknownHostKey(HostKeyError):
    """The host is not in known_hosts (and ``accept_new`` is off)."""


class HostKeyChanged(HostKeyError):
    """The host offered a key other than the one known_hosts holds: possible man-in-the-middle."""


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint, as ``ssh-keygen -lf`` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


# -- settings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SshOptions:
    """Settings shared by every host of one dlctl invocation (from CLI flags and environment)."""

    config_path: Path | None = None  # None: ~/.ssh/config if it exists
    known_hosts: Path | None = None  # the user's file (read, and written by accept_new)
    global_known_hosts: tuple[Path, ...] | None = None  # read only
    accept_new: bool = False
    connect_timeout: float | None = None  # None: ssh config ConnectTimeout, else 10 s
    allow_agent: bool = True
    kill_grace: float = DEFAULT_KILL_GRACE
    keepalive: int = 30  # seconds between keepalives, so NAT/firewalls keep idle reused connections


@dataclass(frozen=True)
class JumpHop:
    """One ``ProxyJump`` element: ``[user@]host[:port]`` or ``ssh://[user@]host[:port]``."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, spec: str, where: str) -> JumpHop:
        text = spec.strip()
        if text.startswith("ssh://"):
            text = text[len("ssh://") :].rstrip("/")
        user, _, hostport = text.rpartition("@")
        host, port = hostport, None
        m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?|([^:\[\]]+)(?::(\d+))?", hostport)
        if m:
            host = m.group(1) or m.group(3)
            digits = m.group(2) or m.group(4)
            port = int(digits) if digits else None
        if not m or not host or host.startswith("-") or (port is not None and not 0 < port < 65536):
            raise ConfigError(f"{where}: invalid ProxyJump element {spec!r}", hint="use [user@]host[:port], comma-separated for several hops")
        return cls(host=host, user=user or None, port=port)

    def __str__(self) -> str:
        return (f"{self.user}@" if self.user else "") + self.host + (f":{self.port}" if self.port else "")


@dataclass(frozen=True)
class Endpoint:
    """Where and how to connect to one host, after applying the ssh config."""

    alias: str  # what the caller asked for (ssh config ``Host`` name or an address)
    hostname: str  # what is actually dialled and looked up in known_hosts
    port: int
    user: str
    identity_files: tuple[Path, ...]
    identities_only: bool
    jumps: tuple[JumpHop, ...]
    connect_timeout: float
    known_hosts: Path  # user file: read, and where accept_new records
    global_known_hosts: tuple[Path, ...]

    @property
    def known_hosts_name(self) -> str:
        """The name known_hosts must hold for this host (``[host]:port`` off port 22)."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.hostname}:{self.port}"

    def describe(self) -> str:
        where = self.alias if self.alias == self.hostname else f"{self.alias} ({self.hostname})"
        via = f" via {' -> '.join(str(j) for j in self.jumps)}" if self.jumps else ""
        return f"{self.user}@{where} port {self.port}{via}"


def load_ssh_config(path: Path | None) -> tuple[paramiko.SSHConfig, Path | None]:
    """Parse the OpenSSH client config (``None``: ``~/.ssh/config`` if present, else empty)."""
    explicit = path is not None
    chosen = (path or DEFAULT_CONFIG).expanduser()
    if not chosen.exists():
        if explicit:
            raise ConfigError(f"ssh config {chosen} does not exist", hint="pass an existing file, or none to use ~/.ssh/config")
        return paramiko.SSHConfig(), None
    try:
        return paramiko.SSHConfig.from_path(str(chosen)), chosen
    except (OSError, paramiko.ConfigParseError, ValueError) as exc:
        raise ConfigError(f"ssh config {chosen}: cannot parse: {exc}", hint="check the file with `ssh -G HOST -F FILE`") from None


def resolve_endpoint(
    host: str,
    *,
    config: paramiko.SSHConfig,
    config_file: Path | None,
    options: SshOptions,
    user: str | None = None,
    port: int | None = None,
    identity_file: str | PathLike[str] | None = None,
    proxy_jump: str | None = None,
) -> Endpoint:
    """Apply the ssh config to ``host``. Explicit arguments win, as on ssh's command line."""
    where = f"ssh config {config_file}" if config_file else "ssh settings"
    if not isinstance(host, str) or not host or host.startswith("-") or any(c.isspace() or c == "\x00" for c in host):
        raise ConfigError(f"invalid SSH host {host!r}", hint="use a host name, an address or a Host alias from your ssh config")
    cfg = config.lookup(host)
    if "proxycommand" in cfg and str(cfg["proxycommand"]).lower() != "none":
        raise ConfigError(
            f"{where}: host {host!r} uses ProxyCommand, which dlctl does not run",
            hint="use ProxyJump instead (dlctl runs jumps itself, checking every hop's host key)",
        )
    try:
        cfg_port = int(cfg.get("port", 22))
        timeout = float(options.connect_timeout or cfg.get("connecttimeout") or DEFAULT_CONNECT_TIMEOUT)
    except ValueError as exc:
        raise ConfigError(f"{where}: host {host!r}: {exc}") from None
    explicit_identity = Path(identity_file).expanduser() if identity_file else None
    if explicit_identity is not None and not explicit_identity.is_file():
        raise ConfigError(
            f"identity file {explicit_identity} for host {host!r} does not exist",
            hint="fix identity_file in the inventory, or remove it to use your ssh config and agent",
        )
    identities = [explicit_identity] if explicit_identity else []
    # Like ssh, config identity files that do not exist are skipped (they often name defaults).
    identities += [p for p in (Path(f).expanduser() for f in cfg.get("identityfile", [])) if p.is_file() and p not in identities]
    jump_spec = proxy_jump if proxy_jump is not None else cfg.get("proxyjump")
    jumps: tuple[JumpHop, ...] = ()
    if jump_spec and jump_spec.strip().lower() != "none":
        jumps = tuple(JumpHop.parse(s, where) for s in jump_spec.split(","))
    user_files = _paths(cfg.get("userknownhostsfile"))
    global_files = _paths(cfg.get("globalknownhostsfile"))
    return Endpoint(
        alias=host,
        hostname=cfg.get("hostname", host),
        port=port or cfg_port,
        user=user or cfg.get("user") or getpass.getuser(),
        identity_files=tuple(identities),
        identities_only=str(cfg.get("identitiesonly", "no")).lower() == "yes",
        jumps=jumps,
        connect_timeout=timeout,
        known_hosts=(options.known_hosts or (user_files[0] if user_files else DEFAULT_KNOWN_HOSTS)).expanduser(),
        global_known_hosts=tuple(p.expanduser() for p in (options.global_known_hosts if options.global_known_hosts is not None else (global_files or DEFAULT_GLOBAL_KNOWN_HOSTS))),
    )


def _paths(value: Any) -> tuple[Path, ...]:
    if not value:
        return ()
    words = value if isinstance(value, list) else shlex.split(str(value))
    return tuple(Path(w).expanduser() for w in words if w.lower() != "none")


# -- known_hosts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _KnownHostsFile:
    """One parsed known_hosts file. Keys stay base64 until a host actually needs them.

    Parsed here rather than by ``paramiko.HostKeys.load``, which is quadratic in the number of
    lines (it de-duplicates every line against all earlier ones) and builds a key object for
    every line: ~5 ms per connection for 64 lines, seconds for a fleet-sized file.
    """

    plain: Mapping[str, tuple[tuple[str, str], ...]]  # exact name -> ((keytype, base64), ...)
    other: tuple[tuple[tuple[str, ...], str, str], ...]  # (patterns or |1| hashes, keytype, base64)
    revoked: frozenset[str]  # base64 blobs of @revoked keys

    def keys_for(self, name: str) -> list[tuple[str, str]]:
        found = list(self.plain.get(name, ()))
        for patterns, keytype, blob in self.other:
            if _entry_matches(patterns, name):
                found.append((keytype, blob))
        return found


def _entry_matches(patterns: tuple[str, ...], name: str) -> bool:
    """OpenSSH host matching: ``|1|salt|hash`` hashed names, ``*``/``?`` wildcards, ``!`` negation."""
    positive = False
    for pattern in patterns:
        if pattern.startswith("|1|"):
            try:
                _, _, salt, digest = pattern.split("|")
                mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
            except (ValueError, binascii.Error):
                continue
            if hmac.compare_digest(mac, base64.b64decode(digest)):
                positive = True
            continue
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in body)
        if re.fullmatch(regex, name, flags=re.IGNORECASE):
            if negated:
                return False  # a matching negation vetoes the whole line
            positive = True
    return positive


def _parse_known_hosts(text: str) -> _KnownHostsFile:
    plain: dict[str, list[tuple[str, str]]] = {}
    other: list[tuple[tuple[str, ...], str, str]] = []
    revoked: set[str] = set()
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if fields[0].startswith("@"):
            if fields[0] == "@revoked" and len(fields) >= 4:
                revoked.add(fields[3])
            # @cert-authority: host certificates are not supported; such hosts stay unknown.
            continue
        if len(fields) < 3:
            continue
        names, keytype, blob = fields[0].split(","), fields[1], fields[2]
        if any(n.startswith(("|", "!")) or "*" in n or "?" in n for n in names):
            other.append((tuple(names), keytype, blob))
        else:
            for n in names:
                plain.setdefault(n.lower(), []).append((keytype, blob))
    return _KnownHostsFile({k: tuple(v) for k, v in plain.items()}, tuple(other), frozenset(revoked))


_KH_CACHE: dict[Path, tuple[tuple[int, int, int], _KnownHostsFile]] = {}
_KH_CACHE_LOCK = threading.Lock()
_EMPTY_KH = _KnownHostsFile({}, (), frozenset())


def _known_hosts_file(path: Path) -> _KnownHostsFile:
    """The parsed file, re-read only when it changed (inode, size or mtime differ)."""
    try:
        st = path.stat()
    except OSError:
        return _EMPTY_KH
    if not stat.S_ISREG(st.st_mode):  # /dev/null and friends: nothing known
        return _EMPTY_KH
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _KH_CACHE_LOCK:
        cached = _KH_CACHE.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
    try:
        parsed = _parse_known_hosts(path.read_text(errors="replace"))
    except OSError as exc:
        raise ConfigError(f"cannot read known_hosts file {path}: {exc.strerror}", hint="check its permissions") from None
    with _KH_CACHE_LOCK:
        _KH_CACHE[path] = (stamp, parsed)
    return parsed


@dataclass(frozen=True)
class _KnownKeys:
    """What the known_hosts files say about one ``[host]:port`` name."""

    keys: tuple[paramiko.PKey, ...]
    unusable: tuple[str, ...]  # key types listed for the host that paramiko cannot check
    revoked: frozenset[str]


def _known_keys(ep: Endpoint) -> _KnownKeys:
    name = ep.known_hosts_name.lower()
    keys: list[paramiko.PKey] = []
    unusable: list[str] = []
    revoked: set[str] = set()
    # The user's file first, so a global entry of the same key type wins, as in paramiko.
    for path in (ep.known_hosts, *ep.global_known_hosts):
        parsed = _known_hosts_file(path)
        revoked |= parsed.revoked
        for keytype, blob in parsed.keys_for(name):
            try:
                keys.append(paramiko.PKey.from_type_string(keytype, base64.b64decode(blob)))
            except (paramiko.SSHException, ValueError, binascii.Error, TypeError):
                unusable.append(keytype)
    return _KnownKeys(tuple(k for k in keys if k.get_base64() not in revoked), tuple(unusable), frozenset(revoked))


def _unknown_key_error(ep: Endpoint, key: paramiko.PKey) -> UnknownHostKey:
    name = ep.known_hosts_name
    port_opt = f"-p {ep.port} " if ep.port != 22 else ""
    return UnknownHostKey(
        f"host key of {ep.describe()} is not known: it offered {key.get_name()} key {fingerprint(key)}; refusing to connect",
        hint=(
            f"verify that fingerprint on the node itself (ssh-keygen -lf /etc/ssh/ssh_host_{_short_type(key)}_key.pub), "
            f"then add it: ssh-keyscan {port_opt}{ep.hostname} >> {ep.known_hosts}  "
            f"(it must be recorded as {name}); or re-run with --ssh-accept-new to trust hosts seen for the first time"
        ),
        details={"host": ep.alias, "hostname": ep.hostname, "port": ep.port, "key_type": key.get_name(), "fingerprint": fingerprint(key), "known_hosts": [str(p) for p in (ep.known_hosts, *ep.global_known_hosts)]},
    )


def _changed_key_error(ep: Endpoint, offered: paramiko.PKey, expected: paramiko.PKey | None) -> HostKeyChanged:
    known = f"{expected.get_name()} {fingerprint(expected)}" if expected is not None else "another key"
    return HostKeyChanged(
        f"HOST KEY CHANGED for {ep.describe()}: known_hosts holds {known} but the host offered "
        f"{offered.get_name()} {fingerprint(offered)}. Someone may be intercepting the connection "
        "(man-in-the-middle); refusing to connect, even with --ssh-accept-new",
        hint=(
            f"if the node was legitimately reinstalled, verify the new fingerprint on the node, then remove the old entry "
            f"(ssh-keygen -R '{ep.known_hosts_name}' -f {ep.known_hosts}) and add the new one"
        ),
        details={"host": ep.alias, "hostname": ep.hostname, "port": ep.port, "offered": f"{offered.get_name()} {fingerprint(offered)}", "known": known},
    )


def _revoked_error(ep: Endpoint, key: paramiko.PKey) -> HostKeyError:
    return HostKeyError(
        f"host key of {ep.describe()} ({key.get_name()} {fingerprint(key)}) is marked @revoked in known_hosts; refusing to connect",
        hint="the node needs a new host key; ask whoever revoked this one",
    )


def _short_type(key: paramiko.PKey) -> str:
    name = key.get_name()
    return "ed25519" if "ed25519" in name else "ecdsa" if "ecdsa" in name else "rsa"


class _RejectUnknown(paramiko.RejectPolicy):
    """paramiko's RejectPolicy, raising our error (host, port, type, fingerprint, the fix)."""

    def __init__(self, endpoint: Endpoint, known: _KnownKeys) -> None:
        self.endpoint = endpoint
        self.known = known

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if key.get_base64() in self.known.revoked:
            raise _revoked_error(self.endpoint, key)
        raise _unknown_key_error(self.endpoint, key)


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """Trust on first use. Only reached for a host with *no* usable known key: paramiko raises
    BadHostKeyException for a known host offering another key before asking the policy."""

    def __init__(self, endpoint: Endpoint, known: _KnownKeys) -> None:
        self.endpoint = endpoint
        self.known = known

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        ep = self.endpoint
        if key.get_base64() in self.known.revoked:
            raise _revoked_error(ep, key)
        if self.known.unusable:
            # The host *is* known, by a key type we cannot check: not a first contact.
            raise HostKeyError(
                f"{ep.describe()} is in known_hosts with a {', '.join(sorted(set(self.known.unusable)))} key that dlctl cannot verify; "
                f"not trusting the {key.get_name()} key {fingerprint(key)} it offered instead",
                hint=f"verify the fingerprint on the node and add its {key.get_name()} key to {ep.known_hosts}",
            )
        record_host_key(ep, hostname, key)
        log.warning("permanently added %s key %s for %s to %s", key.get_name(), fingerprint(key), hostname, ep.known_hosts)


def _create_remote(sftp: paramiko.SFTPClient, path: str, mode: int) -> paramiko.SFTPFile:
    """Create ``path`` for writing, new (``O_EXCL``: never an existing file or a planted
    symlink) and with ``mode`` from its first instant.

    ``SFTPClient.open`` sends an empty attribute block, so the server creates the file with its
    own default (0644 under the usual umask) and a chmod can only follow: a local user who
    opens the file in between keeps that descriptor and reads the secret once it is written
    (issue 19). The SSH_FXP_OPEN request carries the permissions instead; OpenSSH's sftp-server
    passes them to open(2), so the server's umask can only narrow them. The fchmod on the
    handle, before the first byte, then sets exactly ``mode`` (a narrower umask, or a server
    that ignores open attributes)."""
    attrs = paramiko.SFTPAttributes()
    attrs.st_mode = mode
    flags = paramiko.sftp.SFTP_FLAG_WRITE | paramiko.sftp.SFTP_FLAG_CREATE | paramiko.sftp.SFTP_FLAG_TRUNC | paramiko.sftp.SFTP_FLAG_EXCL
    kind, msg = sftp._request(paramiko.sftp.CMD_OPEN, path, flags, attrs)  # noqa: SLF001 - open() cannot pass attributes
    if kind != paramiko.sftp.CMD_HANDLE:
        raise paramiko.SFTPError(f"expected a handle opening {path}, got message type {kind}")
    fout = paramiko.SFTPFile(sftp, msg.get_binary(), "wb")
    try:
        fout.chmod(mode)
    except BaseException:
        fout.close()
        raise
    return fout


def record_host_key(ep: Endpoint, name: str, key: paramiko.PKey) -> None:
    """Append ``name key`` to the user's known_hosts, unless already there. Re-checked under a
    lock: if another connection recorded a *different* key meanwhile, that is a change."""
    path = ep.known_hosts
    with _KNOWN_HOSTS_LOCK:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise DlctlError(f"cannot record the host key of {ep.describe()} in {path}: {exc.strerror}", hint="check that the known_hosts file and its directory are writable") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            current = _parse_known_hosts(os.pread(fd, size, 0).decode(errors="replace"))
            known = current.keys_for(name.lower())
            if known:
                if (key.get_name(), key.get_base64()) in known:
                    return
                keytype, blob = known[0]
                raise _changed_key_error(ep, key, paramiko.PKey.from_type_string(keytype, base64.b64decode(blob)))
            needs_newline = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            line = f"{name} {key.get_name()} {key.get_base64()}\n"
            os.write(fd, (b"\n" if needs_newline else b"") + line.encode())
        finally:
            os.close(fd)


# -- the transport -------------------------------------------------------------------------------

JumpProvider = Callable[[JumpHop, str | None], "SshTransport"]


class SshTransport(Transport):
    """Commands and uploads on one host over one reused SSH connection. Thread-safe.

    ``host`` is an address or an ssh config ``Host`` alias; ``user``/``port``/``identity_file``
    override the config (``None`` = take it from the config). ``name`` is what results and
    errors call the host (default: ``host``). Use ``SshPool`` for many hosts: it shares jump
    host connections and closes everything at once.
    """

    def __init__(
        self,
        host: str,
        *,
        user: str | None = None,
        port: int | None = None,
        identity_file: str | PathLike[str] | None = None,
        options: SshOptions | None = None,
        name: str | None = None,
        proxy_jump: str | None = None,
        jump_provider: JumpProvider | None = None,
        _config: tuple[paramiko.SSHConfig, Path | None] | None = None,
        _depth: int = 0,
    ) -> None:
        self.options = options or SshOptions()
        self.host = name or host
        if _depth > _MAX_JUMP_DEPTH:
            raise ConfigError(f"ProxyJump chain to {host!r} is deeper than {_MAX_JUMP_DEPTH} hops", hint="look for a ProxyJump loop in your ssh config")
        self._config = _config or load_ssh_config(self.options.config_path)
        self.endpoint = resolve_endpoint(
            host,
            config=self._config[0],
            config_file=self._config[1],
            options=self.options,
            user=user,
            port=port,
            identity_file=identity_file,
            proxy_jump=proxy_jump,
        )
        self._depth = _depth
        self._jump_provider = jump_provider
        self._owned_jumps: list[SshTransport] = []
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def for_node(cls, node: Node, options: SshOptions | None = None, **kwargs: Any) -> SshTransport:
        """The transport for an inventory node: its ssh_user/identity_file override the ssh
        config; its ssh_port does too unless it is the default 22 (the inventory cannot tell an
        explicit 22 from an unset port, and the ssh config may know better)."""
        return cls(
            node.host,
            user=node.ssh_user,
            port=node.ssh_port if node.ssh_port != 22 else None,
            identity_file=node.identity_file,
            options=options,
            name=node.id,
            **kwargs,
        )

    # -- connecting ------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        client = self._client
        transport = client.get_transport() if client is not None else None
        return transport is not None and transport.is_active()

    def connect(self, timeout: float | None = None) -> None:
        """Connect now (otherwise the first command does). Raises like ``run`` does."""
        budget = timeout if timeout is not None else self.endpoint.connect_timeout
        self._ensure_client(time.monotonic() + budget, "connect")

    def _ensure_client(self, deadline: float, doing: str) -> paramiko.SSHClient:
        # Bounded wait: another thread may be connecting; this call's deadline still holds.
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise self._timeout(doing, "waiting for another thread to connect", deadline)
        try:
            if self._closed:
                raise DlctlError(f"{self.host}: SSH transport is closed", hint="create a new transport (or SshPool.get)")
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return self._client
                # The node restarted or the network dropped us while idle: nothing is running
                # on this connection any more, so reconnecting cannot repeat a command.
                log.info("%s: SSH connection was closed; reconnecting", self.host)
                self._client.close()
                self._client = None
            self._client = self._open_client(deadline, doing)
            return self._client
        finally:
            self._lock.release()

    def _open_client(self, deadline: float, doing: str) -> paramiko.SSHClient:
        ep = self.endpoint
        budget = min(ep.connect_timeout, deadline - time.monotonic())
        if budget <= 0:
            raise self._timeout(doing, "connecting", deadline)
        connect_deadline = time.monotonic() + budget
        sock = self._open_socket(connect_deadline, doing)
        client = paramiko.SSHClient()
        try:
            # Only this host's keys go into the client (paramiko compares every key it holds
            # for the name; revoked keys are left out, so offering one cannot match).
            known = _known_keys(ep)
            host_keys = client.get_host_keys()
            for key in known.keys:
                host_keys.add(ep.known_hosts_name, key.get_name(), key)
            client.set_missing_host_key_policy(_AcceptNew(ep, known) if self.options.accept_new else _RejectUnknown(ep, known))
            remaining = max(0.05, connect_deadline - time.monotonic())
            client.connect(
                ep.hostname,
                port=ep.port,
                username=ep.user,
                key_filename=[str(p) for p in ep.identity_files] or None,
                allow_agent=self.options.allow_agent and not (ep.identities_only and ep.identity_files),
                look_for_keys=not ep.identity_files,
                timeout=remaining,
                banner_timeout=remaining,
                auth_timeout=remaining,
                channel_timeout=remaining,
                sock=sock,
            )
        except BaseException as exc:
            client.close()
            sock.close()
            raise self._connect_error(exc, connect_deadline, doing) from None
        transport = client.get_transport()
        assert transport is not None
        if self.options.keepalive:
            transport.set_keepalive(self.options.keepalive)
        log.debug("%s: connected to %s", self.host, ep.describe())
        return client

    def _open_socket(self, deadline: float, doing: str) -> socket.socket | paramiko.Channel:
        ep = self.endpoint
        if not ep.jumps:
            try:
                return _connect_tcp(ep.hostname, ep.port, max(0.05, deadline - time.monotonic()))
            except BaseException as exc:
                raise self._connect_error(exc, deadline, doing) from None
        jump = self._jump_transport()
        jump_client = jump._ensure_client(deadline, f"reach {self.host}")
        transport = jump_client.get_transport()
        assert transport is not None
        try:
            return transport.open_channel("direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0), timeout=max(0.05, deadline - time.monotonic()))
        except paramiko.ChannelException as exc:
            raise HostUnreachable(
                f"{self.host}: jump host {jump.host} could not connect to {ep.address}: {exc.text or exc}",
                hint=f"check that sshd runs on {ep.address} and that {jump.host} may reach it (and allows TCP forwarding)",
            ) from None
        except BaseException as exc:
            if time.monotonic() >= deadline - 0.01:
                raise self._timeout(doing, f"opening a tunnel through jump host {jump.host}", deadline) from None
            raise HostUnreachable(f"{self.host}: cannot open a tunnel through jump host {jump.host}: {exc}", hint=f"check the connection to {jump.host}") from None

    def _jump_transport(self) -> SshTransport:
        """The connection to the last hop (earlier hops are reached through it, recursively)."""
        *before, last = self.endpoint.jumps
        via = ",".join(str(h) for h in before) if before else None
        if self._jump_provider is not None:
            return self._jump_provider(last, via)
        if self._owned_jumps:
            return self._owned_jumps[0]
        jump = SshTransport(
            last.host,
            user=last.user,
            port=last.port,
            options=self.options,
            proxy_jump=via,
            _config=self._config,
            _depth=self._depth + 1,
        )
        self._owned_jumps.append(jump)
        return jump

    def _timeout(self, doing: str, phase: str, deadline: float) -> CommandTimeout:
        return CommandTimeout(
            f"{self.host}: no answer from {self.endpoint.describe()} while {phase} ({doing}); gave up at the deadline",
            hint=f"the node or its sshd may be hung or overloaded: check it (and the network to {self.endpoint.address})",
            details={"host": self.host, "phase": phase},
        )

    def _connect_error(self, exc: BaseException, deadline: float, doing: str) -> BaseException:
        ep = self.endpoint
        what = ep.describe()
        if isinstance(exc, (HostKeyError, DlctlError)):
            return exc
        if isinstance(exc, paramiko.BadHostKeyException):
            if exc.key.get_base64() in _known_keys(ep).revoked:
                return _revoked_error(ep, exc.key)
            return _changed_key_error(ep, exc.key, exc.expected_key)
        if isinstance(exc, paramiko.PasswordRequiredException):
            return AuthenticationFailed(
                f"{self.host}: the private key for {what} is encrypted and dlctl never asks for passphrases",
                hint="load the key into your ssh-agent (ssh-add KEYFILE) and retry",
            )
        if isinstance(exc, paramiko.AuthenticationException):
            if "timeout" in str(exc).lower():
                return self._timeout(doing, "authenticating", deadline)
            tried = ", ".join(str(p) for p in ep.identity_files) or "the ssh-agent and ~/.ssh/id_*"
            return AuthenticationFailed(
                f"{self.host}: {what} refused key authentication (tried {tried})",
                hint=f"check ssh_user/identity_file in the inventory (or User/IdentityFile in the ssh config) and {ep.user}'s authorized_keys on the node",
            )
        if isinstance(exc, socket.gaierror):
            return HostUnreachable(f"{self.host}: cannot resolve host name {ep.hostname!r}: {exc.strerror}", hint="check the host in the inventory or HostName in the ssh config")
        if isinstance(exc, (ConnectionRefusedError, paramiko.ssh_exception.NoValidConnectionsError)):
            return HostUnreachable(
                f"{self.host}: connection refused by {ep.address}: nothing listens there",
                hint=f"is the node up and sshd running on port {ep.port}? (systemctl status ssh on the node)",
            )
        if isinstance(exc, (TimeoutError, socket.timeout)) or time.monotonic() >= deadline - 0.01:
            return self._timeout(doing, "connecting", deadline)
        if isinstance(exc, (paramiko.SSHException, EOFError)):
            return HostUnreachable(
                f"{self.host}: SSH handshake with {what} failed: {exc or type(exc).__name__}",
                hint="check the node's sshd log; the node may be overloaded (MaxStartups) or not speak SSH on this port",
            )
        if isinstance(exc, OSError):
            return HostUnreachable(f"{self.host}: cannot connect to {ep.address}: {exc.strerror or exc}", hint="check that the node is up and reachable from here")
        return exc

    # -- running ---------------------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        words = check_argv(self.host, argv)
        extra = check_env(self.host, env)
        timeout = check_timeout(self.host, timeout)
        start = time.monotonic()
        deadline = start + timeout
        # sshd only accepts variables listed in its AcceptEnv, so variables ride on `env`;
        # they are then visible on the node like any argv (hence: never secrets).
        if extra and "=" in words[0]:
            raise DlctlError(f"{self.host}: program name {words[0]!r} contains '=' and cannot be combined with env")
        program = ["env", *(f"{k}={v}" for k, v in extra.items()), *words] if extra else list(words)
        command = shlex.join(["sh", "-c", _WRAPPER, "dlctl", *program])
        doing = f"`{describe(words)}`"
        log.debug("%s: running %s (stdin: %d bytes)", self.host, describe(words), len(stdin or b""))

        client = self._ensure_client(deadline, doing)
        chan = self._open_session(client, deadline, doing)
        state = _RunState()
        watchdog = _Watchdog(deadline, lambda: self._kill_remote(client, chan, state))
        writer: threading.Thread | None = None
        try:
            watchdog.start()
            try:
                chan.exec_command(command)
                if stdin and len(stdin) > _INLINE_STDIN:
                    writer = threading.Thread(target=_feed, args=(chan, stdin), name=f"ssh-stdin-{self.host}", daemon=True)
                    writer.start()
                else:
                    _feed(chan, stdin or b"")
                out, err = _collect(chan, state)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                if watchdog.stop():
                    raise self._command_timeout(words, timeout) from None
                raise HostUnreachable(
                    f"{self.host}: connection lost while running {doing}: {exc or type(exc).__name__}; the command may or may not have run",
                    hint=f"check {self.host}, then re-run (make sure the command is safe to repeat)",
                ) from None
            if watchdog.stop():
                raise self._command_timeout(words, timeout)
            if chan.exit_status == -1 and not chan.eof_received:
                # Closed under us without EOF or status: the connection died, not the command.
                raise HostUnreachable(f"{self.host}: connection lost while running {doing}; the command may or may not have run", hint=f"check {self.host}, then re-run")
        finally:
            watchdog.stop()
            chan.close()
        # -1: the command died from a signal (OpenSSH then sends exit-signal, not exit-status).
        return CommandResult(self.host, words, chan.exit_status, bytes(out), bytes(err), time.monotonic() - start)

    def _open_session(self, client: paramiko.SSHClient, deadline: float, doing: str) -> paramiko.Channel:
        transport = client.get_transport()
        try:
            assert transport is not None
            return transport.open_session(timeout=max(0.05, deadline - time.monotonic()))
        except (paramiko.SSHException, OSError, EOFError, AssertionError) as exc:
            # A connection that cannot even open a channel is wedged or gone: drop it so the
            # next command starts afresh instead of waiting on it again.
            self._drop(client)
            if time.monotonic() >= deadline - 0.01:
                raise self._timeout(doing, "opening a session", deadline) from None
            raise HostUnreachable(
                f"{self.host}: cannot open an SSH session on {self.endpoint.describe()}: {exc or type(exc).__name__}",
                hint="check the node's sshd (MaxSessions) and retry",
            ) from None

    def _kill_remote(self, client: paramiko.SSHClient, chan: paramiko.Channel, state: _RunState) -> None:
        """The timeout path: SIGTERM the command's process group, SIGKILL it after the grace
        period, close the channel.

        Closing the channel alone does not stop a command that has no terminal (sshd just
        detaches it), and SSH ``signal`` requests are ignored for root logins (sshd runs them
        unprivileged only), so the kill is a second, tiny command on the same connection,
        aimed at the process group the wrapper reported.
        """
        grace = self.options.kill_grace
        try:
            if state.pgid is not None and state.pgid > 1 and not chan.status_event.is_set():
                for sig in ("TERM", "KILL"):
                    _exec_quietly(client, ["kill", "-s", sig, "--", f"-{state.pgid}"], grace + 2.0)
                    if chan.status_event.wait(grace if sig == "TERM" else 2.0):
                        break
        except Exception as exc:  # the connection may be gone too; closing is all that is left
            log.debug("%s: could not kill timed-out command: %r", self.host, exc)
        finally:
            chan.close()

    def _drop(self, client: paramiko.SSHClient) -> None:
        with self._lock:
            if self._client is client:
                self._client = None
        client.close()

    def _command_timeout(self, words: tuple[str, ...], timeout: float) -> CommandTimeout:
        return CommandTimeout(
            f"{self.host}: `{describe(words)}` did not finish within {timeout:g}s; it was killed on the node",
            hint="raise the timeout if the command is legitimately slow, or check what it waits for on the node",
            details={"host": self.host, "argv": list(words), "timeout": timeout},
        )

    # -- uploading -------------------------------------------------------------------------------

    def put(self, local_path: str | PathLike[str], remote_path: str, mode: int = 0o644, *, timeout: float = DEFAULT_PUT_TIMEOUT) -> None:
        """SFTP upload: a new temp file next to the target, created with ``mode`` (see
        ``_create_remote``), then an atomic ``posix-rename`` over the target."""
        dest = check_remote_path(self.host, remote_path)
        src = Path(local_path)
        if not src.is_file():
            raise DlctlError(f"{self.host}: cannot upload {src}: no such local file", hint="check the local file name")
        timeout = check_timeout(self.host, timeout)
        deadline = time.monotonic() + timeout
        client = self._ensure_client(deadline, f"upload {src.name}")
        directory, _, base = dest.rpartition("/")
        tmp = f"{directory}/.{base}.dlctl-tmp-{_random.token_hex(6)}"
        try:
            sftp = client.open_sftp()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostUnreachable(f"{self.host}: cannot start SFTP on {self.endpoint.describe()}: {exc}", hint="check that sshd on the node has the sftp subsystem enabled") from None
        channel = sftp.get_channel()
        assert channel is not None
        watchdog = _Watchdog(deadline, channel.close)
        watchdog.start()
        try:
            try:
                with open(src, "rb") as fin, _create_remote(sftp, tmp, mode & 0o7777) as fout:
                    fout.set_pipelined(True)
                    while chunk := fin.read(_PUT_CHUNK):
                        fout.write(chunk)
                sftp.posix_rename(tmp, dest)
            except BaseException as exc:
                if not watchdog.fired:
                    try:
                        sftp.remove(tmp)
                    except (OSError, paramiko.SSHException, EOFError):
                        pass
                if watchdog.stop():
                    raise CommandTimeout(f"{self.host}: upload of {src} to {dest} did not finish within {timeout:g}s", hint="check the node and the network; raise the timeout for large files") from None
                if isinstance(exc, FileNotFoundError):
                    raise DlctlError(f"{self.host}: cannot upload to {dest}: directory {directory or '/'} does not exist on the node", hint=f"create {directory} first (e.g. during agent install)") from None
                if isinstance(exc, PermissionError):
                    raise DlctlError(f"{self.host}: cannot upload to {dest}: permission denied for {self.endpoint.user}", hint="upload somewhere that user can write, or use a user with access") from None
                if isinstance(exc, (OSError, paramiko.SSHException, EOFError)):
                    raise HostUnreachable(f"{self.host}: upload of {src} to {dest} failed: {exc}", hint=f"check {self.host} (disk space, sshd) and retry") from None
                raise
        finally:
            watchdog.stop()
            sftp.close()
        log.debug("%s: uploaded %s to %s (mode %04o)", self.host, src, dest, mode)

    # -- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
            jumps, self._owned_jumps = self._owned_jumps, []
        if client is not None:
            client.close()
        for jump in jumps:
            jump.close()

    def __repr__(self) -> str:
        return f"<SshTransport {self.host} {self.endpoint.describe()} {'connected' if self.connected else 'idle'}>"


class SshPool:
    """One ``SshTransport`` per host, created on demand and shared (also as jump hosts).

    ``pool.get(node)`` for inventory nodes, ``pool.get("alias")`` for ssh config hosts; pass
    ``pool.get`` to fan-out as the transport factory. ``close()`` ends every connection.
    """

    def __init__(self, options: SshOptions | None = None) -> None:
        self.options = options or SshOptions()
        self._config = load_ssh_config(self.options.config_path)
        self._transports: dict[tuple[Any, ...], SshTransport] = {}
        self._lock = threading.Lock()

    def get(self, target: Node | str) -> SshTransport:
        if isinstance(target, Node):
            key: tuple[Any, ...] = ("node", target.id, target.host, target.ssh_user, target.ssh_port, target.identity_file)
            make: Callable[[], SshTransport] = lambda: SshTransport.for_node(target, self.options, jump_provider=self._jump, _config=self._config)  # noqa: E731
        else:
            key = ("host", target)
            make = lambda: SshTransport(target, options=self.options, jump_provider=self._jump, _config=self._config)  # noqa: E731
        return self._get(key, make)

    def _jump(self, hop: JumpHop, via: str | None) -> SshTransport:
        if hop.user is None and hop.port is None and via is None:
            # A plain alias: the very transport `get(alias)` gives, so one connection serves
            # both as a jump host and for commands on that host.
            return self.get(hop.host)
        key = ("jump", hop, via)
        return self._get(key, lambda: SshTransport(hop.host, user=hop.user, port=hop.port, options=self.options, proxy_jump=via, jump_provider=self._jump, _config=self._config))

    def _get(self, key: tuple[Any, ...], make: Callable[[], SshTransport]) -> SshTransport:
        with self._lock:
            transport = self._transports.get(key)
            if transport is None or transport._closed:
                transport = self._transports[key] = make()
            return transport

    def close(self) -> None:
        with self._lock:
            transports = list(self._transports.values())
            self._transports.clear()
        for transport in transports:
            transport.close()

    def __enter__(self) -> SshPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- sockets and channel plumbing ---------------------------------------------------------------


class _QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges every segment at once.

    sshd leaves Nagle on for sessions without a terminal, so a reply it writes while an earlier
    packet is unacknowledged waits for our ACK, which Linux delays by up to 40 ms. That happens
    on every new connection (sshd's ``hostkeys-00`` notice, then our channel-open reply): 40 of
    the ~75 ms of a cold command. Re-arming TCP_QUICKACK after each read sends ACKs at once.
    """

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if _TCP_QUICKACK is not None:
            try:
                self.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
            except OSError:
                pass
        return data


_TCP_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def _connect_tcp(host: str, port: int, timeout: float) -> socket.socket:
    """``socket.create_connection`` with our socket class, NODELAY and QUICKACK."""
    error: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = _QuickAckSocket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            # SSH is many small packets (channel opens, requests): send each at once.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError(f"no address for {host}")


# Every command runs as `sh -c _WRAPPER dlctl ARGV...`: the wrapper reports its process group
# on stderr (stripped again before the caller sees stderr) so a timeout can kill the whole
# group, then execs ARGV unchanged ("$@" keeps every word literal). /proc gives the group;
# without /proc the pid is the best guess (the command keeps it across exec).
_WRAPPER = 'p=$$; { read -r _ _ _ _ p _ < /proc/$$/stat; } 2>/dev/null; printf "dlctl-pgid:%s\\n" "$p" >&2; exec "$@"'
_PGID_LINE = re.compile(rb"(?:^|(?<=\n))dlctl-pgid:(\d+)\n")


@dataclass
class _RunState:
    pgid: int | None = None


def _exec_quietly(client: paramiko.SSHClient, words: Sequence[str], timeout: float) -> None:
    """Run a tiny helper command (the kill) with a hard bound, ignoring its output."""
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        return
    chan = transport.open_session(timeout=timeout)
    # exec_command waits for the server's reply without a timeout of its own.
    timer = threading.Timer(timeout, chan.close)
    timer.daemon = True
    timer.start()
    try:
        chan.exec_command(shlex.join(words))
        chan.shutdown_write()
        chan.status_event.wait(timeout)
    finally:
        timer.cancel()
        chan.close()


class _Watchdog(threading.Thread):
    """Calls ``fire`` at the deadline unless stopped first.

    A thread rather than timeouts on each call because paramiko's ``exec_command`` and
    ``sendall`` can block with no timeout of their own on a hung node; closing the channel
    (what ``fire`` ends with) is what wakes them.
    """

    def __init__(self, deadline: float, fire: Callable[[], None]) -> None:
        super().__init__(name="ssh-watchdog", daemon=True)
        self._deadline = deadline
        self._fire = fire
        self._done = threading.Event()
        self._state_lock = threading.Lock()
        self.fired = False

    def run(self) -> None:
        if self._done.wait(max(0.0, self._deadline - time.monotonic())):
            return
        with self._state_lock:
            if self._done.is_set():
                return
            self.fired = True
        self._fire()

    def stop(self) -> bool:
        """Disarm; True if the deadline had already fired (the caller must report a timeout)."""
        with self._state_lock:
            self._done.set()
            fired = self.fired
        if fired and threading.current_thread() is not self:
            # Let the kill finish before the caller reports: "it was killed" must be true.
            self.join(30.0)
        return fired


def _feed(chan: paramiko.Channel, data: bytes) -> None:
    """Write stdin and send EOF. A command that exits without reading all of it is not an
    error here (like EPIPE for a local pipe); its exit status tells."""
    try:
        if data:
            chan.sendall(data)
        chan.shutdown_write()
    except (OSError, paramiko.SSHException, EOFError):
        pass


def _collect(chan: paramiko.Channel, state: _RunState) -> tuple[bytearray, bytearray]:
    """Read stdout and stderr until EOF and the exit status (or the channel closing); pick
    the wrapper's process group line out of stderr."""
    out, err = bytearray(), bytearray()
    fd = chan.fileno()  # readable when either stream has data, and forever after EOF/close

    def drain() -> None:
        while chan.recv_ready():
            out.extend(chan.recv(_READ_CHUNK))
        while chan.recv_stderr_ready():
            err.extend(chan.recv_stderr(_READ_CHUNK))
        if state.pgid is None:
            m = _PGID_LINE.search(err)
            if m:
                state.pgid = int(m.group(1))
                del err[m.start() : m.end()]

    while not (chan.eof_received or chan.closed):
        select.select([fd], [], [], 1.0)
        drain()
    # EOF comes after all data; the exit status follows it (or the close does).
    while not chan.status_event.wait(1.0):
        if chan.closed:
            break
    drain()
    return out, err


__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "Endpoint",
    "HostKeyChanged",
    "HostKeyError",
    "JumpHop",
    "SshOptions",
    "SshPool",
    "SshTransport",
    "UnknownHostKey",
    "fingerprint",
    "load_ssh_config",
    "record_host_key",
    "resolve_endpoint",
]
