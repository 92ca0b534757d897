"""Pure logic of disaster recovery (issue 11): access modes, clock bases, the unfiltered causality
filter, failover bookkeeping in checkpoints and stream states, divergence accounting."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlctl.log.dlsn import DLSN, INITIAL
from dlctl.log.errors import ERRORS_BY_STATUS, ReadOnlyLogError, error_for_status
from dlctl.log.reader import ReadRecord
from dlctl.replication import dr
from dlctl.meta.access import AccessMode, LogAccess, replication_role
from dlctl.replication.causal import CausalityFilter, SourceClock, dominated
from dlctl.replication.clock import floor_at, parse_base
from dlctl.replication.origin import Origin
from dlctl.replication.records import Checkpoint, StreamState, StreamStatus

ROLES = ["application", replication_role("a-to-b"), replication_role("c-to-b")]


@pytest.mark.parametrize(
    "access, admitted",
    [
        (LogAccess(), set(ROLES)),
        (LogAccess(AccessMode.REPLICA, "a-to-b"), {replication_role("a-to-b")}),
        (LogAccess(AccessMode.READ_ONLY), set()),
    ],
)
def test_each_access_mode_admits_exactly_its_writers(access: LogAccess, admitted: set[str]):
    assert {r for r in ROLES if access.admits(r)} == admitted


def test_access_record_round_trips_and_rejects_garbage_naming_the_znode():
    access = LogAccess(AccessMode.REPLICA, "a-to-b", 7, "sink of a-to-b", 12.5)
    assert LogAccess.from_json(access.to_json(), "x") == access
    with pytest.raises(ValueError, match="/dlctl/b/logs/l/access"):
        LogAccess.from_json(b'{"mode": "sometimes"}', "/dlctl/b/logs/l/access")


def test_read_only_refusal_has_its_own_wire_status_that_clients_decode():
    assert ReadOnlyLogError.status == 12 and ERRORS_BY_STATUS[12] is ReadOnlyLogError
    assert isinstance(error_for_status(12, "log 'x' is read-only"), ReadOnlyLogError)
    assert len(set(ERRORS_BY_STATUS)) == len(ERRORS_BY_STATUS.values())


def test_unfiltered_filter_takes_back_the_sinks_own_records_it_no_longer_holds():
    normal = CausalityFilter("x", {})
    assert not normal.admit("x", {"x": 3})  # normally: its own records are always in its log
    recovering = CausalityFilter("x", {}, unfiltered=True)
    assert recovering.admit("x", {"x": 3})
    assert not recovering.admit("x", {"x": 2})  # in its causal past now (x:3 came back)
    assert not recovering.admit("x", {"x": 3})  # the same record from a second peer
    assert recovering.admit("p", {"x": 3, "p": 1})


@given(st.lists(st.dictionaries(st.sampled_from("xyz"), st.integers(0, 5), max_size=3), max_size=30))
def test_unfiltered_filter_admits_a_record_iff_the_log_vector_does_not_dominate_it(vts):
    f = CausalityFilter("x", {}, unfiltered=True)
    vv: dict[str, int] = {}
    for vt in vts:
        expected = not dominated(vt, vv)
        assert f.admit("y", vt) == expected
        if expected:
            vv = {k: max(vv.get(k, 0), vt.get(k, 0)) for k in set(vv) | set(vt)}


def test_clock_base_raises_local_counters_from_its_position_on_and_keeps_earlier_stamps():
    base = ((DLSN(5, 0, 0), {"x": 100}),)
    clock = SourceClock("x", base=base, start=INITIAL)
    assert clock.stamp(None, DLSN(1, 0, 0)) == {"x": 1}  # before the base: as it always was
    assert clock.stamp(None, DLSN(5, 0, 0)) == {"x": 101}
    assert clock.stamp(Origin("p", DLSN(1, 0, 0), {"p": 4, "x": 7}), DLSN(5, 0, 1)) == {"p": 4, "x": 7}
    assert clock.stamp(None, DLSN(5, 1, 0)) == {"x": 102, "p": 4}
    # A reader starting past the base's position starts from it at once.
    assert SourceClock("x", {"x": 3}, base=base, start=DLSN(6, 0, 0)).vv == {"x": 100}
    assert SourceClock("x", {"x": 300}, base=base, start=DLSN(6, 0, 0)).vv == {"x": 300}


def test_clock_base_parses_steps_in_position_order_and_refuses_negative_counters():
    raw = json.dumps({"steps": [{"from": "9/0/0", "vv": {"x": 9}}, {"from": "2/0/0", "vv": {"x": 2}}]}).encode()
    steps = parse_base(raw, "w")
    assert [s[0] for s in steps] == [DLSN(2, 0, 0), DLSN(9, 0, 0)]
    assert floor_at(steps, DLSN(3, 0, 0)) == {"x": 2} and floor_at(steps, DLSN(9, 0, 0)) == {"x": 9}
    with pytest.raises(ValueError, match="w: malformed clock base"):
        parse_base(b'{"steps": [{"from": "1/0/0", "vv": {"x": -1}}]}', "w")


def test_checkpoint_keeps_the_measured_source_end_and_estimates_what_is_unapplied():
    cp = Checkpoint("l", next=DLSN(1, 10, 0), processed_records=100, source_end=DLSN(1, 40, 0), source_end_records=60, source_end_processed=90)
    assert Checkpoint.from_json(cp.to_json(), "w") == cp
    assert cp.unapplied_estimate() == 50  # 60 behind when 90 were processed; 10 more since
    assert Checkpoint("l").unapplied_estimate() is None
    assert Checkpoint("l", next=DLSN(2, 0, 0), source_end=DLSN(1, 40, 0), source_end_records=5).unapplied_estimate() == 0


def test_failed_over_state_keeps_its_epoch_and_details():
    status = StreamStatus(StreamState.FAILED_OVER, 1.0, "failover to b", 4, {"at_risk": {"l": {"from": "1/2/0"}}})
    assert StreamStatus.from_json(status.to_json(), "w") == status
    assert StreamStatus.from_json(b'{"state": "running"}', "w").epoch == 0  # written before issue 11


def _record(dlsn: DLSN, origin: Origin | None = None, payload: bytes = b"p") -> ReadRecord:
    return ReadRecord(dlsn, 0, payload, headers=origin.headers() if origin else {})


def test_identity_is_the_origin_or_the_local_position_and_missing_counts_duplicates():
    local = _record(DLSN(1, 0, 0))
    relayed = _record(DLSN(1, 0, 1), Origin("a", DLSN(3, 4, 5), {"a": 1}))
    assert dr.identity(local, "b") == ("b", DLSN(1, 0, 0))
    assert dr.identity(relayed, "b") == ("a", DLSN(3, 4, 5))
    expected = [("a", DLSN(1, 0, i)) for i in range(4)]
    lost, dups = dr.missing(expected, expected[:2] + expected[1:2] + expected[3:])
    assert lost == [("a", DLSN(1, 0, 2))] and dups == 1


def test_divergence_report_shows_count_range_and_a_sample():
    div = dr.Divergence("l", "a", DLSN(1, 5, 0), [_record(DLSN(1, 5 + i, 0), payload=f"r{i}".encode()) for i in range(8)])
    out = div.to_dict(sample=3)
    assert (out["records"], out["first"], out["last"], out["from"]) == (8, "1/5/0", "1/12/0", "1/5/0")
    assert [s["payload"] for s in out["sample"]] == ["r0", "r1", "r2"]


# -- a truncated source's clock (dr recover when a peer deleted the beginning of a log) ------------


def _history(kinds: list[bool], steps=()) -> list[tuple[DLSN, Origin | None, dict]]:
    """A source log ``p`` of one record per entry in segment 1 (True: local, False: replicated
    from ``q``), each with the timestamp a stream from the beginning gives it."""
    clock = SourceClock("p", base=steps, start=INITIAL)
    out = []
    for i, local in enumerate(kinds):
        dlsn = DLSN(1 + i // 10, i % 10, 0)
        # A replicated record has seen all (or half) of p's records so far: never more.
        seen = clock.vv.get("p", 0) // (1 + i % 2)
        origin = None if local else Origin("q", DLSN(1, i, 0), {"q": i + 1, "p": seen})
        out.append((dlsn, origin, clock.stamp(origin, dlsn)))
    return out


@given(kinds=st.lists(st.booleans(), min_size=2, max_size=40), data=st.data())
def test_the_clock_at_a_truncation_point_gives_every_later_local_record_the_counter_it_always_had(kinds, data):
    history = _history(kinds)
    cut = data.draw(st.integers(0, len(history) - 1))  # the first record the source still holds
    anchor = data.draw(st.integers(cut, len(history)))  # a checkpoint at or after it
    anchor_vv: dict = {}
    probe = SourceClock("p")
    for dlsn, origin, _ in history[:anchor]:
        probe.stamp(origin, dlsn)
    anchor_vv = dict(probe.vv)
    start = history[cut][0]
    vv = dr.clock_at("p", anchor_vv, [(d, o) for d, o, _ in history[cut:anchor]], start=start)
    clock = SourceClock("p", vv, start=start)  # a stream (or the bootstrap) reading from the cut
    for dlsn, origin, vt in history[cut:]:
        got = clock.stamp(origin, dlsn)
        if origin is None:
            assert got["p"] == vt["p"], "a local record keeps its counter"


def test_the_clock_at_a_truncation_point_honours_clock_steps_and_refuses_when_they_hide_the_count():
    steps = ((DLSN(2, 0, 0), {"p": 100}),)
    history = _history([True] * 15, steps)
    assert [vt["p"] for _, _, vt in history] == list(range(1, 11)) + list(range(101, 106))
    before_anchor = SourceClock("p", base=steps, start=INITIAL)
    for dlsn, origin, _ in history[:13]:
        before_anchor.stamp(origin, dlsn)
    # Cut after the step: counting back is exact.
    assert dr.clock_at("p", before_anchor.vv, [(d, o) for d, o, _ in history[11:13]], steps=steps, start=history[11][0]) == {"p": 101}
    # Cut before the step: the floor hides how many records came before it.
    with pytest.raises(ValueError, match="clock step"):
        dr.clock_at("p", before_anchor.vv, [(d, o) for d, o, _ in history[3:13]], steps=steps, start=history[3][0])
    with pytest.raises(ValueError, match="local records lie between"):
        dr.clock_at("p", {"p": 1}, [(d, o) for d, o, _ in history[0:5]], start=history[0][0])
