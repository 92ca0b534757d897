"""The causality filter and derived vector timestamps over simulated locations (pure logic).

Locations hold logs; local writes carry no timestamp (it is derived while reading, as the
worker does); streams read a source log in order, stamp, filter and append at the sink. For any
interleaving of writes and replication steps, once every stream has drained: every location
holds the same records, each once, every record's causal past comes before it, and the derived
timestamps order records exactly as their true causal histories do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from dlctl.log.dlsn import DLSN
from dlctl.replication.causal import (
    CausalityFilter,
    SourceClock,
    concurrent,
    dominated,
    merge,
)
from dlctl.replication.origin import Origin


@dataclass
class Entry:
    ident: tuple[str, int]
    origin: Origin | None  # None: written locally


@dataclass
class Location:
    name: str
    log: list[Entry] = field(default_factory=list)


@dataclass
class Stream:
    source: str
    sink: str
    position: int = 0
    clock: SourceClock | None = None


class Network:
    def __init__(self, names: list[str], edges: list[tuple[str, str]], shared_filter: bool) -> None:
        self.locations = {n: Location(n) for n in names}
        self.streams = [Stream(s, t, clock=SourceClock(s)) for s, t in edges]
        # One filter per location (what the log's owner would keep), or one per stream (enough
        # when a location has a single inbound stream).
        self.shared = {n: CausalityFilter(n) for n in names}
        self.filters = [self.shared[s.sink] if shared_filter else CausalityFilter(s.sink) for s in self.streams]
        self.past: dict[tuple[str, int], set] = {}
        self.counter = 0

    def write(self, loc: str) -> None:
        self.counter += 1
        ident = (loc, self.counter)
        log = self.locations[loc].log
        self.past[ident] = set().union(*({e.ident} | self.past[e.ident] for e in log)) if log else set()
        log.append(Entry(ident, None))

    def step(self, index: int) -> bool:
        stream = self.streams[index]
        source = self.locations[stream.source].log
        if stream.position >= len(source):
            return False
        entry = source[stream.position]
        stream.position += 1
        assert stream.clock is not None
        vt = stream.clock.stamp(entry.origin)
        origin_cluster = entry.origin.cluster if entry.origin else stream.source
        if self.filters[index].admit(origin_cluster, vt):
            dlsn = entry.origin.dlsn if entry.origin else DLSN(1, entry.ident[1], 0)
            self.locations[stream.sink].log.append(Entry(entry.ident, Origin(origin_cluster, dlsn, vt)))
        return True

    def drain(self) -> None:
        while any([self.step(i) for i in range(len(self.streams))]):
            pass

    def stamps(self, loc: str) -> list[tuple[tuple[str, int], dict[str, int]]]:
        clock = SourceClock(loc)
        return [(e.ident, clock.stamp(e.origin)) for e in self.locations[loc].log]


def judge(net: Network) -> None:
    sets = []
    all_stamps: dict[tuple[str, int], dict[str, int]] = {}
    for loc in net.locations:
        stamped = net.stamps(loc)
        idents = [i for i, _ in stamped]
        assert len(idents) == len(set(idents)), f"{loc} holds a record twice"
        sets.append(set(idents))
        seen: set = set()
        for ident, vt in stamped:
            assert net.past[ident] <= seen, f"{loc}: {ident} before part of its causal past"
            seen.add(ident)
            assert all_stamps.setdefault(ident, vt) == vt, f"{ident} stamped differently at {loc}"
    assert all(s == sets[0] for s in sets), "locations did not converge"
    assert sets[0] == set(net.past)
    idents = list(all_stamps)
    for x in idents:
        for y in idents:
            if x != y:
                assert (x in net.past[y]) == dominated(all_stamps[x], all_stamps[y]), f"{x} vs {y}: timestamps disagree with causality"


TOPOLOGIES = {
    "pair": (["a", "b"], [("a", "b"), ("b", "a")]),
    "cycle": (["a", "b", "c"], [("a", "b"), ("b", "c"), ("c", "a")]),
    "chain-back": (["a", "b", "c"], [("a", "b"), ("b", "a"), ("b", "c"), ("c", "b")]),
    "mesh": (["a", "b", "c"], [(s, t) for s in "abc" for t in "abc" if s != t]),
}
SINGLE_INBOUND = ("pair", "cycle")

operations = st.lists(st.tuples(st.sampled_from(["write", "step"]), st.integers(0, 11)), max_size=60)


def played(topology: str, ops: list[tuple[str, int]], *, shared_filter: bool) -> Network:
    """The network of ``topology`` after ``ops`` (a write at a location, or a step of one stream,
    each picked by its number) and then every stream drained."""
    names, edges = TOPOLOGIES[topology]
    net = Network(names, edges, shared_filter=shared_filter)
    for kind, n in ops:
        if kind == "write":
            net.write(names[n % len(names)])
        else:
            net.step(n % len(edges))
    net.drain()
    return net


@settings(max_examples=150, deadline=None)
@given(topology=st.sampled_from(sorted(TOPOLOGIES)), ops=operations)
def test_any_interleaving_converges_in_causal_order_with_one_filter_per_location(topology, ops):
    judge(played(topology, ops, shared_filter=True))


@settings(max_examples=150, deadline=None)
@given(topology=st.sampled_from(SINGLE_INBOUND), ops=operations)
def test_a_filter_per_stream_suffices_when_each_location_has_one_inbound_stream(topology, ops):
    judge(played(topology, ops, shared_filter=False))


def test_a_filter_per_stream_duplicates_when_two_streams_feed_one_location():
    # Why active-active meshes need the filter at the log's owner: a's record reaches c directly
    # and through b; two independent filters both admit it.
    names, edges = TOPOLOGIES["mesh"]
    net = Network(names, edges, shared_filter=False)
    net.write("a")
    net.step(edges.index(("a", "b")))
    net.step(edges.index(("a", "c")))
    net.step(edges.index(("b", "c")))
    assert [e.ident for e in net.locations["c"].log].count(("a", 1)) == 2


def test_own_records_coming_back_are_never_appended():
    f = CausalityFilter("a")
    assert not f.admit("a", {"a": 5})
    assert f.admit("b", {"b": 1, "a": 5})
    assert not f.admit("b", {"b": 1})  # seen
    assert f.vv == {"b": 1, "a": 5}


def test_vector_time_helpers():
    assert merge({"a": 1, "b": 4}, {"a": 3}) == {"a": 3, "b": 4}
    assert dominated({"a": 1}, {"a": 1, "b": 2}) and not dominated({"c": 1}, {"a": 1})
    assert dominated({"a": 9, "b": 1}, {"b": 1}, here="a")
    assert concurrent({"a": 1}, {"b": 1}) and not concurrent({"a": 1}, {"a": 2})
    clock = SourceClock("a")
    assert clock.stamp(None) == {"a": 1}
    assert clock.stamp(Origin("b", DLSN(1, 0, 0), {"b": 3})) == {"b": 3}
    assert clock.stamp(None) == {"a": 2, "b": 3}
