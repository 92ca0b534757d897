"""The bootstrap decision of ``init-replication`` for one log (DESIGN.md §7), as a pure function.

- an existing stream whose checkpoint the source still retains → resume from the checkpoint;
- a new stream, the source still holds the whole log and the sink has nothing of its own to
  lose, or the stream is causal (the causality filter merges what the sink holds) → stream
  from the start;
- a new *causal* stream (active-active) whose source truncated, with a known deletion vector
  → stream from the source's first retained position once the sink holds everything the source
  deleted (``dlctl.replication.network``): at once when it does already, else it waits
  (``wait-for-causal-past``) for the sink's other peers to bring it. No copy: a copy would put the
  retained records ahead of the deleted ones at the sink, which other peers then drop;
- otherwise (the sink already has data, the source truncated what the sink needs, or the
  stream's pin was overridden) → a bootstrap copy is required first.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..log.dlsn import DLSN, INITIAL
from ..meta.records import SegmentRecord, SegmentState
from .causal import describe_missing, missing_past


class Decision(str, Enum):
    START = "start"
    RESUME = "resume"
    BOOTSTRAP = "bootstrap"
    WAIT = "wait-for-causal-past"  # a causal stream that starts once the sink has the source's deleted past


@dataclass(frozen=True)
class LogFacts:
    log: str
    source_first: DLSN | None  # first position the source still holds; None: nothing was ever deleted
    source_records: int
    sink_exists: bool
    sink_records: int
    checkpoint_next: DLSN | None = None  # the existing stream's checkpoint for this log
    needs_bootstrap: str = ""  # the stream's pin or checkpoint says data it needed was deleted
    sink: str = ""  # the sink location's name
    # Causal streams: the source's deletion vector (None: unknown, or not asked) and a lower
    # bound of the sink's current version vector (``dlctl.replication.network``).
    source_dvv: dict[str, int] | None = None
    sink_cvv: dict[str, int] | None = None


def first_retained(segments: list[SegmentRecord], max_segment_seq: int) -> DLSN | None:
    """The first position a log still holds, or None when it holds everything ever written."""
    live = [s for s in segments if s.state is not SegmentState.TRUNCATED]
    if not live:
        return None if max_segment_seq == 0 else DLSN(max_segment_seq + 1, 0, 0)
    first = live[0]
    if first.seq == 1 and first.min_active_entry == 0:
        return None
    return DLSN(first.seq, first.min_active_entry, 0)


def retained(position: DLSN, source_first: DLSN | None) -> bool:
    return source_first is None or position >= source_first


def decide(facts: LogFacts, *, bidirectional: bool = False) -> tuple[Decision, str]:
    if facts.checkpoint_next is not None:
        if facts.needs_bootstrap:
            return Decision.BOOTSTRAP, f"the stream needs a bootstrap: {facts.needs_bootstrap}"
        if retained(facts.checkpoint_next, facts.source_first):
            return Decision.RESUME, f"existing stream; its checkpoint {facts.checkpoint_next} is still retained at the source"
        return Decision.BOOTSTRAP, f"the source no longer holds checkpoint {facts.checkpoint_next} (it now starts at {facts.source_first})"
    if bidirectional and _deleted_past(facts):
        if facts.source_dvv is not None:
            missing = missing_past(facts.source_dvv, facts.sink_cvv or {}, facts.sink)
            if missing:
                return Decision.WAIT, (
                    f"new causal connection: the source deleted events the sink does not hold ({describe_missing(missing)}); "
                    f"it streams from {facts.source_first or INITIAL} once the sink has them from its other peers"
                )
            return Decision.START, f"new causal connection: everything the source deleted is in the sink's causal past; stream from {facts.source_first or INITIAL}"
    if facts.source_first is not None:
        return Decision.BOOTSTRAP, f"the source no longer holds the whole log (it starts at {facts.source_first})"
    if facts.sink_records > 0 and bidirectional and facts.source_records > 0:
        # A copy cannot go before the sink's own records; the causality filter skips what the
        # sink holds and merges the rest, as for any record of an active-active network.
        return Decision.START, f"new causal stream; the source holds the whole log ({facts.source_records} record(s)) and the causality filter skips what the sink's {facts.sink_records} hold"
    if facts.sink_records > 0 and not bidirectional:
        return Decision.BOOTSTRAP, f"the sink log already holds {facts.sink_records} record(s)"
    if facts.source_records == 0:
        return Decision.START, "new stream; the source log is empty"
    return Decision.START, f"new stream; the source holds the whole log ({facts.source_records} record(s))"


def start_position(decision: Decision, facts: LogFacts) -> DLSN:
    if decision is Decision.RESUME and facts.checkpoint_next is not None:
        return facts.checkpoint_next
    if decision in (Decision.START, Decision.WAIT) and facts.source_first is not None:
        return facts.source_first  # a causal stream past the source's deleted events
    return INITIAL


def _deleted_past(facts: LogFacts) -> bool:
    """The source deleted events (it truncated, or joined its network without its peers' past:
    a deletion vector with other locations' events)."""
    return facts.source_first is not None or any(n > 0 and o != facts.sink for o, n in (facts.source_dvv or {}).items())


def gated(decision: Decision, facts: LogFacts, *, bidirectional: bool) -> bool:
    """A new causal connection from a source that deleted events: its worker checks the
    location-addition rule before it reads anything."""
    return bidirectional and facts.checkpoint_next is None and _deleted_past(facts) and decision in (Decision.START, Decision.WAIT)
