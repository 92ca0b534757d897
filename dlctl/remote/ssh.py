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
    its process group and then ``exec``s the argv unchanged; see ``dlctl.remote.channels.WRAPPER``.)
  * ``ProxyJump`` hops are SSH connections of their own (their host keys checked the same way);
    the target is reached through a ``direct-tcpip`` channel of the last hop. ``SshPool`` shares
    one connection per jump host between all targets behind it.
  * Each command runs through the remote user's login shell (that is what sshd does), so
    the node needs a POSIX ``sh``; argv is quoted with ``shlex.join`` for it.
  * Authentication is by key only: identity files (inventory, then ssh config) and the ssh-agent.
    There is no password parameter anywhere; an encrypted key must be loaded into the agent.

Its parts: ``sshconfig`` (options, ssh config, endpoints), ``hostkeys`` (known_hosts, the key
policies and errors), ``channels`` (sockets, the command wrapper, stdin/stdout plumbing); this
module is the transport and the pool of connections.
"""

from __future__ import annotations

import logging
import secrets as _random
import shlex
import socket
import threading
import time
from collections.abc import Callable
from os import PathLike
from pathlib import Path
from typing import Any

import paramiko

from ..errors import ConfigError, DlctlError
from ..inventory import Node
from .channels import WRAPPER, RunState, Watchdog, collect, connect_tcp, create_remote, exec_quietly, feed
from .hostkeys import (
    AcceptNew,
    HostKeyChanged,
    HostKeyError,
    RejectUnknown,
    UnknownHostKey,
    changed_key_error,
    fingerprint,
    known_keys,
    record_host_key,
    revoked_error,
)
from .sshconfig import DEFAULT_CONNECT_TIMEOUT, Endpoint, JumpHop, SshOptions, load_ssh_config, resolve_endpoint
from .transport import (
    AuthenticationFailed,
    CommandResult,
    CommandTimeout,
    HostUnreachable,
    Transport,
    check_remote_path,
    check_timeout,
    describe,
)

log = logging.getLogger(__name__)

# Uploads are bounded too: a hung node must not hang `agent install` forever.
DEFAULT_PUT_TIMEOUT = 600.0
_MAX_JUMP_DEPTH = 8
# Stdin this small fits the channel window (2 MiB for OpenSSH), so sendall cannot block on a
# command that is not reading yet; anything larger is written from a helper thread.
_INLINE_STDIN = 32 * 1024
_PUT_CHUNK = 1 << 15


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
            known = known_keys(ep)
            host_keys = client.get_host_keys()
            for key in known.keys:
                host_keys.add(ep.known_hosts_name, key.get_name(), key)
            client.set_missing_host_key_policy(AcceptNew(ep, known) if self.options.accept_new else RejectUnknown(ep, known))
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
                return connect_tcp(ep.hostname, ep.port, max(0.05, deadline - time.monotonic()))
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
            if exc.key.get_base64() in known_keys(ep).revoked:
                return revoked_error(ep, exc.key)
            return changed_key_error(ep, exc.key, exc.expected_key)
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

    def execute(self, words: tuple[str, ...], *, stdin: bytes | None, timeout: float, env: dict[str, str]) -> CommandResult:
        start = time.monotonic()
        deadline = start + timeout
        # sshd only accepts variables listed in its AcceptEnv, so variables ride on `env`;
        # they are then visible on the node like any argv (hence: never secrets).
        if env and "=" in words[0]:
            raise DlctlError(f"{self.host}: program name {words[0]!r} contains '=' and cannot be combined with env")
        program = ["env", *(f"{k}={v}" for k, v in env.items()), *words] if env else list(words)
        command = shlex.join(["sh", "-c", WRAPPER, "dlctl", *program])
        doing = f"`{describe(words)}`"
        log.debug("%s: running %s (stdin: %d bytes)", self.host, describe(words), len(stdin or b""))

        client = self._ensure_client(deadline, doing)
        chan = self._open_session(client, deadline, doing)
        state = RunState()
        watchdog = Watchdog(deadline, lambda: self._kill_remote(client, chan, state))
        writer: threading.Thread | None = None
        try:
            watchdog.start()
            try:
                chan.exec_command(command)
                if stdin and len(stdin) > _INLINE_STDIN:
                    writer = threading.Thread(target=feed, args=(chan, stdin), name=f"ssh-stdin-{self.host}", daemon=True)
                    writer.start()
                else:
                    feed(chan, stdin or b"")
                out, err = collect(chan, state)
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

    def _kill_remote(self, client: paramiko.SSHClient, chan: paramiko.Channel, state: RunState) -> None:
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
                    exec_quietly(client, ["kill", "-s", sig, "--", f"-{state.pgid}"], grace + 2.0)
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
        ``create_remote``), then an atomic ``posix-rename`` over the target."""
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
        watchdog = Watchdog(deadline, channel.close)
        watchdog.start()
        try:
            try:
                with open(src, "rb") as fin, create_remote(sftp, tmp, mode & 0o7777) as fout:
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

