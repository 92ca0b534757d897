"""Record batches inside entries, and DLSN ordering/parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlctl.log.dlsn import DLSN
from dlctl.log.records import CorruptRecords, Record, control_record, decode_records, encode_records

records = st.builds(
    Record,
    txid=st.integers(-(2**63), 2**63 - 1),
    payload=st.binary(max_size=200),
    key=st.binary(max_size=20),
    headers=st.dictionaries(st.text(max_size=10), st.binary(max_size=20), max_size=3),
    control=st.booleans(),
)


@given(st.lists(records, max_size=20))
def test_records_round_trip(batch):
    assert list(decode_records(encode_records(batch))) == batch


@given(st.lists(records, min_size=1, max_size=5), st.data())
def test_truncated_or_garbled_payloads_raise_corrupt_records_only(batch, data):
    raw = bytearray(encode_records(batch))
    cut = data.draw(st.integers(0, len(raw)))
    mutated = raw[:cut] + data.draw(st.binary(max_size=8))
    try:
        list(decode_records(bytes(mutated)))
    except CorruptRecords:
        pass


def test_encoded_size_matches():
    record = Record(5, b"payload", key=b"k", headers={"dl.origin": b"east"})
    assert record.encoded_size == len(encode_records([record]))


def test_control_records_are_flagged():
    (decoded,) = decode_records(encode_records([control_record(9)]))
    assert decoded.control and decoded.txid == 9


def test_dlsn_orders_and_parses():
    assert DLSN(1, 5, 0) < DLSN(1, 5, 1) < DLSN(2, 0, 0)
    assert DLSN.parse("3/120/7") == DLSN(3, 120, 7)
    assert str(DLSN(3, 120, 7)) == "3/120/7"
    for bad in ("", "1/2", "a/b/c", "1/2/3/4", "-1/0/0"):
        with pytest.raises(ValueError, match="SEGMENT/ENTRY/SLOT|invalid DLSN"):
            DLSN.parse(bad)
