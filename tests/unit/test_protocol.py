"""Unit tests of the agent wire codec (dlctl.log.protocol) and the handshake (dlctl.log.auth)."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlctl.errors import ConfigError
from dlctl.log import auth
from dlctl.log import protocol as p
from dlctl.log.errors import (
    AgentError,
    BadRequestError,
    FencedError,
    LimboError,
    NoSuchEntryError,
    NotOwnerError,
    UnauthorizedError,
)
from dlctl.log.format import Entry, encode

SECRET = b"0123456789abcdef0123456789abcdef"
U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
RID = st.integers(1, 2**64 - 1)


def one(data: bytes) -> p.Frame:
    frames = p.decode_frames(data)
    assert len(frames) == 1
    return frames[0]


def entry_bytes(entry_id: int = 0, payload: bytes = b"hello") -> bytes:
    return encode(Entry(7, 3, entry_id, entry_id - 1, payload))


# Requests --------------------------------------------------------------------------------------


@given(rid=RID, recovery=st.booleans(), uncached=st.booleans(), payload=st.binary(max_size=300))
def test_add_entry_round_trip(rid: int, recovery: bool, uncached: bool, payload: bytes) -> None:
    data = entry_bytes(5, payload)
    req = p.decode_request(one(p.add_entry_request(rid, data, recovery, uncached)))
    flags = (p.FLAG_RECOVERY if recovery else 0) | (p.FLAG_UNCACHED if uncached else 0)
    assert req == p.Request(p.Op.ADD_ENTRY, flags, rid, (data,))
    assert p.outgoing_bytes(p.add_entry_request_parts(rid, data, recovery, uncached)) == p.add_entry_request(rid, data, recovery, uncached)


def test_an_add_with_a_flag_beyond_recovery_and_uncached_is_refused() -> None:
    frame = bytearray(p.add_entry_request(7, entry_bytes(5, b"x"), True, True))
    length, version, op, flags, rid = p.FRAME_HEADER.unpack_from(frame)
    p.FRAME_HEADER.pack_into(frame, 0, length, version, op, flags | 0x4, rid)
    with pytest.raises(p.ProtocolError, match="unknown flags 0x7 for ADD_ENTRY in request 7"):
        p.decode_request(one(bytes(frame)))


@given(rid=RID, log=U64, seg=U64, entry=I64, fence=st.booleans())
def test_read_entry_round_trip(rid: int, log: int, seg: int, entry: int, fence: bool) -> None:
    req = p.decode_request(one(p.read_entry_request(rid, log, seg, entry, fence)))
    assert req == p.Request(p.Op.READ_ENTRY, p.FLAG_FENCE if fence else 0, rid, (log, seg, entry))


@given(rid=RID, log=U64, seg=U64)
def test_segment_ops_round_trip(rid: int, log: int, seg: int) -> None:
    ops = ((p.Op.READ_LAC, p.read_lac_request), (p.Op.FENCE, p.fence_request), (p.Op.DELETE_SEGMENT, p.delete_segment_request))
    for op, build in ops:
        assert p.decode_request(one(build(rid, log, seg))) == p.Request(op, 0, rid, (log, seg))


@given(rid=RID, log=U64, seg=U64, prev=I64, timeout=st.integers(0, 2**32 - 1))
def test_long_poll_round_trip(rid: int, log: int, seg: int, prev: int, timeout: int) -> None:
    req = p.decode_request(one(p.long_poll_request(rid, log, seg, prev, timeout)))
    assert req == p.Request(p.Op.LONG_POLL, 0, rid, (log, seg, prev, timeout))


def test_long_poll_timeout_is_clamped_to_u32() -> None:
    assert p.decode_request(one(p.long_poll_request(1, 1, 1, 0, 2**40))).args[3] == 2**32 - 1
    assert p.decode_request(one(p.long_poll_request(1, 1, 1, 0, -5))).args[3] == 0


@given(rid=RID, log=U64, seg=U64, first=st.integers(0, 2**63 - 1), last=st.none() | st.integers(0, 2**63 - 1))
def test_digest_round_trip(rid: int, log: int, seg: int, first: int, last: int | None) -> None:
    req = p.decode_request(one(p.digest_request(rid, log, seg, first, last)))
    assert req == p.Request(p.Op.DIGEST, 0, rid, (log, seg, first, last))


@given(rid=RID)
def test_bodyless_ops_round_trip(rid: int) -> None:
    assert p.decode_request(one(p.list_segments_request(rid))) == p.Request(p.Op.LIST_SEGMENTS, 0, rid, ())
    assert p.decode_request(one(p.stat_request(rid))) == p.Request(p.Op.STAT, 0, rid, ())


def test_auth_round_trip() -> None:
    nonce, proof = os.urandom(32), os.urandom(32)
    assert p.decode_request(one(p.auth_request(9, nonce, proof))) == p.Request(p.Op.AUTH, 0, 9, (nonce, proof))
    with pytest.raises(ValueError):
        p.auth_request(9, nonce[:5], proof)


def test_ids_that_do_not_fit_are_refused_by_the_encoder() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        p.read_entry_request(1, 2**64, 1, 0)
    with pytest.raises(ValueError, match="do not fit"):
        p.fence_request(1, -1, 1)


# Responses -------------------------------------------------------------------------------------


def test_ok_responses_round_trip() -> None:
    f = one(p.add_ok_response(42))
    assert f.is_response and f.op == p.Op.ADD_ENTRY and f.request_id == 42
    assert p.decode_response(f) == b""
    assert one(p.add_ok_response(42)) == one(p.ok_response(p.Op.ADD_ENTRY, 42))

    data = entry_bytes()
    assert p.decode_response(one(p.ok_response(p.Op.READ_ENTRY, 3, data))) == data
    assert p.decode_lac(p.decode_response(one(p.ok_response(p.Op.READ_LAC, 3, p.encode_lac(-1))))) == -1
    assert p.decode_fence_result(p.encode_fence_result(10, 9)) == (10, 9)
    assert p.decode_long_poll_result(p.encode_long_poll_result(4, None)) == (4, None)
    assert p.decode_long_poll_result(p.encode_long_poll_result(4, data)) == (4, data)
    assert p.decode_deleted(p.encode_deleted(True)) is True
    assert p.decode_deleted(p.encode_deleted(False)) is False
    hello = one(p.hello_frame(b"n" * 32))
    assert (hello.opcode, hello.request_id, p.decode_response(hello)) == (p.Op.HELLO | p.RESPONSE, 0, b"n" * 32)


def test_digest_segments_stat_round_trip() -> None:
    d = p.SegmentDigest(2**64 - 1, 3, 10, 0, 9, 8, 12345, "ab" * 16)
    assert p.decode_digest(p.encode_digest(d)) == d
    empty = p.SegmentDigest(1, 1, 0, -1, -1, -1, 0, "")
    assert p.decode_digest(p.encode_digest(empty)) == empty
    segs = [p.SegmentInfo(1, 2, 3, 2, 1, True, False, 999), p.SegmentInfo(2**64 - 1, 1, 0, -1, -1, False, True, 0)]
    assert p.decode_segments(p.encode_segments(segs)) == segs
    assert p.decode_segments(p.encode_segments([])) == []
    stat = {"segments": 3, "server": {"connections": 1}, "path": "/x"}
    assert p.decode_stat(p.encode_stat(stat)) == stat


@pytest.mark.parametrize("exc", [FencedError("f"), NoSuchEntryError("n"), LimboError("l"), BadRequestError("b")])
def test_error_responses_raise_the_typed_error(exc: AgentError) -> None:
    frame = one(p.response_for_error(p.Op.READ_ENTRY, 5, exc))
    with pytest.raises(type(exc)) as info:
        p.decode_response(frame)
    assert info.value.message == exc.message


def test_not_owner_carries_the_owner_hint() -> None:
    frame = one(p.response_for_error(p.Op.ADD_ENTRY, 5, NotOwnerError("not mine", owner="10.0.0.2:4181")))
    with pytest.raises(NotOwnerError) as info:
        p.decode_response(frame)
    assert info.value.owner == "10.0.0.2:4181"


def test_unknown_status_and_long_messages() -> None:
    with pytest.raises(AgentError, match="boom"):
        p.decode_response(one(p.error_response(p.Op.STAT, 1, 255, "boom")))
    long = "x" * 100_000
    with pytest.raises(AgentError) as info:
        p.decode_response(one(p.error_response(p.Op.STAT, 1, 7, long)))
    assert len(info.value.message) == p.MAX_MESSAGE


def test_malformed_results_raise_protocol_error() -> None:
    for decode, bad in (
        (p.decode_lac, b"\x00" * 7),
        (p.decode_fence_result, b"\x00" * 17),
        (p.decode_long_poll_result, b"\x00"),
        (p.decode_deleted, b"\x02"),
        (p.decode_digest, b"\x00" * 10),
        (p.decode_digest, b"\x00" * 56 + b"\xff"),
        (p.decode_segments, b"{}"),
        (p.decode_segments, b'[{"log_id": 1}]'),
        (p.decode_segments, b"[1]"),
        (p.decode_segments, b"[" * 100_000),
        (p.decode_stat, b"[]"),
        (p.decode_stat, b"\xff"),
    ):
        with pytest.raises(p.ProtocolError):
            decode(bad)
    bad_types = p.encode_segments([p.SegmentInfo(1, 2, 3, 2, 1, True, False, 9)]).replace(b"true", b"1")
    with pytest.raises(p.ProtocolError, match="fenced"):
        p.decode_segments(bad_types)


# Framing ---------------------------------------------------------------------------------------


def test_decoder_handles_byte_by_byte_and_coalesced_input() -> None:
    frames = [p.read_lac_request(i, 1, 2) for i in range(1, 6)] + [p.add_entry_request(6, entry_bytes(payload=b"x" * 5000))]
    stream = b"".join(frames)
    dec = p.FrameDecoder()
    got = []
    for i in range(len(stream)):
        dec.feed(stream[i : i + 1])
        while (f := dec.next_frame()) is not None:
            got.append(f)
    assert [f.request_id for f in got] == [1, 2, 3, 4, 5, 6]
    assert dec.buffered == 0
    assert p.decode_frames(stream) == got


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.sampled_from([0, 10, 5000, p.FrameDecoder.LARGE_FRAME - 17, p.FrameDecoder.LARGE_FRAME, 200_000]), min_size=1, max_size=6),
    data=st.data(),
)
def test_decoder_gives_the_same_frames_however_small_and_large_frames_are_cut_and_drained(sizes: list[int], data: st.DataObject) -> None:
    frames = [p.encode_frame(p.Op.READ_ENTRY | p.RESPONSE, 0, i + 1, bytes([i]) * n) for i, n in enumerate(sizes)]
    stream = b"".join(frames)
    dec = p.FrameDecoder()
    got: list[p.Frame] = []
    pos = 0
    always_drain = data.draw(st.booleans())
    while pos < len(stream):
        step = data.draw(st.integers(1, 70_000))
        kind = data.draw(st.sampled_from([bytes, bytearray, memoryview]))
        chunk = kind(stream[pos : pos + step])
        dec.feed(chunk)
        if kind is bytearray:
            chunk[:] = b"\xff" * len(chunk)  # a caller reusing its buffer must not change what was fed
        pos += step
        if always_drain:
            # What waits in the buffer never grows to a large frame's size: those are collected
            # chunk by chunk. (Consumed bytes before _pos go at the next feed that finds them
            # at least half the buffer: they are not waiting data.)
            assert len(dec._buf) - dec._pos < p.FrameDecoder.LARGE_FRAME + 70_000
        if always_drain or data.draw(st.booleans()):  # a server under back-pressure stops draining for a while
            while (f := dec.next_frame()) is not None:
                got.append(f)
        assert dec.buffered == min(pos, len(stream)) - sum(p.FRAME_HEADER_SIZE + len(f.body) for f in got)
    while (f := dec.next_frame()) is not None:
        got.append(f)
    assert got == p.decode_frames(stream) and [f.body for f in got] == [bytes([i]) * n for i, n in enumerate(sizes)]
    assert all(type(f.body) is bytes for f in got)
    assert dec.buffered == 0


def test_fatal_framing_errors() -> None:
    for bad in (
        struct.pack(">I", 3) + b"\x01" * 12,  # shorter than a header
        struct.pack(">I", p.MAX_FRAME),  # longer than the maximum
        struct.pack(">IBBHQ", 12, 9, 1, 0, 1),  # unknown version
    ):
        dec = p.FrameDecoder()
        dec.feed(bad)
        with pytest.raises(p.ProtocolError) as info:
            dec.next_frame()
        assert info.value.fatal
    # The length is checked as soon as it arrives, before the body is buffered.
    dec = p.FrameDecoder(max_frame=1024)
    dec.feed(struct.pack(">I", 2000))
    with pytest.raises(p.ProtocolError):
        dec.next_frame()


def test_non_fatal_request_errors() -> None:
    cases = [
        p.encode_frame(99, 0, 1),  # unknown opcode
        p.encode_frame(p.Op.HELLO, 0, 1),  # HELLO is not a request
        p.encode_frame(p.Op.READ_LAC | p.RESPONSE, 0, 1, b"\x00" * 16),  # a response
        p.encode_frame(p.Op.READ_LAC, 0x4, 1, b"\x00" * 16),  # unknown flag
        p.encode_frame(p.Op.READ_LAC, 0, 1, b"\x00" * 15),  # short body
        p.encode_frame(p.Op.STAT, 0, 1, b"x"),  # unexpected body
        p.encode_frame(p.Op.ADD_ENTRY, 0, 1, b"x" * 10),  # shorter than an entry header
        p.encode_frame(p.Op.AUTH, 0, 1, b"x" * 63),
        p.encode_frame(p.Op.FENCE, p.FLAG_FENCE, 1, b"\x00" * 16),  # FENCE flag only on READ_ENTRY
    ]
    for data in cases:
        frame = one(data)
        with pytest.raises(p.ProtocolError) as info:
            p.decode_request(frame)
        assert not info.value.fatal
        assert isinstance(info.value, BadRequestError)


def test_encode_frame_refuses_oversize() -> None:
    with pytest.raises(ValueError):
        p.encode_frame(p.Op.ADD_ENTRY, 0, 1, b"\x00" * p.MAX_FRAME)


def _consume(data: bytes) -> None:
    """Decode ``data`` as a peer would: every frame as a request and as a response."""
    dec = p.FrameDecoder()
    dec.feed(data)
    while True:
        frame = dec.next_frame()
        if frame is None:
            return
        try:
            p.decode_request(frame)
        except p.ProtocolError:
            pass
        try:
            result = p.decode_response(frame)
        except p.ProtocolError:
            continue
        except AgentError:
            continue
        for decode in (p.decode_lac, p.decode_fence_result, p.decode_long_poll_result, p.decode_digest,
                       p.decode_segments, p.decode_stat, p.decode_deleted):
            try:
                decode(result)
            except p.ProtocolError:
                pass


_VALID = [
    p.add_entry_request(1, entry_bytes(3, b"payload"), True),
    p.read_entry_request(2, 1, 2, 3, True),
    p.read_lac_request(3, 1, 2),
    p.long_poll_request(4, 1, 2, 3, 1000),
    p.fence_request(5, 1, 2),
    p.digest_request(6, 1, 2, 0, None),
    p.list_segments_request(7),
    p.delete_segment_request(8, 1, 2),
    p.stat_request(9),
    p.auth_request(10, b"a" * 32, b"b" * 32),
    p.ok_response(p.Op.DIGEST, 11, p.encode_digest(p.SegmentDigest(1, 2, 3, 0, 2, 2, 99, "abc"))),
    p.ok_response(p.Op.LIST_SEGMENTS, 12, p.encode_segments([p.SegmentInfo(1, 2, 3, 2, 1, True, False, 9)])),
    p.error_response(p.Op.ADD_ENTRY, 13, 8, "not owner", "h:1"),
]


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_random_bytes_raise_only_protocol_errors(data: bytes) -> None:
    try:
        _consume(data)
    except p.ProtocolError:
        pass


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(b"".join(draw(st.lists(st.sampled_from(_VALID), min_size=1, max_size=4))))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[i] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[i : i + draw(st.integers(1, 16))]
        else:
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_frames_raise_only_protocol_errors(data: bytes) -> None:
    try:
        _consume(data)
    except p.ProtocolError:
        pass


# Authentication --------------------------------------------------------------------------------


def test_handshake_succeeds_both_ways() -> None:
    server = auth.ServerHandshake(SECRET)
    client = auth.ClientHandshake(SECRET)
    nonce, proof = client.respond(server.challenge)
    server_proof = server.verify(nonce, proof)
    client.verify_server(server_proof)
    assert server.state == client.state == "authenticated"


def test_wrong_secret_is_refused_by_the_server() -> None:
    server = auth.ServerHandshake(SECRET)
    client = auth.ClientHandshake(b"another secret that is long enough")
    with pytest.raises(UnauthorizedError, match="wrong cluster secret"):
        server.verify(*client.respond(server.challenge))
    assert server.state == "failed"


def test_impostor_server_is_refused_by_the_client() -> None:
    client = auth.ClientHandshake(SECRET)
    impostor = auth.ServerHandshake(b"an impostor's secret, long enough")
    nonce, proof = client.respond(impostor.challenge)
    # The impostor cannot verify the client; even if it answers with its own best guess...
    guess = auth._proof(b"an impostor's secret, long enough", b"server", impostor.challenge, nonce, auth.DEFAULT_CONTEXT)
    with pytest.raises(UnauthorizedError, match="agent's proof"):
        client.verify_server(guess)


def test_replayed_client_response_fails_on_a_new_connection() -> None:
    first = auth.ServerHandshake(SECRET)
    nonce, proof = auth.ClientHandshake(SECRET).respond(first.challenge)
    first.verify(nonce, proof)
    second = auth.ServerHandshake(SECRET)  # a fresh challenge
    with pytest.raises(UnauthorizedError):
        second.verify(nonce, proof)


def test_replay_on_the_same_connection_and_retries_are_refused() -> None:
    server = auth.ServerHandshake(SECRET)
    nonce, proof = auth.ClientHandshake(SECRET).respond(server.challenge)
    server.verify(nonce, proof)
    with pytest.raises(UnauthorizedError, match="already"):
        server.verify(nonce, proof)
    # One wrong guess ends the handshake: no brute force on one connection.
    server = auth.ServerHandshake(SECRET)
    with pytest.raises(UnauthorizedError):
        server.verify(os.urandom(32), os.urandom(32))
    with pytest.raises(UnauthorizedError):
        server.verify(*auth.ClientHandshake(SECRET).respond(server.challenge))


def test_reflected_server_proof_is_not_a_client_proof() -> None:
    # An attacker relays a server's proof back as a client proof: the role labels differ.
    victim = auth.ServerHandshake(SECRET)
    client = auth.ClientHandshake(SECRET)
    nonce, proof = client.respond(victim.challenge)
    server_proof = victim.verify(nonce, proof)
    other = auth.ServerHandshake(SECRET, nonce=victim.challenge)
    with pytest.raises(UnauthorizedError):
        other.verify(nonce, server_proof)
    # A client nonce equal to the challenge (an echoed challenge) is refused outright.
    with pytest.raises(UnauthorizedError, match="reflected"):
        auth.ServerHandshake(SECRET, nonce=nonce).verify(nonce, proof)


def test_context_binds_the_proof() -> None:
    server = auth.ServerHandshake(SECRET, b"cluster-a")
    with pytest.raises(UnauthorizedError):
        server.verify(*auth.ClientHandshake(SECRET, b"cluster-b").respond(server.challenge))


def test_bad_sizes_and_secrets() -> None:
    server = auth.ServerHandshake(SECRET)
    with pytest.raises(UnauthorizedError):
        server.verify(b"short", b"x" * 32)
    server = auth.ServerHandshake(SECRET)
    with pytest.raises(UnauthorizedError):
        server.verify(os.urandom(32), b"short")
    with pytest.raises(ValueError):
        auth.ServerHandshake(b"short")
    with pytest.raises(TypeError):
        auth.ClientHandshake("a string secret is a mistake")  # type: ignore[arg-type]
    assert SECRET not in repr(auth.ServerHandshake(SECRET)).encode()


def test_load_secret(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "secret"
    path.write_bytes(auth.generate_secret() + b"\n")
    path.chmod(0o600)
    secret = auth.load_secret(path)
    assert len(secret) == 64 and not secret.endswith(b"\n")
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="chmod 600|group or others"):
        auth.load_secret(path)
    path.chmod(0o600)
    path.write_bytes(b"tiny")
    with pytest.raises(ConfigError, match="shorter"):
        auth.load_secret(path)
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(ConfigError):
        auth.load_secret(link)
    with pytest.raises(ConfigError):
        auth.load_secret(tmp_path / "missing")


# Frames sent as (head, body) -------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(rid=RID, recovery=st.booleans(), size=st.sampled_from([0, 1, p.SPLIT_BYTES - 100, p.SPLIT_BYTES, 3 * p.SPLIT_BYTES]))
def test_split_frames_are_the_same_bytes_and_keep_a_large_body_uncopied(rid: int, recovery: bool, size: int) -> None:
    entry = bytearray(entry_bytes(1, bytes(size)))
    for parts, whole in ((p.add_entry_request_parts(rid, entry, recovery), p.add_entry_request(rid, entry, recovery)),
                         (p.ok_response_parts(p.Op.READ_ENTRY, rid, entry), p.ok_response(p.Op.READ_ENTRY, rid, entry))):
        assert p.outgoing_bytes(parts) == whole
        if len(entry) >= p.SPLIT_BYTES:
            assert isinstance(parts, tuple) and parts[1] is entry  # the very buffer: no copy
        else:
            assert isinstance(parts, bytes)


class _Recorder:
    """A transport that records how it was called (write_frames is pure dispatch)."""

    def __init__(self, tls: bool = False) -> None:
        self.calls: list[tuple[str, object]] = []
        self.tls = tls

    def get_extra_info(self, name: str) -> object:
        return object() if name == "ssl_object" and self.tls else None

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def writelines(self, data: list) -> None:
        self.calls.append(("writelines", list(data)))


def test_out_queue_joins_small_frames_and_hands_large_bodies_over_as_they_are() -> None:
    body = bytearray(p.SPLIT_BYTES)
    cases = [
        ([b"a"], [("write", b"a")]),
        ([b"a", b"b"], [("write", b"ab")]),
        ([b"h", (b"head", body), b"x"], [("writelines", [b"h", b"head", body, b"x"])]),
        ([(b"head", body)], [("writelines", [b"head", body])]),
    ]
    for frames, expected in cases:
        q = p.OutQueue()
        assert [q.push(f) for f in frames] == [True] + [False] * (len(frames) - 1)  # the first schedules the write
        t = _Recorder()
        q.write(t)
        assert t.calls == expected and not q
        if expected[0][0] == "writelines":
            assert any(part is body for part in t.calls[0][1])  # type: ignore[union-attr]
        q.push(b"z")
        q.write(None)  # a closing connection drops what is queued
        assert not q


def test_out_queue_hands_a_large_body_to_a_tls_transport_in_pieces_so_it_goes_out_while_the_rest_is_encrypted() -> None:
    piece = p.TLS_WRITE_PIECE
    body = bytes(range(256)) * ((2 * piece + 100) // 256 + 1)
    q = p.OutQueue()
    for frame in (b"h", (b"head", body), b"x"):
        q.push(frame)
    t = _Recorder(tls=True)
    q.write(t)
    assert [kind for kind, _ in t.calls] == ["write"] * len(t.calls)
    written = [bytes(data) for _, data in t.calls]  # type: ignore[call-overload]
    assert b"".join(written) == b"h" + b"head" + body + b"x"  # the same bytes, in order
    assert max(map(len, written)) == piece and len(written) == 3 + -(-len(body) // piece)
    small = p.OutQueue()
    small.push(b"a")
    small.push(b"b")
    t = _Recorder(tls=True)
    small.write(t)
    assert t.calls == [("write", b"ab")]  # small frames are joined as without TLS
