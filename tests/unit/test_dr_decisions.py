"""The decisions of failover, switchover and failback (``dlctl.ops.dr.decide``): pure functions
over snapshots, tested on plain values — no ZooKeeper, no agents."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlctl.errors import NotFoundError, RefusedError, UsageError
from dlctl.log.dlsn import DLSN, INITIAL
from dlctl.log.reader import ReadRecord
from dlctl.meta.access import AccessMode
from dlctl.ops.dr import decide
from dlctl.ops.dr.facts import SinkProgress, StreamFacts
from dlctl.replication import dr
from dlctl.replication.origin import ORIGIN_CLUSTER, ORIGIN_DLSN, SOURCE_POSITION, VECTOR_TIME, decode_vt
from dlctl.replication.positions import AppliedPosition
from dlctl.replication.records import Checkpoint, StreamConfig, StreamState, StreamStatus


def stream(source: str = "a", sink: str = "b", *, state: StreamState = StreamState.RUNNING, bidirectional: bool = False, logs: tuple[str, ...] = ("l",), stream_id: str = "") -> StreamFacts:
    config = StreamConfig(stream_id or f"{source}-to-{sink}", source, "zk", sink, logs, bidirectional=bidirectional)
    return StreamFacts(config, StreamStatus(state))


def progress(cp: Checkpoint, applied: AppliedPosition | None = None) -> SinkProgress:
    return SinkProgress(cp.log, cp, applied)


def divergence(log: str, count: int, start: DLSN = DLSN(2, 0, 0)) -> dr.Divergence:
    return dr.Divergence(log, "a", start, [ReadRecord(DLSN(2, i, 0), 0, b"r%d" % i) for i in range(count)])


# -- which stream ----------------------------------------------------------------------------------


def test_failover_takes_the_one_one_way_stream_into_the_sink_in_the_states_asked():
    chosen = decide.stream_into("b", [stream("a"), stream("c", state=StreamState.FAILED_OVER)], None, decide.STANDBY_STATES)
    assert chosen.config.stream_id == "a-to-b"
    assert decide.stream_into("b", [stream("a"), stream("c")], "c", decide.STANDBY_STATES).config.source_cluster == "c"


def test_failover_refuses_active_active_streams_every_location_takes_writes_already():
    with pytest.raises(RefusedError, match="active-active"):
        decide.stream_into("b", [stream("a", bidirectional=True)], None, decide.STANDBY_STATES)


def test_failover_without_a_matching_stream_is_not_found_and_with_several_asks_for_the_source():
    with pytest.raises(NotFoundError, match="no one-way stream from 'c' into 'b' is running/paused"):
        decide.stream_into("b", [stream("a")], "c", decide.STANDBY_STATES)
    with pytest.raises(UsageError, match="--from"):
        decide.stream_into("b", [stream("a"), stream("c")], None, decide.STANDBY_STATES)


def test_failover_without_a_stream_names_the_stream_records_it_could_not_read():
    with pytest.raises(NotFoundError, match=r"into 'b' is running/paused; the record of stream a-to-b cannot be read: /x/config: not valid JSON"):
        decide.stream_into("b", [], None, decide.STANDBY_STATES, {"a-to-b": "/x/config: not valid JSON"})


def test_failover_beside_a_stream_record_it_cannot_read_asks_for_the_source():
    """The unreadable record may be the stream from the lost location: taking the readable one
    (from a location still primary) would make two primaries. Named with --from, it is taken."""
    damaged = {"a-to-b": "/x/config: not valid JSON"}
    with pytest.raises(UsageError, match=r"stream c-to-b flows into 'b', and so may stream a-to-b, whose record cannot be read \(/x/config: not valid JSON\); name the source with --from"):
        decide.stream_into("b", [stream("c")], None, decide.STANDBY_STATES, damaged)
    assert decide.stream_into("b", [stream("c")], "c", decide.STANDBY_STATES, damaged).config.stream_id == "c-to-b"
    assert decide.stream_into("b", [stream("c")], None, decide.STANDBY_STATES, {}).config.stream_id == "c-to-b"


def test_failback_finds_only_the_failed_over_stream_from_the_returning_cluster():
    streams = [stream("a", state=StreamState.FAILED_OVER), stream("c")]
    assert decide.stream_into("b", streams, "a", (StreamState.FAILED_OVER,)).config.stream_id == "a-to-b"
    assert decide.has_failed_over_from(streams, "a")
    assert not decide.has_failed_over_from(streams, "c")  # running, not failed over


def test_switchover_needs_exactly_one_running_or_paused_one_way_stream():
    assert decide.only_one_way_source("b", [stream("a", state=StreamState.PAUSED), stream("c", bidirectional=True), stream("d", state=StreamState.FAILED_OVER)]) == "a"
    with pytest.raises(UsageError, match="has 0 one-way stream"):
        decide.only_one_way_source("b", [stream("c", bidirectional=True)])
    with pytest.raises(UsageError, match="has 2 one-way stream"):
        decide.only_one_way_source("b", [stream("a"), stream("c")])


@pytest.mark.parametrize(
    "status, exists",
    [(None, False), (StreamStatus(StreamState.SETTING_UP), False), (StreamStatus(StreamState.RUNNING), True), (StreamStatus(StreamState.PAUSED), True)],
)
def test_a_reverse_stream_registered_by_an_earlier_run_is_kept_unless_still_setting_up(status, exists):
    assert decide.reverse_exists(status) is exists


# -- fencing and promoting ---------------------------------------------------------------------------


def test_promote_changes_only_the_logs_not_read_write_already():
    modes = {"x": AccessMode.READ_WRITE, "y": AccessMode.REPLICA, "z": AccessMode.READ_ONLY}
    assert decide.to_promote(modes) == ["y", "z"]
    assert decide.to_promote({"x": AccessMode.READ_WRITE}) == []


@pytest.mark.parametrize(
    "owner, only_prefix, action",
    [
        (None, None, "none"),
        ({"owner": "app-1"}, None, "depose"),
        ({"owner": "agent-n1", "address": "10.0.0.1:7000"}, None, "release"),
        ({"owner": "app-1"}, "replication:", "leave"),  # promote deposes only replication workers
        ({"owner": "replication:a-to-b", "address": "10.0.0.1:7000"}, "replication:", "release"),
    ],
)
def test_taking_a_log_from_its_writer_releases_agents_deposes_others_and_leaves_owners_not_named(owner, only_prefix, action):
    assert decide.owner_action(owner, only_prefix) == action


# -- failover ----------------------------------------------------------------------------------------


def test_at_risk_starts_at_the_checkpoint_when_the_sink_log_holds_nothing_later():
    cp = Checkpoint("l", next=DLSN(3, 4, 0), sink_dlsn=DLSN(1, 9, 0))
    risk = decide.at_risk(progress(cp, AppliedPosition(DLSN(3, 2, 0), DLSN(1, 7, 0))), now=100.0)  # the tail is behind: ignored
    assert risk["from"] == str(DLSN(3, 4, 0)) and risk["sink_last"] == str(DLSN(1, 9, 0)) and risk["checkpoint"] == str(DLSN(3, 4, 0))
    assert risk["records_estimate"] is None and risk["source_end"] is None and risk["source_end_age_seconds"] is None


def test_at_risk_moves_past_records_the_worker_applied_after_its_last_checkpoint():
    cp = Checkpoint("l", next=DLSN(3, 4, 0), sink_dlsn=DLSN(1, 9, 0))
    risk = decide.at_risk(progress(cp, AppliedPosition(DLSN(3, 6, 2), DLSN(1, 12, 0))), now=100.0)
    assert risk["from"] == str(DLSN(3, 6, 3))  # just after the last record applied
    assert risk["sink_last"] == str(DLSN(1, 12, 0))
    assert risk["checkpoint"] == str(DLSN(3, 4, 0))


def test_at_risk_counts_from_the_last_measured_source_end_and_says_how_old_it_is():
    cp = Checkpoint("l", next=DLSN(3, 0, 0), processed_records=50, source_end=DLSN(3, 10, 0), source_end_records=10, source_end_processed=48, source_end_at=90.0)
    risk = decide.at_risk(progress(cp), now=100.0)
    assert risk["records_estimate"] == 8 and risk["source_end"] == str(DLSN(3, 10, 0)) and risk["source_end_age_seconds"] == 10.0
    reached = decide.at_risk(progress(cp, AppliedPosition(DLSN(3, 10, 0), DLSN(1, 1, 0))), now=100.0)
    assert reached["records_estimate"] == 0  # the tail reached the end the worker last saw


def test_risk_note_says_nothing_at_risk_or_how_much_never_reached_the_sink():
    base = {"log": "l", "from": "3:0:0", "source_end": None, "source_end_age_seconds": None}
    assert decide.risk_note("a", "b", {**base, "records_estimate": 0}).startswith("a/l: nothing at risk")
    unknown = decide.risk_note("a", "b", {**base, "records_estimate": None})
    assert unknown.startswith("AT RISK a/l") and "an unknown number of records" in unknown and "never reached b" in unknown
    counted = decide.risk_note("a", "b", {**base, "records_estimate": 7, "source_end": "3:9:0", "source_end_age_seconds": 4.5})
    assert "about 7 record(s), source end 3:9:0 seen 4.5s ago" in counted


def test_settling_moves_the_checkpoint_to_the_at_risk_position_only_when_it_differs():
    cp = Checkpoint("l", next=DLSN(3, 4, 0), sink_dlsn=DLSN(1, 9, 0), processed_records=5)
    assert decide.settled_checkpoint(cp, {"from": str(DLSN(3, 4, 0)), "sink_last": None}) is None
    moved = decide.settled_checkpoint(cp, {"from": str(DLSN(3, 6, 3)), "sink_last": str(DLSN(1, 12, 0))})
    assert moved == Checkpoint("l", next=DLSN(3, 6, 3), sink_dlsn=DLSN(1, 12, 0), processed_records=5)
    assert decide.settled_checkpoint(cp, {"from": str(DLSN(4, 0, 0)), "sink_last": None}).sink_dlsn is None


# -- switchover ------------------------------------------------------------------------------------


def test_switchover_is_behind_on_a_log_whose_checkpoint_precedes_the_sources_final_end():
    checkpoints = {"l": Checkpoint("l", next=DLSN(2, 5, 0)), "m": Checkpoint("m", next=DLSN(1, 3, 0)), "n": Checkpoint("n")}
    ends = {"l": DLSN(2, 7, 0), "m": DLSN(1, 3, 0), "n": None}  # n: empty at the source
    assert decide.still_behind(checkpoints, ends) == {"l": f"{DLSN(2, 5, 0)} < {DLSN(2, 7, 0)}"}


def test_switchover_reverse_stream_starts_after_the_last_record_the_sink_applied_with_its_clock():
    cp = Checkpoint("l", next=DLSN(2, 8, 0), source_vv={"a": 12})
    position, vv = decide.switchover_start(progress(cp, AppliedPosition(DLSN(2, 7, 0), DLSN(5, 3, 1))))
    assert (position, vv) == (DLSN(5, 3, 2), {"a": 12})
    assert decide.switchover_start(progress(cp)) == (INITIAL, {"a": 12})  # nothing applied: from the start


def test_switchover_verification_passes_only_when_every_record_is_held_once():
    a1, a2, a3 = ("a", DLSN(1, 0, 0)), ("a", DLSN(1, 1, 0)), ("a", DLSN(1, 2, 0))
    ok = decide.copy_report("a", "b", {"l": ([a1, a2], [a1, a2])})
    assert ok["lost"] == 0 and ok["duplicates"] == 0 and ok["logs"]["l"]["sink_records"] == 2
    with pytest.raises(RefusedError, match="1 record\\(s\\) of a missing at b, 1 duplicate") as failed:
        decide.copy_report("a", "b", {"l": ([a1, a2], [a1, a1]), "m": ([a3], [a3])})
    assert failed.value.details["logs"]["l"]["first_lost"] == [f"a@{DLSN(1, 1, 0)}"]


# -- failback --------------------------------------------------------------------------------------


def test_failback_accepts_only_its_three_choices():
    for choice in (None, "reconcile", "discard"):
        decide.check_choice(choice)
    with pytest.raises(UsageError):
        decide.check_choice("merge")


def test_failback_reads_where_the_primary_stopped_from_the_settled_failover():
    assert decide.recorded_start({"from": str(DLSN(3, 6, 3))}) == DLSN(3, 6, 3)
    assert decide.recorded_start({"from": None}) is None and decide.recorded_start(None) is None


def test_failback_notes_name_each_divergence_or_say_nothing_diverged():
    notes = decide.divergence_notes({"m": divergence("m", 0), "l": divergence("l", 3)}, "a", "b")
    assert notes == [f"DIVERGED a/l: 3 record(s) from {DLSN(2, 0, 0)} to {DLSN(2, 2, 0)} that b never received", "a/m: nothing diverged (as far as a can be read before it is frozen)"]


def test_failback_refuses_before_any_change_when_records_diverged_and_no_choice_was_made():
    divergences = {"l": divergence("l", 3), "m": divergence("m", 0)}
    with pytest.raises(RefusedError, match="a holds 3 record\\(s\\) that b never received \\(l: 3\\); nothing was changed"):
        decide.refuse_undecided(divergences, None, "a", "b")
    decide.refuse_undecided(divergences, "reconcile", "a", "b")
    decide.refuse_undecided({"m": divergence("m", 0)}, None, "a", "b")


def test_failback_rebuild_drops_divergent_records_found_after_the_freeze_only_when_discarding():
    fresh = {"l": divergence("l", 2), "m": divergence("m", 0)}
    for choice in (None, "reconcile"):
        with pytest.raises(RefusedError, match="nothing was dropped"):
            decide.refuse_unchosen_loss(fresh, choice, "a", "b")
    assert decide.refuse_unchosen_loss(fresh, "discard", "a", "b") == {"l": 2}
    assert decide.refuse_unchosen_loss({"m": divergence("m", 0)}, None, "a", "b") == {}


@pytest.mark.parametrize("tail, rebuilt", [(None, True), (0, False), (1, True)])
def test_a_returning_log_is_rebuilt_unless_it_is_a_prefix_of_the_primarys(tail, rebuilt):
    assert decide.needs_rebuild(tail) is rebuilt


def test_the_rebuild_report_says_what_became_of_the_divergent_records():
    recreated = {"recreated": "l"}
    assert decide.rebuilt_report(recreated, "l", None, {"l": 2}, "discard", "b") == {"recreated": "l"}
    assert decide.rebuilt_report(recreated, "l", 5, {"l": 2}, "discard", "b") == {"recreated": "l", "dropped": 2, "tail_records": 5}
    assert decide.rebuilt_report(recreated, "l", 5, {}, "reconcile", "b") == {"recreated": "l", "re-appended at b": 0, "tail_records": 5}


def test_failback_stream_starts_after_the_last_record_the_primary_applied_or_from_the_start_of_a_rebuilt_log():
    risk = {"sink_last": str(DLSN(4, 2, 0))}
    assert decide.failback_start(risk, emptied=False, primary_truncated=False) == DLSN(4, 2, 1)
    assert decide.failback_start({"sink_last": None}, emptied=False, primary_truncated=False) == INITIAL
    assert decide.failback_start(risk, emptied=True, primary_truncated=False) == INITIAL
    assert decide.failback_start(risk, emptied=True, primary_truncated=True) is None  # only a bootstrap copy can fill it


def test_failback_refuses_to_refill_a_log_whose_beginning_the_primary_deleted():
    decide.refuse_copy_needed([], "a", "b")
    with pytest.raises(RefusedError, match="b no longer holds the beginning of l, m") as refused:
        decide.refuse_copy_needed(["l", "m"], "a", "b")
    assert "init-replication --source b --sink a" in refused.value.hint


def test_a_reconciled_record_keeps_its_identity_and_loses_its_old_hop():
    local = decide.reappended_headers({"app": b"1"}, "a", DLSN(3, 4, 5), {"a": 9})
    assert local[ORIGIN_CLUSTER] == b"a" and local[ORIGIN_DLSN] == str(DLSN(3, 4, 5)).encode() and local["app"] == b"1"
    assert decode_vt(local[VECTOR_TIME]) == {"a": 9}
    relayed = decide.reappended_headers({ORIGIN_CLUSTER: b"c", ORIGIN_DLSN: b"1:2:3", SOURCE_POSITION: b"c@1:2:3"}, "a", DLSN(3, 4, 5), {"a": 9, "c": 2})
    assert relayed[ORIGIN_CLUSTER] == b"c" and relayed[ORIGIN_DLSN] == b"1:2:3" and SOURCE_POSITION not in relayed


@given(st.integers(1, 5), st.integers(0, 20), st.integers(0, 20), st.integers(0, 20), st.integers(0, 20))
def test_at_risk_never_starts_before_the_checkpoint_nor_before_what_the_sink_log_holds(seg, cp_entry, applied_entry, sink_entry, slot):
    cp = Checkpoint("l", next=DLSN(seg, cp_entry, 0))
    applied = AppliedPosition(DLSN(seg, applied_entry, slot), DLSN(1, sink_entry, 0))
    start = DLSN.parse(decide.at_risk(progress(cp, applied), now=0.0)["from"])
    assert start == max(cp.next, dr.after(applied.source))
