"""Exactly-once appends through write proxies: producer identity and the owner's dedup table.

A producer (``dlctl.log.producer``) has a 63-bit id, an epoch and, per request, a sequence
number starting at 1; it resends a failed request as it was (same records, same number). The
owner of the log (``dlagent.proxy``) keeps, per producer id, the epoch it knows, the last
sequence number it applied and the positions (DLSNs) of the last few requests, and decides
each request with ``ProducerTable.check``:

- unknown id, sequence 1: a new producer (or a new epoch of one): applied — unless the request
  is a *retry* (an earlier attempt failed ambiguously, so it may be in the log beyond what this
  owner knows): refused like the next case;
- unknown id, later sequence: refused (``UnknownProducerError``): its state expired or was lost
  with a failover, so a resend cannot be told from a new request;
- older epoch than known: refused (``ProducerFencedError``, zombie fencing);
- newer epoch: must start again at sequence 1 (then applied; the old epoch's state is dropped);
- same epoch, the next sequence: applied; a sequence among the last ``RETAINED`` applied: a
  duplicate, answered with the positions its records got the first time, nothing written; an
  older one: refused (``DuplicateTooOldError``); a gap: refused (``OutOfOrderSequenceError``).

Every refusal writes nothing, so a producer that gets one knows its request is not in the log
from that request (unless an earlier attempt of it was ambiguous).

State on disk: the first record of each request carries the header ``dl.p`` (id, epoch,
sequence, record count), so a new owner rebuilds the table from the log's tail
(``restore``) before it accepts anything (a request's records are consecutive in the log: the
writer queues a group without interleaving). Bounded: a producer idle for ``ttl`` seconds is
forgotten, and past ``max_producers`` the least recently seen one is; either way its next
request is refused as unknown, never duplicated.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import DuplicateTooOldError, OutOfOrderSequenceError, ProducerFencedError, UnknownProducerError

PRODUCER_HEADER = "dl.p"
_MARK = struct.Struct(">QIQI")  # producer id, epoch, sequence, records in the request
RETAINED = 8  # requests remembered per producer: more than a producer keeps in flight (4)
MAX_PRODUCER_ID = 2**63 - 1
MAX_EPOCH = 2**32 - 1


@dataclass(frozen=True, slots=True)
class ProducerMark:
    """Who sent a request: what ``dl.p`` says on its first record."""

    producer: int
    epoch: int
    seq: int
    count: int

    def encode(self) -> bytes:
        return _MARK.pack(self.producer, self.epoch, self.seq, self.count)


def producer_mark(headers: Mapping[str, bytes]) -> ProducerMark | None:
    """The request mark on a record, None when it has none; ``ValueError`` when malformed."""
    raw = headers.get(PRODUCER_HEADER)
    if raw is None:
        return None
    if len(raw) != _MARK.size:
        raise ValueError(f"malformed {PRODUCER_HEADER} header of {len(raw)} bytes (expected {_MARK.size})")
    mark = ProducerMark(*_MARK.unpack(raw))
    if mark.seq < 1 or mark.count < 1:
        raise ValueError(f"malformed {PRODUCER_HEADER} header: sequence {mark.seq}, count {mark.count}")
    return mark


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A request applied before: what its records got (DLSNs, or futures of them)."""

    results: list[Any]


@dataclass
class _Producer:
    epoch: int
    last_seq: int
    seen: float
    recent: OrderedDict[int, list[Any]] = field(default_factory=OrderedDict)


class ProducerTable:
    """One log's producers at its owner (pure bookkeeping: the caller supplies the clock)."""

    def __init__(self, ttl: float, max_producers: int = 100_000) -> None:
        if ttl <= 0 or max_producers < 1:
            raise ValueError("producer_id_ttl must be > 0 and max_producers >= 1")
        self.ttl = ttl
        self.max_producers = max_producers
        self._producers: OrderedDict[int, _Producer] = OrderedDict()  # least recently seen first
        self.counters = {"duplicates": 0, "fenced": 0, "unknown": 0, "out_of_order": 0, "too_old": 0, "expired": 0, "evicted": 0}

    def __len__(self) -> int:
        return len(self._producers)

    def check(self, producer: int, epoch: int, seq: int, now: float, *, retry: bool = False) -> Duplicate | None:
        """None: a new request, to be applied (then ``applied``); a ``Duplicate``: answer it
        with its first results; raises the refusal otherwise (see the module docstring).
        ``retry``: an earlier attempt of the request may have been written."""
        self.expire(now)
        state = self._producers.get(producer)
        who = f"producer {producer:#x} epoch {epoch}"
        if state is None:
            if seq == 1 and not retry:
                return None
            self.counters["unknown"] += 1
            raise UnknownProducerError(
                f"{who}: {'a retry of ' if retry else ''}request {seq} from a producer this owner holds no state for (idle longer than "
                f"producer_id_ttl = {self.ttl:g}s, evicted, or its requests are older than the log tail "
                "the owner read); nothing written"
            )
        if epoch < state.epoch:
            self.counters["fenced"] += 1
            raise ProducerFencedError(f"{who}: fenced by epoch {state.epoch} of the same producer id; nothing written")
        if epoch > state.epoch:
            if seq == 1:
                return None
            self.counters["out_of_order"] += 1
            raise OutOfOrderSequenceError(f"{who}: a new epoch must start at request 1, got {seq}; nothing written")
        if seq == state.last_seq + 1:
            return None
        if seq in state.recent:
            self.counters["duplicates"] += 1
            state.seen = now
            self._producers.move_to_end(producer)
            return Duplicate(state.recent[seq])
        if seq <= state.last_seq:
            self.counters["too_old"] += 1
            raise DuplicateTooOldError(
                f"{who}: request {seq} repeats one older than the last {RETAINED} this owner remembers "
                f"(it has applied up to {state.last_seq}): it is in the log, at positions no longer known; not written again"
            )
        self.counters["out_of_order"] += 1
        raise OutOfOrderSequenceError(f"{who}: request {seq} after {state.last_seq} (requests {state.last_seq + 1}..{seq - 1} never arrived); nothing written")

    def applied(self, producer: int, epoch: int, seq: int, results: list[Any], now: float) -> None:
        """Record that request ``seq`` (which ``check`` found new) was handed to the writer."""
        state = self._producers.get(producer)
        if state is None or epoch != state.epoch:
            state = self._producers[producer] = _Producer(epoch, 0, now)
        state.last_seq = seq
        state.seen = now
        state.recent[seq] = results
        while len(state.recent) > RETAINED:
            state.recent.popitem(last=False)
        self._producers.move_to_end(producer)
        while len(self._producers) > self.max_producers:
            self._producers.popitem(last=False)
            self.counters["evicted"] += 1

    def restore(self, mark: ProducerMark, results: list[Any], now: float) -> None:
        """A request found in the log (oldest first): as if applied, unless a newer epoch or
        sequence of its producer is known already."""
        state = self._producers.get(mark.producer)
        if state is not None and (mark.epoch < state.epoch or (mark.epoch == state.epoch and mark.seq <= state.last_seq)):
            return
        self.applied(mark.producer, mark.epoch, mark.seq, results, now)

    def expire(self, now: float) -> None:
        cutoff = now - self.ttl
        while self._producers:
            producer, state = next(iter(self._producers.items()))
            if state.seen >= cutoff:
                break
            del self._producers[producer]
            self.counters["expired"] += 1
