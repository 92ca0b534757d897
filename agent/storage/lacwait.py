"""Long polls waiting for a replica's LAC to pass a point (``SegmentStore.wait_lac``).

A waiter is woken by the add (or LAC learnt) that raises the LAC past its point — never by
polling — or resolved with None at its timeout; when the store stops or fails, every waiter
gets the error at once, so no long poll outlives the storage it waits on.
"""

from __future__ import annotations

import asyncio

from .layout import Key
from .segment import Segment

Waiter = tuple[int, asyncio.Future]  # (the LAC to pass, resolved with the LAC that passed it)


class LacWaiters(dict[Key, list[Waiter]]):
    """The waiters, by replica (a dict, so what still waits is plain to see: nothing is
    left behind for a replica nobody waits on)."""

    def raise_lac(self, seg: Segment, lac: int) -> None:
        """Set the replica's LAC to ``lac`` (higher than it was) and wake those it passes."""
        seg.lac = lac
        waiters = self.get(seg.key)
        if not waiters:
            return
        keep = []
        for item in waiters:
            above, fut = item
            if lac > above:
                if not fut.done():
                    fut.set_result(lac)
            else:
                keep.append(item)
        waiters[:] = keep

    def fail_all(self, exc: BaseException) -> None:
        for waiters in self.values():
            for _above, fut in waiters:
                if not fut.done():
                    fut.set_exception(exc)
        self.clear()

    async def wait(self, loop: asyncio.AbstractEventLoop, key: Key, above: int, timeout: float) -> int | None:
        """The LAC of replica ``key`` once it exceeds ``above``; None at ``timeout``."""
        fut = loop.create_future()
        item = (above, fut)
        self.setdefault(key, []).append(item)
        handle = loop.call_later(timeout, _resolve_none, fut)
        try:
            return await fut
        finally:
            handle.cancel()
            waiters = self.get(key)
            if waiters is not None:
                try:
                    waiters.remove(item)
                except ValueError:
                    pass
                if not waiters:
                    del self[key]


def _resolve_none(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
