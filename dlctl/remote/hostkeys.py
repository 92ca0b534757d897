"""Host keys for the SSH transport: the errors an unknown, changed or revoked key raises, OpenSSH's
known_hosts files (parsed once per process, re-read when they change; hashed names, patterns,
negations, ``@revoked``), the policies paramiko asks about a key it has not seen, and recording a
key trusted on first use (``--ssh-accept-new``). See ``dlctl.remote.ssh`` for the whole contract."""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import hmac
import logging
import os
import re
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import paramiko

from ..errors import ConfigError, DlctlError, RefusedError
from .sshconfig import Endpoint


log = logging.getLogger(__name__)


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


# -- known_hosts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownHostsFile:
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
            if entry_matches(patterns, name):
                found.append((keytype, blob))
        return found


def entry_matches(patterns: tuple[str, ...], name: str) -> bool:
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


def parse_known_hosts(text: str) -> KnownHostsFile:
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
    return KnownHostsFile({k: tuple(v) for k, v in plain.items()}, tuple(other), frozenset(revoked))


_KH_CACHE: dict[Path, tuple[tuple[int, int, int], KnownHostsFile]] = {}
_KH_CACHE_LOCK = threading.Lock()
_EMPTY_KH = KnownHostsFile({}, (), frozenset())


def known_hosts_file(path: Path) -> KnownHostsFile:
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
        parsed = parse_known_hosts(path.read_text(errors="replace"))
    except OSError as exc:
        raise ConfigError(f"cannot read known_hosts file {path}: {exc.strerror}", hint="check its permissions") from None
    with _KH_CACHE_LOCK:
        _KH_CACHE[path] = (stamp, parsed)
    return parsed


@dataclass(frozen=True)
class KnownKeys:
    """What the known_hosts files say about one ``[host]:port`` name."""

    keys: tuple[paramiko.PKey, ...]
    unusable: tuple[str, ...]  # key types listed for the host that paramiko cannot check
    revoked: frozenset[str]


def known_keys(ep: Endpoint) -> KnownKeys:
    name = ep.known_hosts_name.lower()
    keys: list[paramiko.PKey] = []
    unusable: list[str] = []
    revoked: set[str] = set()
    # The user's file first, so a global entry of the same key type wins, as in paramiko.
    for path in (ep.known_hosts, *ep.global_known_hosts):
        parsed = known_hosts_file(path)
        revoked |= parsed.revoked
        for keytype, blob in parsed.keys_for(name):
            try:
                keys.append(paramiko.PKey.from_type_string(keytype, base64.b64decode(blob)))
            except (paramiko.SSHException, ValueError, binascii.Error, TypeError):
                unusable.append(keytype)
    return KnownKeys(tuple(k for k in keys if k.get_base64() not in revoked), tuple(unusable), frozenset(revoked))


def unknown_key_error(ep: Endpoint, key: paramiko.PKey) -> UnknownHostKey:
    name = ep.known_hosts_name
    port_opt = f"-p {ep.port} " if ep.port != 22 else ""
    return UnknownHostKey(
        f"host key of {ep.describe()} is not known: it offered {key.get_name()} key {fingerprint(key)}; refusing to connect",
        hint=(
            f"verify that fingerprint on the node itself (ssh-keygen -lf /etc/ssh/ssh_host_{short_type(key)}_key.pub), "
            f"then add it: ssh-keyscan {port_opt}{ep.hostname} >> {ep.known_hosts}  "
            f"(it must be recorded as {name}); or re-run with --ssh-accept-new to trust hosts seen for the first time"
        ),
        details={"host": ep.alias, "hostname": ep.hostname, "port": ep.port, "key_type": key.get_name(), "fingerprint": fingerprint(key), "known_hosts": [str(p) for p in (ep.known_hosts, *ep.global_known_hosts)]},
    )


def changed_key_error(ep: Endpoint, offered: paramiko.PKey, expected: paramiko.PKey | None) -> HostKeyChanged:
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


def revoked_error(ep: Endpoint, key: paramiko.PKey) -> HostKeyError:
    return HostKeyError(
        f"host key of {ep.describe()} ({key.get_name()} {fingerprint(key)}) is marked @revoked in known_hosts; refusing to connect",
        hint="the node needs a new host key; ask whoever revoked this one",
    )


def short_type(key: paramiko.PKey) -> str:
    name = key.get_name()
    return "ed25519" if "ed25519" in name else "ecdsa" if "ecdsa" in name else "rsa"


class RejectUnknown(paramiko.RejectPolicy):
    """paramiko's RejectPolicy, raising our error (host, port, type, fingerprint, the fix)."""

    def __init__(self, endpoint: Endpoint, known: KnownKeys) -> None:
        self.endpoint = endpoint
        self.known = known

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if key.get_base64() in self.known.revoked:
            raise revoked_error(self.endpoint, key)
        raise unknown_key_error(self.endpoint, key)


class AcceptNew(paramiko.MissingHostKeyPolicy):
    """Trust on first use. Only reached for a host with *no* usable known key: paramiko raises
    BadHostKeyException for a known host offering another key before asking the policy."""

    def __init__(self, endpoint: Endpoint, known: KnownKeys) -> None:
        self.endpoint = endpoint
        self.known = known

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        ep = self.endpoint
        if key.get_base64() in self.known.revoked:
            raise revoked_error(ep, key)
        if self.known.unusable:
            # The host *is* known, by a key type we cannot check: not a first contact.
            raise HostKeyError(
                f"{ep.describe()} is in known_hosts with a {', '.join(sorted(set(self.known.unusable)))} key that dlctl cannot verify; "
                f"not trusting the {key.get_name()} key {fingerprint(key)} it offered instead",
                hint=f"verify the fingerprint on the node and add its {key.get_name()} key to {ep.known_hosts}",
            )
        record_host_key(ep, hostname, key)
        log.warning("permanently added %s key %s for %s to %s", key.get_name(), fingerprint(key), hostname, ep.known_hosts)


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
            current = parse_known_hosts(os.pread(fd, size, 0).decode(errors="replace"))
            known = current.keys_for(name.lower())
            if known:
                if (key.get_name(), key.get_base64()) in known:
                    return
                keytype, blob = known[0]
                raise changed_key_error(ep, key, paramiko.PKey.from_type_string(keytype, base64.b64decode(blob)))
            needs_newline = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            line = f"{name} {key.get_name()} {key.get_base64()}\n"
            os.write(fd, (b"\n" if needs_newline else b"") + line.encode())
        finally:
            os.close(fd)

