"""The rules of a changing replication network that ``init-replication`` and ``replication
delete`` apply as they plan (issue 21, DESIGN.md §7): the network as the locations in reach know
it (their streams and merged network history), where a filter may sit
(``dlctl.replication.filters`` says why), retired locations, and the step that records a change
of the network at both its ends."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kazoo.exceptions import KazooException

from ..errors import DlctlError, NotFoundError, RefusedError
from ..plan import Step
from ..replication.history import HistoryStore, NetworkEvent, current_filters, ever_on_cycle, replay
from ..replication.history import merge as merge_history
from ..replication.store import StreamStore
from .session import ClusterSession


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
            streams = StreamStore(session.meta)
            for stream_id in streams.list_streams():
                try:
                    cfg = streams.get_config(stream_id).value
                except (NotFoundError, ValueError):
                    continue
                streams_now[(cfg.source_cluster, cfg.sink_cluster)] = cfg.filter
        except (KazooException, DlctlError):
            if session.cluster.name in ends:
                raise
    history = merge_history(*histories)
    return NetworkView({**current_filters(history), **streams_now}, history)


def check_filter_placement(view: NetworkView, src: str, snk: str) -> None:
    """A filter only on a connection that never was on a cycle, into a location it alone feeds
    and that passes nothing on (``dlctl.replication.filters`` says why). Refused otherwise,
    naming the reason."""
    edges, history = view.edges, view.history
    edge = (src, snk)
    if edge in ever_on_cycle(history, set(edges) | {edge}):
        raise RefusedError(
            f"--filter on {src} -> {snk}: that connection is or was on a cycle of the network; a filter there would lose records (Eventuate #314)",
            hint="see `dlctl replication topology`; filter a connection into a location that it alone feeds",
        )
    others = sorted({u for u, v in edges if v == snk and u != src} | {e.source for e in history if e.kind == "connect" and e.sink == snk and e.source != src})
    if others:
        raise RefusedError(
            f"--filter on {src} -> {snk}: {snk} is (or was) fed by {', '.join(others)} too; records filtered out on one path and delivered by another would arrive out of their origin's order and be dropped",
            hint="filter a connection into a location that it alone feeds",
        )
    onward = sorted({v for u, v in edges if u == snk} | {e.sink for e in history if e.kind == "connect" and e.source == snk})
    if onward:
        raise RefusedError(
            f"--filter on {src} -> {snk}: {snk} passes records on (to {', '.join(onward)}); the holes a filter leaves would reach them ahead of the records another path brings, which they would then drop",
            hint="filter a connection into a terminal location (one that replicates to nobody)",
        )


def refuse_next_to_a_filter(view: NetworkView, src: str, snk: str) -> None:
    """A new connection out of a location a filtered connection feeds (which would also be the
    only way to put that connection on a cycle), or into one: refused
    (``dlctl.replication.filters``)."""
    filtered = {e for e, f in view.edges.items() if f and e != (src, snk)}
    if not filtered:
        return
    feeding = sorted(u for u, v in filtered if v == src)
    if feeding:
        raise RefusedError(
            f"{src} receives over a filtered connection (from {', '.join(feeding)}): a location a filter feeds is terminal, it passes nothing on (the filter's holes would reach {snk} ahead of what other paths bring)",
            hint="remove the filter first (re-run init-replication for that stream without --filter)",
        )
    beside = sorted(u for u, v in filtered if v == snk)
    if beside:
        raise RefusedError(
            f"{snk} is fed by a filtered connection from {', '.join(beside)}: a second connection into it would deliver filtered-out records out of their origin's order",
            hint="remove the filter first (re-run init-replication for that stream without --filter), or delete that stream",
        )


def history_step(source: ClusterSession | None, sink: ClusterSession, event: NetworkEvent) -> Step:
    """Record a change of the network at both its ends (``dlctl.replication.history``); the
    sink agents pass it on along their streams."""
    ends = [s for s in (sink, source) if s is not None]

    def record() -> str:
        return "recorded" if any([HistoryStore(s.meta).record(event) for s in ends]) else "recorded already"

    return Step("record-history", f"{sink.cluster.name}/network", f"record in the network history of {' and '.join(s.cluster.name for s in ends)}: {event.kind} {event.source} -> {event.sink}", run=record)

