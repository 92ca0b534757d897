"""Pure decisions of the log reader: which replica first, how long before a speculative read,
where a txid or DLSN starts, how much to read ahead. No I/O here, so every rule is unit-tested
on plain values; ``dlctl.log.reader`` and ``dlctl.log.speculative`` do the talking.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..meta.records import NO_TXID, SegmentRecord, SegmentState
from .dlsn import DLSN
from .records import Record

# -- replica order ------------------------------------------------------------------------------


def order_replicas(
    write_set: Sequence[str],
    nodes: Mapping[str, Mapping[str, object]],
    region: str | None = None,
    rack: str | None = None,
    suspects: Collection[str] = (),
    lacking: Collection[str] = (),
) -> tuple[str, ...]:
    """The write set in the order to try it: same rack, same region, other regions; then, in
    the same order, replicas that recently failed or were slow and agents that are not
    registered as available (probably down); last, members the segment's record says lack the
    entry (``SegmentRecord.lacking``: tried only when nothing else answers).

    Within a tier the write-set order is kept: write sets rotate with the entry id (round-robin
    striping), so equally close replicas share the first-choice load without randomness.
    """

    def tier(node: str) -> int:
        if node in lacking:
            return 6
        info = nodes.get(node)
        if info is None:
            return 5
        if region is None:
            near = 0
        elif info.get("region") != region:
            near = 2
        elif rack is not None and info.get("rack") == rack:
            near = 0
        else:
            near = 1 if rack is not None else 0
        return near + (3 if node in suspects else 0)

    return tuple(sorted(write_set, key=tier))  # sorted() is stable


class ReplicaScores:
    """What a reader has seen of each replica lately: a smoothed latency and a decaying count of
    failures (unreachable, timed out, a wrong answer). Observations older than ``memory``
    seconds are forgotten, so a replica avoided for being slow is tried again later (it would
    otherwise never be sampled again). ``now`` is passed in: a pure function of time."""

    def __init__(self, memory: float = 10.0, alpha: float = 0.3) -> None:
        self.memory, self.alpha = memory, alpha
        self._latency: dict[str, tuple[float, float]] = {}  # node -> (smoothed seconds, when last observed)
        self._failures: dict[str, tuple[float, float]] = {}  # node -> (decayed count, when last updated)

    def observe(self, node: str, seconds: float, now: float) -> None:
        """``node`` answered after ``seconds`` (or had not answered after that long: a lower
        bound counts too, it is what makes a slow replica look slow without any failure)."""
        if seconds < 0:
            return
        current = self._fresh_latency(node, now)
        smoothed = seconds if current is None else current + self.alpha * (seconds - current)
        self._latency[node] = (smoothed, now)

    def fail(self, node: str, now: float) -> None:
        self._failures[node] = (self.failures(node, now) + 1.0, now)

    def latency(self, node: str, now: float) -> float | None:
        return self._fresh_latency(node, now)

    def failures(self, node: str, now: float) -> float:
        """Failures, each weighing half as much every ``memory / 2`` seconds."""
        count, at = self._failures.get(node, (0.0, now))
        if not count or self.memory <= 0:
            return 0.0
        return count * 0.5 ** (max(0.0, now - at) / (self.memory / 2))

    def _fresh_latency(self, node: str, now: float) -> float | None:
        seen = self._latency.get(node)
        return seen[0] if seen is not None and now - seen[1] <= self.memory else None


SLOW_FACTOR = 3.0  # a replica this many times slower than the fastest one seen, ...
SLOW_MARGIN = 0.005  # ... and this many seconds slower, is asked after the others


def speculative_order(
    write_set: Sequence[str],
    nodes: Mapping[str, Mapping[str, object]],
    region: str | None = None,
    rack: str | None = None,
    *,
    scores: ReplicaScores | None = None,
    now: float = 0.0,
    suspects: Collection[str] = (),
    lacking: Collection[str] = (),
    rng: random.Random | None = None,
    salt: object = None,
) -> tuple[str, ...]:
    """The order in which a reader asks the replicas of an entry (DistributedLog's speculative
    reads): the first request to the closest replica (the fastest one seen lately among equally
    close ones, at random among equals), the second across a failure domain (another rack than
    the first), the third into another region, then the rest by distance. So the first few
    requests cross domains even when two replicas share the reader's rack, and one slow rack or
    region cannot hold every attempt up. When the first choice is not fast (over ``SLOW_MARGIN``)
    and a replica has not been heard from lately, that one is asked first instead, to learn its
    latency: a slow route is found out even when it answers within the speculative timeout.

    A replica that failed lately (``scores`` failures, or ``suspects``) or is much slower than
    the fastest one seen (``SLOW_FACTOR`` and ``SLOW_MARGIN``) is asked only after the others,
    nearest first: a slow route is left without waiting for a failure. Unregistered agents come
    next, and last the members the segment's record says lack the entry."""
    rng = rng or random
    registered = [n for n in write_set if n in nodes and n not in lacking]
    tail = [n for n in write_set if n not in nodes and n not in lacking] + [n for n in write_set if n in lacking]
    latency = {n: scores.latency(n, now) if scores else None for n in registered}
    known = [v for v in latency.values() if v is not None]
    fastest = min(known) if known else None

    def distance(node: str) -> int:
        info = nodes[node]
        if region is None:
            return 0
        if info.get("region") != region:
            return 2
        return 0 if rack is not None and info.get("rack") == rack else (1 if rack is not None else 0)

    def penalized(node: str) -> bool:
        if node in suspects or (scores is not None and scores.failures(node, now) >= 0.5):
            return True
        seen = latency[node]
        return seen is not None and fastest is not None and seen > SLOW_FACTOR * fastest and seen - fastest > SLOW_MARGIN

    # Ties broken at random, so that equals share the load: with a ``salt`` (the entry being
    # read) by a hash of it and the node, the same draw for every reader of that entry
    # (reproducible, and still spread over entries); else by ``rng``.
    jitter = {n: rng.random() if salt is None else _draw(salt, n) for n in registered}

    def key(node: str, *domain: bool) -> tuple:
        seen = latency[node]
        # Within a tier, a replica seen fast before one never seen, before one seen slow — but
        # only by a clear margin: small differences are noise, and the load should spread.
        speed = 0 if seen is None or fastest is None or seen <= 2 * fastest + SLOW_MARGIN else 1
        return (penalized(node), *domain, distance(node), speed, jitter[node])

    order: list[str] = []
    left = list(registered)
    if left:
        first = min(left, key=key)
        seen_first = latency[first]
        if seen_first is not None and seen_first > SLOW_MARGIN and not penalized(first):
            # The usual first choice is not fast, and some replica has not been heard from
            # lately: ask that one first, once, to learn whether it is faster (otherwise a slow
            # route that still answers within the speculative timeout would be kept for ever).
            unknown = [n for n in left if latency[n] is None and not penalized(n)]
            if unknown:
                first = min(unknown, key=key)
        order.append(first)
        left.remove(first)
        info = nodes[first]
        if left:  # the second: another rack (another region counts as another rack)
            other_rack = lambda n: (nodes[n].get("region"), nodes[n].get("rack")) == (info.get("region"), info.get("rack"))  # noqa: E731
            second = min(left, key=lambda n: key(n, other_rack(n)))
            order.append(second)
            left.remove(second)
            if left:  # the third: a region neither of them is in
                seen_regions = {info.get("region"), nodes[second].get("region")}
                third = min(left, key=lambda n: key(n, nodes[n].get("region") in seen_regions))
                order.append(third)
                left.remove(third)
        order += sorted(left, key=key)
    return tuple(order + tail)


def _draw(salt: object, node: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{salt}\0{node}".encode(), digest_size=8).digest(), "big")


def poll_targets(segment: SegmentRecord, lac: int) -> tuple[str, ...]:
    """The agents to long-poll for LAC > ``lac``: the write sets of entries lac+1 and lac+2.

    Entry lac+1's holders can piggyback it; but the LAC that confirms it travels on entry
    lac+2, whose write set differs from lac+1's in a striped ensemble (E > W). With E = W
    both are the whole ensemble.
    """
    out = dict.fromkeys(segment.write_set(lac + 1))
    out.update(dict.fromkeys(segment.write_set(lac + 2)))
    return tuple(out)


# -- speculative timeout ------------------------------------------------------------------------


class AdaptiveTimeout:
    """How long to wait for one replica before asking the next, from observed latencies.

    Jacobson's estimator (as TCP's RTO): smoothed latency plus ``k`` mean deviations, clamped
    to [floor, ceiling]. A deviation term rather than a mean alone keeps jittery replicas from
    triggering needless speculation; the floor keeps a fast loopback cluster from speculating
    on scheduler noise; the ceiling bounds what a hung replica costs.
    """

    def __init__(
        self,
        floor: float = 0.01,
        ceiling: float = 1.0,
        initial: float | None = None,
        *,
        alpha: float = 0.125,
        beta: float = 0.25,
        k: float = 4.0,
    ) -> None:
        if not 0 < floor <= ceiling:
            raise ValueError(f"speculative timeout needs 0 < floor <= ceiling (got {floor}, {ceiling})")
        self.floor, self.ceiling = floor, ceiling
        self._alpha, self._beta, self._k = alpha, beta, k
        self._initial = min(max(initial if initial is not None else 10 * floor, floor), ceiling)
        self._srtt: float | None = None
        self._rttvar = 0.0
        self.samples = 0

    def observe(self, seconds: float) -> None:
        """A replica answered after ``seconds`` (answers only: a request that never answered
        tells nothing about the next replica's latency)."""
        if seconds < 0:
            return
        self.samples += 1
        if self._srtt is None:
            self._srtt, self._rttvar = seconds, seconds / 2
            return
        self._rttvar += self._beta * (abs(self._srtt - seconds) - self._rttvar)
        self._srtt += self._alpha * (seconds - self._srtt)

    @property
    def current(self) -> float:
        if self._srtt is None:
            return self._initial
        return min(max(self._srtt + self._k * self._rttvar, self.floor), self.ceiling)

    def after(self, speculations: int, *, backoff: float = 2.0, cap: float | None = None) -> float:
        """The wait before the next speculative request when ``speculations`` were sent
        already (BookKeeper's speculative read policy): the adaptive timeout, times ``backoff``
        per request sent, up to ``cap`` (default: twice the ceiling). Each replica asked is one
        more request in flight: the next must wait longer before adding load to a slow cluster."""
        limit = cap if cap is not None else 2 * self.ceiling
        return min(self.current * backoff ** max(0, speculations), max(limit, self.current))


class SuspectList:
    """Replicas that failed or were slow recently: tried last until ``until`` passes.

    Demoting them makes a hung replica cost one speculative timeout per ``duration``, not one
    per entry. ``now`` is passed in so the rule stays a pure function of time.
    """

    def __init__(self, duration: float = 5.0) -> None:
        self.duration = duration
        self._until: dict[str, float] = {}

    def mark(self, node: str, now: float) -> None:
        self._until[node] = now + self.duration

    def clear(self, node: str) -> None:
        self._until.pop(node, None)

    def active(self, now: float) -> frozenset[str]:
        if not self._until:
            return frozenset()
        expired = [n for n, t in self._until.items() if t <= now]
        for node in expired:
            del self._until[node]
        return frozenset(self._until)


# -- positioning --------------------------------------------------------------------------------


def live_segments(segments: Iterable[SegmentRecord]) -> list[SegmentRecord]:
    """Segments a reader can visit, in sequence order (truncated ones hold nothing readable)."""
    return sorted((s for s in segments if s.state is not SegmentState.TRUNCATED), key=lambda s: s.seq)


def segment_index_for_txid(segments: Sequence[SegmentRecord], txid: int) -> int:
    """Index of the first live segment that may hold a record with txid >= ``txid``.

    ``segments`` are live segments in order. Binary search over closed segments' ``last_txid``
    (an in-progress segment, always last, has no last txid yet and is always a candidate).
    Returns ``len(segments)`` when every segment ends before ``txid``: start at the next one.
    Empty closed segments (last_txid -1) inherit the previous segment's last txid so that the
    searched sequence stays monotonic.
    """
    closed_end = len(segments)
    while closed_end > 0 and segments[closed_end - 1].state is SegmentState.INPROGRESS:
        closed_end -= 1
    running = NO_TXID
    keys: list[int] = []
    for seg in segments[:closed_end]:
        running = max(running, seg.last_txid)
        keys.append(running)
    return bisect.bisect_left(keys, txid)


def start_for_dlsn(segments: Sequence[SegmentRecord], dlsn: DLSN) -> DLSN:
    """Where a reader asked to start at ``dlsn`` really starts.

    The first live segment at or after the DLSN's; within a partially truncated segment never
    before ``min_active_entry``. A DLSN beyond every segment is kept as is (the reader waits for
    that segment to be written).
    """
    for seg in segments:
        if seg.seq < dlsn.segment_seq or seg.state is SegmentState.TRUNCATED:
            continue
        if seg.seq == dlsn.segment_seq and dlsn.entry_id >= seg.min_active_entry:
            return dlsn
        return DLSN(seg.seq, seg.min_active_entry, 0)
    return dlsn


def start_of_log(segments: Sequence[SegmentRecord], max_segment_seq: int) -> DLSN:
    """The first readable position: the first live segment's first active entry, or the
    segment the next writer will create when there is none."""
    for seg in segments:
        if seg.state is not SegmentState.TRUNCATED:
            return DLSN(seg.seq, seg.min_active_entry, 0)
    return DLSN(max_segment_seq + 1, 0, 0)


def entry_max_txid(records: Iterable[Record]) -> int | None:
    """The highest txid in an entry, control records included: a control record's txid is the
    last one the writer assigned, so it keeps the per-entry key monotonic for binary search."""
    best: int | None = None
    for record in records:
        if best is None or record.txid > best:
            best = record.txid
    return best


async def bisect_first(lo: int, hi: int, reaches: Callable[[int], Awaitable[bool]]) -> int:
    """The smallest x in [lo, hi] with ``await reaches(x)``, or hi + 1 if none; ``reaches`` must
    be monotonic (False...False True...True). Async because each probe reads an entry."""
    while lo <= hi:
        mid = (lo + hi) // 2
        if await reaches(mid):
            hi = mid - 1
        else:
            lo = mid + 1
    return lo


def readable_end(segment: SegmentRecord, lac: int) -> int:
    """The last entry a reader may read now: a closed segment's last entry (recovery fixed it),
    an in-progress segment's LAC (anything after it may still vanish in recovery)."""
    if segment.state is SegmentState.INPROGRESS:
        return lac
    if segment.state is SegmentState.TRUNCATED:
        return -1
    return segment.last_entry_id


# -- read-ahead ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadAhead:
    """Bounds of the prefetch buffer: entries fetched or in flight, and their bytes."""

    max_entries: int = 64
    max_bytes: int = 4 * 1024 * 1024
    adaptive: bool = True  # within these bounds, a ReadAheadWindow paced by the consumer

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.max_bytes < 1:
            raise ValueError(f"read-ahead bounds must be >= 1 (got {self.max_entries} entries, {self.max_bytes} bytes)")

    def allows(self, buffered: int, buffered_bytes: int, in_flight: int, size_estimate: int) -> bool:
        """May one more entry be requested? ``buffered`` counts entries in the buffer including
        the ``in_flight`` ones, whose size is estimated as the largest entry seen so far (0:
        none seen yet). An empty buffer always admits one entry, so an entry larger than the
        byte bound still gets read; with nothing known about sizes, one entry at a time."""
        if buffered == 0:
            return True
        if buffered >= self.max_entries:
            return False
        if size_estimate <= 0:
            return in_flight == 0 and buffered_bytes < self.max_bytes
        return buffered_bytes + (in_flight + 1) * size_estimate <= self.max_bytes


class ReadAheadWindow:
    """How many entries to keep requested ahead of the consumer, paced by what it does
    (DistributedLog's read-ahead adapts; a fixed bound either starves a fast reader catching up
    or buffers megabytes for a slow one), within ``ReadAhead``'s bounds.

    Each time the consumer takes an entry, ``taken(waited, ready)`` says whether it had to wait
    for that entry although it was already requested (the window was too small to cover the
    fetch latency at the consumer's pace: double it, up to ``maximum``), and how many entries
    behind it had arrived (more than half the window waiting: the consumer is the slow side,
    shrink by one, down to ``minimum``). Waiting for an entry that was not yet readable is
    tailing, not a shortage, and changes nothing: at the log's end no window reads further."""

    def __init__(self, maximum: int, *, minimum: int = 2, initial: int = 4) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"read-ahead window needs 1 <= minimum <= maximum (got {minimum}, {maximum})")
        self.minimum, self.maximum = minimum, maximum
        self.size = min(max(initial, minimum), maximum)
        self.grown = self.shrunk = 0

    def taken(self, *, waited: bool, ready: int) -> None:
        if waited:
            if self.size < self.maximum:
                self.size = min(self.size * 2, self.maximum)
                self.grown += 1
        elif ready > self.size // 2 and self.size > self.minimum:
            self.size -= 1
            self.shrunk += 1

