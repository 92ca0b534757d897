"""The location-addition rule of a changing replication network (Eventuate #314, DESIGN.md §7).

A causal stream X -> Y (active-active: ``--bidirectional``, ``--causal``) over a *new*
connection may start only when everything X deleted is in Y's causal past already:

    DVV(X) <= CVV(Y)    (pointwise, ignoring Y's own component)

``DVV(X)``, X's *deletion vector* for a log, is the least upper bound of the timestamps of the
records X truncated: exactly the truncation base X records before it truncates a replicated log
(``dlctl.replication.clock``: the version vector a reader from the beginning holds at the
truncation point). ``CVV(Y)``, Y's *current version vector*, is what Y's log holds; it is read
here from what Y's own metadata guarantees is in that log: every stream into Y checkpoints the
source's version vector before its ``next`` position (every record before it was appended at Y,
or skipped because Y held it already), and the vector of what it appended; Y's truncation
base is the vector of records Y held. Checkpoints lag the log by a checkpoint interval,
so this CVV is a lower bound: the rule may wait a little longer than needed, never less.

Why the rule: replicated records reach an owner in their origin's order, and the owner (and the
causality filter) treat an origin's event numbered at or below the highest one held as held
already. Were X to deliver its retained events to Y while events X deleted were still on their
way to Y through other peers, Y would drop those for ever (issue 21's anomaly). While the rule
does not hold the stream waits, visibly (``waiting-for-causal-past``, naming the missing origins
and counter ranges), and starts by itself once Y received them from its other peers.

This module decides; the stream worker waits and ``init-replication`` plans with it.
"""

from __future__ import annotations

from ..errors import NotFoundError
from ..meta.store import MetaStore
from .causal import merge, missing_past
from .clock import ClockStore
from .decision import first_retained
from .store import StreamStore


def deletion_vector(source: MetaStore, log: str) -> dict[str, int] | None:
    """DVV of ``log`` at ``source``: ``{}`` when it never truncated; None when it truncated
    without recording a base (a log nobody replicated then: what it deleted is unknown)."""
    base = ClockStore(source).truncation_base(log)
    if base is not None:
        return {o: n for o, n in base[1].items() if n > 0}
    return None if _truncated(source, log) else {}


def _truncated(meta: MetaStore, log: str) -> bool:
    try:
        segments = [s.value for s in meta.segments(log)]
        max_seq = meta.get_log(log).value.max_segment_seq
    except NotFoundError:
        return False
    return first_retained(segments, max_seq) is not None


def current_version_vector(sink: MetaStore, log: str, *, exclude: str | None = None) -> dict[str, int]:
    """A lower bound of CVV of ``log`` at ``sink`` from the sink's metadata (see the module
    docstring): every stream into the sink carrying ``log`` (but ``exclude``, and streams still
    waiting themselves), and the log's own truncation base. (Not its raising clock steps:
    ``dr recover`` raises a location's own counter past events it may no longer hold.)"""
    streams = StreamStore(sink)
    out: dict[str, int] = {}
    for stream_id in streams.list_streams():
        if stream_id == exclude:
            continue
        try:
            cp = streams.get_checkpoint(stream_id, log).value
        except NotFoundError:
            continue
        if cp.gated:
            continue
        try:
            filtered = bool(streams.get_config(stream_id).value.filter)
        except (NotFoundError, ValueError):
            continue
        # A filtered stream skipped records it read: only what it appended is held.
        out = merge(out, cp.sink_vv) if filtered else merge(merge(out, cp.source_vv), cp.sink_vv)
    base = ClockStore(sink).truncation_base(log)
    if base is not None:
        out = merge(out, base[1])
    return {o: n for o, n in out.items() if n > 0}


def causal_gate(source: MetaStore, sink: MetaStore, log: str, *, stream_id: str, own_events: bool = False) -> tuple[dict[str, tuple[int, int]] | None, dict[str, int]]:
    """(what sink location ``sink.cluster`` still lacks of what ``source`` deleted from ``log``
    — empty: stream ``stream_id`` may start; None: the source's deletion vector is unknown —,
    the sink's current version vector it was judged against). ``own_events``: the sink lost
    data (``dr recover``: an unfiltered stream), so its own events count too."""
    cvv = current_version_vector(sink, log, exclude=stream_id)
    dvv = deletion_vector(source, log)
    return (None if dvv is None else missing_past(dvv, cvv, "" if own_events else sink.cluster)), cvv
