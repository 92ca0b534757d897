"""What the log writer reads and writes in ZooKeeper: its segments' records, created and
completed by compare-and-set in a way that survives a connection blip, and the ensembles of new
segments, chosen by the log's placement policy among agents that answer.

**Blips.** A ZooKeeper request whose answer was lost (connection loss, timeout) may or may not
have been applied. Creating or completing a segment is therefore retried until ``stall_timeout``,
and after a lost answer the record is read back: the very record we wrote means it went
through. Before every attempt the writer must still own the log *through the session that
claimed it*: kazoo replays requests queued while disconnected on a new session after an expiry,
so a retry could otherwise create a segment for an owner that was deposed meanwhile (and its
successor would then depose itself).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kazoo.exceptions import ConnectionLoss, OperationTimeoutError

from ..errors import ConflictError, RefusedError
from ..meta import policy as placement_store
from ..meta.records import EnsembleChange, LogRecord, SegmentRecord, SegmentState, Versioned
from ..meta.store import MetaStore
from ..placement import PlacementPolicy
from .ensembles import probed_ensemble
from .errors import AgentError
from .ownership import Ownership
from .pool import ReplicaPool
from .segment_pipeline import SegmentPipeline
from .writer_options import WriterDeposedError, WriterError, deposed

log = logging.getLogger(__name__)

# ZooKeeper answers lost to a connection blip: the request may or may not have been applied.
ZK_BLIPS = (ConnectionLoss, OperationTimeoutError)
RETRY_PAUSE = 0.2  # between attempts across a blip
# How old the agents' availability records may be when a roll chooses the next ensemble: its
# members are probed (or are acknowledging our entries) anyway, and re-reading them is several
# thread hops that, with the writer's process busy, held every roll ~20 ms (entries wait for it).
NODES_MAX_AGE = 2.0  # seconds

T = TypeVar("T")


class WriterMeta:
    """The metadata side of writer ``ownership.owner_id`` of log ``name``. ``log`` is the log's
    record as last read or written (the writer reads it at open). ``stopped()``: the writer's
    error once it stopped, which every later attempt raises."""

    def __init__(self, meta: MetaStore, pool: ReplicaPool, name: str, ownership: Ownership, *, stall_timeout: float, stopped: Callable[[], WriterError | None]) -> None:
        self.meta = meta
        self.pool = pool
        self.name = name
        self.ownership = ownership
        self.stall_timeout = stall_timeout
        self.log: Versioned[LogRecord] | None = None
        self._stopped = stopped
        self._loop = asyncio.get_running_loop()
        self._last_placement: PlacementPolicy | None = None
        self._nodes_read_at = float("-inf")  # (monotonic) when available() last read them

    async def zk(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` (a blocking kazoo call) off the event loop."""
        return await self._loop.run_in_executor(None, fn, *args)

    def deposed(self, why: str) -> WriterDeposedError:
        return deposed(self.ownership.owner_id, self.name, why)

    def check_still_owner(self) -> None:
        """Raise unless this writer still owns the log through the session that claimed it (see
        the module doc)."""
        error = self._stopped()
        if error is not None:
            raise error
        if self.ownership.lost:
            raise self.deposed(self.ownership.lost_reason or "ownership lost")
        client_id = self.meta.client.client_id
        if client_id is not None and self.ownership.session_id is not None and client_id[0] != self.ownership.session_id:
            raise self.deposed("its ZooKeeper session expired (the ownership belonged to the old session)")

    def check_blip_deadline(self, deadline: float, what: str, exc: Exception) -> None:
        if time.monotonic() > deadline:
            raise WriterError(
                f"writer of log {self.name!r} stalled {what}: ZooKeeper unreachable for {self.stall_timeout:g}s ({exc!r})",
                hint="check the ZooKeeper ensemble; records not yet acknowledged may or may not be in the log",
            )
        log.warning("log %r: ZooKeeper connection trouble while %s (%r); retrying", self.name, what, exc)

    async def across_blips(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` (which may be repeated: a lost answer means nothing was decided), retried
        across blips while we own the log, up to ``stall_timeout``."""
        deadline = time.monotonic() + self.stall_timeout
        while True:
            self.check_still_owner()
            try:
                return await attempt()
            except ZK_BLIPS as exc:
                self.check_blip_deadline(deadline, what, exc)
            await asyncio.sleep(RETRY_PAUSE)

    # -- segments --------------------------------------------------------------------------------

    async def create_next_segment(self, ensemble: tuple[str, ...], first_txid: int) -> Versioned[SegmentRecord]:
        """Create the log's next in-progress segment on ``ensemble`` (its sequence number by CAS on
        the log record); deposed when another writer created one meanwhile."""
        assert self.log is not None
        while True:
            log_rec = self.log.value
            record = SegmentRecord(
                seq=log_rec.max_segment_seq + 1,
                state=SegmentState.INPROGRESS,
                ensembles=(EnsembleChange(0, ensemble),),
                write_quorum=log_rec.config.write_quorum,
                ack_quorum=log_rec.config.ack_quorum,
                created=time.time(),
                writer=self.ownership.owner_id,
                first_txid=first_txid,
            )
            if self.ownership.lost:
                raise self.deposed(f"ownership lost: {self.ownership.lost_reason}")
            try:
                self.log, versioned = await self._create_segment(record)
                return versioned
            except ConflictError:
                fresh = await self.zk(self.meta.get_log, self.name)
                if fresh.value.max_segment_seq != log_rec.max_segment_seq:
                    raise self.deposed(f"another writer created segment {fresh.value.max_segment_seq}") from None
                self.log = fresh  # only the config changed: use it

    async def _create_segment(self, record: SegmentRecord) -> tuple[Versioned[LogRecord], Versioned[SegmentRecord]]:
        assert self.log is not None
        deadline = time.monotonic() + self.stall_timeout
        while True:
            self.check_still_owner()  # before every attempt, retries included (module doc)
            try:
                return await self.zk(self.meta.create_segment, self.name, self.log, record)
            except ZK_BLIPS as exc:
                self.check_blip_deadline(deadline, f"creating segment {record.seq}", exc)
            # Did it go through before the answer was lost? Then the segment is ours as written.
            await asyncio.sleep(RETRY_PAUSE)
            try:
                log_now = await self.zk(self.meta.get_log, self.name)
                if log_now.value.max_segment_seq != record.seq:
                    continue  # not applied (or someone else's: the retry's CAS says so)
                seg_now = await self.zk(self.meta.get_segment, self.name, record.seq)
            except ZK_BLIPS:
                continue
            if seg_now.value == record:
                return log_now, seg_now
            raise ConflictError(f"segment {record.seq} of log {self.name!r} was created by another writer")

    async def update_segment(self, current: Versioned[SegmentRecord], new: SegmentRecord) -> Versioned[SegmentRecord]:
        """``current`` becomes ``new`` (CAS); ``ConflictError`` when someone else changed it."""
        deadline = time.monotonic() + self.stall_timeout
        while True:
            self.check_still_owner()
            try:
                return await self.zk(self.meta.update_segment, self.name, current, new)
            except ZK_BLIPS as exc:
                self.check_blip_deadline(deadline, f"completing segment {new.seq}", exc)
            await asyncio.sleep(RETRY_PAUSE)
            try:
                now = await self.zk(self.meta.get_segment, self.name, new.seq)
            except ZK_BLIPS:
                continue
            if now.value == new:
                return now  # applied before the answer was lost
            if now.version != current.version:
                raise ConflictError(f"segment {new.seq} of log {self.name!r} was changed by someone else")

    # -- ensembles -------------------------------------------------------------------------------

    async def new_ensemble(self, avoid: set[str]) -> tuple[str, ...]:
        """An ensemble for a new segment, without ``avoid`` (agents that failed the last one) if
        possible; waits up to ``stall_timeout`` for enough agents."""
        deadline = time.monotonic() + self.stall_timeout
        while True:
            nodes = await self.available()
            policy = await self.placement()
            try:
                return await self.probed_ensemble(nodes, avoid, policy)
            except RefusedError as exc:
                try:  # agents we saw fail may be back: better than no segment at all
                    return await self.probed_ensemble(nodes, set(), policy)
                except RefusedError:
                    if time.monotonic() > deadline:
                        raise WriterError(f"writer of log {self.name!r} cannot start a segment: {exc.message}", hint=exc.hint) from None
                    await asyncio.sleep(RETRY_PAUSE)

    async def wait_for_ensemble(self, seg: SegmentPipeline, reason: str) -> tuple[str, ...] | None:
        """Entries cannot reach quorum on ``seg``: wait for agents to form a fresh ensemble, or
        for the entries to get their acks after all (None), up to ``stall_timeout``."""
        assert self.log is not None
        deadline = time.monotonic() + self.stall_timeout
        delay = 0.1
        while True:
            error = self._stopped()
            if error is not None:
                raise error
            if seg.all_ackable():
                return None
            ensemble = await self.fresh_ensemble(set(seg.failed), silent=seg.silent)
            if ensemble is not None:
                return ensemble
            if time.monotonic() + delay > deadline:
                raise WriterError(
                    f"writer of log {self.name!r} stalled: {reason}; failed agents: "
                    + "; ".join(f"{n}: {why}" for n, why in sorted(seg.failed.items()))
                    + f"; no fresh ensemble of {self.log.value.config.ensemble_size} agents for {self.stall_timeout:g}s",
                    hint="bring agents back; records not yet acknowledged may or may not be in the log",
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def fresh_ensemble(self, failed: set[str], silent: set[str] = frozenset(), answering: set[str] = frozenset()) -> tuple[str, ...] | None:  # type: ignore[assignment]
        """An ensemble without agents that are still failing, or None when too few are left.
        ``silent``: failed members that just went silent; a probe of them would only wait.
        ``answering``: agents acknowledging our entries right now, so not probed (a probe of a
        busy member waits behind the entries queued on its connection)."""
        policy = asyncio.ensure_future(self.placement())  # (a ZooKeeper read: meanwhile)
        try:
            nodes = await self.available(max_age=NODES_MAX_AGE)
            suspects = {n for n in failed if n in nodes and n not in silent}
            still_failing = set(failed) - suspects
            if suspects:
                # A failed agent that answers now (a dropped connection, a restart) may serve again.
                checks = await asyncio.gather(*(self.healthy(n) for n in sorted(suspects)))
                still_failing |= {n for n, ok in zip(sorted(suspects), checks) if not ok}
            return await self.probed_ensemble(nodes, still_failing, await policy, healthy=(suspects - still_failing) | (set(answering) - still_failing))
        except RefusedError:
            return None
        finally:
            if not policy.done():
                policy.cancel()
            # (its error, if any, is the one raised here already, or no longer of interest)
            policy.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def probed_ensemble(self, nodes: dict[str, dict], exclude: set[str], policy: PlacementPolicy, healthy: set[str] | None = None) -> tuple[str, ...]:
        """An ensemble whose members answer right now (``dlctl.log.ensembles``); ``RefusedError``
        when too few do."""
        return await probed_ensemble(nodes, policy, self.healthy, exclude=exclude, known_healthy=healthy or ())

    async def placement(self) -> PlacementPolicy:
        """This log's placement policy (its E/W/A, the cluster's m, regions and drains), read at
        every ensemble choice so a drain or a new m applies from the next segment on."""
        assert self.log is not None
        deadline = time.monotonic() + self.stall_timeout
        while True:
            try:
                cluster_policy = (await self.zk(placement_store.load, self.meta.client, self.meta.cluster)).value
                self._last_placement = cluster_policy.for_log(self.name, self.log.value.config)
                return self._last_placement
            except ZK_BLIPS as exc:
                if self._last_placement is not None:
                    return self._last_placement  # as last read: a blip must not stop a roll
                # Never read yet: a blip is retried like every other ZooKeeper call here.
                self.check_still_owner()
                self.check_blip_deadline(deadline, "reading the placement policy", exc)
            await asyncio.sleep(RETRY_PAUSE)

    async def available(self, max_age: float = 0.0) -> dict[str, dict]:
        """The available agents, re-read unless read within ``max_age`` seconds."""
        if time.monotonic() - self._nodes_read_at < max_age and self.pool.nodes:
            return self.pool.nodes
        try:
            nodes = await self.pool.refresh()
        except ZK_BLIPS:
            return self.pool.nodes  # as last seen: the agents themselves are checked anyway
        self._nodes_read_at = time.monotonic()
        return nodes

    async def healthy(self, node: str) -> bool:
        try:
            client = await self.pool.client(node)
            await asyncio.wait_for(client.stat(), 1.0)
            return True
        except (AgentError, TimeoutError):
            return False


__all__ = ["RETRY_PAUSE", "WriterMeta", "ZK_BLIPS"]
