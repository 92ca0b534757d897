"""The bulk-copy ops on the wire: READ_RANGE (request round trip, malformed requests with a
clear error naming the op, the request and the field, splitting an answer into entries) and
ADD_BATCH (a body of entries back to back: round trip, bounds, malformed bodies)."""

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


# -- ADD_BATCH ---------------------------------------------------------------------------------


def test_a_batch_request_round_trips_with_its_flags_and_entries():
    es = entries(5)
    for recovery, uncached in ((False, False), (True, False), (True, True)):
        # Buffers of one entry or of several back to back (slices of a READ_RANGE answer).
        parts = [es[0], memoryview(b"".join(es[1:4])), es[4]]
        (frame,) = p.decode_frames(p.add_batch_request(11, parts, recovery, uncached))
        req = p.decode_request(frame)
        assert (req.op, req.flags, req.request_id) == (p.Op.ADD_BATCH, (p.FLAG_RECOVERY if recovery else 0) | (p.FLAG_UNCACHED if uncached else 0), 11)
        body, spans = req.args
        assert body == b"".join(es) and [body[a:b] for a, b in spans] == es


def test_a_large_batch_is_sent_as_its_buffers_not_copied_into_the_frame():
    big = [encode(Entry(1, 2, i, i - 1, bytes([i]) * 40_000)) for i in range(3)]
    view = memoryview(b"".join(big))
    out = p.add_batch_request_parts(5, [view], True, True)
    assert isinstance(out, tuple) and out[1] is view and len(out) == 2
    (frame,) = p.decode_frames(p.outgoing_bytes(out))
    assert p.decode_request(frame).args[0] == bytes(view)
    small = p.add_batch_request_parts(6, entries(2))
    assert isinstance(small, bytes) and p.decode_request(p.decode_frames(small)[0]).args[1] == p.split_entries(b"".join(entries(2)))


def test_a_batch_that_cannot_be_sent_is_not():
    with pytest.raises(ValueError, match="must be 1.."):
        p.add_batch_request(1, [])
    with pytest.raises(ValueError, match="a larger entry travels by ADD_ENTRY"):
        p.add_batch_request(1, [b"\x00" * (p.MAX_BATCH_BYTES + 1)])
    assert p.MAX_BATCH_BYTES + p.FRAME_HEADER_SIZE <= p.MAX_FRAME  # a full batch fits a frame


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", r"ADD_BATCH request 7: a body of 0 bytes, must be 48..\d+ \(at least one entry"),
        (b"x" * 47, r"a body of 47 bytes"),
        (b"".join(entries(3))[:-1], r"ADD_BATCH request 7: ADD_BATCH body: the entry at offset \d+ claims \d+ payload bytes, \d+ remain \(entry 2 of the body\); nothing stored"),
        (b"".join(entries(2)) + b"\x00" * 20, r"20 bytes at offset \d+ are too few for an entry header \(entry 2 of the body\)"),
        (b"\x00" * (p.MAX_BATCH_BYTES + 1), r"a body of \d+ bytes, must be 48..8388608"),
    ],
)
def test_a_malformed_batch_is_a_bad_request_naming_what_is_wrong(body, message):
    with pytest.raises(p.ProtocolError, match=message) as err:
        p.decode_request(frame_of(p.Op.ADD_BATCH, body))
    assert not err.value.fatal  # a well-delimited frame: the connection stays usable


def test_unknown_flags_on_a_batch_are_refused():
    with pytest.raises(p.ProtocolError, match="unknown flags 0x4 for ADD_BATCH"):
        p.decode_request(frame_of(p.Op.ADD_BATCH, b"".join(entries(1)), flags=0x4))


def test_a_batch_answer_says_how_many_entries_it_stored():
    (frame,) = p.decode_frames(p.ok_response(p.Op.ADD_BATCH, 3, p.encode_added(17)))
    assert frame.op == p.Op.ADD_BATCH and p.decode_added(p.decode_response(frame)) == 17
    with pytest.raises(p.ProtocolError, match="ADD_BATCH result body is 2 bytes"):
        p.decode_added(b"\x00\x01")
