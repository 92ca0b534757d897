"""PULL_RANGE on the wire: the request (ids, byte cap, the source node id) round trips, a
malformed one is a bad request naming the field, and the answer (count, bytes, reason, CRCs)
decodes only when its parts add up."""

from __future__ import annotations

import struct

import pytest

from dlctl.log import protocol as p


def frame_of(body: bytes, flags: int = 0) -> p.Frame:
    (frame,) = p.decode_frames(p.encode_frame(p.Op.PULL_RANGE, flags, 7, body))
    return frame


def body_of(log_id: int, seg: int, first: int, last: int, cap: int, source: bytes) -> bytes:
    return struct.pack(">QQqqI", log_id, seg, first, last, cap) + struct.pack(">H", len(source)) + source


def test_a_pull_request_round_trips_with_its_source_and_flag():
    for uncached in (True, False):
        (frame,) = p.decode_frames(p.pull_range_request(9, 3, 4, 10, 20, 4096, "node-é", uncached))
        req = p.decode_request(frame)
        assert (req.op, req.request_id, req.args) == (p.Op.PULL_RANGE, 9, (3, 4, 10, 20, 4096, "node-é"))
        assert bool(req.flags & p.FLAG_UNCACHED) is uncached


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "PULL_RANGE body of 0 bytes is shorter than 36"),
        (struct.pack(">QQqqI", 1, 1, 0, 5, 9), "PULL_RANGE body of 36 bytes has no source node id"),
        (body_of(1, 1, 0, 5, 9, b""), "PULL_RANGE source node id of 0 bytes overruns the body or is out of range"),
        (body_of(1, 1, 0, 5, 9, b"ab")[:-1], "PULL_RANGE source node id of 2 bytes overruns the body"),
        (body_of(1, 1, 0, 5, 9, b"\xff\xfe"), "PULL_RANGE source node id is not UTF-8"),
        (body_of(1, 1, 0, 5, 9, b"a") + b"x", "PULL_RANGE body has 1 bytes after the source node id"),
        (body_of(1, 1, 5, 4, 9, b"a"), "PULL_RANGE request 7: entries 5..4 (needs 0 <= first <= last)"),
        (body_of(1, 1, -1, 4, 9, b"a"), "PULL_RANGE request 7: entries -1..4"),
        (body_of(1, 1, 0, 4, 0, b"a"), "PULL_RANGE request 7: max bytes must be at least 1"),
    ],
)
def test_a_malformed_pull_request_is_a_bad_request_naming_what_is_wrong(body, message):
    with pytest.raises(p.ProtocolError) as err:
        p.decode_request(frame_of(body))
    assert message in str(err.value)
    assert not err.value.fatal  # a well-delimited frame: the connection stays usable


def test_a_pull_request_with_the_recovery_flag_is_refused():
    with pytest.raises(p.ProtocolError, match="unknown flags 0x1 for PULL_RANGE"):
        p.decode_request(frame_of(body_of(1, 1, 0, 5, 9, b"a"), flags=p.FLAG_RECOVERY))


def test_a_pull_request_that_cannot_be_answered_is_not_sent():
    with pytest.raises(ValueError, match="needs first <= last"):
        p.pull_range_request(1, 1, 1, 5, 4, 10, "a")
    with pytest.raises(ValueError, match="source node id of 0 bytes"):
        p.pull_range_request(1, 1, 1, 0, 4, 10, "")
    with pytest.raises(ValueError, match="source node id of 256 bytes"):
        p.pull_range_request(1, 1, 1, 0, 4, 10, "n" * 256)


def test_a_pull_answer_round_trips_and_a_torn_one_is_refused():
    crcs = (1, 2**32 - 1, 77)
    encoded = p.encode_pulled(3, 4000, "source b: NoSuchEntryError (at entry 3)", crcs)
    assert p.decode_pulled(encoded) == p.PullResult(3, 4000, "source b: NoSuchEntryError (at entry 3)", crcs)
    assert p.decode_pulled(p.encode_pulled(0, 0, "", ())) == p.PullResult(0, 0, "", ())
    for torn in (encoded[:-1], encoded + b"\0", encoded[:10]):
        with pytest.raises(p.ProtocolError, match="PULL_RANGE result"):
            p.decode_pulled(torn)
    with pytest.raises(ValueError, match="2 CRCs for 3 entries"):
        p.encode_pulled(3, 10, "", (1, 2))
