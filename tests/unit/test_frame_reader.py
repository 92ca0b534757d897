"""dlctl.log.frame_reader: frames parsed from bytes a transport writes into the reader's buffers."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlctl.log import protocol as p
from dlctl.log.frame_reader import FrameReader

LARGE = FrameReader.LARGE_FRAME


def _deliver(reader: FrameReader, stream: bytes, steps: list[int]) -> None:
    """What a transport does: ask for a buffer, write at most its size into it, report."""
    pos, k = 0, 0
    while pos < len(stream):
        buf = reader.get_buffer(-1)
        n = min(len(buf), steps[k % len(steps)], len(stream) - pos)
        buf[:n] = stream[pos : pos + n]
        pos += n
        k += 1
        reader.received(n)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.sampled_from([0, 10, 5000, LARGE - p.FRAME_HEADER_SIZE - 1, LARGE - p.FRAME_HEADER_SIZE, 200_000, 300_000]), min_size=1, max_size=7),
    steps=st.lists(st.integers(1, 400_000), min_size=1, max_size=8),
)
def test_reader_gives_the_frames_the_decoder_gives_however_the_transport_cuts_the_stream(sizes: list[int], steps: list[int]) -> None:
    frames = [p.encode_frame(p.Op.READ_RANGE | p.RESPONSE, 0, i + 1, bytes([i]) * n) for i, n in enumerate(sizes)]
    stream = b"".join(frames)
    got: list[p.Frame] = []
    reader = FrameReader(got.append)
    _deliver(reader, stream, steps)
    assert got == p.decode_frames(stream)
    assert reader.buffered == 0
    # A small frame's body is bytes; a large one's the buffer it was received into (no copy),
    # unless it arrived whole in the small frames' buffer (then copied out once, as bytes).
    for frame, n in zip(got, sizes):
        assert type(frame.body) in ((bytes, bytearray) if p.FRAME_HEADER_SIZE + n >= LARGE else (bytes,))


def test_a_large_body_goes_into_the_buffer_lent_for_its_request_and_others_into_their_own() -> None:
    lent = bytearray(300_000)
    asked: list[tuple[int, int]] = []

    def body_for(request_id: int, size: int) -> memoryview | None:
        asked.append((request_id, size))
        return memoryview(lent)[:size] if request_id == 7 else None

    bodies = {7: b"a" * 250_000, 8: b"b" * 100_000}
    stream = b"".join(p.encode_frame(p.Op.READ_RANGE | p.RESPONSE, 0, rid, body) for rid, body in bodies.items())
    got: list[p.Frame] = []
    reader = FrameReader(got.append, body_for=body_for)
    _deliver(reader, stream, [1000, 65_536, 3])
    assert asked == [(7, 250_000), (8, 100_000)]
    assert [f.request_id for f in got] == [7, 8]
    assert type(got[0].body) is memoryview and got[0].body.obj is lent and got[0].body == bodies[7]
    assert type(got[1].body) is bytearray and got[1].body == bodies[8]


def test_the_small_frames_buffer_never_grows_and_a_frame_split_at_its_end_moves_to_its_front() -> None:
    small = p.encode_frame(p.Op.READ_LAC | p.RESPONSE, 0, 1, b"x" * 40_000)
    stream = small * 40  # ~1.6 MB of frames that each fit the buffer, cut anywhere
    got: list[p.Frame] = []
    reader = FrameReader(got.append)
    _deliver(reader, stream, [70_001, 12_345, 99_999])
    assert len(got) == 40 and all(f.body == b"x" * 40_000 for f in got)
    assert len(reader._buf) == FrameReader.BUFFER


@pytest.mark.parametrize(
    "head, message",
    [
        (p.FRAME_HEADER.pack(3, p.PROTOCOL_VERSION, 1, 0, 1), "frame length 3 outside"),
        (p.FRAME_HEADER.pack(p.MAX_FRAME, p.PROTOCOL_VERSION, 1, 0, 1), "outside"),
        (p.FRAME_HEADER.pack(12, p.PROTOCOL_VERSION + 1, 1, 0, 1), "unsupported protocol version"),
    ],
)
def test_a_bad_length_or_version_is_a_fatal_protocol_error(head: bytes, message: str) -> None:
    reader = FrameReader(lambda frame: None)
    buf = reader.get_buffer(-1)
    buf[: len(head)] = head
    with pytest.raises(p.ProtocolError, match=message) as info:
        reader.received(len(head))
    assert info.value.fatal
