"""A change of owner as the log writer lives it (DESIGN.md §5; the bounds and the fast way in are
``dlctl.log.takeover``'s).

At open the writer takes over what the previous owner left in progress: those segments are
fenced, recovered and closed (``dlctl.log.recovery``), before the writer appends or — a *fast*
takeover, when the previous owner had reserved bounds — while it already appends in a segment of
its own, above those bounds, so appends resume before that recovery ends.

While it writes, the writer keeps bounds of its own for its successor: no entry goes out above
what it has reserved (``within``), and it reserves more ahead of need, in the background, one
extension at a time, across ZooKeeper blips. Losing the bounds record to another writer is being
deposed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..meta.bounds import BoundsStore, WriterBounds
from ..meta.records import SegmentRecord, SegmentState, Versioned
from .pool import ReplicaPool
from .recovery import RecoveryResult, recover_segment
from .takeover import BoundsKeeper, BoundsLost, takeover_floor
from .writer_meta import WriterMeta
from .writer_options import WriterError, WriterOptions, stopped_by

log = logging.getLogger(__name__)


class WriterTakeover:
    """The writer's part in a change of owner: the previous owner's segments, our bounds.
    ``learn_ends(segments)``: the writer never goes below the ends they record (called once
    they are recovered); ``on_error(error)``: stop the writer; ``on_reserved()``: more bounds
    are reserved (entries held back may go)."""

    def __init__(
        self,
        wmeta: WriterMeta,
        pool: ReplicaPool,
        options: WriterOptions,
        *,
        learn_ends: Callable[[list[Versioned[SegmentRecord]]], None],
        on_error: Callable[[WriterError], None],
        on_reserved: Callable[[], None],
    ) -> None:
        self._wmeta = wmeta
        self._pool = pool
        self._options = options
        self._learn_ends = learn_ends
        self._on_error = on_error
        self._on_reserved = on_reserved
        self.recovered: tuple[RecoveryResult, ...] = ()
        self.taken_over_seq = 0  # the log's last segment when we took it over
        self._bounds: BoundsKeeper | None = None
        self._recovery: asyncio.Task | None = None  # fast takeover: the previous owner's segments
        self._recovery_error: WriterError | None = None
        self.extending: asyncio.Task | None = None  # reserving more bounds

    # -- the previous owner ------------------------------------------------------------------------

    async def begin(self, segments: list[Versioned[SegmentRecord]], next_txid: int, time_ms: int) -> WriterBounds | None:
        """Claim the bounds record (from ``next_txid`` and ``time_ms`` on) and take over the
        segments the previous owner left in progress. Returns the bounds to start above when
        they are recovered in the background (a fast takeover); None when they are recovered
        already (or there were none)."""
        wmeta = self._wmeta
        assert wmeta.log is not None
        self.taken_over_seq = wmeta.log.value.max_segment_seq
        inprogress = [s for s in segments if s.value.state is SegmentState.INPROGRESS]
        ownership = wmeta.ownership
        self._bounds = BoundsKeeper(BoundsStore(wmeta.meta), wmeta.name, ownership.owner_id, ownership.session_id or 0, wmeta.zk, self._options.clock)
        previous = await self._bounds.claim(next_txid, time_ms)
        floor = takeover_floor(previous, inprogress[-1].value.writer if inprogress else None)
        if floor is not None and self._options.fast_takeover:
            # Everything the previous writer left in progress is within the bounds it had
            # reserved: start above them, and recover its segments meanwhile.
            self._recovery = asyncio.ensure_future(self._recover_in_background(inprogress))
            return floor
        if inprogress:
            await self._recover(inprogress)
        return None

    async def _recover(self, inprogress: list[Versioned[SegmentRecord]]) -> None:
        """Fence, recover and close the segments a previous owner left in progress, in order."""
        wmeta = self._wmeta
        assert wmeta.log is not None
        results = []
        for seg in inprogress:
            results.append(await recover_segment(wmeta.meta, self._pool, wmeta.name, wmeta.log.value.log_id, seg, timeout=self._options.recovery_timeout))
        self.recovered = tuple(results)
        self._learn_ends(await wmeta.zk(wmeta.meta.segments, wmeta.name))

    async def _recover_in_background(self, inprogress: list[Versioned[SegmentRecord]]) -> None:
        try:
            await self._recover(inprogress)
        except Exception as exc:  # noqa: BLE001 - every failure stops the writer (its appends say why)
            error = stopped_by(self._wmeta.name, exc, f"recovering segment(s) {', '.join(str(s.value.seq) for s in inprogress)} of the previous owner failed")
            self._recovery_error = error
            self._on_error(error)
            return
        log.info("log %r: the previous owner's segments are recovered: %s", self._wmeta.name, [r.to_dict() for r in self.recovered])

    @property
    def recovering(self) -> bool:
        """The previous owner's segments are still being recovered (a fast takeover)."""
        return self._recovery is not None and not self._recovery.done()

    async def wait_recovered(self) -> bool:
        """Until the background recovery (if any) ended; raises its error when it failed; False
        when it was cancelled (the writer stopped before it ended)."""
        task = self._recovery
        if task is not None and not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise  # we were cancelled, not the recovery
        if self._recovery_error is not None:
            raise self._recovery_error
        return task is None or not task.cancelled()

    # -- our bounds ----------------------------------------------------------------------------

    @property
    def bounds(self) -> BoundsKeeper | None:
        """Our side of the bounds record (None until ``begin`` claimed it)."""
        return self._bounds

    def reserved_ms(self) -> int:
        assert self._bounds is not None
        return self._bounds.confirmed.time_ms

    def within(self, txid: int, now_ms: int) -> bool:
        """May an entry with txids up to ``txid`` go out at ``now_ms``? Nothing above the bounds
        we have reserved may: a new owner would start above them before our segment is
        recovered. Reserves more ahead of need, and at once when they do not cover it."""
        assert self._bounds is not None
        if self._bounds.covers(txid, now_ms):
            if self.extending is None and self._bounds.running_low(txid, now_ms):
                self._extend(txid, now_ms)
            return True
        if self.extending is None:
            self._extend(txid, now_ms)
        return False

    def _extend(self, txid: int, time_ms: int) -> None:
        self.extending = asyncio.ensure_future(self._extending(txid, time_ms))

    async def _extending(self, txid: int, time_ms: int) -> None:
        bounds = self._bounds
        assert bounds is not None
        try:
            await self._wmeta.across_blips("reserving txids and append time", lambda: bounds.extend(txid, time_ms))
        except BoundsLost as exc:
            self._on_error(self._wmeta.deposed(exc.message))
            return
        except Exception as exc:  # noqa: BLE001 - a writer that cannot reserve cannot write
            self._on_error(stopped_by(self._wmeta.name, exc, "reserving txids and append time"))
            return
        finally:
            self.extending = None
        self._on_reserved()

    def cancel(self) -> None:
        """The writer stopped: no more recovering or reserving (unless that is who stops it)."""
        for task in (self._recovery, self.extending):
            if task is not None and task is not asyncio.current_task():
                task.cancel()


__all__ = ["WriterTakeover"]
