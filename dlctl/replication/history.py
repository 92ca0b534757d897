"""The replication network's history and its shape (issue 21, DESIGN.md §7, Eventuate #314).

Every change of a connection — a stream set up (``connect``), deleted (``disconnect``), its
filter changed (``filter``), a location retired (``retire``), a retired location's events held
everywhere (``settle``) — is one ``NetworkEvent``, recorded
in the ZooKeeper of every location it involves (``/dlctl/<cluster>/network/events``). An event
keeps its id wherever it is recorded, so the histories of several locations merge into one
(``merge``) without counting an event twice; whoever reads more locations sees more of the
network. The rules that depend on the past of the network (a filter never sits on a connection
that ever was on a cycle) read it from here.

The shape of a network is pure graph work over (source, sink) edges: ``on_cycle`` (an edge
u -> v lies on a directed cycle iff u is reachable from v) and ``ever_on_cycle`` (every edge
that lay on a cycle at some point of the history, replayed event by event).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from kazoo.exceptions import NodeExistsError, NoNodeError

from ..errors import CorruptMetadata
from ..meta import paths
from ..meta.store import MetaStore
from ..names import validate_name

KINDS = ("connect", "disconnect", "filter", "retire", "settle")

Edge = tuple[str, str]  # (source location, sink location)


@dataclass(frozen=True)
class NetworkEvent:
    kind: str
    source: str  # for ``retire`` and ``settle``: the retired location (sink empty)
    sink: str = ""
    stream: str = ""
    causal: bool = False  # the connection applies the causality filter (active-active)
    logs: tuple[str, ...] = ()
    filter: str = ""  # the connection's filter after the event ("" none)
    note: str = ""
    # ``settle``: (log, the retired location's last counter in it) — every location holds its
    # events up to there (``dlctl.replication.settle``)
    counters: tuple[tuple[str, int], ...] = ()
    at: float = field(default_factory=time.time)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"network event kind must be one of {', '.join(KINDS)} (got {self.kind!r})")
        validate_name("location", self.source)
        if self.sink:
            validate_name("location", self.sink)
        if any(n < 1 for _, n in self.counters):
            raise ValueError(f"a settled counter must be positive (got {dict(self.counters)})")

    @property
    def edge(self) -> Edge:
        return (self.source, self.sink)

    def name(self) -> str:
        """Its znode name: time order, then the id (so the same event recorded twice is one node)."""
        return f"ev-{int(self.at * 1000):015d}-{self.id}"

    def to_dict(self) -> dict:
        raw = asdict(self)
        raw["logs"] = list(self.logs)
        raw["counters"] = dict(self.counters)
        return raw

    @classmethod
    def from_json(cls, data: bytes, where: str) -> NetworkEvent:
        try:
            raw = json.loads(data)
            raw["logs"] = tuple(raw.get("logs", ()))
            raw["counters"] = tuple(sorted((str(k), int(v)) for k, v in raw.get("counters", {}).items()))
            return cls(**raw)
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise CorruptMetadata(f"{where}: malformed network event: {exc}") from None


class HistoryStore:
    """The network events one location recorded."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self.cluster = meta.cluster

    def record(self, event: NetworkEvent) -> bool:
        """Record ``event`` here (False: it was recorded already — idempotent)."""
        body = json.dumps(event.to_dict(), sort_keys=True).encode()
        try:
            self.meta.client.create(paths.network_event(self.cluster, event.name()), body, acl=self.meta.acl, makepath=True)
        except NodeExistsError:
            return False
        return True

    def names(self) -> list[str]:
        try:
            return sorted(self.meta.client.get_children(paths.network_events(self.cluster)))
        except NoNodeError:
            return []

    def events(self, names: Iterable[str] | None = None) -> list[NetworkEvent]:
        """The events recorded here (or those of ``names``), oldest first."""
        where = paths.network_events(self.cluster)
        names = self.names() if names is None else sorted(names)
        out = []
        for name in names:
            try:
                data, _ = self.meta.client.get(f"{where}/{name}")
            except NoNodeError:
                continue
            out.append(NetworkEvent.from_json(data, f"{where}/{name}"))
        return out


def merge(*histories: Iterable[NetworkEvent]) -> list[NetworkEvent]:
    """One history from several locations' records: each event once, in time order."""
    seen: dict[str, NetworkEvent] = {}
    for history in histories:
        for event in history:
            seen.setdefault(event.id, event)
    return sorted(seen.values(), key=lambda e: (e.at, e.id))


def on_cycle(edges: Iterable[Edge]) -> set[Edge]:
    """The edges that lie on a directed cycle."""
    edges = set(edges)
    succ: dict[str, set[str]] = {}
    for u, v in edges:
        succ.setdefault(u, set()).add(v)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            here = todo.pop()
            if here == goal:
                return True
            for nxt in succ.get(here, ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    return {(u, v) for u, v in edges if reaches(v, u)}


def _replay(history: Iterable[NetworkEvent]) -> tuple[dict[Edge, str], set[Edge], set[str]]:
    edges: dict[Edge, str] = {}  # each connection the history leaves, with its filter ("" none)
    ever: set[Edge] = set()
    retired: set[str] = set()
    for event in history:
        if event.kind in ("connect", "filter"):
            edges[event.edge] = event.filter
        elif event.kind == "disconnect":
            edges.pop(event.edge, None)
        elif event.kind == "retire":
            retired.add(event.source)
            edges = {e: f for e, f in edges.items() if event.source not in e}
        ever |= on_cycle(edges)
    return edges, ever, retired


def settled(history: Iterable[NetworkEvent]) -> dict[str, dict[str, int]]:
    """Retired location -> log -> its last counter there, for every log where the network agreed
    every location holds its events (``settle`` events)."""
    out: dict[str, dict[str, int]] = {}
    for event in history:
        if event.kind == "settle":
            logs = out.setdefault(event.source, {})
            for name, count in event.counters:
                logs[name] = max(logs.get(name, 0), count)
    return out


def settled_floors(history: Iterable[NetworkEvent], log: str) -> dict[str, int]:
    """Retired location -> its settled last counter in ``log``."""
    return {location: logs[log] for location, logs in settled(history).items() if log in logs}


def current_filters(history: Iterable[NetworkEvent]) -> dict[Edge, str]:
    """The connections the history leaves, each with its filter ("" none)."""
    return _replay(history)[0]


def replay(history: Iterable[NetworkEvent]) -> tuple[set[Edge], set[Edge], set[str]]:
    """(the edges the history leaves, every edge that lay on a cycle at some point, the retired
    locations)."""
    edges, ever, retired = _replay(history)
    return set(edges), ever, retired


def ever_on_cycle(history: Iterable[NetworkEvent], also: Iterable[Edge] = ()) -> set[Edge]:
    """Every edge that is or ever was on a cycle: replayed from the history, plus the cycles of
    the edges ``also`` (the streams that exist now, in case part of their history is unknown)."""
    _, ever, _ = replay(history)
    return ever | on_cycle(also)


def sync(source: MetaStore, sink: MetaStore) -> int:
    """Copy to ``sink`` the network events ``source`` recorded that ``sink`` has not (how the
    history reaches every location: along the streams, from each source to its sinks). Only
    the names are compared (an event's node name holds its id); only missing events are read.
    The number copied."""
    theirs, mine = HistoryStore(source), HistoryStore(sink)
    missing = sorted(set(theirs.names()) - set(mine.names()))
    return sum(1 for event in theirs.events(missing) if mine.record(event))
