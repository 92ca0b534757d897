"""The decisions of ``dr recover`` (``dlctl.ops.dr.recover_decide`` and, for a peer that deleted
the beginning of a log, ``dlctl.ops.dr.truncated``): pure functions over snapshots, tested on
plain values — no ZooKeeper, no agents."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlctl.errors import RefusedError
from dlctl.log.dlsn import DLSN, INITIAL
from dlctl.meta.access import AccessMode
from dlctl.ops.dr import recover_decide as rd
from dlctl.ops.dr.cold import ColdCover
from dlctl.ops.dr.recover_facts import ClockEvidence, IncomingFacts, Outgoing, Truncation
from dlctl.ops.dr.truncated import Incoming, SourceStart, decide, gap_note, saved_anchor
from dlctl.replication.records import Checkpoint, StreamConfig, StreamState

T = DLSN(5, 0, 0)  # where a truncating peer's log starts now


def into_x(source: str, logs: tuple[str, ...] = ("l",), *, bidirectional: bool = False) -> StreamConfig:
    return StreamConfig(f"{source}-to-x", source, "zk", "x", logs, bidirectional=bidirectional)


def out_of_x(peer: str, logs: tuple[str, ...] = ("l",), state: StreamState = StreamState.RUNNING) -> Outgoing:
    return Outgoing(peer, StreamConfig(f"x-to-{peer}", "x", "zk", peer, logs), state)


def cold_cover() -> ColdCover:
    store = SimpleNamespace(describe=lambda: "fs:/cold/p")
    return ColdCover(store, [SimpleNamespace(segment=SimpleNamespace(seq=1)), SimpleNamespace(segment=SimpleNamespace(seq=4))])  # type: ignore[arg-type]


def truncated(cover: ColdCover | None = None, *, cold_store: bool = False, why: str = "") -> Truncation:
    return Truncation(T, cover, why, cold_store)


def facts(*, holds: dict | None = None, truncations: dict | None = None, starts: dict | None = None, saved: dict | None = None) -> IncomingFacts:
    return IncomingFacts(holds or {}, saved or {}, truncations or {}, starts or {})


# -- what the recovery covers ----------------------------------------------------------------------


def test_recover_refuses_a_location_no_stream_flows_into():
    with pytest.raises(RefusedError, match="no stream flows into 'x'"):
        rd.refuse_nothing_to_recover("x", [])
    rd.refuse_nothing_to_recover("x", [(into_x("p"), StreamState.RUNNING)])


def test_recover_covers_every_log_a_stream_into_or_out_of_the_location_carries():
    incoming = [(into_x("p", ("l", "m")), StreamState.RUNNING)]
    assert rd.recovered_logs(incoming, [out_of_x("q", ("n", "l"))]) == ["l", "m", "n"]


def test_only_streams_running_before_the_recovery_are_resumed_named_where_their_state_lives():
    incoming = [(into_x("p"), StreamState.RUNNING), (into_x("q"), StreamState.PAUSED)]
    outgoing = [out_of_x("p"), out_of_x("q", state=StreamState.PAUSED)]
    assert rd.running_before("x", incoming, outgoing) == ["p-to-x@x", "x-to-p@p"]


def test_a_rebuilt_log_returns_to_the_mode_it_had_before_the_loss_not_its_read_only_rebuild():
    assert rd.modes_before({"l": "read-only", "m": "replica"}, {"l": "read-write"}) == {"l": "read-write", "m": "replica"}


# -- metadata: lost segments, the clock, the peers' progress ----------------------------------------


def test_everything_from_the_first_unserved_segment_on_is_dropped_newest_first():
    assert rd.segments_to_drop([1, 2, 3, 4], None) == []
    assert rd.segments_to_drop([1, 2, 3, 4], 1) == [4, 3, 2]
    assert rd.segments_to_drop([1, 2, 3, 4], 0) == [4, 3, 2, 1]


def test_the_clock_rises_above_every_counter_of_x_anyone_saw_from_the_next_segment():
    evidence = ClockEvidence(seen=({"x": 7, "p": 40}, {"x": 12}, {"p": 99}), held={"x": 9}, max_segment_seq=6)
    assert rd.raised_clock("x", evidence) == (12, DLSN(7, 0, 0))  # p's counters are not x's
    assert rd.raised_clock("x", ClockEvidence(seen=(), held={"x": 3}, max_segment_seq=0)) == (3, DLSN(1, 0, 0))


@given(st.lists(st.dictionaries(st.sampled_from("xp"), st.integers(0, 100), max_size=2), max_size=8), st.integers(0, 100))
def test_the_raised_clock_is_never_below_a_counter_of_x_seen_or_held(seen, held):
    floor, _ = rd.raised_clock("x", ClockEvidence(tuple(seen), {"x": held}, 1))
    assert floor >= held and all(floor >= vv.get("x", 0) for vv in seen)
    assert floor in {held, *(vv.get("x", 0) for vv in seen)}


def test_the_peers_restart_reading_x_at_its_end_or_after_the_segments_an_emptied_log_had():
    assert rd.outgoing_start(DLSN(3, 2, 1), DLSN(2, 0, 0)) == DLSN(3, 2, 1)
    assert rd.outgoing_start(None, DLSN(8, 0, 0)) == DLSN(8, 0, 0)  # not INITIAL: that reads as "truncated"
    assert rd.outgoing_start(None, None) == INITIAL


def test_resetting_a_peers_progress_clears_its_bootstrap_wait_and_error():
    cp = Checkpoint("l", next=DLSN(9, 0, 0), source_vv={"x": 50}, needs_bootstrap="why", last_error="boom", processed_records=4)
    assert rd.reset_outgoing(cp, DLSN(3, 0, 0), {"x": 20}) == Checkpoint("l", next=DLSN(3, 0, 0), source_vv={"x": 20}, processed_records=4)


def test_access_modes_return_to_what_they_were_a_replica_of_its_one_way_stream_a_copy_target_stays_frozen():
    incoming = [(into_x("p", ("l", "m"), bidirectional=True), StreamState.RUNNING), (into_x("q", ("m",)), StreamState.RUNNING)]
    current = {"l": AccessMode.READ_ONLY, "m": AccessMode.READ_ONLY, "n": AccessMode.READ_WRITE, "o": AccessMode.READ_ONLY}
    saved = {"l": "read-write", "m": "replica", "n": "read-write"}
    assert rd.mode_restores(["l", "m", "n", "o"], saved, current, incoming) == [
        ("l", AccessMode.READ_WRITE, ""),
        ("m", AccessMode.REPLICA, "q-to-x"),  # the one-way stream, not the active-active one
        ("o", AccessMode.READ_WRITE, ""),  # nothing recorded: read-write
    ]
    assert [name for name, _, _ in rd.mode_restores(["l", "m"], saved, current, incoming, skip={"m"})] == ["l"]


# -- the streams into X ------------------------------------------------------------------------------


def test_a_stream_from_a_source_that_holds_everything_restarts_from_the_start():
    [(_, item)] = rd.decide_incoming("x", [(into_x("p"), StreamState.RUNNING)], facts(holds={"l": 0}))
    assert (item.mode, item.first, item.vv, item.gap) == ("start", INITIAL, {}, None)


def test_into_an_empty_log_one_stream_copies_what_a_truncating_source_retains_the_others_stream():
    incoming = [(into_x("p"), StreamState.RUNNING), (into_x("q"), StreamState.RUNNING)]
    starts = {("p-to-x", "l"): SourceStart(T, {"p": 30}), ("q-to-x", "l"): SourceStart(T, {"q": 8})}
    decided = rd.decide_incoming("x", incoming, facts(holds={"l": 0}, truncations={("p", "l"): truncated(), ("q", "l"): truncated()}, starts=starts))
    assert [(i.stream, i.mode) for _, i in decided] == [("p-to-x", "bootstrap"), ("q-to-x", "stream")]
    assert decided[0][1].vv == {"p": 30} and decided[0][1].first == T
    assert rd.logs_copied(decided, "bootstrap") == {"l"}
    assert rd.held_back(incoming, {"l"}) == {"p-to-x", "q-to-x"}


def test_into_a_log_x_still_holds_a_truncating_source_streams_from_its_first_position_and_the_gap_is_reported():
    [(_, item)] = rd.decide_incoming("x", [(into_x("p"), StreamState.RUNNING)], facts(holds={"l": 4}, truncations={("p", "l"): truncated()}, starts={("p-to-x", "l"): SourceStart(T, {"p": 30})}))
    assert item.mode == "stream" and not item.gated
    assert item.gap["peer"] == "p" and item.gap["to"] == str(T) and item.gap["x_kept_records"] == 4 and item.gap["covered_by"] == []
    assert "is lost for x" in item.gap["note"]


def test_a_truncating_source_waits_for_a_source_that_holds_the_whole_log_and_no_copy_is_made():
    incoming = [(into_x("p"), StreamState.RUNNING), (into_x("q"), StreamState.RUNNING)]
    decided = rd.decide_incoming("x", incoming, facts(holds={"l": 0}, truncations={("p", "l"): truncated()}, starts={("p-to-x", "l"): SourceStart(T, {"p": 30})}))
    gated, complete = decided[0][1], decided[1][1]
    assert (gated.mode, gated.gated, gated.gap["covered_by"]) == ("stream", True, ["q"])
    assert complete.mode == "start"
    assert rd.logs_copied(decided, "bootstrap") == set()


def test_what_a_source_deleted_comes_back_from_its_cold_store_once_per_log():
    incoming = [(into_x("p"), StreamState.RUNNING), (into_x("q"), StreamState.RUNNING)]
    truncations = {("p", "l"): truncated(cold_cover(), cold_store=True), ("q", "l"): truncated(cold_cover(), cold_store=True)}
    starts = {("p-to-x", "l"): SourceStart(T, {"p": 30}), ("q-to-x", "l"): SourceStart(T, {"q": 8})}
    decided = rd.decide_incoming("x", incoming, facts(holds={"l": 0}, truncations=truncations, starts=starts))
    replayed, other = decided[0][1], decided[1][1]
    assert replayed.mode == "cold" and replayed.gap["covered_by"] == ["cold store of p: fs:/cold/p (segments 1..4)"]
    assert replayed.gap["note"].startswith("COLD p/l")
    assert other.mode == "stream"  # the log is being replayed: no second replay, no copy
    assert rd.logs_copied(decided, "cold") == {"l"}


def test_a_cold_store_that_cannot_help_is_named_with_why_in_the_gap():
    [(_, item)] = rd.decide_incoming(
        "x", [(into_x("p"), StreamState.RUNNING)],
        facts(holds={"l": 0}, truncations={("p", "l"): truncated(cold_store=True, why="starts at segment 3")}, starts={("p-to-x", "l"): SourceStart(T, {"p": 30})}),
    )
    assert item.mode == "bootstrap" and item.gap["cold_store"] == "starts at segment 3"
    [(_, plain)] = rd.decide_incoming("x", [(into_x("p"), StreamState.RUNNING)], facts(holds={"l": 0}, truncations={("p", "l"): truncated()}, starts={("p-to-x", "l"): SourceStart(T, {})}))
    assert "cold_store" not in plain.gap  # no cold store configured: nothing to say about it


def test_recover_refuses_when_a_truncating_sources_clock_at_its_first_position_is_unknown():
    with pytest.raises(RefusedError, match=f"p no longer holds the beginning of l \\(it starts at {T}\\).*no anchor"):
        rd.decide_incoming("x", [(into_x("p"), StreamState.RUNNING)], facts(truncations={("p", "l"): truncated()}, starts={("p-to-x", "l"): SourceStart(T, unknown="no anchor")}))


def test_the_gap_estimate_counts_what_the_saved_checkpoint_had_read_before_the_first_retained_position():
    saved = {"next": str(DLSN(6, 0, 0)), "source_vv": {"p": 40}, "processed": 25}
    assert saved_anchor(saved) == (DLSN(6, 0, 0), {"p": 40}) and saved_anchor({"next": ""}) is None
    own = decide("x", into_x("p"), "l", SourceStart(T, {"p": 30}, anchor=DLSN(6, 0, 0), between=10), saved=saved, x_holds=0, copying=set(), complete_sources=[])
    assert own.gap["records_estimate"] == 15 and own.gap["peer_own_records_before"] == 30
    other = decide("x", into_x("p"), "l", SourceStart(T, {"p": 30}, anchor=DLSN(7, 0, 0), between=10), saved=saved, x_holds=0, copying=set(), complete_sources=[])
    assert other.gap["records_estimate"] is None  # derived from another sink's checkpoint: X's count says nothing
    assert "about 15 record(s)" in gap_note(own.gap) and "an unknown number" in gap_note(other.gap)


def test_a_restarted_stream_reads_from_the_sources_first_position_with_its_clock_and_a_filter_from_what_x_holds():
    cp = Checkpoint("l", next=DLSN(9, 0, 0), sink_dlsn=DLSN(2, 0, 0), last_error="boom", safe_time=5.0, waiting_for={"q": 1}, processed_records=3)
    item = Incoming("p-to-x", "l", "bootstrap", T, {"p": 30}, gated=False)
    assert rd.restarted(cp, item, {"x": 4}, "pending") == Checkpoint("l", next=T, source_vv={"p": 30}, sink_vv={"x": 4}, needs_bootstrap="pending", processed_records=3)


def test_each_restart_is_described_by_its_mode():
    gap = {"covered_by": ["q"]}
    assert rd.incoming_description("x", "p", Incoming("s", "l", "start", INITIAL, {})) == "from the start, unfiltered"
    assert rd.incoming_description("x", "p", Incoming("s", "l", "stream", T, {}, gap, gated=True)).endswith("once x holds what p deleted again (from q)")
    assert rd.incoming_description("x", "p", Incoming("s", "l", "bootstrap", T, {})).startswith(f"bootstrap copy from {T}")
    assert rd.incoming_description("x", "p", Incoming("s", "l", "cold", T, {})).startswith(f"what p deleted before {T} replayed from its cold store")


def test_after_a_copy_every_stream_carrying_the_log_filters_from_what_x_holds():
    incoming = [(into_x("p", ("l", "m")), StreamState.RUNNING), (into_x("q", ("m",)), StreamState.RUNNING)]
    assert rd.streams_carrying(incoming, {"m"}) == [("p-to-x", "m"), ("q-to-x", "m")]
    assert rd.streams_carrying(incoming, set()) == []


# -- events and the end ----------------------------------------------------------------------------


def test_event_recovery_refuses_when_a_stream_could_not_bring_the_records_back():
    rd.refuse_gaps("x", {})
    with pytest.raises(RefusedError, match="event recovery of x is incomplete") as refused:
        rd.refuse_gaps("x", {"p-to-x": "truncated"})
    assert refused.value.details == {"gaps": {"p-to-x": "truncated"}}


def test_recovered_records_are_what_the_logs_hold_beyond_what_they_kept():
    assert rd.recovered_records({"l": 3, "m": "2"}, {"l": 10, "m": 2}) == 7


def test_at_the_end_each_stream_returns_to_its_state_before_the_recovery():
    incoming = [(into_x("p"), StreamState.RUNNING), (into_x("q"), StreamState.RUNNING)]
    outgoing = [out_of_x("p"), out_of_x("q")]
    pause, resume = rd.end_states("x", incoming, outgoing, ["p-to-x@x", "x-to-q@q"])
    assert pause == ["q-to-x"] and [o.peer for o in resume] == ["q"]


def test_the_plan_names_each_truncating_peer_and_whether_its_cold_store_gives_the_past_back():
    incoming = [(into_x("p", ("l", "m")), StreamState.RUNNING), (into_x("q"), StreamState.RUNNING)]
    truncations = {("p", "l"): truncated(cold_cover(), cold_store=True), ("p", "m"): truncated(cold_store=True, why="unreachable"), ("q", "l"): truncated()}
    cold, gap_with_store, gap = rd.truncated_notes("x", incoming, truncations)
    assert cold.startswith("COLD p/l") and cold.endswith(f"then streaming from {T}")
    assert gap_with_store.startswith("GAP p/m") and "(its cold store cannot help: unreachable)" in gap_with_store
    assert gap.startswith("GAP q/l") and "cold store" not in gap
    assert rd.truncated_notes("x", incoming, {}) == []
