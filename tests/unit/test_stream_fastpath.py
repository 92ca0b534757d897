"""The stream worker's C loop over whole entries (dlctl.replication.fastpath) builds, byte for
byte, the sink records of the per-record path: each source record stamped by ``SourceClock``,
given ``applied_headers`` and encoded with the sink writer's next txid. The oracle below is that
per-record path; the vector times are also spelled out by hand for the simple case."""

from __future__ import annotations

import pytest

from dlctl.log.dlsn import DLSN
from dlctl.log.reader import WholeEntry
from dlctl.log.records import CorruptRecords, Record, control_record, decode_records, encode_records
from dlctl.replication import fastpath
from dlctl.replication.causal import SourceClock
from dlctl.replication.origin import ORIGIN_CLUSTER, ORIGIN_DLSN, VECTOR_TIME, applied_headers

SEQ, ENTRY = 3, 17


def entry(*records: Record) -> WholeEntry:
    return WholeEntry(SEQ, ENTRY, encode_records(list(records)))


def per_record(source: WholeEntry, clock: SourceClock, first_txid: int, from_slot: int = 0) -> list[Record]:
    """What the worker's per-record path appends for the entry's data records from ``from_slot``."""
    out = []
    txid = first_txid
    for slot, record in enumerate(decode_records(source.payload)):
        if slot < from_slot or record.control:
            continue
        dlsn = DLSN(source.seq, source.entry_id, slot)
        vt = clock.stamp(None, dlsn)
        out.append(Record(txid, record.payload, record.key, applied_headers(record.headers, None, b"a", str(dlsn).encode(), vt)))
        txid += 1
    return out


def pieces(source: WholeEntry, clock: SourceClock, first_txid: int, limit: int = 1 << 20) -> tuple[list[fastpath.Piece], int, int]:
    """Every piece of the entry (pos, slot where the C loop left it)."""
    loop = fastpath.LocalEntries("a", limit)
    got, pos, slot, txid = [], 0, 0, first_txid
    while pos < len(source.payload):
        piece = loop.piece(source, pos, slot, clock, txid)
        if piece is None:
            break
        got.append(piece)
        pos, slot, txid = piece.next_pos, piece.next_slot, txid + piece.count
    return got, pos, slot


def test_local_records_get_the_headers_txids_and_times_of_the_per_record_path():
    source = entry(
        Record(5, b"first"), Record(6, b"keyed", key=b"k1"), Record(7, b""), control_record(7), Record(9, b"x" * 300), control_record(9),
    )
    got, pos, slot = pieces(source, SourceClock("a", {"a": 41, "b": 7, "z": 2}), first_txid=1000)
    assert pos == len(source.payload) and slot == 6
    [piece] = got
    expected = per_record(source, SourceClock("a", {"a": 41, "b": 7, "z": 2}), first_txid=1000)
    assert piece.encoded == encode_records(expected)
    assert piece.count == 4 and piece.first_txid == 1000 and piece.payload_bytes == 5 + 5 + 0 + 300
    assert piece.last == DLSN(SEQ, ENTRY, 4)  # the last data record (the control records are not the sink's)
    # Spelled out: the own counter counts up past 41, the other components stay in name order.
    decoded = list(decode_records(piece.encoded))
    assert [r.txid for r in decoded] == [1000, 1001, 1002, 1003]
    assert [r.headers[VECTOR_TIME] for r in decoded] == [b"a=42,b=7,z=2", b"a=43,b=7,z=2", b"a=44,b=7,z=2", b"a=45,b=7,z=2"]
    assert [r.headers[ORIGIN_DLSN] for r in decoded] == [b"3/17/0", b"3/17/1", b"3/17/2", b"3/17/4"]
    assert all(list(r.headers) == [ORIGIN_CLUSTER, ORIGIN_DLSN, VECTOR_TIME] and r.headers[ORIGIN_CLUSTER] == b"a" for r in decoded)
    assert decoded[1].key == b"k1"


def test_the_clock_is_advanced_as_stamping_each_record_would():
    clock, oracle = SourceClock("b", {"a": 3, "c": 9}), SourceClock("b", {"a": 3, "c": 9})
    source = entry(*(Record(i, b"r%d" % i) for i in range(1, 12)))
    pieces(source, clock, first_txid=1)
    per_record(source, oracle, first_txid=1)
    assert clock.vv == oracle.vv == {"a": 3, "b": 11, "c": 9}


def test_a_piece_stops_before_the_record_that_would_pass_the_limit_and_the_next_goes_on_there():
    records = [Record(i, b"p" * 100) for i in range(1, 41)]
    source = entry(*records, control_record(40))
    expected = per_record(source, SourceClock("a"), first_txid=1)
    sizes = [len(encode_records([r])) for r in expected]  # (they grow: slot and counter get digits)
    limit = 10 * sizes[0] + 5
    splits, run = [], 0  # greedy, by hand: as many records as fit
    for size in sizes:
        if run and run + size > limit:
            splits.append(run)
            run = 0
        run += size
    splits.append(run)
    got, pos, slot = pieces(source, SourceClock("a"), first_txid=1, limit=limit)
    assert [len(p.encoded) for p in got] == splits and len(got) > 3
    assert pos == len(source.payload) and slot == 41
    assert b"".join(p.encoded for p in got) == encode_records(expected)
    assert [p.first_txid for p in got] == [1 + sum(p.count for p in got[:i]) for i in range(len(got))]
    # A record larger than the limit still goes (alone): a piece is never empty.
    big = entry(Record(1, b"b" * 500))
    [piece], _, _ = pieces(big, SourceClock("a"), first_txid=1, limit=10)
    assert piece.count == 1


def test_records_with_headers_leave_the_rest_of_the_entry_to_the_per_record_path():
    relayed = Record(3, b"from-z", headers={ORIGIN_CLUSTER: b"z", ORIGIN_DLSN: b"1/0/0", VECTOR_TIME: b"z=1"})
    source = entry(Record(1, b"p1"), Record(2, b"p2"), relayed, Record(4, b"p4"))
    loop = fastpath.LocalEntries("a", 1 << 20)
    clock = SourceClock("a", {"a": 5})
    # From the start: the entry holds a record with headers, so nothing of it is built in C.
    assert loop.piece(source, 0, 0, clock, 1) is None
    assert clock.vv == {"a": 5}  # and the clock is untouched
    # From the record after it on, the rest is local records again.
    after = len(encode_records([Record(1, b"p1"), Record(2, b"p2"), relayed]))
    piece = loop.piece(source, after, 3, clock, 1)
    assert piece is not None and piece.count == 1 and piece.last == DLSN(SEQ, ENTRY, 3)
    assert piece.encoded == encode_records(per_record(source, SourceClock("a", {"a": 5}), 1, from_slot=3))


def test_a_clock_step_or_settled_components_in_range_leave_it_to_the_per_record_path():
    source = entry(Record(1, b"p"))
    loop = fastpath.LocalEntries("a", 1 << 20)
    stepped = SourceClock("a", {"a": 1}, base=[(DLSN(SEQ, ENTRY, 0), {"b": 4})], start=DLSN(1, 0, 0))
    assert loop.piece(source, 0, 0, stepped, 1) is None
    later = SourceClock("a", {"a": 1}, base=[(DLSN(SEQ, ENTRY + 1, 0), {"b": 4})], start=DLSN(1, 0, 0))
    assert loop.piece(source, 0, 0, later, 1) is not None  # a step after the entry does not matter
    settled = SourceClock("a", {"a": 1, "x": 3}, settled={"x": 3})
    assert loop.piece(source, 0, 0, settled, 1) is None


def test_a_broken_layout_is_corrupt_records_naming_the_entry():
    good = encode_records([Record(1, b"ok")])
    broken = WholeEntry(SEQ, ENTRY, good + b"\x00\x00\x10\x00garbage")
    with pytest.raises(CorruptRecords, match=f"entry {ENTRY} of segment {SEQ}"):
        fastpath.LocalEntries("a", 1 << 20).piece(broken, 0, 0, SourceClock("a"), 1)
