"""The READ_RANGE op on the wire: request round trip, malformed requests (a clear error naming
the op, the request and the field), and splitting an answer into entries."""

from __future__ import annotations

import struct

import pytest

from dlctl.log import protocol as p
from dlctl.log.format import Entry, encode


def frame_of(opcode: int, body: bytes, rid: int = 7, flags: int = 0) -> p.Frame:
    (frame,) = p.decode_frames(p.encode_frame(opcode, flags, rid, body))
    return frame


def test_a_range_request_round_trips():
    (frame,) = p.decode_frames(p.read_range_request(9, 3, 4, 10, 20, 4096))
    req = p.decode_request(frame)
    assert (req.op, req.request_id, req.args) == (p.Op.READ_RANGE, 9, (3, 4, 10, 20, 4096))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "READ_RANGE body is 0 bytes, expected 36"),
        (struct.pack(">QQqq", 1, 1, 0, 5), "READ_RANGE body is 32 bytes, expected 36"),
        (struct.pack(">QQqqI", 1, 1, 0, 5, 9) + b"x", "READ_RANGE body is 37 bytes, expected 36"),
        (struct.pack(">QQqqI", 1, 1, 5, 4, 9), "READ_RANGE request 7: last entry 4 is before first entry 5"),
        (struct.pack(">QQqqI", 1, 1, 0, 4, 0), "READ_RANGE request 7: max bytes must be at least 1"),
    ],
)
def test_a_malformed_range_request_is_a_bad_request_naming_what_is_wrong(body, message):
    with pytest.raises(p.ProtocolError) as err:
        p.decode_request(frame_of(p.Op.READ_RANGE, body))
    assert message in str(err.value)
    assert not err.value.fatal  # a well-delimited frame: the connection stays usable


def test_unknown_flags_on_a_range_request_are_refused():
    with pytest.raises(p.ProtocolError, match="unknown flags 0x1 for READ_RANGE"):
        p.decode_request(frame_of(p.Op.READ_RANGE, struct.pack(">QQqqI", 1, 1, 0, 4, 9), flags=1))


def test_a_range_request_that_cannot_be_answered_is_not_sent():
    with pytest.raises(ValueError, match="needs first <= last"):
        p.read_range_request(1, 1, 1, 5, 4, 100)
    with pytest.raises(ValueError, match="max bytes"):
        p.read_range_request(1, 1, 1, 0, 4, 0)


def entries(n: int) -> list[bytes]:
    return [encode(Entry(1, 2, i, i - 1, bytes([i]) * (10 + i))) for i in range(n)]


def test_an_answer_splits_into_its_entries():
    es = entries(4)
    data = b"".join(es)
    assert [data[s:e] for s, e in p.split_entries(data)] == es
    assert p.split_entries(b"") == []


def test_an_answer_whose_entries_do_not_tile_it_is_refused_naming_the_offset():
    data = b"".join(entries(3))
    with pytest.raises(p.ProtocolError, match=r"too few for an entry header"):
        p.split_entries(data + b"\x00" * 10)
    with pytest.raises(p.ProtocolError, match=r"the entry at offset \d+ claims \d+ payload bytes"):
        p.split_entries(data[:-1])
