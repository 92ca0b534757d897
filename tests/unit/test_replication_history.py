"""The network history's graph work and replication filters (issue 21; pure logic)."""

from __future__ import annotations

import pytest

from dlctl.replication.filters import RecordFilter
from dlctl.replication.history import NetworkEvent, current_filters, ever_on_cycle, merge, on_cycle, replay


def ev(kind: str, source: str, sink: str = "", at: float = 0.0, **kw) -> NetworkEvent:
    return NetworkEvent(kind, source, sink, at=at, **kw)


def test_an_edge_is_on_a_cycle_exactly_when_its_sink_reaches_its_source():
    assert on_cycle({("a", "b"), ("b", "a")}) == {("a", "b"), ("b", "a")}
    assert on_cycle({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == {("a", "b"), ("b", "c"), ("c", "a")}
    assert on_cycle({("a", "b"), ("a", "c"), ("c", "b")}) == set()  # two paths, no cycle


def test_a_cycle_that_existed_once_is_remembered_after_it_was_broken():
    history = [
        ev("connect", "a", "b", 1), ev("connect", "b", "c", 2), ev("connect", "c", "a", 3),
        ev("disconnect", "c", "a", 4), ev("connect", "c", "d", 5),
    ]
    edges, ever, retired = replay(history)
    assert edges == {("a", "b"), ("b", "c"), ("c", "d")} and not on_cycle(edges)
    assert ever == {("a", "b"), ("b", "c"), ("c", "a")} and retired == set()
    # Edges that never coexisted do not make a cycle.
    assert ever_on_cycle([ev("connect", "a", "b", 1), ev("disconnect", "a", "b", 2), ev("connect", "b", "a", 3)]) == set()
    # The streams that exist now count even when their history is unknown.
    assert ever_on_cycle([], {("x", "y"), ("y", "x")}) == {("x", "y"), ("y", "x")}


def test_histories_of_several_locations_merge_each_event_once_in_time_order():
    one, two, three = ev("connect", "a", "b", 2), ev("connect", "b", "c", 1), ev("filter", "a", "b", 3, filter="key=x*")
    assert merge([one, three], [two, one]) == [two, one, three]
    assert current_filters([two, one, three]) == {("b", "c"): "", ("a", "b"): "key=x*"}
    assert current_filters([one, ev("retire", "b", at=4)]) == {}
    _, _, retired = replay([one, ev("retire", "b", at=4)])
    assert retired == {"b"}


def test_a_network_event_survives_its_json_and_refuses_nonsense():
    event = ev("connect", "a", "b", 1.5, stream="a-to-b", causal=True, logs=("l1",), filter="key=eu-*")
    import json

    assert NetworkEvent.from_json(json.dumps(event.to_dict()).encode(), "x") == event
    with pytest.raises(ValueError, match="kind"):
        ev("teleport", "a", "b")
    with pytest.raises(ValueError, match="location"):
        ev("connect", "../etc", "b")
    with pytest.raises(ValueError, match="where: malformed"):
        NetworkEvent.from_json(b"{", "where")


def test_a_filter_admits_a_record_only_when_every_clause_matches():
    f = RecordFilter.parse(["key=eu-*", "header.tier=gold"])
    assert f.canonical() == "key=eu-*;header.tier=gold"
    assert f.admits(b"eu-1", {"tier": b"gold"})
    assert not f.admits(b"us-1", {"tier": b"gold"})
    assert not f.admits(b"eu-1", {"tier": b"silver"}) and not f.admits(b"eu-1", {})
    assert RecordFilter.parse("key=*").admits(b"\xff\xfe", None)  # undecodable keys still match '*'
    assert RecordFilter.parse(f.canonical()) == f


@pytest.mark.parametrize("bad", ["", "key", "key=", "value=x", "header.=x", "header.a/b=x"])
def test_a_malformed_filter_is_refused_naming_the_clause(bad):
    with pytest.raises(ValueError):
        RecordFilter.parse(bad)
