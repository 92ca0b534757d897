"""Pure decisions of the bootstrap copy: what is copied, where the stream continues, sink
numbering and batching, vector clocks, resumability, verification, the re-encoding of entries."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlctl.errors import RefusedError, UsageError
from dlctl.log import format as fmt
from dlctl.log.dlsn import DLSN
from dlctl.log.records import Record, decode_records, encode_records
from dlctl.log.recovery import entry_summary, totals_record
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.placement import PlacementPolicy
from dlctl.replication.causal import SourceClock
from dlctl.replication.origin import SOURCE_POSITION, Origin, decode_source_position
from dlctl.spark import plan as P
from dlctl.spark.credentials import SecretRef, secure_spark_conf_problems
from dlctl.spark.engine import EngineOptions, parse_conf
from dlctl.log.records import CorruptRecords
from dlctl.spark import segment_read as R
from dlctl.spark.transform import Clock, ClockEffect, ClockScanner, ContentDigest, EntryCopier, content_digest


def seg(seq: int, state: SegmentState = SegmentState.COMPLETED, last: int = 9, records: int = 10, nbytes: int = 1000, min_active: int = 0) -> SegmentRecord:
    return SegmentRecord(seq, state, (EnsembleChange(0, ("a", "b", "c")),), 3, 2, 0.0, last_entry_id=last, first_txid=seq * 100, last_txid=seq * 100 + records - 1, records=records, bytes=nbytes, min_active_entry=min_active)


# -- selection and the snapshot point -------------------------------------------------------------


def test_selection_copies_completed_segments_up_to_the_first_in_progress_one_and_continues_there():
    segs = [seg(3, SegmentState.TRUNCATED), seg(4, SegmentState.PARTIALLY_TRUNCATED, min_active=5), seg(5), seg(6, last=-1, records=0), seg(7, SegmentState.INPROGRESS)]
    sel = P.select(segs, 7)
    assert [s.seq for s in sel.copy] == [4, 5]
    assert sel.skipped_empty == (6,)
    assert sel.first == DLSN(4, 5, 0)
    assert sel.snapshot == DLSN(7, 0, 0)  # the in-progress segment is where the stream picks up
    assert "in progress" in sel.reason


def test_selection_of_a_log_without_completed_segments_copies_nothing_and_streams_from_its_start():
    assert P.select([], 0).snapshot == DLSN(1, 0, 0)
    assert P.select([], 9).snapshot == DLSN(10, 0, 0)
    sel = P.select([seg(2, SegmentState.INPROGRESS, min_active=3)], 2)
    assert sel.copy == () and sel.snapshot == DLSN(2, 3, 0) and sel.first is None


def test_sink_numbers_follow_the_highest_allocated_one():
    assert P.assign(3, 0) == [1, 2, 3]
    assert P.assign(2, 41) == [42, 43]


def test_a_sink_log_with_an_owner_or_an_in_progress_segment_blocks_the_copy_and_says_why():
    assert P.sink_blockers(owner=None, segments=[seg(1)]) == []
    reasons = P.sink_blockers(owner="agent-3", segments=[seg(1), seg(2, SegmentState.INPROGRESS)])
    assert len(reasons) == 2
    assert "owner (agent-3)" in reasons[0] and "pause the stream" in reasons[0]
    assert "segment 2 is in progress" in reasons[1] and "recover log" in reasons[1]


def task_for(source: SegmentRecord, sink_seq: int, start_vv: dict | None = None) -> P.SegmentTask:
    return P.SegmentTask("l", "east", 7, source, "west", 9, sink_seq, PlacementPolicy(), dict(start_vv or {}), True)


def test_batches_group_consecutive_segments_of_one_log_and_bound_size_and_count():
    tasks = [task_for(seg(i, nbytes=10), i) for i in range(1, 21)]
    groups = P.batches(tasks, slots=2, per_slot=2)
    assert [t for g in groups for t in g] == tasks  # every task once, in order
    assert max(len(g) for g in groups) == 5 and len(groups) == 4
    big = [task_for(seg(i, nbytes=100), i) for i in range(1, 5)]
    assert [len(g) for g in P.batches(big, slots=1, per_slot=1, max_bytes=250)] == [2, 2]
    mixed = tasks[:2] + [P.SegmentTask("m", "east", 8, seg(1), "west", 10, 1, PlacementPolicy(), {}, True)]
    assert [len(g) for g in P.batches(mixed, slots=1, per_slot=1)] == [2, 1]  # never two logs in one task


# -- vector clocks ---------------------------------------------------------------------------------


def test_start_vectors_of_local_segments_count_the_records_before_them():
    effects = [P.local_effect(seg(1, records=10)), P.local_effect(seg(2, records=5)), P.local_effect(seg(3, records=7))]
    assert P.start_vectors("east", effects) == [{}, {"east": 10}, {"east": 15}]


events = st.lists(
    st.one_of(st.just(None), st.dictionaries(st.sampled_from(["east", "west", "north"]), st.integers(0, 50), max_size=3)),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(events, st.integers(1, 5))
def test_clock_effects_folded_per_segment_give_the_same_clocks_as_reading_the_whole_log(log_events, parts):
    """SourceClock over the whole log == per-segment ClockEffects composed, then a Clock per segment."""
    whole = SourceClock("east")
    expected = [whole.stamp(None if vt is None else Origin("west", DLSN(1, 0, 0), vt)) for vt in log_events]
    size = max(1, len(log_events) // parts)
    chunks = [log_events[i : i + size] for i in range(0, len(log_events), size)] or [[]]
    effects = []
    for chunk in chunks:
        effect = ClockEffect()
        for vt in chunk:
            effect = effect.then(ClockEffect(1) if vt is None else ClockEffect(0, vt.get("east", 0), {k: v for k, v in vt.items() if k != "east"}))
        effects.append(effect)
    got = []
    for chunk, start in zip(chunks, P.start_vectors("east", effects)):
        clock = Clock("east", start)
        for vt in chunk:
            if vt is None:
                stamp = clock.stamp_local()
                got.append({k: int(v) for k, v in (p.split("=") for p in stamp.decode().split(","))})
            else:
                clock.stamp_replicated(vt)
                got.append(vt)
    assert [{k: v for k, v in e.items() if v > 0} for e in expected] == [{k: v for k, v in g.items() if v > 0} for g in got]


# -- re-encoding entries ----------------------------------------------------------------------------


def entry(seq: int, entry_id: int, records: list[Record], control: bool = False) -> bytes:
    body = encode_records(records + [totals_record(records[-1].txid if records else 0, 99, 12345)])
    return fmt.encode(fmt.Entry(7, seq, entry_id, entry_id - 1, body, fmt.FLAG_CONTROL if control else 0))


def test_copied_entries_keep_ids_slots_and_contents_and_carry_each_records_origin():
    records = [Record(10, b"a" * 100), Record(11, b"b", key=b"k", headers={"app": b"v"}), Record(12, b"")]
    copier = EntryCopier(source_cluster="east", source_seq=4, sink_log_id=9, sink_seq=17, clock=Clock("east", {"east": 5}))
    out = fmt.decode(copier.copy(entry(4, 3, records)))
    assert (out.log_id, out.segment_seq, out.entry_id, out.lac) == (9, 17, 3, 2)
    copied = list(decode_records(out.payload))
    for slot, (src, rec) in enumerate(zip(records, copied)):
        assert (rec.txid, rec.payload, rec.key) == (src.txid, src.payload, src.key)
        assert {k: v for k, v in rec.headers.items() if not k.startswith("dl.")} == dict(src.headers)
        origin = Origin.from_headers(rec.headers)
        assert origin == Origin("east", DLSN(4, 3, slot), {"east": 6 + slot})
        assert decode_source_position(rec.headers) == ("east", DLSN(4, 3, slot))
    # The totals record at the end now tells the sink segment's own numbers.
    summary = entry_summary(copier.copy(entry(4, 4, [Record(13, b"x")])))
    assert summary is not None and summary.records == 4 and summary.bytes == copier.stats.sink_bytes
    assert copier.stats.records == 4 and copier.stats.local_records == 4 and copier.stats.last_data_slot == (4, 0)


def test_a_record_replicated_into_the_source_keeps_its_origin_and_advances_the_clock():
    relayed = Record(20, b"p", headers={**Origin("north", DLSN(8, 1, 2), {"north": 7}).headers(), SOURCE_POSITION: b"north@8/1/2"})
    copier = EntryCopier(source_cluster="east", source_seq=1, sink_log_id=9, sink_seq=1, clock=Clock("east", {"east": 3}))
    first, second = list(decode_records(fmt.decode(copier.copy(entry(1, 0, [relayed, Record(21, b"q")]))).payload))[:2]
    assert Origin.from_headers(first.headers) == Origin("north", DLSN(8, 1, 2), {"north": 7})
    assert decode_source_position(first.headers) == ("east", DLSN(1, 0, 0))  # the relay's position is replaced
    assert Origin.from_headers(second.headers).vt == {"east": 4, "north": 7}
    assert copier.stats.local_records == 1


def test_control_entries_are_kept_in_place():
    copier = EntryCopier(source_cluster="east", source_seq=1, sink_log_id=9, sink_seq=2, clock=Clock("east"))
    out = fmt.decode(copier.copy(fmt.encode(fmt.Entry(7, 1, 5, 4, encode_records([totals_record(3, 4, 500)]), fmt.FLAG_CONTROL))))
    assert out.is_control and out.entry_id == 5
    assert [r.control for r in decode_records(out.payload)] == [True]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=300), st.binary(max_size=8), st.dictionaries(st.text("abcxyz", min_size=1, max_size=5), st.binary(max_size=10), max_size=3)), min_size=1, max_size=20))
def test_the_content_digest_of_a_copy_equals_the_sources_and_changes_with_any_payload_bit(items):
    records = [Record(i, payload, key, headers) for i, (payload, key, headers) in enumerate(items)]
    source = entry(1, 0, records)
    copier = EntryCopier(source_cluster="east", source_seq=1, sink_log_id=2, sink_seq=3, clock=Clock("east"))
    sink = copier.copy(source)
    src_digest, sink_digest = ContentDigest(), ContentDigest()
    src_digest.add_entry(source)
    sink_digest.add_entry(sink)
    assert src_digest.hexdigest() == sink_digest.hexdigest() and src_digest.records == len(records)
    flipped = [Record(r.txid, bytes([r.payload[0] ^ 1]) + r.payload[1:] if r.payload else b"!", r.key, r.headers) for r in records[:1]] + records[1:]
    assert content_digest([fmt.decode(entry(1, 0, flipped)).payload]) != src_digest.hexdigest()


_RECORDS = st.lists(
    st.one_of(
        st.builds(lambda p, i: Record(i, p), st.binary(max_size=200), st.integers(0, 1000)),  # what writers write: the fast path
        st.builds(lambda p, k, h: Record(5, p, k, h), st.binary(max_size=50), st.binary(max_size=8), st.dictionaries(st.sampled_from(["app", "x", "dl.own"]), st.binary(max_size=10), max_size=3)),
        st.builds(lambda vt: Record(7, b"r", headers={**Origin("north", DLSN(8, 1, 2), vt).headers(), SOURCE_POSITION: b"north@8/1/2"}), st.dictionaries(st.sampled_from(["north", "west", "east"]), st.integers(1, 50), min_size=1)),
        st.just(Record(9, b"c", control=True)),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_RECORDS, min_size=1, max_size=4), st.dictionaries(st.sampled_from(["east", "north", "a", "z"]), st.integers(0, 9)))
def test_every_record_keeps_its_content_and_gets_its_source_position_and_the_clock_a_stream_gives_it(entries, vv0):
    """The copy against a straightforward model: decode every sink record and compare it with
    its source record, a stream's ``SourceClock`` stamping the same records in order."""
    copier = EntryCopier(source_cluster="east", source_seq=3, sink_log_id=9, sink_seq=4, clock=Clock("east", vv0))
    model = SourceClock("east", vv0)
    for e, records in enumerate(entries):
        sink = fmt.decode(copier.copy(entry(3, e, records)))
        assert (sink.log_id, sink.segment_seq, sink.entry_id) == (9, 4, e)
        out = list(decode_records(sink.payload))
        assert len(out) == len(records) + 1 and out[-1].control  # + the writer's totals, rewritten
        for slot, (src, got) in enumerate(zip(records, out)):
            assert (got.txid, got.key, got.payload, got.control) == (src.txid, src.key, src.payload, src.control)
            if src.control:
                assert got.headers == src.headers
                continue
            assert {k: v for k, v in got.headers.items() if not k.startswith("dl.")} == {k: v for k, v in src.headers.items() if not k.startswith("dl.")}
            assert decode_source_position(got.headers) == ("east", DLSN(3, e, slot))
            origin = Origin.from_headers(src.headers)
            vt = {k: v for k, v in model.stamp(origin).items() if v > 0}  # as encoded: no zero counters
            assert Origin.from_headers(got.headers) == (origin or Origin("east", DLSN(3, e, slot), vt))
    assert copier.clock.vv == model.vv


@settings(max_examples=100, deadline=None)
@given(_RECORDS, st.binary(max_size=30), st.binary(max_size=30))
def test_an_entry_is_copied_and_digested_alike_wherever_it_lies_in_a_buffer(records, before, after):
    source = entry(1, 0, records)
    alone = EntryCopier(source_cluster="east", source_seq=1, sink_log_id=2, sink_seq=3, clock=Clock("east"))
    inside = EntryCopier(source_cluster="east", source_seq=1, sink_log_id=2, sink_seq=3, clock=Clock("east"))
    assert inside.copy(before + source + after, len(before)) == alone.copy(source)
    a, b = ContentDigest(), ContentDigest()
    a.add_entry(source)
    b.add_entry(before + source + after, len(before))
    assert a.hexdigest() == b.hexdigest() and a.records == b.records


def test_a_digest_names_the_first_entry_whose_content_differs():
    good = [entry(1, i, [Record(i, bytes([i]) * 10)]) for i in range(4)]
    bad = good[:2] + [entry(1, 2, [Record(2, b"\x02" * 9 + b"!")])] + good[3:]
    a, b = ContentDigest(), ContentDigest()
    for x, y in zip(good, bad):
        a.add_entry(x)
        b.add_entry(y)
    assert a.hexdigest() != b.hexdigest() and a.first_difference(b) == 2 and a.first_difference(a) is None
    short = ContentDigest()
    short.add_entry(good[0])
    assert a.first_difference(short) == 1
    problem = P.verification_problem(good_result(sink_digest="e", content_differs_at_entry=7))
    assert "first at entry 7" in problem


def _overrun_header_value() -> bytes:
    raw = bytearray(encode_records([Record(1, b"abc", headers={"dl.vt": b"east=1"})]))
    raw[24:28] = b"\xff\xff\xff\xff"  # the header's value length: far past the record's end
    return bytes(raw)


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        (encode_records([Record(1, b"abc")])[:-1], "record at byte 0 claims"),  # the last record overruns the entry
        (encode_records([Record(1, b"abc")]) + b"\x00\x00", "truncated record header at byte 20"),
        (_overrun_header_value(), "record at byte 0: header (value )?overruns the record"),
    ],
)
def test_records_that_do_not_parse_are_refused_naming_the_byte_by_the_copy_and_by_the_digest(payload, where):
    bad = fmt.encode(fmt.Entry(7, 1, 0, -1, payload))
    with pytest.raises(CorruptRecords, match=where):
        ContentDigest().add_entry(bad)
    with pytest.raises(CorruptRecords, match=where):
        EntryCopier(source_cluster="east", source_seq=1, sink_log_id=2, sink_seq=3, clock=Clock("east")).copy(bad)


def test_ranges_cover_the_segment_in_pieces_of_about_the_target_size_never_across_an_ensemble_change():
    s = SegmentRecord(5, SegmentState.COMPLETED, (EnsembleChange(0, ("a", "b", "c")), EnsembleChange(10, ("a", "b", "d"))), 3, 2, 0.0, last_entry_id=24, records=25, bytes=25 * 1000)
    ranges = R._ranges(s, 0, 24, 4000)
    assert ranges == [(0, 3), (4, 7), (8, 9), (10, 13), (14, 17), (18, 21), (22, 24)]
    assert R._ranges(s, 22, 24, 10**9) == [(22, 24)]
    assert R._whole_ensembles(s)
    assert not R._whole_ensembles(SegmentRecord(5, SegmentState.COMPLETED, (EnsembleChange(0, ("a", "b", "c")),), 2, 2, 0.0, last_entry_id=3))


def test_the_clock_scanner_summarises_a_segment_as_a_clock_effect():
    relayed = Record(1, b"r", headers=Origin("west", DLSN(1, 0, 0), {"west": 4, "east": 9}).headers())
    scanner = ClockScanner("east")
    scanner.add_entry(entry(1, 0, [Record(0, b"a"), relayed, Record(2, b"b")]))
    vv = scanner.effect.apply("east", {"east": 2})
    clock = SourceClock("east", {"east": 2})
    for origin in (None, Origin.from_headers(relayed.headers), None):
        clock.stamp(origin)
    assert vv == clock.vv and scanner.replicated == 1


# -- results and resuming ---------------------------------------------------------------------------


def good_result(**changes) -> dict:
    base = {"log": "l", "source_seq": 4, "source_digest": "d", "sink_digest": "d", "records": 3, "source_records": 3, "ensemble": ["a", "b"], "replica_check": {"a": "ok", "b": "ok"}}
    return {**base, **changes}


def test_a_result_is_verified_only_when_digests_counts_and_every_replica_agree():
    assert P.verification_problem(good_result()) is None
    assert "digest" in P.verification_problem(good_result(sink_digest="e"))
    assert "records" in P.verification_problem(good_result(records=2))
    assert "b: holds" in P.verification_problem(good_result(replica_check={"a": "ok", "b": "holds 2 entries"}))
    assert "not every member" in P.verification_problem(good_result(replica_check={"a": "ok"}))
    assert "segment 4 of log 'l': boom" == P.verification_problem(good_result(error="boom"))


def test_earlier_verified_copies_are_reused_only_for_the_same_segment_number_and_clock():
    task = task_for(seg(4), 17, {"east": 10})
    progress = P.LogProgress(9, (17, 18), 3, verified={4: {"sink_seq": 17, "last_entry": 9, "first_entry": 0, "start_vv": {"east": 10}}})
    assert P.reusable(progress, [task]) == {4: progress.verified[4]}
    assert P.reusable(progress, [task_for(seg(4), 18, {"east": 10})]) == {}
    assert P.reusable(progress, [task_for(seg(4), 17, {"east": 11})]) == {}
    assert P.reusable(progress, [task_for(seg(4, last=10), 17, {"east": 10})]) == {}
    assert P.LogProgress.from_dict(progress.to_dict()) == progress


def test_a_reservation_is_kept_only_while_the_sink_log_is_untouched():
    progress = P.LogProgress(9, (5, 7), 12)
    assert P.reservation_still_ours(progress, sink_log_id=9, log_version=12, max_segment_seq=7, count=3, first_seq=5)
    assert not P.reservation_still_ours(progress, sink_log_id=9, log_version=13, max_segment_seq=8, count=3, first_seq=5)
    assert not P.reservation_still_ours(progress, sink_log_id=10, log_version=12, max_segment_seq=7, count=3, first_seq=5)
    assert not P.reservation_still_ours(progress, sink_log_id=9, log_version=12, max_segment_seq=7, count=4, first_seq=5)


def test_sink_segments_are_completed_on_the_copys_ensemble_with_its_numbers():
    result = {"ensemble": ["x", "y", "z"], "first_txid": 400, "last_txid": 409, "records": 10, "sink_bytes": 2222}
    out = P.sink_segment(seg(4, min_active=2), 17, result, write_quorum=3, ack_quorum=2, writer="bootstrap:h", now=5.0)
    assert (out.seq, out.state, out.ensembles[0].nodes, out.last_entry_id, out.min_active_entry) == (17, SegmentState.PARTIALLY_TRUNCATED, ("x", "y", "z"), 9, 2)
    assert (out.records, out.bytes, out.first_txid, out.last_txid, out.completed) == (10, 2222, 400, 409, 5.0)


# -- Spark settings and secrets ----------------------------------------------------------------------


def test_spark_settings_pass_through_but_secrets_on_the_command_line_are_refused():
    assert parse_conf(["spark.executor.memory=2g", "spark.network.crypto.enabled=true"]) == {"spark.executor.memory": "2g", "spark.network.crypto.enabled": "true"}
    with pytest.raises(RefusedError, match="must not be passed on the command line") as refused:
        parse_conf(["spark.authenticate.secret=hunter2"])
    assert "spark-defaults.conf" in (refused.value.hint or "") and "hunter2" not in str(refused.value)
    with pytest.raises(UsageError):
        parse_conf(["executor.memory=2g"])
    assert secure_spark_conf_problems({"spark.authenticate": "true"}) == ["spark.network.crypto.enabled=true", "spark.io.encryption.enabled=true"]
    assert EngineOptions(parallelism=3).effective_master == "local[3]" and EngineOptions().effective_master == "local[*]"
    assert not EngineOptions(master="spark://h:7077").local


def test_a_secret_reference_never_shows_the_secret(tmp_path):
    path = tmp_path / "s"
    path.write_bytes(b"top-secret-value")
    os.chmod(path, 0o600)
    ref = SecretRef(path=path, label="east")
    assert ref.get() == b"top-secret-value"
    assert "top-secret" not in repr(ref) and "top-secret" not in str(ref)
    import pickle

    assert pickle.loads(pickle.dumps(ref)).get() == b"top-secret-value"
    assert b"top-secret" not in pickle.dumps(ref)  # a path travels to executors, not the secret


def test_a_range_read_from_an_agent_without_read_range_falls_back_to_reading_its_first_entry():
    import asyncio

    from dlctl.log.errors import BadRequestError

    class OldAgent:  # what an agent from before READ_RANGE answers
        async def read_range(self, *args, **options):
            raise BadRequestError("unknown opcode 13 in request 4")

        async def read(self, log_id, seq, entry_id):
            return b"entry %d" % entry_id

    class Pool:
        nodes = {"a": {}, "b": {}, "c": {}}

        async def client(self, node):
            return OldAgent()

    s = SegmentRecord(5, SegmentState.COMPLETED, (EnsembleChange(0, ("a", "b", "c")),), 3, 2, 0.0, last_entry_id=9)
    reader = R.RangeReader(Pool())
    reader.ends[4] = 9
    assert asyncio.run(reader.read(7, s, 4)) == (b"entry 4", [(0, 7)])
    assert reader.stats.replica_failures == 0
