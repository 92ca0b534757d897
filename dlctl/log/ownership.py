"""Ownership of a log: one writer at a time, held as an ephemeral ``logs/<name>/owner`` znode.

ZooKeeper sessions are the failure detector (DESIGN.md §5): when the owner's session expires
its znode vanishes and another writer may take over, fencing the old one's segment. The owner
learns it was deposed from its kazoo state listener (LOST) or from a watch on its znode (an
operator removed it); either way ``lost`` is set and the ``on_lost`` callbacks run on the event
loop, so the writer stops acknowledging at once instead of waiting for its next fenced add.
A merely SUSPENDED connection is not a loss: the session may still be alive, and fencing keeps
a writer that is in fact deposed from committing anything.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

from kazoo.client import KazooState
from kazoo.protocol.states import EventType, WatchedEvent

from ..errors import ConflictError, DlctlError
from ..meta import paths
from ..meta.store import MetaStore

log = logging.getLogger(__name__)


class OwnershipError(ConflictError):
    """The log is owned by another writer; ``owner`` names it (None if it vanished meanwhile)."""

    def __init__(self, message: str, *, owner: str | None, address: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint, details={"owner": owner, "address": address})
        self.owner = owner
        self.address = address  # where the owner serves as write proxy, when it is an agent


class OwnershipLost(DlctlError):
    """This writer no longer owns the log (session expired or owner znode removed)."""


def default_owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _owner_name(data: bytes) -> str:
    try:
        return str(json.loads(data)["owner"])
    except (ValueError, KeyError, TypeError):
        return data.decode("utf-8", "replace") or "<unnamed>"


def owner_info(data: bytes) -> dict:
    """The owner znode's record: ``owner`` always; ``address`` and ``node`` when the owner is an
    agent acting as write proxy (clients are sent there)."""
    try:
        info = json.loads(data)
    except ValueError:
        info = None
    if not isinstance(info, dict):
        return {"owner": _owner_name(data)}
    info["owner"] = _owner_name(data)
    if not isinstance(info.get("address"), str):
        info.pop("address", None)
    return info


class Ownership:
    """Acquire, hold and release ownership of log ``name`` for ``owner_id``."""

    def __init__(self, meta: MetaStore, name: str, owner_id: str | None = None, info: dict | None = None) -> None:
        self.meta = meta
        self.name = name
        self.owner_id = owner_id or default_owner_id()
        self.info = dict(info or {})  # e.g. a proxy's address, published in the owner znode
        self.path = paths.log_owner(meta.cluster, name)
        self.session_id: int | None = None
        self.lost_reason: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._callbacks: list[Callable[[str], None]] = []
        self._released = False

    @property
    def held(self) -> bool:
        return self.session_id is not None and self.lost_reason is None and not self._released

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Run ``callback(reason)`` on the event loop when ownership is lost (at most once)."""
        self._callbacks.append(callback)

    async def acquire(self, wait: float = 0.0) -> None:
        """Become the owner; wait up to ``wait`` s for the current owner to go away.

        Raises ``OwnershipError`` naming the current owner when it is still there after ``wait``.
        """
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + wait
        data = json.dumps({**self.info, "owner": self.owner_id, "host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}).encode()
        while True:
            claim = asyncio.ensure_future(self._zk(self.meta.claim_owner, self.name, data))
            try:
                self.session_id = await asyncio.shield(claim)
                break
            except ConflictError:
                pass
            except asyncio.CancelledError:
                # The create goes on in ZooKeeper's thread: a znode it makes after this would stay
                # for as long as the session lives (an agent's: until it restarts), and no writer
                # could own the log. Let it go when it lands.
                claim.add_done_callback(self._let_go_of_late_claim)
                raise
            current = await self._zk(self.meta.owner_of, self.name)
            if current is None:
                continue  # released between our create and our read
            owner_data, owner_session = current
            if owner_session == self.meta.client.client_id[0] and _owner_name(owner_data) == self.owner_id:
                self.session_id = owner_session  # ours already (a retried create that did succeed)
                break
            remaining = deadline - time.monotonic()
            owner = _owner_name(owner_data)
            if remaining <= 0:
                raise OwnershipError(
                    f"log {self.name!r} is owned by {owner}",
                    owner=owner,
                    address=owner_info(owner_data).get("address"),
                    hint="wait for that writer to close (or its session to expire), "
                    f"or depose it with `dlctl fence {self.name}`",
                )
            await self._wait_gone(remaining)
        self.meta.client.add_listener(self._on_state)
        try:
            await self._zk(self.meta.client.exists, self.path, self._on_event)
        except BaseException:
            await self.release()  # (cancelled, say: a caller that never got it cannot release it)
            raise
        log.info("%s owns log %r (session %#x)", self.owner_id, self.name, self.session_id)

    def _let_go_of_late_claim(self, claim: asyncio.Future[int]) -> None:
        if claim.cancelled() or claim.exception() is not None or self._loop is None:
            return
        session_id = claim.result()

        def release() -> None:
            try:
                self.meta.release_owner(self.name, session_id)
            except Exception as exc:  # noqa: BLE001 - the session's end removes it anyway
                log.warning("could not let go of ownership of log %r claimed after a cancel: %s", self.name, exc)

        self._loop.run_in_executor(None, release)

    async def _wait_gone(self, timeout: float) -> None:
        assert self._loop is not None
        gone = asyncio.Event()
        loop = self._loop

        def on_event(_event: WatchedEvent) -> None:
            loop.call_soon_threadsafe(gone.set)

        if await self._zk(self.meta.client.exists, self.path, on_event) is None:
            return
        try:
            await asyncio.wait_for(gone.wait(), timeout)
        except TimeoutError:
            pass

    async def release(self) -> None:
        """Give ownership up (idempotent); the znode is deleted only if our session still holds it."""
        if self._released:
            return
        self._released = True
        self.meta.client.remove_listener(self._on_state)
        if self.session_id is not None and self.lost_reason is None:
            try:
                await self._zk(self.meta.release_owner, self.name, self.session_id)
            except Exception as exc:  # noqa: BLE001 - the session's end removes it anyway
                log.warning("could not release ownership of log %r: %s", self.name, exc)

    # -- signals from kazoo's thread ----------------------------------------------------------

    def _on_state(self, state: str) -> bool:
        if state == KazooState.LOST:
            self._signal(f"the ZooKeeper session of owner {self.owner_id} expired")
            return True  # stop listening: a new session never owns the log again by itself
        return False

    def _on_event(self, event: WatchedEvent) -> None:
        if self._released or self.lost_reason is not None:
            return
        if event.type == EventType.DELETED:
            self._signal(f"the owner znode {self.path} was removed")
        else:
            # Watches fire once: re-arm (kazoo's thread must not block, so from a worker).
            self.meta.client.handler.spawn(self._rearm)

    def _rearm(self) -> None:
        try:
            if self.meta.client.exists(self.path, watch=self._on_event) is None:
                self._signal(f"the owner znode {self.path} was removed")
        except Exception:  # noqa: BLE001 - connection trouble: the state listener decides
            pass

    def _signal(self, reason: str) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._lost_now, reason)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def _lost_now(self, reason: str) -> None:
        if self.lost_reason is not None or self._released:
            return
        self.lost_reason = reason
        log.warning("ownership of log %r lost: %s", self.name, reason)
        for callback in self._callbacks:
            try:
                callback(reason)
            except Exception:  # noqa: BLE001 - one broken callback must not hide the loss from others
                log.exception("ownership-lost callback failed")

    async def _zk(self, fn: Callable, *args: object):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
