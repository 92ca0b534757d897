"""ZooKeeper connections and ACLs.

ACLs are on whenever credentials are configured: ZooKeeper does not inherit ACLs, so every
create must pass ``acl_for(auth)``. Credentials are read from a 0600 file, never from argv.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import OPEN_ACL_UNSAFE, ACL, make_digest_acl

from ..errors import ConfigError, DlctlError
from ..secrets import read_secret_file

log = logging.getLogger(__name__)


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


def connect(connect_string: str, auth: ZkAuth | None = None, timeout: float = 10.0, session_timeout: float = 10.0) -> KazooClient:
    """Start a kazoo client (authenticated when ``auth`` is given) or raise naming the ensemble."""
    client = KazooClient(
        hosts=connect_string,
        timeout=session_timeout,
        auth_data=[("digest", f"{auth.user}:{auth.password}")] if auth else None,
        # Every create without an explicit ACL — kazoo's recipes (elections, locks, parties)
        # included — gets the cluster's: ZooKeeper does not inherit ACLs.
        default_acl=acl_for(auth) if auth else None,
        connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 2},
        command_retry={"max_tries": 3, "delay": 0.1, "backoff": 2, "max_delay": 1},
    )
    try:
        client.start(timeout=timeout)
    except KazooTimeoutError as exc:
        client.close()
        raise DlctlError(
            f"cannot reach ZooKeeper at {connect_string} within {timeout:g}s",
            hint="check the connect string in the configuration and that the ensemble is up",
        ) from exc
    return client
