"""Failures from below the operations that the command line shows as the errors they are, not as
internal ones: turned into ``DlctlError`` here, so the command line needs no knowledge of
ZooKeeper (tests/unit/test_layers.py)."""

from __future__ import annotations

from kazoo.exceptions import NoAuthError

from ..errors import DlctlError
from ..meta.zk import refused


def as_user_error(exc: BaseException) -> DlctlError | None:
    """``exc`` as an error for the operator, or None when it is a bug (an internal error)."""
    if isinstance(exc, NoAuthError):
        return refused(exc)  # a znode whose ACL refuses the cluster's credentials, named
    return None


__all__ = ["as_user_error"]
