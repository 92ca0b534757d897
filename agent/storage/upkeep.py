"""The store's background upkeep: what its two timers do while it serves, and once more at a
clean close. Part of ``SegmentStore`` (a base class of it: the timers and the work live on the
store, whose state they read), apart from the request path.

- Every TRIM_IDLE_SECONDS: replicas left idle give back their preallocated space, throttled log
  lines are flushed, and index checkpoints (checkpoint.py) are written for replicas whose
  durable data grew and then rested — a shortcut for the next start, never needed for safety.
- Every ACKED_SECONDS: the durable length of each replica that grew is recorded in its .acked
  file (see recovery.py: a file found shorter at start-up was cut, and goes to limbo).
- At a clean close: every replica's final length and index, so the next start sees any cut
  made while the agent was down and reads only what comes after the checkpoints.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from dlctl.log.errors import AgentIOError
from dlctl.logthrottle import LogThrottle

from .files import ReplicaFiles
from .index import EntryIndex
from .layout import Key
from .segment import FdCache, Segment
from .types import SyncPolicy

log = logging.getLogger("dlagent.storage")

# How often segments left idle give back their preallocated space: one that took no data over
# a whole period is trimmed (so within two periods of its last add).
TRIM_IDLE_SECONDS = 2.0
# How often the durable length of replicas that grew is recorded in their .acked files: a file
# cut while the agent is down is caught unless the cut reaches into the last second of data
# made durable before a crash (a clean stop records everything).
ACKED_SECONDS = 1.0
# Index checkpoints written per trim tick at most (the rest: at the next ticks).
CHECKPOINTS_PER_TICK = 32


class Upkeep:
    """The store's timers and their work (a base class of ``SegmentStore``)."""

    # The store's state the upkeep works on (set by SegmentStore.__init__ and open()).
    data_dir: object
    sync: SyncPolicy
    _segments: dict[Key, Segment]
    _deleting: dict[Key, asyncio.Task]
    _background: set[asyncio.Task]
    _serving: bool
    _loop: asyncio.AbstractEventLoop | None
    _fds: FdCache
    _files: ReplicaFiles
    _throttle: LogThrottle
    _blocking: Callable[..., Awaitable]
    _trim_timer: asyncio.TimerHandle | None
    _acked_timer: asyncio.TimerHandle | None
    _checkpointing: asyncio.Task | None  # index checkpoints being written (one batch at a time)

    def _start_upkeep(self) -> None:
        self._trim_timer = self._loop.call_later(TRIM_IDLE_SECONDS, self._trim_idle)  # type: ignore[union-attr]
        self._acked_timer = self._loop.call_later(ACKED_SECONDS, self._record_acked_soon)  # type: ignore[union-attr]

    def _stop_upkeep(self) -> None:
        if self._trim_timer is not None:
            self._trim_timer.cancel()
            self._trim_timer = None
        if self._acked_timer is not None:
            self._acked_timer.cancel()
            self._acked_timer = None

    async def _last_upkeep(self) -> None:
        """At a clean close, all written: nothing is pending any more."""
        # Every replica's final length: a cut made while the agent is down is then always seen.
        await self._record_acked(self._acked_due(), reschedule=False)
        # And every replica's index: the next start reads only what comes after.
        if self._checkpointing is not None:
            await asyncio.shield(self._checkpointing)
        await self._write_checkpoints(self._checkpoints_due(everything=True))

    def _trim_idle(self) -> None:
        """Every TRIM_IDLE_SECONDS: give back the preallocated space of segments left idle."""
        self._trim_timer = None
        if not self._serving:
            return
        self._fds.trim_idle()
        self._throttle.flush()
        if self._checkpointing is None or self._checkpointing.done():
            due = self._checkpoints_due(everything=False)
            if due:
                self._checkpointing = self._loop.create_task(self._write_checkpoints(due))  # type: ignore[union-attr]
        self._trim_timer = self._loop.call_later(TRIM_IDLE_SECONDS, self._trim_idle)  # type: ignore[union-attr]

    # -- index checkpoints (checkpoint.py) -----------------------------------------------------------

    def _checkpoints_due(self, *, everything: bool) -> list[tuple[Key, int, int, EntryIndex]]:
        """(key, covered length, LAC, index snapshot) of each replica whose durable data grew past
        its checkpoint and has rested since the last look (``everything``: at a clean stop, every
        one that grew). Loop thread: snapshots copy the index arrays whole, cheaply.

        Only where durable means fdatasync'ed (``mode="always"``): with ``"never"`` a power loss
        may tear what a checkpoint covers, which the full scan cuts as a torn tail."""
        if self.sync.mode != "always":
            return []
        due = []
        for key, seg in self._segments.items():
            rested = everything or seg.rest_mark == seg.durable
            seg.rest_mark = seg.durable
            if seg.limbo is not None or key in self._deleting or seg.pinned or seg.durable <= seg.indexed or not rested:
                continue
            # Stopping, nothing changes an index any more: no copy. Running, a bounded batch per
            # tick, so the first ticks after a start that read everything (all replicas due at
            # once) do not copy every index at the same time.
            due.append((key, seg.durable, seg.lac, seg.index if everything else seg.index.snapshot()))
            if not everything and len(due) >= CHECKPOINTS_PER_TICK:
                break
        return due

    async def _write_checkpoints(self, due: list[tuple[Key, int, int, EntryIndex]]) -> None:
        """Write them on a thread of their own (not the sync thread: group commits do not wait
        for them). A checkpoint is only a shortcut for the next start: one that cannot be written
        is logged and the replica is read in full then."""
        try:
            written = await asyncio.to_thread(self._files.write_checkpoints, due)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("cannot write index checkpoints in %s: %s", self.data_dir, exc)
            return
        for key, covered in written:
            seg = self._segments.get(key)
            if seg is not None and covered > seg.indexed:
                seg.indexed = covered

    # -- acknowledged lengths (.acked files; see recovery.py) ------------------------------------

    def _acked_due(self) -> list[tuple[Key, int]]:
        return [(k, s.durable) for k, s in self._segments.items() if s.limbo is None and s.durable > s.acked and k not in self._deleting]

    def _record_acked_soon(self) -> None:
        """Every ACKED_SECONDS: record the durable length of each replica that grew since."""
        self._acked_timer = None
        if not self._serving:
            return
        due = self._acked_due()
        if not due:
            self._acked_timer = self._loop.call_later(ACKED_SECONDS, self._record_acked_soon)  # type: ignore[union-attr]
            return
        task = self._loop.create_task(self._record_acked(due))  # type: ignore[union-attr]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _record_acked(self, due: list[tuple[Key, int]], reschedule: bool = True) -> None:
        try:
            await self._blocking("cannot record acknowledged lengths", self._files.write_acked, due)
            for key, length in due:
                seg = self._segments.get(key)
                if seg is not None and length > seg.acked:
                    seg.acked = length
        except AgentIOError as exc:
            log.error("%s", exc)  # a failed fsync is fatal (see _blocking); anything else: next time
        finally:
            if reschedule and self._serving:
                self._acked_timer = self._loop.call_later(ACKED_SECONDS, self._record_acked_soon)  # type: ignore[union-attr]
