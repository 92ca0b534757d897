"""Vector time over locations and the causality filter (Eventuate's model, DESIGN.md §7).

A location's log is read in order. A replicated record carries its vector timestamp (``dl.vt``);
a record written locally carries none, and its timestamp is *derived* while reading, the same
way by every reader: the version vector of the log before it, with the location's own counter
plus one. So local writers need no clock and no coordination, and every stream reading a log
sees the same timestamps. The version vector of a log is the pointwise maximum of the
timestamps of its records; a checkpoint stores it with the read position so a reader can
resume mid-log.

A sink appends a replicated record only if it is not in the sink's causal past: skip when the
record's timestamp is ≤ the sink log's version vector (the sink's own component is ignored:
every event of the sink's own location is already in its log). Because each location reads its
sources in their log order and their logs are linear extensions of the causal order, so is the
sink's; records never loop.

**Retired locations leave the timestamps.** Once every location holds a retired location R's
events in a log up to its last counter F (the network's ``settle`` event,
``dlctl.replication.settle``), a derived timestamp whose past holds exactly F of R's events
omits R (``settle``): the omitted component is F, known from the history, so nothing is lost,
and new records stop carrying R. Version vectors keep R (one entry per log, not per record):
they stay exact, so deletion and version vectors still compare as before. No decision here
reads R off a local record's timestamp: a replicated record is held or not by its origin's own
counter (the owner's origin dedup), and dropping a component only makes ``dominated`` answer
"held" for records the origin counter says are held.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..log.dlsn import INITIAL
from .origin import Origin


def merge(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for loc, count in b.items():
        if count > out.get(loc, 0):
            out[loc] = count
    return out


def dominated(vt: Mapping[str, int], vv: Mapping[str, int], here: str | None = None) -> bool:
    """vt ≤ vv pointwise, ignoring location ``here``."""
    return all(count <= vv.get(loc, 0) for loc, count in vt.items() if loc != here)


def settle(vt: Mapping[str, int], floors: Mapping[str, int]) -> dict[str, int]:
    """``vt`` without each retired location's component that equals its settled last counter
    (``floors``: retired location -> last counter; a component below or above it stays)."""
    return {loc: n for loc, n in vt.items() if floors.get(loc) != n}


def concurrent(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    return not dominated(a, b) and not dominated(b, a)


def missing_past(dvv: Mapping[str, int], cvv: Mapping[str, int], here: str) -> dict[str, tuple[int, int]]:
    """The events a source deleted (its deletion vector ``dvv``) that location ``here`` does
    not hold (its version vector ``cvv``): origin -> (first, last) counter; empty when
    ``dvv`` <= ``cvv``. ``here``'s own events are never missing at ``here``
    (``dlctl.replication.network``)."""
    return {o: (cvv.get(o, 0) + 1, n) for o, n in sorted(dvv.items()) if o != here and n > cvv.get(o, 0)}


def describe_missing(missing: Mapping[str, Sequence[int]]) -> str:
    """``a 1..2, b 7..7``: per origin, the counters of its events that are missing."""
    return ", ".join(f"{o} {r[0]}..{r[1]}" for o, r in sorted(missing.items()))


class SourceClock:
    """Timestamps of the records of location ``location``'s log, read in order from a point
    whose version vector is ``vv``.

    ``base``: the log's clock base steps (``dlctl.replication.clock``), (from, vector) pairs:
    from each step's position on, the clock counts from at least its vector. Steps at or
    before ``start`` (where reading starts) apply at once; later ones when a record at or
    after them is stamped (``stamp(..., dlsn=)``).

    ``settled``: retired location -> its settled last counter in this log: derived timestamps
    omit those components where they equal it (``settle``); ``vv`` keeps them."""

    def __init__(self, location: str, vv: Mapping[str, int] | None = None, *, base: Sequence[tuple[Any, Mapping[str, int]]] = (), start: Any = None, settled: Mapping[str, int] | None = None) -> None:
        self.location = location
        self.vv: dict[str, int] = dict(vv or {})
        self.settled: dict[str, int] = {k: v for k, v in (settled or {}).items() if k != location}
        self._steps = sorted(base, key=lambda s: s[0])
        start = start if start is not None else INITIAL
        while self._steps and self._steps[0][0] <= start:
            self.vv = merge(self.vv, self._steps.pop(0)[1])

    def stamp(self, origin: Origin | None, dlsn: Any = None) -> dict[str, int]:
        """The record's timestamp (its own for replicated records, derived for local ones);
        advances the version vector past it."""
        while self._steps and dlsn is not None and self._steps[0][0] <= dlsn:
            self.vv = merge(self.vv, self._steps.pop(0)[1])
        if origin is not None:
            vt = origin.vt
            self.vv = merge(self.vv, vt)
            return vt
        vt = dict(self.vv)
        vt[self.location] = vt.get(self.location, 0) + 1
        self.vv = vt
        return settle(vt, self.settled) if self.settled else vt

    def local_template(self, before: Any) -> tuple[bytes, bytes] | None:
        """For a loop that stamps local records itself (``dlctl.replication.fastpath``): (head,
        tail) such that the encoded timestamp ``stamp(None)`` gives a local record read before
        position ``before`` is ``head + b"%d" % n + tail``, n the own counter it reaches — or
        None when stamping there is more than counting: a clock step applies before ``before``,
        or settled components are left out. The loop hands the counter back (``advance_local``)."""
        if self.settled or (self._steps and self._steps[0][0] < before):
            return None
        lower = [f"{loc}={n}" for loc, n in sorted(self.vv.items()) if n > 0 and loc < self.location]
        upper = [f"{loc}={n}" for loc, n in sorted(self.vv.items()) if n > 0 and loc > self.location]
        return ",".join([*lower, f"{self.location}="]).encode(), "".join("," + part for part in upper).encode()

    def advance_local(self, counter: int) -> None:
        """Local records were stamped up to own counter ``counter`` (``local_template``)."""
        self.vv = {**self.vv, self.location: counter}

    @property
    def local_counter(self) -> int:
        return self.vv.get(self.location, 0)


class CausalityFilter:
    """The sink side: which replicated records are new to location ``here``.

    ``unfiltered`` (disaster recovery: ``here`` lost records, some of them its own): the
    sink's own component counts and records that originated here are admitted too, so a
    record is skipped only when the sink log's version vector dominates it over all
    components. ``vv`` must then be the vector of what the sink log really holds."""

    def __init__(self, here: str, vv: Mapping[str, int] | None = None, *, unfiltered: bool = False) -> None:
        self.here = here
        self.vv: dict[str, int] = dict(vv or {})
        self.unfiltered = unfiltered

    def admit(self, origin_cluster: str, vt: Mapping[str, int]) -> bool:
        """True (and the record is now counted in the version vector) when it must be appended."""
        if self.unfiltered:
            if dominated(vt, self.vv):
                return False
        elif origin_cluster == self.here or dominated(vt, self.vv, self.here):
            return False
        self.vv = merge(self.vv, vt)
        return True

    def seen(self, vt: Mapping[str, int]) -> None:
        """A record already in the sink log (found when resuming)."""
        self.vv = merge(self.vv, vt)
