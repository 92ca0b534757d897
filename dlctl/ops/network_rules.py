"""The rules of a changing replication network that ``init-replication`` and ``replication
delete`` apply as they plan (issue 21, DESIGN.md §7): the network as the locations in reach know
it (their streams and merged network history), where a filter may sit
(``dlctl.replication.filters`` says why), retired locations, and the step that records a change
of the network at both its ends."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kazoo.exceptions import KazooException

from ..errors import DlctlError, RefusedError
from ..plan import Step
from ..replication.history import HistoryStore, NetworkEvent, current_filters, ever_on_cycle, replay
from ..replication.history import merge as merge_history
from ..replication.store import StreamStore
from ..session import ClusterSession


@dataclass(frozen=True)
class NetworkView:
    """The network as the locations in reach know it: every connection (their streams, and what
    their merged network history leaves) with its filter, and that history. Read once per plan;
    the rules below decide on it without reading again."""

    edges: dict[tuple[str, str], str]
    history: list[NetworkEvent]

    def retired_among(self, *names: str) -> list[str]:
        """Which of ``names`` the network history says were retired."""
        return sorted(replay(self.history)[2] & set(names))


def network_view(source: ClusterSession, sink: ClusterSession, peers: Iterable[ClusterSession] = ()) -> NetworkView:
    """Read the network from ``source``, ``sink`` (both must answer) and ``peers`` (one out of
    reach adds nothing; the history its streams passed on still counts)."""
    histories: list[list[NetworkEvent]] = []
    streams_now: dict[tuple[str, str], str] = {}
    ends = {source.cluster.name, sink.cluster.name}
    for session in (source, sink, *(p for p in peers if p.cluster.name not in ends)):
        try:
            histories.append(HistoryStore(session.meta).events())
            for cfg in StreamStore(session.meta).configs():
                streams_now[(cfg.source_cluster, cfg.sink_cluster)] = cfg.filter
        except (KazooException, DlctlError):
            if session.cluster.name in ends:
                raise
    history = merge_history(*histories)
    return NetworkView({**current_filters(history), **streams_now}, history)


def _fed_through(view: NetworkView, location: str) -> dict[str, set[str]]:
    """Every filter that fed ``location``, now or in the history, with the sources it came from."""
    out: dict[str, set[str]] = {}
    for (u, v), f in view.edges.items():
        if v == location and f:
            out.setdefault(f, set()).add(u)
    for e in view.history:
        if e.kind in ("connect", "filter") and e.sink == location and e.filter:
            out.setdefault(e.filter, set()).add(e.source)
    return out


def check_connection(view: NetworkView, src: str, snk: str, record_filter: str, *, causal: bool) -> None:
    """The filter rules for the connection ``src -> snk`` carrying ``record_filter`` ("" none),
    new or re-declared (``dlctl.replication.filters`` says why). Refused, naming the reason:

    - out of a location a filter feeds or fed (it is terminal: the filter's holes would reach
      ``snk`` ahead of what other paths bring);
    - into a location a filter feeds or fed, unless it carries that same filter: a wider filter
      or none would never bring the records held back before (the sink's owner takes an
      origin's earlier records for held once a later one arrived), a narrower one would leave
      holes beside a path without them. The same filter is #314's redundant filtered connection
      (two feeds at once) and fail-over (a second feed once the first is gone); every feed of such
      a location is causal (its causality filter skips what the location holds; a plain one-way
      stream makes its sink's logs replicas of its source, which take no other writer);
    - a filter on a connection that is or was on a cycle, into a location that passes records on
      (now or before), or beside an unfiltered feed of the same location."""
    fed = _fed_through(view, src)
    if fed:
        feeding = sorted({u for sources in fed.values() for u in sources})
        raise RefusedError(
            f"{src} receives (or received) over a filtered connection (from {', '.join(feeding)}): a location a filter feeds is terminal, it passes nothing on (the filter's holes would reach {snk} ahead of what other paths bring)",
            hint="replicate to that location only; take records onward from the filtered connection's source instead",
        )
    feeds = _fed_through(view, snk)
    other = sorted((f, sorted(sources)) for f, sources in feeds.items() if f != record_filter)
    if other:
        f, sources = other[0]
        carried = f"filter {record_filter}" if record_filter else "no filter"
        raise RefusedError(
            f"{snk} is (or was) fed by a filtered connection from {', '.join(sources)} (filter {f}); a connection into it with {carried} would never bring the records that filter held back (the sink takes an origin's earlier records for held once a later one arrived)",
            hint=f"a further feed of {snk} carries the same filter ({f}): --filter " + " --filter ".join(f.split(";")),
        )
    if not record_filter:
        return
    others = {u for sources in feeds.values() for u in sources} - {src}
    if others and not causal:
        raise RefusedError(
            f"--filter on {src} -> {snk}: {snk} is (or was) fed through its filter by {', '.join(sorted(others))}; a further feed of it must be causal, so that it skips what {snk} holds",
            hint="add --causal",
        )
    plain = sorted({e.source for e in view.history if e.kind in ("connect", "filter") and e.sink == snk and e.source in others and not e.causal})
    if plain:
        raise RefusedError(
            f"--filter on {src} -> {snk}: {snk} is (or was) fed by the one-way stream(s) from {', '.join(plain)}, whose sink logs are replicas of them and take no other writer; a location with several feeds has causal ones only",
            hint=f"set up the first feed of {snk} with --causal too",
        )
    edge = (src, snk)
    if edge in ever_on_cycle(view.history, set(view.edges) | {edge}):
        raise RefusedError(
            f"--filter on {src} -> {snk}: that connection is or was on a cycle of the network; a filter there would lose records (Eventuate #314)",
            hint="see `dlctl replication topology`; filter a connection into a location that passes nothing on",
        )
    unfiltered = sorted({u for (u, v), f in view.edges.items() if v == snk and u != src and not f})
    if unfiltered:
        raise RefusedError(
            f"--filter on {src} -> {snk}: {snk} is fed by {', '.join(unfiltered)} without a filter too; records filtered out on one path and delivered by another would arrive out of their origin's order and be dropped",
            hint="filter every feed of a location alike, or none",
        )
    onward = sorted({v for u, v in view.edges if u == snk} | {e.sink for e in view.history if e.kind == "connect" and e.source == snk})
    if onward:
        raise RefusedError(
            f"--filter on {src} -> {snk}: {snk} passes records on (to {', '.join(onward)}); the holes a filter leaves would reach them ahead of the records another path brings, which they would then drop",
            hint="filter a connection into a terminal location (one that replicates to nobody)",
        )


def history_step(source: ClusterSession | None, sink: ClusterSession, event: NetworkEvent) -> Step:
    """Record a change of the network at both its ends (``dlctl.replication.history``); the
    sink agents pass it on along their streams."""
    ends = [s for s in (sink, source) if s is not None]

    def record() -> str:
        return "recorded" if any([HistoryStore(s.meta).record(event) for s in ends]) else "recorded already"

    return Step("record-history", f"{sink.cluster.name}/network", f"record in the network history of {' and '.join(s.cluster.name for s in ends)}: {event.kind} {event.source} -> {event.sink}", run=record)

