"""What the SSH transport takes from the operator's OpenSSH setup: ``SshOptions``, ``~/.ssh/config``
(``load_ssh_config``) and the endpoint a node resolves to through it (``resolve_endpoint``: host,
port, user, identities, known_hosts files, ``ProxyJump`` hops). See ``dlctl.remote.ssh``."""

from __future__ import annotations

import getpass
import re
import shlex
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import paramiko

from ..errors import ConfigError


DEFAULT_CONFIG = Path("~/.ssh/config")
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
DEFAULT_GLOBAL_KNOWN_HOSTS = (Path("/etc/ssh/ssh_known_hosts"),)
DEFAULT_CONNECT_TIMEOUT = 10.0
# After SIGTERM on timeout, how long the remote command may take to exit before SIGKILL.
DEFAULT_KILL_GRACE = 1.0


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
    user_files = config_paths(cfg.get("userknownhostsfile"))
    global_files = config_paths(cfg.get("globalknownhostsfile"))
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


def config_paths(value: Any) -> tuple[Path, ...]:
    if not value:
        return ()
    words = value if isinstance(value, list) else shlex.split(str(value))
    return tuple(Path(w).expanduser() for w in words if w.lower() != "none")


