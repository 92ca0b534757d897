"""Append times and the time index (issue 24 item 4; pure logic): the totals record's two forms,
the segment search, the copy keeping a source entry's time, times on the command line, and the
segment record's fields."""

from __future__ import annotations

import struct
from datetime import datetime, timezone

import pytest

from dlctl.log import format as fmt
from dlctl.log.recovery import append_time, entry_summary, read_totals, totals_record
from dlctl.log.records import Record, decode_records, encode_records
from dlctl.log.timeindex import iso, segment_index_for_time
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState, segment_from_json, to_json
from dlctl.units import parse_time
from dlctl.spark import transform
from dlctl.spark.transform import Clock, EntryCopier

T = 1_795_000_000_000  # ms since the epoch


def untimed_totals(txid: int, records: int, nbytes: int) -> Record:
    """The totals record as writers wrote it before entries carried their append time."""
    return Record(txid=txid, payload=struct.pack(">QQ", records, nbytes), control=True)


def test_totals_are_read_in_both_forms_and_zero_means_unknown():
    assert read_totals(totals_record(5, 3, 300, T)) == (3, 300, T)
    assert read_totals(untimed_totals(5, 3, 300)) == (3, 300, None)
    assert read_totals(totals_record(5, 3, 300)) == (3, 300, None)
    assert read_totals(Record(5, b"data")) is None and read_totals(Record(5, b"x" * 24, control=True)) == (int.from_bytes(b"x" * 8), int.from_bytes(b"x" * 8), int.from_bytes(b"x" * 8))
    assert append_time([Record(1, b"a"), totals_record(1, 1, 100, T)]) == T
    assert append_time([Record(1, b"a")]) is None and append_time([]) is None
    for totals, expected in ((totals_record(9, 4, 400, T), T), (untimed_totals(9, 4, 400), None)):
        summary = entry_summary(fmt.encode(fmt.Entry(1, 1, 0, -1, encode_records([Record(9, b"r"), totals]))))
        assert summary is not None and (summary.records, summary.bytes, summary.last_txid, summary.append_ms) == (4, 400, 9, expected)


def seg(seq: int, *, last_time: int | None = None, completed: float | None = None, state: SegmentState = SegmentState.COMPLETED) -> SegmentRecord:
    return SegmentRecord(seq, state, (EnsembleChange(0, ("a",)),), 1, 1, 0.0, last_time=last_time, completed=completed, last_entry_id=9)


def test_the_segment_search_finds_the_first_segment_that_may_hold_a_later_record():
    live = [seg(1, last_time=T), seg(2, last_time=T + 10), seg(3, last_time=T + 20), seg(4, state=SegmentState.INPROGRESS)]
    assert segment_index_for_time(live, T - 1) == 0
    assert segment_index_for_time(live, T) == 0
    assert segment_index_for_time(live, T + 1) == 1
    assert segment_index_for_time(live, T + 20) == 2
    assert segment_index_for_time(live, T + 21) == 3  # only the in-progress one may
    assert segment_index_for_time(live[:3], T + 21) == 3  # none: the next segment
    # Without recorded times the completion time bounds a segment from above; keys stay sorted.
    legacy = [seg(1, completed=(T + 50) / 1000), seg(2, last_time=T + 30), seg(3, last_time=T + 60)]
    assert segment_index_for_time(legacy, T + 40) == 0  # may hold it: searched, never skipped
    assert segment_index_for_time(legacy, T + 55) == 2


def _entry(records: list[Record], totals: Record) -> bytes:
    return fmt.encode(fmt.Entry(7, 3, 0, -1, encode_records([*records, totals])))


@pytest.mark.parametrize("fast", [True, False])
def test_a_copied_entry_keeps_its_source_entrys_append_time(fast: bool):
    if fast:
        assert transform._speedups is not None  # the C loop is built where tests run
    for totals, expected in ((totals_record(2, 2, 999, T), T), (untimed_totals(2, 2, 999), None)):
        copier = EntryCopier(source_cluster="east", source_seq=3, sink_log_id=9, sink_seq=4, clock=Clock("east"), speedups=fast)
        out = list(decode_records(fmt.decode(bytes(copier.copy(_entry([Record(1, b"a"), Record(2, b"b")], totals)))).payload))
        assert [r.payload for r in out if not r.control] == [b"a", b"b"]
        assert len(out) == 3 and read_totals(out[-1])[0] == 2 and append_time(out) == expected  # rewritten totals, the time kept


def test_times_on_the_command_line_are_iso_8601_or_a_duration_ago():
    now = 1_800_000_000.0
    assert parse_time("2026-11-26T10:00Z", now) == datetime(2026, 11, 26, 10, 0, tzinfo=timezone.utc).timestamp()
    assert parse_time("2026-11-26T10:00", now) == parse_time("2026-11-26T10:00+00:00", now)  # no zone: UTC
    assert parse_time("2026-11-26T12:00+02:00", now) == parse_time("2026-11-26T10:00Z", now)
    assert parse_time("15m", now) == now - 900 and parse_time("1d2h", now) == now - 93600
    with pytest.raises(ValueError, match="invalid time 'yesterday'"):
        parse_time("yesterday", now)
    assert iso(T) == "2026-11-18T11:06:40.000Z" and iso(None) is None


def test_a_segment_record_keeps_its_times_and_leaves_them_out_when_unknown():
    timed = seg(1, last_time=T + 5, completed=1.0)
    timed = SegmentRecord(**{**timed.__dict__, "first_time": T})
    assert segment_from_json(to_json(timed), "here") == timed
    assert b"first_time" not in to_json(seg(1)) and b"last_time" not in to_json(seg(1))
    bad = to_json(timed).replace(b'"last_time":' + str(T + 5).encode(), b'"last_time":"soon"')
    with pytest.raises(ValueError, match="/x: malformed segment record: 'last_time' must be milliseconds"):
        segment_from_json(bad, "/x")
