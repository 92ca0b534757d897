"""The agent's availability record: an ephemeral znode ``available/<node_id>`` in ZooKeeper.

ZooKeeper sessions are the failure detector: the record vanishes when the agent's session
expires. After a session loss kazoo opens a new session and we register again, so a paused
or partitioned agent reappears on its own once it is reachable.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import ConnectionLoss, NodeExistsError, NoNodeError, SessionExpiredError

from dlctl.errors import RefusedError
from dlctl.meta import paths
from dlctl.meta.zk import ZkAuth, acl_for

log = logging.getLogger(__name__)


class Registration:
    def __init__(self, client: KazooClient, cluster: str, node_id: str, info: dict[str, Any], auth: ZkAuth | None) -> None:
        self.client = client
        self.path = paths.available_node(cluster, node_id)
        self.data = json.dumps({"node_id": node_id, **info}, sort_keys=True).encode()
        self.acl = acl_for(auth)
        self._lost = threading.Event()
        self._connected = threading.Event()
        self._connected.set()
        client.add_listener(self._track_connection)
        self._stopped = False
        self.registrations = 0  # how many times the record was (re)created; reported in stat

    def start(self, wait_for_stale: float) -> None:
        """Register, waiting up to ``wait_for_stale`` s for a crashed predecessor's record to expire."""
        deadline = time.monotonic() + wait_for_stale
        while True:
            try:
                if self._try_register(deadline):
                    break
            except (SessionExpiredError, ConnectionLoss):
                # Our own session ended (e.g. the agent was paused while starting): kazoo opens
                # a new one by itself; try again with it until the deadline.
                if time.monotonic() > deadline:
                    raise
                self._connected.wait(max(0.0, deadline - time.monotonic()))
        self.client.add_listener(self._on_state)

    def _try_register(self, deadline: float) -> bool:
        """One attempt: True once registered; False to try again (the stale record changed)."""
        try:
            self._create()
            return True
        except NodeExistsError:
            pass
        changed = threading.Event()
        stat = self.client.exists(self.path, watch=lambda _event: changed.set())
        if stat is None:
            return False
        if self._ours(stat):
            return True
        log.warning("%s is held by session %#x; waiting for it to expire", self.path, stat.ephemeralOwner)
        if not changed.wait(max(0.0, deadline - time.monotonic())):
            raise RefusedError(
                f"node is already registered at {self.path} by another live session",
                hint="another agent with the same node_id is running; stop it or fix node_id",
            )
        return False

    def _ours(self, stat: Any) -> bool:
        """Whether the record belongs to our current session. Between an expired session and
        the next one kazoo has no session id: the caller waits for the connection and retries."""
        session = self.client.client_id
        if session is None:
            raise ConnectionLoss("no ZooKeeper session (reconnecting)")
        return stat.ephemeralOwner == session[0]

    def _track_connection(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()

    def _create(self) -> None:
        self.client.create(self.path, self.data, acl=self.acl, ephemeral=True, makepath=True)
        self.registrations += 1
        log.info("registered %s", self.path)

    def _on_state(self, state: str) -> None:
        # Listeners run on kazoo's event thread and must not block: re-register elsewhere.
        if state == KazooState.LOST:
            log.warning("ZooKeeper session lost; %s is gone until we reconnect", self.path)
            self._lost.set()
        elif state == KazooState.CONNECTED and self._lost.is_set() and not self._stopped:
            self._lost.clear()
            self.client.handler.spawn(self._reregister)

    def _reregister(self) -> None:
        try:
            self._create()
        except NodeExistsError:
            log.error("cannot re-register: %s exists under another session", self.path)
        except Exception:  # noqa: BLE001 - the next reconnect retries
            log.exception("re-registration of %s failed", self.path)
            self._lost.set()

    def stop(self) -> None:
        self._stopped = True
        self.client.remove_listener(self._on_state)
        self.client.remove_listener(self._track_connection)
        try:
            stat = self.client.exists(self.path)
            if stat is not None and self._ours(stat):
                self.client.delete(self.path, version=stat.version)
        except (NoNodeError, ConnectionLoss):
            pass  # gone, or no session: the record is ephemeral and ends with it
