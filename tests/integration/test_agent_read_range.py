"""READ_RANGE against a real agent process (the harness of ``test_agent_protocol``): many
consecutive entries per request, each verified on both ends; bad requests are answered, not
fatal; a flipped bit on disk is never served."""

from __future__ import annotations

import os
import struct

import pytest
import test_agent_protocol
from test_agent_protocol import Agent, Raw, entry

from dlctl.log import protocol as p
from dlctl.log.client import SyncAgentClient
from dlctl.log.errors import BadRequestError, LimboError, NoSuchEntryError, NoSuchSegmentError
from dlctl.log.format import HEADER_SIZE

pytestmark = pytest.mark.agent

# test_agent_protocol's fixtures, so this module has an agent of its own (module-scoped) and a client of it.
secret, agent, client = test_agent_protocol.secret, test_agent_protocol.agent, test_agent_protocol.client


def test_a_range_comes_back_as_the_entries_written(client: SyncAgentClient) -> None:
    data = [entry(11, 1, i, os.urandom(1000 + i)) for i in range(20)]
    for d in data:
        client.add(d)
    buf, spans = client.read_range(11, 1, 0, 19, 1 << 20)
    assert [buf[s:e] for s, e in spans] == data
    buf, spans = client.read_range(11, 1, 5, 9, 1 << 20)
    assert [buf[s:e] for s, e in spans] == data[5:10]
    buf, spans = client.read_range(11, 1, 3, 19, 2 * len(data[3]) + 10)  # capped by max bytes
    assert [buf[s:e] for s, e in spans] == data[3:5]
    with pytest.raises(NoSuchEntryError):
        client.read_range(11, 1, 20, 30, 1 << 20)
    with pytest.raises(NoSuchSegmentError):
        client.read_range(11, 2, 0, 3, 1 << 20)


def test_the_agent_caps_an_answer_whatever_the_client_asks(client: SyncAgentClient) -> None:
    big = [entry(12, 1, i, os.urandom(2 * 1024 * 1024)) for i in range(5)]
    for d in big:
        client.add(d)
    buf, spans = client.read_range(12, 1, 0, 4, 2**32 - 1)
    assert len(buf) <= p.MAX_RANGE_BYTES and [buf[s:e] for s, e in spans] == big[:3]


def test_a_malformed_range_request_is_answered_and_the_connection_stays_usable(agent: Agent, client: SyncAgentClient) -> None:
    client.add(entry(13, 1, 0))
    raw = Raw(agent)
    try:
        raw.authenticate(agent.secret)
        for rid, body, what in (
            (2, struct.pack(">QQqq", 13, 1, 0, 0), "READ_RANGE body is 32 bytes, expected 36"),
            (3, struct.pack(">QQqqI", 13, 1, 4, 2, 100), "last entry 2 is before first entry 4"),
            (4, struct.pack(">QQqqI", 0, 1, 0, 2, 100), "log id 0 out of range"),
        ):
            raw.sock.sendall(p.encode_frame(p.Op.READ_RANGE, 0, rid, body))
            reply = raw.frame()
            assert reply is not None and reply.request_id == rid
            with pytest.raises(BadRequestError, match=what):
                p.decode_response(reply)
        raw.sock.sendall(p.read_range_request(5, 13, 1, 0, 0, 100))
        reply = raw.frame()
        assert reply is not None and reply.request_id == 5 and p.decode_response(reply) == entry(13, 1, 0)
    finally:
        raw.close()


def test_a_flipped_bit_on_disk_is_refused_not_served(agent: Agent, client: SyncAgentClient) -> None:
    data = [entry(14, 1, i, os.urandom(500)) for i in range(6)]
    for d in data:
        client.add(d)
    client.fence(14, 1)  # durable, nothing left in memory
    path = agent.data_dir / "segments" / f"{14:016x}" / f"{1:016x}.log"
    offset = sum(len(d) for d in data[:4]) + HEADER_SIZE + 100
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))
    with pytest.raises(LimboError, match="entry 4: CRC-32C mismatch"):
        client.read_range(14, 1, 0, 5, 1 << 20)
    with pytest.raises(LimboError):
        client.read(14, 1, 0)  # the replica no longer serves anything of the segment
