"""Compare-and-set of a versioned znode, written once (issue 26 item 2; BookKeeper's
``MetadataUpdateLoop``).

``put`` writes a znode only if it is still at the version read (or creates it when it was
absent), and maps what ZooKeeper answers — someone else wrote first, the znode (or its parent)
is gone — to the errors operators see, in one place. A conflict is always a conflict: even a
znode now holding exactly the bytes we meant to write at the next version may be another
writer's (two creators allocating the same next id write the same bytes), so it is never taken
for our own success. (A write whose answer a dropped connection lost surfaces from ``put`` as the
client's ``ConnectionLoss``, its outcome unknown; ``update`` settles it for idempotent changes,
below — by deriving again, not by comparing bytes.)

``update`` is the loop around it: read, let ``change`` derive the new value from the current
one (None: nothing to do), ``put``, and on a conflict read again and derive again — so a change
someone made meanwhile is built upon, never overwritten.

A write whose answer was lost (the connection dropped with it in flight: kazoo's
``ConnectionLoss``) may or may not have been applied. ``update`` recognises which only for a
change its caller declares ``idempotent`` — one that, derived again from its own result, finds
nothing left to do (a pin moved to at least P, fields set to values): it reads again once
reconnected and derives again, so an applied write ends the loop as done, and one that was not
applied is made now. Any other change (a counter's increment would be applied twice) raises
``OutcomeUnknownError`` naming the znode: the caller, or the operator, must look before retrying.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import time

from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError

from ..errors import ConflictError, DlctlError, OutcomeUnknownError
from .records import Versioned

ABSENT = -1  # the version of a znode that does not exist yet: ``put`` creates it
ATTEMPTS = 8
RECONNECT_PATIENCE = 30.0  # seconds a read after a lost answer waits for ZooKeeper to be reachable again

S = TypeVar("S")  # the value read (``T``, or None for a znode not there yet)
T = TypeVar("T")


def changed_concurrently(path: str, version: int | None = None) -> ConflictError:
    expected = "" if version is None else f" (expected {'no znode' if version < 0 else f'version {version}'})"
    return ConflictError(f"aborted: {path} changed concurrently{expected}", hint="nothing was overwritten; read it again and retry")


def put(
    client: Any,
    path: str,
    data: bytes,
    version: int,
    *,
    acl: Any = None,
    makepath: bool = False,
    conflict: Callable[[], DlctlError] | None = None,
    missing: Callable[[], DlctlError] | None = None,
) -> int:
    """Write ``data`` at ``path`` if it is still at ``version`` (``ABSENT``: create it); returns
    the new version. ``conflict()``: the error when someone else changed it first (default:
    ``changed_concurrently``); ``missing()``: when the znode (or its parent) does not exist
    (default: a conflict too). ``makepath``: a create makes missing parents too."""
    conflict = conflict or (lambda: changed_concurrently(path, version))
    try:
        if version < 0:
            client.create(path, data, acl=acl, makepath=makepath)
            return 0
        return int(client.set(path, data, version=version).version)
    except (BadVersionError, NodeExistsError):
        raise conflict() from None
    except NoNodeError:
        raise (missing or conflict)() from None


def delete(client: Any, path: str, version: int, *, conflict: Callable[[], DlctlError] | None = None) -> bool:
    """Delete ``path`` if it is still at ``version``: True when deleted, False when it was gone
    already (deleting is idempotent); ``conflict()`` (default: ``changed_concurrently``) when
    someone changed it since it was read."""
    try:
        client.delete(path, version=version)
        return True
    except BadVersionError:
        raise (conflict or (lambda: changed_concurrently(path, version)))() from None
    except NoNodeError:
        return False


def update(
    read: Callable[[], Versioned[S]],
    change: Callable[[S], T | None],
    write: Callable[[T, int], Versioned[T]],
    *,
    what: str,
    attempts: int = ATTEMPTS,
    idempotent: bool = False,
) -> Versioned[S] | Versioned[T]:
    """Read, derive the new value (``change``; None or an equal value: nothing to do, the
    current one is returned), write it by compare-and-set on the version read (``write(new,
    version)``, raising ``ConflictError`` when it moved), and on a conflict start again. A znode
    that may not exist yet is read as ``Versioned(None, ABSENT)``: ``change(None)`` derives the
    value to create, and ``put`` at ``ABSENT`` creates it (or conflicts, when someone was first).
    ``idempotent``: ``change`` derived again from its own result finds nothing to do, so a write
    whose answer was lost is settled by reading again (see the module docstring)."""
    after_loss = False
    for _ in range(attempts):
        current = _read_when_reachable(read, what) if after_loss else read()
        new = change(current.value)
        if new is None or new == current.value:
            return current
        try:
            return write(new, current.version)
        except ConflictError:
            after_loss = False
            continue
        except ConnectionLoss:
            if not idempotent:
                raise OutcomeUnknownError(
                    f"{what}: the connection to ZooKeeper dropped before the write's answer came: it may or may not have been applied",
                    hint="read it again (e.g. `dlctl log show`) before repeating the operation",
                ) from None
            after_loss = True  # the next read tells: applied (nothing left to derive) or not (write again)
    raise ConflictError(f"aborted: {what} kept changing concurrently", hint="nothing was overwritten; retry")


def _read_when_reachable(read: Callable[[], Versioned[S]], what: str) -> Versioned[S]:
    """``read``, retried while the connection is being re-established (kazoo fails requests
    with ConnectionLoss until it is)."""
    deadline = time.monotonic() + RECONNECT_PATIENCE
    pause = 0.05
    while True:
        try:
            return read()
        except ConnectionLoss:
            if time.monotonic() + pause > deadline:
                raise OutcomeUnknownError(
                    f"{what}: a write's answer was lost and ZooKeeper stayed out of reach for {RECONNECT_PATIENCE:g}s: it may or may not have been applied",
                    hint="read it again once ZooKeeper is reachable, before repeating the operation",
                ) from None
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


__all__ = ["ABSENT", "changed_concurrently", "delete", "put", "update"]
