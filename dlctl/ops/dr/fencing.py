"""Taking logs from their writers and giving them back: the access-mode and ownership changes
every runbook makes (``dlctl.meta.access`` holds the modes), and ``dr promote``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...log.recovery import recover_log
from ...meta.access import REPLICATION_PREFIX, AccessMode, AccessStore
from ...meta.records import SegmentState
from ...plan import Plan, Step
from ...session import ClusterSession
from .. import replication as repl
from ..logs import ask_owner_to_release, owner_record, remove_owner_znode
from .decide import owner_action, to_promote


def depose_owner(session: ClusterSession, name: str, *, only_prefix: str | None = None, timeout: float = 30.0, close: bool = True) -> str:
    """Take log ``name`` away from whoever writes it (an agent releases it gracefully: flush,
    complete the segment; anyone else is deposed and fenced), then close any segment left in
    progress so the log's end is fixed. ``only_prefix``: only an owner whose id starts so."""
    info = owner_record(session, name)
    action = owner_action(info, only_prefix)
    what = "no owner"
    if action == "leave":
        return f"owned by {info['owner']} (left alone)"
    if action == "release":
        try:
            ask_owner_to_release(session, name, info["address"])
            what = f"released by agent {info['address']}"
        except Exception:  # noqa: BLE001 - the agent is gone or no longer owns it: depose
            remove_owner_znode(session, name)
            what = f"deposed {info['owner']} (its agent did not answer)"
    elif action == "depose":
        remove_owner_znode(session, name)
        what = f"deposed {info['owner']}"
    if close and session.meta.owner_of(name) is None and any(s.value.state is SegmentState.INPROGRESS for s in session.meta.segments(name)):
        results = session.with_pool(lambda pool: recover_log(session.meta, pool, name, timeout=timeout))
        what += f"; closed {len(results)} in-progress segment(s) (fenced)"
    return what


def freeze_logs(session: ClusterSession, names: Iterable[str], *, mode: AccessMode, stream: str = "", reason: str, close: bool = True) -> dict[str, Any]:
    """Set the logs' access mode to a non-writable one and take them from their writers: after
    this, no application append can land in them."""
    access = AccessStore(session.meta)
    out = {}
    for name in names:
        state = access.set(name, mode, stream=stream, reason=reason)
        out[name] = {"access": state.value.describe(), "owner": depose_owner(session, name, close=close)}
    return out


def promote_logs(session: ClusterSession, names: Iterable[str], *, reason: str) -> dict[str, Any]:
    """Make the logs read-write (a replication worker still owning one is deposed first)."""
    access = AccessStore(session.meta)
    out = {}
    for name in names:
        owner = depose_owner(session, name, only_prefix=REPLICATION_PREFIX)
        state = access.set(name, AccessMode.READ_WRITE, reason=reason)
        out[name] = {"access": state.value.describe(), "owner": owner}
    return out


def promote_plan(session: ClusterSession, patterns: tuple[str, ...] = ("*",)) -> Plan:
    access = AccessStore(session.meta)
    current = {n: access.get(n).value for n in repl.matching_logs(session.meta.list_logs(), patterns)}
    names = to_promote({n: a.mode for n, a in current.items()})
    where = session.cluster.name
    if not names:
        return Plan.of(f"dr promote {where}", [], notes=["every matching log is read-write already"])
    return Plan.of(
        f"dr promote {where}",
        [Step("promote", f"{where}/{n}", f"make {where}/{n} read-write (was {current[n].describe()})", run=lambda n=n: promote_logs(session, [n], reason="dr promote")[n]) for n in names],
        notes=[f"applications may write to {where} afterwards: make sure no other cluster is primary for these logs"],
    )


__all__ = ["depose_owner", "freeze_logs", "promote_logs", "promote_plan"]
