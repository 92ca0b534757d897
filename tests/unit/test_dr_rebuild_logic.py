"""Pure logic of rebuilding a location's metadata from its peers' records (issue 11, ``dr recover``
of a location rebuilt empty or restored from an old backup): ``dlctl.replication.rebuild``."""

from __future__ import annotations

from dlctl.log.dlsn import DLSN, INITIAL
from dlctl.meta.access import AccessMode
from dlctl.meta.pins import PinRecord
from dlctl.meta.records import LogConfig
from dlctl.replication.rebuild import (
    REBUILT_REASON,
    PeerFacts,
    TargetFacts,
    clock_floor,
    derive,
    new_checkpoint,
    pinned_streams,
    positions_floor,
)
from dlctl.replication.records import Checkpoint, StreamConfig, StreamState

NOW = 1_000_000.0


def pin(holder: str, log: str, sink: str, *, updated: float = NOW, max_age: float = 3600.0) -> PinRecord:
    return PinRecord(holder=holder, log=log, position=DLSN(3, 0, 0), sink_cluster=sink, updated=updated, max_age_seconds=max_age)


def stream(source: str, sink: str, logs: tuple[str, ...], *, bidirectional: bool = True, throttle: int = 0) -> StreamConfig:
    return StreamConfig(f"{source}-to-{sink}", source, f"zk-{source}:2181", sink, logs, bidirectional=bidirectional, throttle_bytes_per_second=throttle)


def cycle_peers() -> list[PeerFacts]:
    """a <-> b an active-active pair (profiles, carts), b -> c and c -> a causal one-way
    streams (profiles); a lost everything. b holds a-to-b and pins of b-to-a; c holds b-to-c
    and pins of c-to-a."""
    b = PeerFacts(
        "b",
        "zk-b:2181",
        streams=((stream("a", "b", ("carts", "profiles"), throttle=5000), StreamState.RUNNING),),
        checkpoints={
            ("a-to-b", "profiles"): Checkpoint("profiles", DLSN(2, 4, 0), source_vv={"a": 300, "c": 120}, sink_vv={"a": 280, "b": 310}),
            ("a-to-b", "carts"): Checkpoint("carts", DLSN(1, 9, 0), source_vv={"a": 40}, sink_vv={"a": 38}),
        },
        pins=(pin("b-to-a", "profiles", "a"), pin("b-to-a", "carts", "a"), pin("b-to-c", "profiles", "c"), pin("bootstrap-b-to-a", "carts", "a")),
        logs={"profiles": LogConfig(3, 2, 2), "carts": LogConfig(2, 2, 1)},
        applied={("a-to-b", "profiles"): DLSN(3, 1, 7)},  # b's log tail holds a record from a's segment 3
    )
    c = PeerFacts(
        "c",
        "zk-c:2181",
        streams=((stream("b", "c", ("profiles",)), StreamState.RUNNING),),
        checkpoints={("b-to-c", "profiles"): Checkpoint("profiles", DLSN(5, 0, 0), source_vv={"a": 333, "b": 300}, sink_vv={"a": 290})},
        pins=(pin("c-to-a", "profiles", "a"),),
        logs={"profiles": LogConfig(3, 3, 2)},
    )
    return [b, c]


def test_a_location_rebuilt_empty_gets_every_stream_into_it_from_its_sources_pins():
    rebuild = derive(TargetFacts("a", layout=False), cycle_peers(), now=NOW)
    assert rebuild.layout and not rebuild.empty
    created = {s.config.stream_id: s for s in rebuild.streams}
    assert set(created) == {"b-to-a", "c-to-a"}  # the bootstrap pin and b-to-c are not streams into a
    b_to_a, c_to_a = created["b-to-a"].config, created["c-to-a"].config
    assert (b_to_a.source_cluster, b_to_a.sink_cluster, b_to_a.logs, b_to_a.source_zookeeper) == ("b", "a", ("carts", "profiles"), "zk-b:2181")
    assert c_to_a.logs == ("profiles",) and c_to_a.source_zookeeper == "zk-c:2181"
    # a takes local writes (a-to-b is active-active), so the streams into it filter causally.
    assert b_to_a.bidirectional and c_to_a.bidirectional
    assert b_to_a.throttle_bytes_per_second == 5000  # the pair's other half says so
    assert c_to_a.pin_max_age_seconds == 3600.0
    assert all(s.create and set(s.checkpoints) == set(s.config.logs) for s in created.values())
    # recover_plan sees them as running (they ran before the loss).
    assert [(c.stream_id, st) for c, st in rebuild.incoming] == [("b-to-a", StreamState.RUNNING), ("c-to-a", StreamState.RUNNING)]


def test_recreated_logs_copy_a_peers_configuration_and_start_above_every_counter_of_the_location_its_peers_saw():
    rebuild = derive(TargetFacts("a", layout=False), cycle_peers(), now=NOW)
    logs = {log.name: log for log in rebuild.logs}
    assert set(logs) == {"carts", "profiles"}
    assert logs["carts"].config == LogConfig(2, 2, 1) and logs["carts"].config_from == "b"
    # profiles: b is the first source of a stream into a holding it.
    assert logs["profiles"].config == LogConfig(3, 2, 2) and logs["profiles"].config_from == "b"
    # c's checkpoint of b-to-c saw a's counter 333 (a's records relayed through b).
    assert logs["profiles"].clock_floor == 333 and logs["carts"].clock_floor == 40
    assert rebuild.modes == {"carts": (AccessMode.READ_WRITE, ""), "profiles": (AccessMode.READ_WRITE, "")}


def test_a_recreated_log_numbers_its_segments_after_every_position_its_peers_hold():
    rebuild = derive(TargetFacts("a", layout=False), cycle_peers(), now=NOW)
    logs = {log.name: log for log in rebuild.logs}
    # profiles: b's checkpoint of a-to-b is at 2/4/0, but b's log tail holds a record from 3/1/7.
    assert logs["profiles"].max_segment_seq == 3 and logs["profiles"].to_dict()["first_segment"] == 4
    assert logs["carts"].max_segment_seq == 1


def test_positions_floor_counts_only_streams_out_of_the_location():
    peers = cycle_peers()
    assert positions_floor("a", "profiles", peers) == 3
    # c's checkpoint of b-to-c (at 5/0/0) is a position of b's log, not of a's or c's.
    assert positions_floor("b", "profiles", peers) == 5
    assert positions_floor("c", "profiles", peers) == 0
    with_end = PeerFacts("b", "zk-b", streams=((stream("a", "b", ("l",)), StreamState.RUNNING),), checkpoints={("a-to-b", "l"): Checkpoint("l", DLSN(2, 0, 0), source_end=DLSN(6, 3, 0))})
    assert positions_floor("a", "l", [with_end]) == 6


def test_a_one_way_standby_is_rebuilt_as_a_replica_of_its_stream():
    primary = PeerFacts("p", "zk-p", pins=(pin("p-to-s", "orders", "s"),), logs={"orders": LogConfig(3, 3, 2)})
    rebuild = derive(TargetFacts("s"), [primary], now=NOW)
    (created,) = rebuild.streams
    assert not created.config.bidirectional
    assert rebuild.modes == {"orders": (AccessMode.REPLICA, "p-to-s")}
    assert rebuild.logs[0].mode is AccessMode.REPLICA and rebuild.logs[0].stream == "p-to-s"
    assert rebuild.logs[0].clock_floor == 0


def test_a_location_whose_metadata_survived_needs_nothing_and_keeps_its_streams_states():
    peers = cycle_peers()
    b_to_a, c_to_a = stream("b", "a", ("carts", "profiles")), stream("c", "a", ("profiles",))
    target = TargetFacts(
        "a",
        streams={"b-to-a": (b_to_a, StreamState.RUNNING, ""), "c-to-a": (c_to_a, StreamState.PAUSED, "operator")},
        checkpoints=frozenset({("b-to-a", "carts"), ("b-to-a", "profiles"), ("c-to-a", "profiles")}),
        logs=frozenset({"carts", "profiles"}),
        max_segment_seq={"carts": 1, "profiles": 4},
    )
    rebuild = derive(target, peers, now=NOW)
    assert rebuild.empty and rebuild.modes == {}
    # (A cluster set up without `cluster init` has no config record: nothing to rebuild either.)
    assert derive(TargetFacts(**{**target.__dict__, "layout": False}), peers, now=NOW).empty
    assert rebuild.incoming == [(b_to_a, StreamState.RUNNING), (c_to_a, StreamState.PAUSED)]


def test_an_old_backup_gets_the_logs_and_checkpoints_added_after_it_and_a_rebuilt_stream_counts_as_running():
    peers = cycle_peers()
    old = stream("b", "a", ("profiles",))  # carts was added to the pair after the backup
    target = TargetFacts(
        "a",
        streams={"b-to-a": (old, StreamState.RUNNING, ""), "c-to-a": (stream("c", "a", ("profiles",)), StreamState.PAUSED, REBUILT_REASON)},
        checkpoints=frozenset({("b-to-a", "profiles")}),  # c-to-a's checkpoint was not written yet
        logs=frozenset({"profiles"}),
        max_segment_seq={"profiles": 2},  # the backup was taken when a's log was at segment 2
    )
    rebuild = derive(target, peers, now=NOW)
    assert rebuild.renumber == {"profiles": 3}, "new segments go after every position of a the peers hold"
    changes = {s.config.stream_id: s for s in rebuild.streams}
    assert not changes["b-to-a"].create and changes["b-to-a"].add_logs == ("carts",) and changes["b-to-a"].checkpoints == ("carts",)
    assert changes["b-to-a"].config.logs == ("carts", "profiles")
    assert changes["c-to-a"].checkpoints == ("profiles",) and not changes["c-to-a"].add_logs
    assert [log.name for log in rebuild.logs] == ["carts"]
    assert {c.stream_id: st for c, st in rebuild.incoming} == {"b-to-a": StreamState.RUNNING, "c-to-a": StreamState.RUNNING}


def test_a_log_a_rebuild_recreated_earlier_still_returns_to_its_mode_on_a_re_run():
    target = TargetFacts("a", logs=frozenset({"carts", "profiles"}), rebuilt_logs=frozenset({"profiles"}))
    rebuild = derive(target, cycle_peers(), now=NOW)
    assert rebuild.modes == {"profiles": (AccessMode.READ_WRITE, "")}
    assert rebuild.logs == []


def test_no_peer_knowing_the_location_leaves_nothing_to_recover_from():
    stranger = PeerFacts("q", "zk-q", pins=(pin("q-to-r", "x", "r"),))
    rebuild = derive(TargetFacts("a", layout=False), [stranger], now=NOW)
    assert rebuild.incoming == [] and rebuild.known_by == []


def test_a_pure_source_is_known_but_has_no_stream_into_it():
    standby = PeerFacts("b", "zk-b", streams=((stream("a", "b", ("orders",), bidirectional=False), StreamState.RUNNING),))
    rebuild = derive(TargetFacts("a"), [standby], now=NOW)
    assert rebuild.incoming == [] and rebuild.known_by == ["b"]


def test_a_pin_whose_stream_at_the_location_replicates_from_elsewhere_is_reported_not_used():
    peer = PeerFacts("b", "zk-b", pins=(pin("x-to-a", "l", "a"),))
    other = stream("x", "a", ("l",))
    target = TargetFacts("a", streams={"x-to-a": (other, StreamState.RUNNING, "")}, checkpoints=frozenset({("x-to-a", "l")}), logs=frozenset({"l"}))
    rebuild = derive(target, [peer], now=NOW)
    assert rebuild.streams == [] and any("replicates from x" in n for n in rebuild.notes)


def test_expired_pins_are_still_evidence_but_the_plan_says_data_may_be_gone():
    peer = PeerFacts("b", "zk-b", pins=(pin("b-to-a", "l", "a", updated=NOW - 7200, max_age=3600),))
    (created,) = derive(TargetFacts("a"), [peer], now=NOW).streams
    assert "expired on l" in created.evidence


def test_pinned_streams_groups_pins_by_stream_and_ignores_bootstrap_holders_and_other_sinks():
    peer = cycle_peers()[0]
    grouped = pinned_streams("a", peer)
    assert sorted(grouped) == ["b-to-a"] and sorted(p.log for p in grouped["b-to-a"]) == ["carts", "profiles"]


def test_clock_floor_is_the_highest_component_of_the_location_in_any_checkpoint_of_the_log():
    assert clock_floor("a", "profiles", cycle_peers()) == 333
    assert clock_floor("b", "profiles", cycle_peers()) == 310
    assert clock_floor("a", "unknown", cycle_peers()) == 0


def test_new_checkpoints_start_at_the_beginning():
    cp = new_checkpoint("l")
    assert cp.log == "l" and cp.next == INITIAL and cp.source_vv == {} and cp.sink_vv == {} and cp.sink_dlsn is None
