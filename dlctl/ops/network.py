"""``dlctl replication topology``: the replication network as the inventory's locations see it
(issue 21, DESIGN.md §7): the connections that exist now (every location's streams, as a sink),
which of them lie on a cycle now or ever did (from the merged network history,
``dlctl.replication.history``), their filters, and the history itself; and
``dlctl replication retire``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from kazoo.exceptions import KazooException

from ..errors import DlctlError, NotFoundError
from ..names import validate_name
from ..plan import Plan, Step
from ..replication import history as H
from ..replication import settle as S
from ..replication.network import current_version_vector
from ..replication.records import StreamConfig
from ..replication.store import StreamStore
from .streams import delete_plan
from ..session import ClusterSession


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def topology(sessions: Iterable[ClusterSession]) -> dict[str, Any]:
    """The network: ``edges`` (one per stream), ``history`` (merged, oldest first), the
    ``locations`` read, the ``retired`` ones, and those that could not be read
    (``unreachable``: what they know is missing from the picture), and per retired location the
    logs where it is ``settled`` (its last counter there: new timestamps no longer carry it)."""
    histories: list[list[H.NetworkEvent]] = []
    edges: dict[H.Edge, dict[str, Any]] = {}
    read, unreachable = [], []
    for session in sessions:
        name = session.cluster.name
        try:
            histories.append(H.HistoryStore(session.meta).events())
            streams = StreamStore(session.meta)
            for stream_id in streams.list_streams():
                try:
                    config = streams.get_config(stream_id).value
                    state = streams.get_state(stream_id).value.state.value
                except (NotFoundError, ValueError):
                    continue
                edges[(config.source_cluster, config.sink_cluster)] = {
                    "source": config.source_cluster,
                    "sink": config.sink_cluster,
                    "stream": stream_id,
                    "causal": config.bidirectional,
                    "filter": config.filter,
                    "state": state,
                    "logs": list(config.logs),
                }
            read.append(name)
        except (KazooException, DlctlError, ValueError) as exc:
            unreachable.append({"location": name, "error": str(exc) or type(exc).__name__})
    history = H.merge(*histories)
    now_on_cycle = H.on_cycle(edges)
    ever = H.ever_on_cycle(history, edges)
    _, _, retired = H.replay(history)
    rows = []
    for edge, row in sorted(edges.items()):
        rows.append({
            **row,
            "edge": f"{edge[0]} {'<->' if (edge[1], edge[0]) in edges else '->'} {edge[1]}",
            "on_cycle": edge in now_on_cycle,
            "ever_on_cycle": edge in ever,
        })
    locations = sorted({*read, *(e[0] for e in edges), *(e[1] for e in edges)} - retired)
    return {
        "locations": locations,
        "retired": sorted(retired),
        "settled": H.settled(history),
        "edges": rows,
        "history": [{**e.to_dict(), "time": _iso(e.at)} for e in history],
        "unreachable": unreachable,
    }


def graph_lines(view: dict[str, Any]) -> list[str]:
    """A text drawing of the network: one line per connection, a pair on one line; cycles and
    filters marked."""
    lines = []
    drawn: set[tuple[str, str]] = set()
    edges = {(r["source"], r["sink"]): r for r in view["edges"]}
    for (u, v), row in sorted(edges.items()):
        if (u, v) in drawn:
            continue
        back = edges.get((v, u))
        drawn |= {(u, v), (v, u)}
        marks = []
        if row["on_cycle"]:
            marks.append("cycle")
        elif row["ever_on_cycle"]:
            marks.append("was on a cycle")
        marks.append("causal" if row["causal"] else "one-way")
        for r in (row, back):
            if r and r["filter"]:
                marks.append(f"filter {r['source']}->{r['sink']}: {r['filter']}")
        arrow = "<==>" if back else "===>"
        lines.append(f"{u} {arrow} {v}   [{', '.join(marks)}]")
    lonely = [loc for loc in view["locations"] if not any(loc in e for e in edges)]
    lines += [f"{loc}   [no connection]" for loc in lonely]
    return lines


def retire_plan(location: str, sessions: Sequence[ClusterSession]) -> Plan:
    """``dlctl replication retire LOCATION``: delete every stream into or out of ``location``
    (each as ``replication delete`` would: workers stopped, pins and state removed), then record
    its retirement in the network history of every location in reach — from where it travels on
    along the streams. A retired location never comes back: ``init-replication`` refuses it."""
    validate_name("location", location)
    steps: list[Step] = []
    notes: list[str] = []
    # reachable location -> (session, the streams it is the sink of that touch ``location``: id -> source)
    found: dict[str, tuple[ClusterSession, dict[str, str]]] = {}
    known = any(s.cluster.name == location for s in sessions)
    histories: list[list[H.NetworkEvent]] = []  # of the locations in reach, read once
    for session in sessions:
        try:
            touching = {i: u for i, (u, v) in _stream_ends(session).items() if location in (u, v)}
            events = H.HistoryStore(session.meta).events()
            known = known or bool(touching) or any(location in (e.source, e.sink) for e in events)
        except (KazooException, DlctlError) as exc:
            notes.append(f"{session.cluster.name} is out of reach ({exc}): it learns of the retirement from its sources' history, or when retire is re-run")
            continue
        found[session.cluster.name] = (session, touching)
        histories.append(events)
    reachable = [session for session, _ in found.values()]
    for session, touching in found.values():
        for stream_id, source_name in touching.items():
            source = found[source_name][0] if source_name in found else None  # out of reach: its pins expire
            steps += list(delete_plan(session, source, stream_id).steps)
    if not known:
        raise NotFoundError(f"no location of the inventory knows a location named {location!r}", hint="see `dlctl replication topology`")
    history = H.merge(*histories)
    already = next((e for e in history if e.kind == "retire" and e.source == location), None)
    event = already or H.NetworkEvent("retire", location, note="dlctl replication retire")

    def record() -> str:
        done = [s.cluster.name for s in reachable if H.HistoryStore(s.meta).record(event)]
        return f"recorded at {', '.join(done)}" if done else "recorded already"

    steps.append(Step("record-retirement", f"{location}/network", f"record the retirement of {location} in the network history of {', '.join(s.cluster.name for s in reachable)}", run=record))
    # Every location that was ever the source of a connection or the sink of an unfiltered one
    # (a filtered feed ends at a terminal location: dlctl.replication.settle).
    _, _, retired = H.replay(history)
    members = {loc for e in history if e.kind == "connect" for loc in ((e.source, e.sink) if not e.filter else (e.source,))} - retired - {location}
    unreachable = tuple(sorted(members - set(found)))

    def settle() -> dict[str, Any]:
        # Read when the step runs: the streams touching ``location`` are gone by then.
        done = set(H.settled(H.merge(*(H.HistoryStore(s.meta).events() for s in reachable))).get(location, {}))
        verdict = S.decide(location, _held_events(reachable, location, skip=done), unreachable)
        result: dict[str, Any] = {"settled": sorted(done), "pending": verdict.describe()}
        if verdict.counters and not verdict.unreachable:
            mark = H.NetworkEvent("settle", location, counters=tuple(sorted(verdict.counters.items())), note="dlctl replication retire")
            for s in reachable:
                H.HistoryStore(s.meta).record(mark)
            result["settled"] = sorted(done | set(verdict.counters))
            result["counters"] = verdict.counters
        return result

    steps.append(Step(
        "settle", f"{location}/network",
        f"once every location holds {location}'s events in a log (the same last counter everywhere), record that in the history: "
        f"new records' timestamps stop carrying {location} there; re-run retire to settle the logs still behind",
        run=settle,
    ))
    notes.append(f"{location} may never join again under this name; its counters stay in the timestamps of the records it wrote and leave those of new records once settled")
    return Plan.of(f"replication retire {location}", steps, notes)


def _held_events(sessions: Sequence[ClusterSession], retired: str, skip: set[str]) -> dict[str, dict[str, int]]:
    """Log -> location -> the highest of ``retired``'s counters it holds there, for each location
    of ``sessions`` at an end of a stream carrying the log: its source, or the sink of an
    unfiltered one (``dlctl.replication.settle``; ``skip``: logs settled already, final)."""
    carries: dict[str, set[str]] = {}  # location -> logs
    for session in sessions:
        for config in _stream_configs(session).values():
            carries.setdefault(config.source_cluster, set()).update(config.logs)
            if not config.filter:
                carries.setdefault(config.sink_cluster, set()).update(config.logs)
    held: dict[str, dict[str, int]] = {}
    for session in sessions:
        for log in sorted(carries.get(session.cluster.name, set()) - skip):
            held.setdefault(log, {})[session.cluster.name] = current_version_vector(session.meta, log).get(retired, 0)
    return held


def _stream_configs(session: ClusterSession) -> dict[str, StreamConfig]:
    """Stream id -> config of the streams ``session``'s location is the sink of (a stream whose
    config is gone or unreadable is left out)."""
    streams = StreamStore(session.meta)
    out = {}
    for stream_id in streams.list_streams():
        try:
            out[stream_id] = streams.get_config(stream_id).value
        except (NotFoundError, ValueError):
            continue
    return out


def _stream_ends(session: ClusterSession) -> dict[str, tuple[str, str]]:
    """Stream id -> (source, sink) of the streams ``session``'s location is the sink of."""
    return {i: (c.source_cluster, c.sink_cluster) for i, c in _stream_configs(session).items()}
