"""The bootstrap decision of ``init-replication`` for one log (DESIGN.md §7), as a pure function.

- an existing stream whose checkpoint the source still retains → resume from the checkpoint;
- a new stream, the source still holds the whole log and the sink has nothing of its own to
  lose → stream from the start;
- otherwise (the sink already has data, the source truncated what the sink needs, or the
  stream's pin was overridden) → a bootstrap copy is required first.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..log.dlsn import DLSN, INITIAL
from ..meta.records import SegmentRecord, SegmentState


class Decision(str, Enum):
    START = "start"
    RESUME = "resume"
    BOOTSTRAP = "bootstrap"


@dataclass(frozen=True)
class LogFacts:
    log: str
    source_first: DLSN | None  # first position the source still holds; None: nothing was ever deleted
    source_records: int
    sink_exists: bool
    sink_records: int
    checkpoint_next: DLSN | None = None  # the existing stream's checkpoint for this log
    needs_bootstrap: str = ""  # the stream's pin or checkpoint says data it needed was deleted


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
    if facts.source_first is not None:
        return Decision.BOOTSTRAP, f"the source no longer holds the whole log (it starts at {facts.source_first})"
    if facts.sink_records > 0 and (not bidirectional or facts.source_records > 0):
        return Decision.BOOTSTRAP, f"the sink log already holds {facts.sink_records} record(s)"
    if facts.source_records == 0:
        return Decision.START, "new stream; the source log is empty"
    return Decision.START, f"new stream; the source holds the whole log ({facts.source_records} record(s))"


def start_position(decision: Decision, facts: LogFacts) -> DLSN:
    if decision is Decision.RESUME and facts.checkpoint_next is not None:
        return facts.checkpoint_next
    return INITIAL
