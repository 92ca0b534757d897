"""Reading one entry from whichever replica of its write set answers first and correctly.

Replicas are tried in ``readpolicy.speculative_order`` order (closest first, then across a rack,
then across a region; a replica slow or failing lately after the others). If the replicas asked
have not answered within the adaptive speculative timeout, the next is asked too and the first
good answer wins, so a hung replica costs about one timeout rather than a request timeout; each
further speculative request waits twice as long as the one before (up to a cap), so a slow
cluster is not flooded. Every answer, failure and wait past the timeout feeds the reader's
``ReplicaScores``, so the order adapts to what it observes. A replica that fails (unreachable,
in limbo, corrupt answer, no such entry) hands over to the next one at once. Only when every
replica of the write set has failed is the read an error, naming each failure.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import DlctlError
from ..meta.records import SegmentRecord
from .compression import WireStats
from .errors import AgentError, AgentUnavailableError, NoSuchEntryError, NoSuchSegmentError
from .format import Entry
from .pool import AgentPool
from .protocol import Seen
from .quorum import lac_quorum
from .readpolicy import AdaptiveTimeout, ReplicaScores, SuspectList, speculative_order


class EntryReadError(DlctlError):
    """No replica of an entry's write set could serve it; ``failures`` maps node -> reason."""

    def __init__(self, log_id: int, segment_seq: int, entry_id: int, failures: dict[str, str]) -> None:
        detail = "; ".join(f"{node}: {reason}" for node, reason in failures.items()) or "no replica in the write set"
        super().__init__(
            f"entry {entry_id} of segment {segment_seq} (log id {log_id}) could not be read from any replica: {detail}",
            hint="check that the agents of the write set are up; a segment left under-replicated needs re-replication",
            details={"log_id": log_id, "segment": segment_seq, "entry": entry_id, "failures": dict(failures)},
        )
        self.failures = dict(failures)
        self.segment_seq = segment_seq
        self.entry_id = entry_id


@dataclass
class SpeculationStats:
    reads: int = 0
    speculative: int = 0  # extra requests sent because a replica was slower than the timeout
    replica_failures: int = 0


class ReplicaReader:
    """Speculative, region-aware reads of entries and LACs through an ``AgentPool``."""

    def __init__(
        self,
        pool: AgentPool,
        *,
        region: str | None = None,
        rack: str | None = None,
        timeout: AdaptiveTimeout | None = None,
        suspect_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        scores: ReplicaScores | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.pool = pool
        self.region, self.rack = region, rack
        self.timeout = timeout or AdaptiveTimeout()
        self.suspects = SuspectList(suspect_seconds)
        # What is seen of a replica is remembered about as long as a suspicion lasts (twice:
        # latency is worth keeping longer than one timeout); 0 demotes nothing.
        self.scores = scores or ReplicaScores(memory=2 * suspect_seconds)
        self.stats = SpeculationStats()
        self._clock = clock
        self._rng = rng or random.Random()

    def order(self, nodes: tuple[str, ...], lacking: frozenset[str] = frozenset(), *, salt: object = None) -> tuple[str, ...]:
        """``salt``: what is read (log id, segment, entry): equally good replicas are then
        ordered by a hash of it, the same for every reader (``readpolicy.speculative_order``)."""
        now = self._clock()
        return speculative_order(
            nodes, self.pool.nodes, self.region, self.rack, scores=self.scores, now=now, suspects=self.suspects.active(now), lacking=lacking,
            rng=self._rng, salt=salt,
        )

    async def _read_one(
        self, node: str, log_id: int, segment_seq: int, entry_id: int, seen: Seen | None = None, summary: bool = False, wire: WireStats | None = None,
    ) -> Entry:
        client = await self.pool.client(node)
        return await client.read_entry(log_id, segment_seq, entry_id, seen=seen, summary=summary, wire=wire)

    async def read(
        self, log_id: int, segment: SegmentRecord, entry_id: int, seen: Seen | None = None, summary: bool = False, wire: WireStats | None = None,
    ) -> Entry:
        """Entry ``entry_id`` of ``segment``, CRC-verified (by the client) and from its write set.
        ``seen``, ``summary``, ``wire``: see ``AgentClient.read_entry``."""
        self.stats.reads += 1
        write_set = segment.write_set(entry_id)
        order = iter(self.order(write_set, segment.lacking(entry_id) if segment.short else frozenset(), salt=(log_id, segment.seq, entry_id)))
        remaining = len(write_set)
        loop = asyncio.get_running_loop()
        running: dict[asyncio.Task[Entry], tuple[str, float]] = {}
        failures: dict[str, str] = {}

        def launch() -> None:
            nonlocal remaining
            node = next(order, None)
            if node is None:
                return
            remaining -= 1
            trim = {k: v for k, v in (("seen", seen), ("summary", summary), ("wire", wire)) if v}  # (subclasses read whole ranges)
            one = self._read_one(node, log_id, segment.seq, entry_id, **trim)
            task = asyncio.ensure_future(one)
            running[task] = (node, loop.time())

        launch()
        speculations = 0
        try:
            while running:
                wait = self.timeout.after(speculations) if remaining > 0 else None
                done, _ = await asyncio.wait(running, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    # Everyone asked so far is slower than the timeout: ask the next replica too,
                    # keep waiting for the others, and try the slow ones last for a while (their
                    # wait so far counts as a latency: at least that slow).
                    now = self._clock()
                    for node, started in running.values():
                        self.suspects.mark(node, now)
                        self.scores.observe(node, loop.time() - started, now)
                    self.stats.speculative += 1
                    speculations += 1
                    launch()
                    continue
                for task in done:
                    node, started = running.pop(task)
                    exc = task.exception()
                    if exc is None:
                        self.timeout.observe(loop.time() - started)
                        self.scores.observe(node, loop.time() - started, self._clock())
                        self.suspects.clear(node)
                        return task.result()
                    failures[node] = _describe(exc)
                    self.stats.replica_failures += 1
                    if isinstance(exc, (NoSuchEntryError, NoSuchSegmentError)):
                        # A real, prompt answer (a lagging or striped replica): its latency counts.
                        self.timeout.observe(loop.time() - started)
                    else:
                        self.suspects.mark(node, self._clock())
                        self.scores.fail(node, self._clock())
                    if not isinstance(exc, AgentError):
                        raise exc  # a bug, not a replica failure
                    launch()
        finally:
            for task in running:
                if task.done():
                    if not task.cancelled():
                        task.exception()  # answered too late to matter; retrieved so it is not logged
                else:
                    task.cancel()
        raise EntryReadError(log_id, segment.seq, entry_id, failures)

    async def read_lac(self, log_id: int, segment: SegmentRecord, *, quorum: bool = False, timeout: float = 10.0) -> int:
        """The highest LAC the replicas of the segment's ensembles report (-1: they hold no entry).

        ``quorum``: for freshness where it matters (``wait-drain`` targets, a stream's end in
        ``replication status``, ``log show``, a safe time's claim), as DistributedLog's quorum
        LAC read: the answer comes from at least E - A + 1 replicas of the current ensemble, so
        one of them stored the newest acknowledged entry and the LAC it carries (everything
        acknowledged before the writer sent it). ``AgentUnavailableError`` when too few answer
        within ``timeout``. Without it (tailing, lag estimates), best effort as below.

        Any replica's LAC is a lower bound of the true one (the writer piggybacks only what it
        confirmed), so the maximum is safe. Once one replica has answered, the others get one
        speculative timeout more: a hung replica must not hold the answer up. When none answers,
        ``AgentUnavailableError`` naming each: -1 would say the segment is empty, and a caller
        would take an unreachable tail for the log's end (a replication lag of 0, nothing at
        risk in a failover)."""
        if quorum:
            return await self._quorum_lac(log_id, segment, timeout)
        nodes = dict.fromkeys(n for change in segment.ensembles for n in change.nodes)

        async def one(node: str) -> int:
            client = await self.pool.client(node)
            return await client.read_lac(log_id, segment.seq)

        tasks = {asyncio.ensure_future(one(n)) for n in nodes}
        best = -1
        failures: list[str] = []
        try:
            pending = tasks
            answered = False
            while pending:
                done, pending = await asyncio.wait(
                    pending, timeout=self.timeout.current if answered else None, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break
                for task in done:
                    exc = task.exception()
                    if exc is None:
                        best = max(best, task.result())
                        answered = True
                    elif isinstance(exc, NoSuchSegmentError):
                        answered = True  # it never stored an entry of it: an answer, "nothing"
                    elif not isinstance(exc, AgentError):
                        raise exc
                    else:
                        failures.append(_describe(exc))
        finally:
            for task in tasks:
                task.cancel()
        if not answered:
            raise AgentUnavailableError(f"no replica of segment {segment.seq} of log {log_id} answered its LAC ({', '.join(nodes)}): " + "; ".join(failures))
        return best


    async def _quorum_lac(self, log_id: int, seg: SegmentRecord, timeout: float) -> int:
        """The highest LAC of the first E - A + 1 replicas of the segment's current ensemble to
        answer. (More answers could only raise it: a higher end is no truer, only harder to reach.)"""
        nodes = seg.ensembles[-1].nodes
        need = lac_quorum(len(nodes), seg.ack_quorum)

        async def one(node: str) -> int:
            client = await self.pool.client(node)
            try:
                return await client.read_lac(log_id, seg.seq)
            except NoSuchSegmentError:
                return -1  # a member no entry has reached yet: it holds nothing of the segment

        tasks = {asyncio.ensure_future(one(n)) for n in nodes}
        answers: list[int] = []
        failures: list[str] = []
        try:
            async with asyncio.timeout(timeout):
                for next_done in asyncio.as_completed(tasks):
                    try:
                        answers.append(await next_done)
                    except AgentError as exc:
                        failures.append(str(exc))
                    if len(answers) >= need:
                        return max(answers)
        except TimeoutError:
            pass
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        raise AgentUnavailableError(
            f"segment {seg.seq}: {len(answers)} of {len(nodes)} replicas told their LAC, {need} needed" + (f" ({'; '.join(failures)})" if failures else "")
        )


def _describe(exc: BaseException) -> str:
    kind = "unreachable" if isinstance(exc, AgentUnavailableError) else type(exc).__name__
    return f"{kind}: {exc}"
