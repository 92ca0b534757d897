"""Settling a retired location (issue 21 item 7; pure logic): ``causal.settle``, the clocks that
apply it (the stream's ``SourceClock`` and the bootstrap copier's ``Clock``), the decision, and the
``settle`` network event."""

from __future__ import annotations

import json

import pytest

from dlctl.log.dlsn import DLSN
from dlctl.replication.causal import SourceClock, settle
from dlctl.replication.history import NetworkEvent, settled_floors
from dlctl.replication.origin import Origin, encode_vt
from dlctl.replication.settle import decide
from dlctl.spark.transform import Clock


def test_settle_drops_a_component_only_where_it_equals_the_settled_counter():
    assert settle({"r": 5, "a": 3}, {"r": 5}) == {"a": 3}
    assert settle({"r": 4, "a": 3}, {"r": 5}) == {"r": 4, "a": 3}  # part of r's events: kept
    assert settle({"r": 6, "a": 3}, {"r": 5}) == {"r": 6, "a": 3}  # more than settled: kept
    assert settle({"a": 3}, {"r": 5}) == {"a": 3}


def test_a_source_clock_omits_a_settled_location_from_derived_stamps_and_keeps_it_in_its_vector():
    clock = SourceClock("a", {"r": 1}, settled={"r": 2, "a": 9})  # its own location is never settled
    assert clock.stamp(None) == {"r": 1, "a": 1}  # holds 1 of r's 2 events: exact, kept
    replicated = Origin("r", DLSN(1, 0, 0), {"r": 2})
    assert clock.stamp(replicated) == {"r": 2}  # a replicated record keeps its own timestamp
    assert clock.stamp(None) == {"a": 2}
    assert clock.vv == {"r": 2, "a": 2}  # the version vector stays exact


def test_the_bootstrap_copier_clock_stamps_as_the_stream_clock_does():
    """The two implementations of derived stamps (the stream's and the bootstrap's fast template)
    agree, settled components included."""
    settled = {"r": 2, "q": 7}
    stream = SourceClock("b", {"q": 7}, settled=settled)
    copier = Clock("b", {"q": 7}, settled=settled)
    events: list[dict[str, int] | None] = [None, {"r": 1}, None, {"r": 2, "c": 4}, None, {"c": 5}, None]
    for vt in events:
        if vt is None:
            assert copier.stamp_local() == encode_vt(stream.stamp(None))
        else:
            stream.stamp(Origin("x", DLSN(1, 0, 0), vt))
            copier.stamp_replicated(vt)
    before, after = copier.local_template()
    assert before + b"%d" % (copier.vv["b"] + 1) + after == encode_vt(stream.stamp(None))
    assert b"r=" not in before + after and b"q=" not in before + after


def test_decide_settles_a_log_once_every_holder_holds_the_same_last_counter():
    verdict = decide("r", {"ledger": {"a": 3, "b": 3, "c": 0}, "other": {"a": 2, "b": 1}, "never": {"a": 0}})
    assert verdict.counters == {"ledger": 3}  # c holds none of r's events yet: it does not hold it back
    assert verdict.lagging == {"other": {"b": (1, 2)}}
    assert not verdict.agreed and verdict.describe() == "other: b holds 1 of 2"
    out = decide("r", {"ledger": {"a": 3}}, unreachable=("d",))
    assert not out.agreed and "d is out of reach" in out.describe()
    assert decide("r", {"ledger": {"a": 3, "b": 3}}).agreed


def test_a_settle_event_round_trips_and_gives_the_floors_per_log():
    event = NetworkEvent("settle", "r", counters=(("ledger", 3), ("orders", 9)))
    back = NetworkEvent.from_json(json.dumps(event.to_dict()).encode(), "here")
    assert back == event
    other = NetworkEvent("settle", "q", counters=(("ledger", 1),))
    assert settled_floors([back, other, NetworkEvent("retire", "r")], "ledger") == {"r": 3, "q": 1}
    assert settled_floors([back], "nothing") == {}


@pytest.mark.parametrize("counters", ['{"ledger": 0}', '["ledger", 3]', '{"ledger": "x"}'])
def test_a_malformed_settle_event_is_refused_naming_where(counters: str):
    raw = json.loads(json.dumps(NetworkEvent("settle", "r").to_dict()))
    raw["counters"] = json.loads(counters)
    with pytest.raises(ValueError, match="/dlctl/a/network/events/ev-1: malformed network event"):
        NetworkEvent.from_json(json.dumps(raw).encode(), "/dlctl/a/network/events/ev-1")
