"""Settling a retired location: its id leaves the timestamps of new records (issue 21 item 7).

``dlctl replication retire R`` takes R out of the network: its streams go and the history
records it, so no event of R enters the network any more. R's counter then stays in every
timestamp derived after one of R's events, for ever. Once every location that receives R's
events holds all of them, per log — the same last counter F everywhere — the network *settles*
R: a ``settle`` event carrying F per log is recorded in the history of every location in reach
(and travels on along the streams). From then on a derived timestamp whose past holds exactly F
of R's events omits R (``dlctl.replication.causal.settle``): the history says what it was.

Which locations must agree: every location in the network at an end of a stream carrying the
log — its source, or the sink of an unfiltered one (a filtered feed ends at a terminal location,
which relays nothing). Each holds either none of R's events there or the same last counter F.
One holding some but fewer than another, or one out of reach, leaves R unsettled in that log;
``retire`` run again settles it once they caught up. A location that holds none yet either
never receives them or receives them in R's order later (new connections wait for a source's
deleted past, ``dlctl.replication.network``); until it holds F its timestamps keep R, exactly.

Nothing depends on F being the true last counter for correctness: a timestamp omits R only where
its vector holds exactly F, so an omitted component always means F. F matters for how soon R
leaves new timestamps. What a location holds is read from its metadata
(``current_version_vector``: a lower bound, so it may settle later than it could; a location
that holds events of R no checkpoint shows — its stream in deleted — keeps R in the timestamps
that follow them).

This module decides (pure) and reads; ``dlctl.ops.network`` plans.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..meta.store import MetaStore
from .history import HistoryStore, NetworkEvent, settled_floors


@dataclass(frozen=True)
class Settlement:
    """What the network agrees on about retired location ``location``."""

    location: str
    counters: dict[str, int] = field(default_factory=dict)  # log -> R's last counter, held everywhere
    lagging: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)  # log -> location -> (holds, of)
    unreachable: tuple[str, ...] = ()  # locations that must agree but did not answer

    @property
    def agreed(self) -> bool:
        return not self.lagging and not self.unreachable

    def describe(self) -> str:
        parts = [f"{log}: {loc} holds {held} of {of}" for log, behind in sorted(self.lagging.items()) for loc, (held, of) in sorted(behind.items())]
        parts += [f"{loc} is out of reach" for loc in self.unreachable]
        return "; ".join(parts)


def decide(location: str, held: Mapping[str, Mapping[str, int]], unreachable: tuple[str, ...] = ()) -> Settlement:
    """``held``: log -> location that must agree -> the highest of ``location``'s counters it
    holds there. A log where no location holds any of its events has nothing to settle; a
    location holding none does not hold a log back (see the module docstring)."""
    counters: dict[str, int] = {}
    lagging: dict[str, dict[str, tuple[int, int]]] = {}
    for log, by_location in held.items():
        final = max(by_location.values(), default=0)
        if final <= 0:
            continue
        behind = {loc: (n, final) for loc, n in by_location.items() if 0 < n < final}
        if behind:
            lagging[log] = behind
        else:
            counters[log] = final
    return Settlement(location, counters, lagging, tuple(sorted(unreachable)))


class SettledFloors:
    """The settled retired locations as location ``meta.cluster``'s network history knows them,
    read incrementally: each look lists the history and reads only the events it has not seen
    (a stream worker looks every contact interval; the history only grows)."""

    def __init__(self, meta: MetaStore) -> None:
        self._history = HistoryStore(meta)
        self._seen: set[str] = set()
        self._settles: list[NetworkEvent] = []

    def of(self, log: str) -> dict[str, int]:
        """Retired location -> its settled last counter in ``log``."""
        new = set(self._history.names()) - self._seen
        if new:
            self._settles += [e for e in self._history.events(new) if e.kind == "settle"]
            self._seen |= new
        return settled_floors(self._settles, log)
