"""The record of a resumable operation, at ``/dlctl/<cluster>/ops/<op-id>`` (issue 26 item 2).

Operations that run long and must survive the operator's command dying — re-replication of lost
agents, a bootstrap copy, a disaster recovery — keep what they have done in a JSON record there,
so that running the same command again continues instead of starting over. This class is the
one way they write it:

- ``start``: create the record, or, when a run of the same operation left one, resume it (its
  ``runs`` counted up, ``state`` back to ``running``); a record whose operation had finished is
  started afresh, if the caller says so.
- ``update``: derive the next record from the current one and compare-and-set it
  (``dlctl.meta.cas.update``). The first attempt builds on the version this run last wrote; on a
  conflict — another run of the same operation wrote meanwhile — the record is read again and
  the change derived again, so what the other run recorded is kept, not overwritten.
- Updates are serialised by a lock: results arrive from several tasks or threads at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import NotFoundError
from . import cas
from .records import Versioned
from .store import MetaStore

RUNNING = "running"


def _stamped(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "updated_at": time.time()}


class OperationRecord:
    def __init__(self, meta: MetaStore, op_id: str, versioned: Versioned[dict]) -> None:
        self.meta, self.op_id, self.versioned = meta, op_id, versioned
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls,
        meta: MetaStore,
        op_id: str,
        fresh: dict[str, Any],
        *,
        resume: Callable[[dict[str, Any]], dict[str, Any]] = dict,
        restart_if: Callable[[dict[str, Any]], bool] = lambda _record: False,
    ) -> OperationRecord:
        """Create ``ops/<op_id>`` as ``fresh`` (plus state running, runs 1 and times), or continue
        the record an earlier run left: ``resume(current)`` is the record to go on with (its
        runs counted up, state running). ``restart_if(current)``: that earlier record is of an
        operation that ended, and is replaced by a fresh one."""
        try:
            current = meta.get_op(op_id)
        except NotFoundError:
            return cls.create(meta, op_id, fresh)
        if restart_if(current.value):
            meta.delete_op(op_id, current)  # (a concurrent run's change makes this a conflict: nothing lost)
            return cls.create(meta, op_id, fresh)
        record = cls(meta, op_id, current)
        record.update(lambda value: {**resume(value), "state": RUNNING, "runs": int(value.get("runs", 0)) + 1})
        return record

    @classmethod
    def create(cls, meta: MetaStore, op_id: str, fresh: dict[str, Any]) -> OperationRecord:
        """A new record (``ConflictError`` when a concurrent run created it first)."""
        now = time.time()
        return cls(meta, op_id, meta.create_op(op_id, {**fresh, "state": fresh.get("state", RUNNING), "runs": 1, "created_at": now, "updated_at": now}))

    @property
    def value(self) -> dict[str, Any]:
        return self.versioned.value

    def update(self, change: Callable[[dict[str, Any]], dict[str, Any] | None], *, idempotent: bool = False) -> dict[str, Any]:
        """Write ``change(current)`` (None or the same record: nothing to write) by
        compare-and-set; a conflict re-reads and re-derives (``ConflictError`` after
        ``cas.ATTEMPTS`` in a row). ``idempotent``: see ``cas.update`` (a lost answer settled)."""
        with self._lock:
            known: Versioned[dict] | None = self.versioned

            def read() -> Versioned[dict]:
                nonlocal known
                if known is not None:  # first, the version this run last wrote: no read needed
                    current, known = known, None
                    return current
                return self.meta.get_op(self.op_id)

            def derive(current: dict[str, Any]) -> dict[str, Any] | None:
                new = change(dict(current))
                return None if new is None or new == current else _stamped(new)

            def write(new: dict[str, Any], version: int) -> Versioned[dict]:
                return self.meta.update_op(self.op_id, Versioned(new, version), new)

            self.versioned = cas.update(read, derive, write, what=f"operation record ops/{self.op_id}", idempotent=idempotent)
            return self.versioned.value

    def set(self, **changes: Any) -> dict[str, Any]:
        """Update the record's top-level fields (idempotent: a lost answer is settled)."""
        return self.update(lambda record: {**record, **changes}, idempotent=True)

    def delete(self) -> None:
        """Remove the record: the operation is over and leaves nothing to resume."""
        with self._lock:
            try:
                self.meta.delete_op(self.op_id, self.meta.get_op(self.op_id))
            except NotFoundError:
                pass
