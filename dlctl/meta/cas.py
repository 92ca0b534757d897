"""Compare-and-set of a versioned znode, written once (issue 26 item 2; BookKeeper's
``MetadataUpdateLoop``).

``put`` writes a znode only if it is still at the version read (or creates it when it was
absent), and maps what ZooKeeper answers — someone else wrote first, the znode (or its parent)
is gone — to the errors operators see, in one place. A conflict is always a conflict: even a
znode now holding exactly the bytes we meant to write at the next version may be another
writer's (two creators allocating the same next id write the same bytes), so it is never taken
for our own success. (A write whose answer a dropped connection lost surfaces as the client's
``ConnectionLoss``, its outcome unknown; it is not guessed from the content either.)

``update`` is the loop around it: read, let ``change`` derive the new value from the current
one (None: nothing to do), ``put``, and on a conflict read again and derive again — so a change
someone made meanwhile is built upon, never overwritten.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from ..errors import ConflictError, DlctlError
from .records import Versioned

ABSENT = -1  # the version of a znode that does not exist yet: ``put`` creates it
ATTEMPTS = 8

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


def update(
    read: Callable[[], Versioned[S]],
    change: Callable[[S], T | None],
    write: Callable[[T, int], Versioned[T]],
    *,
    what: str,
    attempts: int = ATTEMPTS,
) -> Versioned[S] | Versioned[T]:
    """Read, derive the new value (``change``; None or an equal value: nothing to do, the
    current one is returned), write it by compare-and-set on the version read (``write(new,
    version)``, raising ``ConflictError`` when it moved), and on a conflict start again. A znode
    that may not exist yet is read as ``Versioned(None, ABSENT)``: ``change(None)`` derives the
    value to create, and ``put`` at ``ABSENT`` creates it (or conflicts, when someone was first)."""
    for _ in range(attempts):
        current = read()
        new = change(current.value)
        if new is None or new == current.value:
            return current
        try:
            return write(new, current.version)
        except ConflictError:
            continue
    raise ConflictError(f"aborted: {what} kept changing concurrently", hint="nothing was overwritten; retry")


__all__ = ["ABSENT", "changed_concurrently", "put", "update"]
