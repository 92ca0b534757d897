"""Deposing a log's owner (``dlctl.ops.logs.remove_owner_znode``) against a scripted owner
znode: an owner that lets go meanwhile is the outcome wanted, another taking over is a conflict.
(A stress run's failover failed its promote step when the fenced replication worker released the
log between the read of its owner znode and the delete.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dlctl.errors import ConflictError
from dlctl.ops.logs import remove_owner_znode


class ScriptedOwner:
    """``owner_of`` answers from ``owners`` in turn (a session id, or None: no owner znode);
    ``release_owner`` succeeds only for a session id listed in ``releasable``."""

    def __init__(self, owners: list[int | None], releasable: set[int] = frozenset()) -> None:
        self.owners, self.releasable, self.deleted = list(owners), set(releasable), []

    def owner_of(self, name: str) -> tuple[bytes, int] | None:
        session = self.owners.pop(0)
        return None if session is None else (b"{}", session)

    def release_owner(self, name: str, session_id: int) -> bool:
        if session_id in self.releasable:
            self.deleted.append(session_id)
            return True
        return False


def depose(meta: ScriptedOwner) -> dict:
    return remove_owner_znode(SimpleNamespace(meta=meta), "orders")


def test_the_owner_is_deleted():
    meta = ScriptedOwner([7], releasable={7})
    assert depose(meta) == {"released": True, "forced": True} and meta.deleted == [7]


def test_an_owner_that_lets_go_between_the_read_and_the_delete_is_not_a_conflict():
    meta = ScriptedOwner([7, None])
    assert depose(meta) == {"released": False, "reason": "its owner let go meanwhile"}


def test_another_session_taking_the_log_meanwhile_is_a_conflict():
    with pytest.raises(ConflictError, match="the owner of log 'orders' changed meanwhile"):
        depose(ScriptedOwner([7, 8]))


def test_the_same_owner_rewriting_its_znode_is_deleted_on_a_later_try():
    meta = ScriptedOwner([7, 7], releasable=set())
    meta.release_owner = lambda name, session_id, tries=iter([False, True]): next(tries)  # type: ignore[method-assign]
    assert depose(meta) == {"released": True, "forced": True}


def test_no_owner_at_all():
    assert depose(ScriptedOwner([None])) == {"released": False, "reason": "no owner any more"}
