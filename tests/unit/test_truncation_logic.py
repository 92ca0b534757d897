"""Truncation and retention decisions (pure logic): marks, targets, retention, pins, collection,
replica verdicts, and the records' JSON."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlctl.log.dlsn import DLSN
from dlctl.meta.pins import PinRecord
from dlctl.meta.records import (
    EnsembleChange,
    LogConfig,
    LogRecord,
    SegmentRecord,
    SegmentState,
    Versioned,
    log_from_json,
    to_json,
)
from dlctl.meta.truncation import (
    SegmentMark,
    TruncationRecord,
    check_target,
    clamp_to_pins,
    collectable,
    mark_for,
    marks_for,
    normalize,
    overrun_pins,
    retention_point,
    truncated_txid,
)
from dlctl.retention.collect import (
    KEEP,
    ORPHAN,
    STALE,
    LogState,
    LogView,
    LogViews,
    classify,
    decide,
    verdict,
)
from dlctl.units import parse_duration, parse_size

NOW = 1_000_000.0
C, P, T, I = SegmentState.COMPLETED, SegmentState.PARTIALLY_TRUNCATED, SegmentState.TRUNCATED, SegmentState.INPROGRESS


def seg(seq: int, state: SegmentState = C, last: int = 9, completed: float | None = None, nbytes: int = 1000, min_active: int = 0, nodes=("n1", "n2", "n3")) -> SegmentRecord:
    done = state is not I
    return SegmentRecord(
        seq=seq,
        state=state,
        ensembles=(EnsembleChange(0, tuple(nodes)),),
        write_quorum=3,
        ack_quorum=2,
        created=0.0,
        last_entry_id=last if done else -1,
        first_txid=(seq - 1) * 100,
        last_txid=(seq - 1) * 100 + 99 if done else -1,
        records=100 if done else 0,
        bytes=nbytes if done else 0,
        completed=(completed if completed is not None else NOW - 10) if done else None,
        min_active_entry=min_active,
    )


def pin(holder: str = "s1", position: DLSN = DLSN(3, 0, 0), age: float = 0.0, max_age: float = 3600.0, needs_bootstrap: bool = False) -> PinRecord:
    return PinRecord(holder=holder, log="orders", position=position, created=NOW - age, updated=NOW - age, max_age_seconds=max_age, needs_bootstrap=needs_bootstrap)


# -- marks -------------------------------------------------------------------------------------


def test_marks_whole_segments_before_the_point_and_the_boundary_partially():
    segments = [seg(1), seg(2), seg(3), seg(4, I)]
    assert marks_for(segments, DLSN(3, 5, 2)) == [SegmentMark(1, T), SegmentMark(2, T), SegmentMark(3, P, 5)]


def test_the_in_progress_segment_is_never_marked_even_past_it():
    assert marks_for([seg(1), seg(2, I)], DLSN(9, 0, 0)) == [SegmentMark(1, T)]


def test_a_point_past_a_closed_segments_last_entry_truncates_it_whole():
    assert mark_for(seg(2, last=9), DLSN(2, 10, 0)) == SegmentMark(2, T)
    assert normalize([seg(1), seg(2, last=9)], DLSN(2, 10, 0)) == DLSN(3, 0, 0)
    assert normalize([seg(1), seg(2, I)], DLSN(2, 10, 0)) == DLSN(2, 10, 0)  # in progress: unknown end


def test_marks_never_go_backwards():
    assert mark_for(seg(3, P, min_active=7), DLSN(3, 5, 0)) is None
    assert mark_for(seg(3, T), DLSN(3, 5, 0)) is None
    assert SegmentMark(3, P, 2).apply(seg(3, P, min_active=7)).min_active_entry == 7


def _apply(segments: list[SegmentRecord], point: DLSN) -> list[SegmentRecord]:
    by = {m.seq: m for m in marks_for(segments, point)}
    return [by[s.seq].apply(s) if s.seq in by else s for s in segments]


points = st.builds(DLSN, st.integers(1, 6), st.integers(0, 12), st.integers(0, 3))


@given(a=points, b=points)
def test_racing_truncations_converge_on_the_larger_point_in_any_order(a, b):
    segments = [seg(1), seg(2), seg(3), seg(4), seg(5, I)]
    # What readers see of each segment: its state and, unless wholly truncated, where it starts.
    seen = lambda segs: [(s.state, None if s.state is T else s.min_active_entry) for s in segs]
    ab = _apply(_apply(segments, a), b)
    ba = _apply(_apply(segments, b), a)
    assert seen(ab) == seen(ba) == seen(_apply(segments, max(a, b)))
    # Never touched: the in-progress segment.
    assert ab[-1] == segments[-1]


def test_truncated_txid_counts_whole_segments_only():
    segments = [seg(1), seg(2), seg(3)]
    assert truncated_txid(segments, DLSN(3, 4, 0)) == 199
    assert truncated_txid(segments, DLSN(1, 4, 0)) == -1


# -- targets -------------------------------------------------------------------------------------


def test_check_refuses_a_point_inside_the_in_progress_segment_but_not_its_start():
    segments = [seg(1), seg(2), seg(3, I)]
    assert check_target(segments, DLSN(3, 0, 0), 3, [], NOW).ok
    bad = check_target(segments, DLSN(3, 1, 0), 3, [], NOW)
    assert bad.in_progress is not None and bad.in_progress.seq == 3


def test_check_refuses_a_point_past_the_end_of_the_log():
    segments = [seg(1), seg(2)]
    assert check_target(segments, DLSN(3, 0, 0), 2, [], NOW).ok
    assert check_target(segments, DLSN(3, 1, 0), 2, [], NOW).beyond_end == 3


def test_check_names_live_pins_the_point_passes_and_ignores_expired_or_bootstrapping_ones():
    segments = [seg(s) for s in range(1, 6)]
    pins = [pin("live", DLSN(3, 4, 0)), pin("old", DLSN(2, 0, 0), age=7200), pin("boot", DLSN(1, 0, 0), needs_bootstrap=True), pin("ahead", DLSN(5, 0, 0))]
    check = check_target(segments, DLSN(4, 0, 0), 5, pins, NOW)
    assert [p.holder for p in check.pins] == ["live"]
    assert check_target(segments, DLSN(3, 4, 0), 5, pins, NOW).ok  # exactly at the pin: allowed
    assert [p.holder for p in overrun_pins(pins, DLSN(4, 0, 0))] == ["live", "old"]


# -- retention ------------------------------------------------------------------------------------


def test_ttl_truncates_exactly_the_expired_completed_prefix():
    segments = [seg(1, completed=NOW - 500), seg(2, completed=NOW - 400), seg(3, completed=NOW - 50), seg(4, completed=NOW - 450), seg(5, I)]
    decision = retention_point(segments, NOW, ttl=300)
    assert decision is not None and decision.point == DLSN(3, 0, 0) and decision.segments == (1, 2)
    assert decision.truncated_txid == 199
    # Segment 4 is old too but follows a young one: truncation only removes a prefix.


def test_ttl_never_takes_the_in_progress_segment():
    segments = [seg(1, completed=NOW - 500), seg(2, I)]
    decision = retention_point(segments, NOW, ttl=10)
    assert decision is not None and decision.point == DLSN(2, 0, 0)
    assert retention_point([seg(1, I)], NOW, ttl=1) is None


def test_size_cap_drops_the_oldest_completed_segments_while_over_the_cap():
    segments = [seg(1, nbytes=400), seg(2, nbytes=400), seg(3, nbytes=400), seg(4, I)]
    decision = retention_point(segments, NOW, max_bytes=500)
    assert decision is not None and decision.segments == (1, 2) and decision.point == DLSN(3, 0, 0)
    assert retention_point(segments, NOW, max_bytes=1200) is None
    # Already truncated segments no longer count.
    assert retention_point([seg(1, T, nbytes=10_000), seg(2, nbytes=400)], NOW, max_bytes=500) is None


def test_retention_stops_at_the_segment_of_a_live_pin():
    point, holders = clamp_to_pins(DLSN(6, 0, 0), [pin("s1", DLSN(4, 7, 0)), pin("dead", DLSN(2, 0, 0), age=7200)], NOW)
    assert point == DLSN(4, 0, 0) and holders == ["s1"]


# -- collection --------------------------------------------------------------------------------------


def test_collectable_skips_pinned_segments_and_keeps_the_last_record_as_a_txid_tombstone():
    segments = [seg(1, T), seg(2, T), seg(3, T), seg(4, T)]
    result = collectable(segments, [pin("s1", DLSN(3, 0, 0), age=0)], NOW)
    assert [s.seq for s in result.collect] == [1, 2]
    assert "pinned by s1" in result.kept[3] and result.tombstone is None  # 4 is pinned too
    result = collectable(segments, [], NOW)
    assert [s.seq for s in result.collect] == [1, 2, 3] and result.tombstone == 4
    result = collectable([seg(1, T), seg(2, P), seg(3, I)], [], NOW)
    assert [s.seq for s in result.collect] == [1] and result.tombstone is None


def _state(segments, *, config=LogConfig(), point=None, pins=()):
    record = LogRecord("orders", 7, 0.0, config, max(s.seq for s in segments))
    truncation = Versioned(TruncationRecord(point), 0) if point else None
    return LogState("orders", Versioned(record, 0), truncation, [Versioned(s, 0) for s in segments], [Versioned(p, 0) for p in pins])


def test_decide_applies_ttl_marks_and_collects_but_leaves_pinned_and_in_progress_segments():
    segments = [seg(1, completed=NOW - 900), seg(2, completed=NOW - 800), seg(3, completed=NOW - 700), seg(4, completed=NOW - 5), seg(5, I)]
    d = decide(_state(segments, config=LogConfig(retention_seconds=60), pins=[pin("s1", DLSN(3, 2, 0))]), NOW)
    assert d.retention is not None and d.retention.point == DLSN(3, 0, 0) and d.clamped_by == ["s1"]
    assert [m.seq for m in d.marks] == [1, 2] and [s.seq for s in d.collect] == [1, 2]
    # No pin: segment 3 goes too; 4 is young, 5 in progress.
    d = decide(_state(segments, config=LogConfig(retention_seconds=60)), NOW)
    assert d.retention.point == DLSN(4, 0, 0) and [s.seq for s in d.collect] == [1, 2, 3]
    # Without retention the log is left alone.
    assert decide(_state(segments), NOW).empty


def test_decide_marks_expired_pins_passed_and_the_override_passes_live_ones():
    segments = [seg(1, completed=NOW - 900), seg(2, completed=NOW - 800), seg(3, I)]
    config = LogConfig(retention_seconds=60)
    d = decide(_state(segments, config=config, pins=[pin("dead", DLSN(1, 0, 0), age=7200)]), NOW)
    assert d.pins_to_mark == ["dead"] and d.retention.point == DLSN(3, 0, 0)
    d = decide(_state(segments, config=config, pins=[pin("live", DLSN(1, 0, 0))]), NOW)
    assert d.retention is None and d.pins_to_mark == []
    d = decide(_state(segments, config=config, pins=[pin("live", DLSN(1, 0, 0))]), NOW, override="disk-space override: n1 low")
    assert d.retention.point == DLSN(3, 0, 0) and d.pins_to_mark == ["live"] and "disk-space" in d.retention.reason


def test_decide_finishes_marking_for_a_recorded_point():
    d = decide(_state([seg(1), seg(2), seg(3, I)], point=DLSN(2, 4, 0)), NOW)
    assert d.retention is None and d.marks == [SegmentMark(1, T), SegmentMark(2, P, 4)] and [s.seq for s in d.collect] == [1]


# -- replica verdicts --------------------------------------------------------------------------------


def view(**kw) -> LogView:
    records = {s.seq: s for s in (seg(5), seg(6, I))}
    base = dict(name="orders", log_id=7, point=DLSN(5, 0, 0), seqs=frozenset(records), records=records, tombstone=None)
    return LogView(**{**base, **kw})


def test_verdicts():
    v = view()
    assert verdict(v, 3, "n1")[0] == STALE  # below the point, record collected
    assert verdict(v, 9, "n1")[0] == ORPHAN  # no record, not below the point
    assert verdict(None, 3, "n1")[0] == ORPHAN  # no such log
    assert verdict(v, 5, "n1")[0] == KEEP
    assert verdict(v, 5, "n9")[0] == ORPHAN  # not a member
    assert verdict(v, 5, "n9", busy={("orders", 5)})[0] == KEEP  # a re-replication is copying it
    assert verdict(view(point=None), 3, "n1")[0] == ORPHAN
    assert verdict(view(records={}, seqs=frozenset({5, 6})), 5, "n9")[0] == KEEP  # record not read: no judgement
    tomb = view(records={5: seg(5, T)}, seqs=frozenset({5}), point=DLSN(6, 0, 0), tombstone=5)
    assert verdict(tomb, 5, "n1")[0] == STALE


def test_classify_sorts_a_listing():
    infos = [SimpleNamespace(log_id=7, segment_seq=s, size_bytes=10 * s) for s in (3, 5, 9)] + [SimpleNamespace(log_id=99, segment_seq=1, size_bytes=1)]
    stale, orphans = classify("n1", infos, LogViews({7: view()}))
    assert [(r.seq, r.bytes) for r in stale] == [(3, 30)]
    assert sorted((r.log_id, r.seq) for r in orphans) == [(7, 9), (99, 1)]


def test_a_log_whose_metadata_cannot_be_read_has_none_of_its_replicas_judged_and_the_others_are():
    infos = [SimpleNamespace(log_id=7, segment_seq=s, size_bytes=1) for s in (3, 9)] + [SimpleNamespace(log_id=8, segment_seq=s, size_bytes=1) for s in (3, 9)]
    damaged = LogView.of_unreadable("payments", 8, "segment record 3 is not valid JSON")
    stale, orphans = classify("n1", infos, LogViews({7: view(), 8: damaged}))
    assert [(r.log_id, r.seq) for r in stale] == [(7, 3)]  # the readable log is judged as ever
    assert [(r.log_id, r.seq) for r in orphans] == [(7, 9)]  # the damaged log's replicas are kept
    kind, why = verdict(damaged, 3, "n1")
    assert kind == KEEP and "payments" in why and "not valid JSON" in why


def test_a_replica_of_no_readable_log_is_kept_while_some_log_record_cannot_be_read():
    """It may belong to the log whose own record is damaged (its id unknown): an orphan, which
    `gc --force` deletes, it is only once every log record is read."""
    infos = [SimpleNamespace(log_id=99, segment_seq=1, size_bytes=1)]
    views = LogViews({7: view()}, {"payments": "not valid JSON"})
    assert classify("n1", infos, views) == ([], [])
    assert views.verdict(99, 1, "n1")[0] == KEEP and "payments" in views.verdict(99, 1, "n1")[1]
    assert views.damaged() == {"payments": "not valid JSON"}
    assert classify("n1", infos, LogViews({7: view()}))[1] != []  # control: an orphan without it


# -- records and units ---------------------------------------------------------------------------------


def test_truncation_record_round_trip_and_malformed_input_names_where():
    record = TruncationRecord(DLSN(3, 4, 1), 199, 12.5, "explicit", "dlctl")
    assert TruncationRecord.from_json(record.to_json(), "x") == record
    with pytest.raises(ValueError, match="logs/a/truncation: malformed truncation record"):
        TruncationRecord.from_json(b'{"point":"nope"}', "logs/a/truncation")


def test_log_config_retention_is_optional_and_validated():
    old = to_json(LogRecord("a", 1, 0.0, LogConfig()))
    raw = old.replace(b',"retention_bytes":null,"retention_seconds":null', b"")
    assert b"retention" not in raw  # as written before retention existed
    assert log_from_json(raw, "x").config.retention_seconds is None
    assert LogConfig(retention_seconds=60, retention_bytes=10).retention_bytes == 10
    for bad in ({"retention_seconds": 0}, {"retention_bytes": -1}, {"retention_bytes": 1.5}, {"retention_seconds": True}):
        with pytest.raises(ValueError, match="retention"):
            LogConfig(**bad)


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("15m", 900), ("12h", 43200), ("7d", 604800), ("1d12h", 129600), ("2w", 1209600)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text,size", [("1048576", 1048576), ("500MB", 500_000_000), ("10GiB", 10 * 2**30), ("4 kib", 4096)])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "0", "7x", "d7", "-5s"])
def test_bad_durations_say_what_is_expected(bad):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_retention_fields_survive_a_config_replace():
    assert replace(LogConfig(), retention_seconds=5.0).retention_seconds == 5.0
