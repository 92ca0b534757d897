"""ADD_BATCH against a real agent process (the harness of ``test_agent_protocol``): many entries
of one segment in one request, stored exactly as single adds store them, all or nothing; a
malformed, mixed or oversize batch is answered with an error naming what is wrong, stores
nothing, and leaves the connection usable."""

from __future__ import annotations

import os

import pytest
import test_agent_protocol
from test_agent_protocol import Agent, Raw, entry

from dlctl.log import protocol as p
from dlctl.log.client import SyncAgentClient
from dlctl.log.errors import BadRequestError, FencedError, NoSuchSegmentError
from dlctl.log.format import HEADER_SIZE

pytestmark = pytest.mark.agent

# test_agent_protocol's fixtures, so this module has an agent of its own (module-scoped) and a client of it.
secret, agent, client = test_agent_protocol.secret, test_agent_protocol.agent, test_agent_protocol.client


def flipped(buf: bytes, pos: int) -> bytes:
    b = bytearray(buf)
    b[pos] ^= 0x01
    return bytes(b)


def test_a_batch_is_stored_as_single_adds_would_be_and_reads_back(client: SyncAgentClient) -> None:
    data = [entry(21, 1, i, os.urandom(1000 + i)) for i in range(40)]
    assert client.add_batch(data[:25], recovery=True, uncached=True) == 25  # a new segment: the task path
    assert client.add_batch([b"".join(data[25:])]) == 15  # several entries in one buffer; the hot path
    buf, spans = client.read_range(21, 1, 0, 39, 1 << 20)
    assert [buf[s:e] for s, e in spans] == data
    assert client.read(21, 1, 7) == data[7] and client.read_lac(21, 1) == 38
    before = client.digest(21, 1)
    assert client.add_batch([buf[spans[5][0] : spans[30][1]]], recovery=True) == 26  # a range answer forwarded: idempotent
    assert client.digest(21, 1) == before
    striped = [entry(21, 2, i) for i in (0, 2, 3, 5)]  # a striped replica's entries: ids skip
    assert client.add_batch(striped) == 4 and client.digest(21, 2).entries == 4


def test_a_batch_with_a_corrupt_entry_in_the_middle_stores_none_of_it(client: SyncAgentClient) -> None:
    data = [entry(22, 1, i, os.urandom(500)) for i in range(5)]
    bad = [*data[:2], flipped(data[2], HEADER_SIZE + 100), *data[3:]]
    with pytest.raises(BadRequestError, match=r"batch entry 3 of 5 \(entry 2\): CRC-32C mismatch in entry 2 .*nothing of the batch stored"):
        client.add_batch(bad, recovery=True)
    with pytest.raises(NoSuchSegmentError):
        client.read(22, 1, 0)  # not even the entries before it, nor the segment
    client.add(entry(22, 2, 0))
    bad = [entry(22, 2, i, os.urandom(500)) for i in range(1, 6)]
    bad[3] = flipped(bad[3], HEADER_SIZE + 1)
    with pytest.raises(BadRequestError, match=r"batch entry 4 of 5 \(entry 4\): CRC-32C mismatch"):
        client.add_batch(bad, recovery=True)  # an existing segment: the hot path
    assert client.digest(22, 2).entries == 1
    bad[3] = flipped(bad[3], HEADER_SIZE + 1)
    assert client.add_batch(bad, recovery=True) == 5  # the same batch, whole again


def test_a_batch_spanning_two_segments_is_refused_and_stores_nothing(client: SyncAgentClient) -> None:
    client.add(entry(23, 1, 0))
    with pytest.raises(BadRequestError, match=r"batch entry 3 of 3 \(entry 0\) is of segment 2 of log 23, the batch's first of segment 1 of log 23"):
        client.add_batch([entry(23, 1, 1), entry(23, 1, 2), entry(23, 2, 0)], recovery=True)
    assert client.digest(23, 1).entries == 1
    with pytest.raises(NoSuchSegmentError):
        client.read(23, 2, 0)
    with pytest.raises(BadRequestError, match=r"batch entry 2 of 2 \(entry 1\) follows entry 2: a batch's entry ids must increase"):
        client.add_batch([entry(23, 1, 2), entry(23, 1, 1)])
    assert client.digest(23, 1).entries == 1


def test_a_fenced_replica_takes_a_batch_only_as_recovery(client: SyncAgentClient) -> None:
    client.add(entry(24, 1, 0))
    client.fence(24, 1)
    with pytest.raises(FencedError, match="fenced"):
        client.add_batch([entry(24, 1, 1), entry(24, 1, 2)])
    assert client.digest(24, 1).entries == 1
    assert client.add_batch([entry(24, 1, 1), entry(24, 1, 2)], recovery=True) == 2


def test_an_oversize_or_malformed_batch_is_answered_and_the_connection_stays_usable(agent: Agent, client: SyncAgentClient) -> None:
    raw = Raw(agent)
    good = b"".join(entry(25, 1, i) for i in range(3))
    try:
        raw.authenticate(agent.secret)
        for rid, flags, body, what in (
            (2, 0, b"\x00" * (p.MAX_BATCH_BYTES + 1), f"a body of {p.MAX_BATCH_BYTES + 1} bytes, must be {HEADER_SIZE}..{p.MAX_BATCH_BYTES}"),
            (3, 0, good[:-1], r"the entry at offset \d+ claims \d+ payload bytes, \d+ remain \(entry 2 of the body\); nothing stored"),
            (4, 0, good + b"\x00" * 10, r"10 bytes at offset \d+ are too few for an entry header \(entry 3 of the body\)"),
            (5, 0, b"", "a body of 0 bytes"),
            (6, 0x4, good, "unknown flags 0x4 for ADD_BATCH"),
            (7, 0, flipped(good, 0), r"batch entry 1 of 3: bad entry header: bad magic"),
        ):
            raw.sock.sendall(p.encode_frame(p.Op.ADD_BATCH, flags, rid, body))
            reply = raw.frame()
            assert reply is not None and reply.request_id == rid and reply.op == p.Op.ADD_BATCH
            with pytest.raises(BadRequestError, match=what):
                p.decode_response(reply)
        with pytest.raises(NoSuchSegmentError):
            client.read(25, 1, 0)
        raw.sock.sendall(p.add_batch_request(8, [good], recovery=True))
        reply = raw.frame()
        assert reply is not None and reply.request_id == 8 and p.decode_added(p.decode_response(reply)) == 3
    finally:
        raw.close()
    assert client.digest(25, 1).entries == 3
    with pytest.raises(BadRequestError, match="not sent"):
        client.add_batch([b"\x00" * (p.MAX_BATCH_BYTES + 1)])
