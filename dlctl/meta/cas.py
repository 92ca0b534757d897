"""Compare-and-set of a versioned znode, written once (issue 26 item 2; BookKeeper's
``MetadataUpdateLoop``).

``put`` writes a znode only if it is still at the version read (or creates it when it was
absent). The ZooKeeper client retries a request whose connection dropped; when the first try
had in fact been applied, the retry meets the write itself — ``BadVersion`` (a set) or
``NodeExists`` (a create) — and a caller would take its own success for someone else's change.
``put`` recognises that case: after such an error it reads the znode back, and when it holds
exactly the bytes written at exactly the next version, the write is done. Anything else is a
real conflict (``conflict()``, nothing overwritten).

``update`` is the loop around it: read, let ``change`` derive the new value from a copy of the
current one (None: nothing to do), ``put``, and on a conflict read again and retry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from ..errors import ConflictError, DlctlError
from .records import Versioned

ABSENT = -1  # the version of a znode that does not exist yet: ``put`` creates it
ATTEMPTS = 8

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
    conflict: Callable[[], DlctlError] | None = None,
    missing: Callable[[], DlctlError] | None = None,
) -> int:
    """Write ``data`` at ``path`` if it is still at ``version`` (``ABSENT``: create it); returns
    the new version. ``conflict()``: the error when someone else changed it first (default:
    ``changed_concurrently``); ``missing()``: when the znode (or its parent) does not exist
    (default: a conflict too)."""
    conflict = conflict or (lambda: changed_concurrently(path, version))
    try:
        if version < 0:
            client.create(path, data, acl=acl)
            return 0
        return int(client.set(path, data, version=version).version)
    except (BadVersionError, NodeExistsError):
        try:
            now, stat = client.get(path)
        except NoNodeError:
            raise conflict() from None
        if now == data and stat.version == version + 1:
            return int(stat.version)  # our own write, whose answer was lost and retried
        raise conflict() from None
    except NoNodeError:
        raise (missing or conflict)() from None


def update(
    read: Callable[[], Versioned[T]],
    change: Callable[[T], T | None],
    write: Callable[[T, int], Versioned[T]],
    *,
    what: str,
    attempts: int = ATTEMPTS,
) -> Versioned[T]:
    """Read, derive the new value (``change``; None or an equal value: nothing to do, the
    current one is returned), write it by compare-and-set on the version read (``write(new,
    version)``, raising ``ConflictError`` when it moved), and on a conflict start again."""
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
