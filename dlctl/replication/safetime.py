"""A stream's safe time (issue 23; YugabyteDB xCluster's consistency timestamp): the latest time
T such that every log of the stream has applied at the sink everything its source held at T.

Records carry no time of their own, so a worker learns times from its own measures of the
source: an **observation** ``(at, end)`` says that the source log held nothing after ``end`` at
time ``at``. ``at`` is read on the worker's clock (a sink agent's) *before* it asks where the
log ends; ``end`` is ``positions.quorum_end``: the segments as listed after ``at``, an
in-progress one up to the LAC of replicas that meet every ack quorum. So ``end`` covers every
record whose entry's LAC had been published (carried by an acknowledged entry) by ``at``.
Once the checkpoint's position (the first source position not yet applied; written only once
the sink acknowledged everything before it) reaches ``end``, ``at`` is safe. A log's safe time
is the newest such ``at`` and never goes back; the stream's is the minimum over its logs.

What it guarantees, for a log with safe time S: every record of the source log whose LAC was
published by S is at the sink; a record acknowledged to its writer at time t is covered once
t <= S - d, d the LAC publication delay (the writer sends the LAC with its next entry, or with
a control entry ``lac_delay`` after going idle, or it comes with the segment's closing, and that
entry must be acknowledged: milliseconds while the source is healthy). S is on the worker's
clock: against times read on other hosts, allow for the clocks' skew too. ("At the sink": as
the checkpoint counts it, so a record the stream's filter leaves out, or one an active-active
sink held already, counts as applied. ``dlctl dr recover`` of a sink that lost data is the one
thing that sets it back, to none.)

Pure computation; the worker (``dlctl.replication.worker``) feeds it and persists the value in
its checkpoint (``Checkpoint.safe_time``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..log.dlsn import DLSN

MAX_PENDING = 32  # observations kept while lagging (each a few bytes; thinned, never unbounded)


@dataclass(frozen=True)
class Observation:
    at: float  # Unix time, worker's clock, taken before the source was asked
    end: DLSN  # the source's end then: just after its last data record


class SafeTime:
    """One log's safe time: the observations not yet covered by the applied position, and the
    value so far (``floor``: what an earlier worker persisted)."""

    def __init__(self, floor: float = 0.0, *, limit: int = MAX_PENDING) -> None:
        self.value = floor
        self.limit = max(2, limit)
        self._pending: list[Observation] = []  # oldest first; each newer than ``value``

    @property
    def pending(self) -> tuple[Observation, ...]:
        return tuple(self._pending)

    def observe(self, at: float, end: DLSN) -> None:
        """The source held nothing at or after ``end`` at time ``at``."""
        if at <= self.value or (self._pending and at <= self._pending[-1].at):
            return  # nothing newer to learn (measurements overlap; the clock may step back)
        self._pending.append(Observation(at, end))
        if len(self._pending) > self.limit:
            # Lagging for long: keep the span and the newest, halve the resolution. Dropping an
            # observation only ever delays the safe time, never makes it claim too much.
            self._pending = self._pending[::-1][::2][::-1]

    def value_at(self, applied: DLSN) -> float:
        """The safe time once everything before ``applied`` is at the sink (a checkpoint's
        ``next``): the newest observation whose end is at or before it, else the value so far.
        Changes nothing: the value holds only once that checkpoint is written (``settle``)."""
        return max([self.value, *(o.at for o in self._pending if o.end <= applied)])

    def settle(self, written: float) -> None:
        """A checkpoint with safe time ``written`` was written: the floor from now on, and the
        observations it covers are no longer needed."""
        if written > self.value:
            self.value = written
            self._pending = [o for o in self._pending if o.at > written]


def stream_safe_time(per_log: Iterable[float | None]) -> float | None:
    """The stream's safe time from its logs' (None or 0: a log has none yet, so the stream has
    none). Monotonic while the stream's logs stay the same: a log joining later starts at none."""
    values = list(per_log)
    if not values or any(not v for v in values):
        return None
    return min(v for v in values if v)
