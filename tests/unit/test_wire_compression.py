"""Compressed answers on the agent protocol (issue 23): the codec (round trip, only when it pays,
a bomb and a corrupt frame refused), the flag on the wire, and a real AgentServer answering a
real AgentClient compressed, or refusing the flag as an agent that predates it does
(``[server] compression = false``), which the client falls back on."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import zstandard
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dlctl.log import protocol as p
from dlctl.log.client import AgentClient
from dlctl.log.compression import LACKING, MIN_BYTES, ZSTD, Compressor, CorruptCompressed, Decompressor, WireStats
from dlctl.log.format import Entry, encode
from dlctl.log.records import Record, encode_records
from dlctl.replication.worker import WorkerReport

from dlagent.limits import ServerLimits
from dlagent.metrics import AgentMetrics
from dlagent.server import AgentServer
from dlagent.storage import SegmentStore

SECRET = b"s" * 32


def events(n: int, start: int = 0) -> list[bytes]:
    """JSON-like records: what a stream of application events looks like (compressible)."""
    return [
        json.dumps({"id": i, "type": "order.created", "customer": f"customer-{i % 37:04d}", "items": [{"sku": f"SKU-{(i * 7 + k) % 101:05d}", "qty": k + 1} for k in range(3)], "status": "pending"}).encode()
        for i in range(start, start + n)
    ]


def test_an_answer_round_trips_and_is_compressed_only_when_it_pays():
    body = b"".join(events(50))
    packed = Compressor().compress(memoryview(body))  # the agent hands over views of entries too
    assert packed is not None and len(packed) * 4 < len(body)
    assert Decompressor().decompress(packed, p.MAX_FRAME, "READ_ENTRY answer") == body
    assert Compressor().compress(body[: MIN_BYTES - 1]) is None  # too small to gain
    assert Compressor().compress(os.urandom(64 * 1024)) is None  # does not shrink: sent plain
    # One compressor per connection: its context is reused across answers.
    compressor, decompressor = Compressor(), Decompressor()
    for i in range(3):
        body = b"".join(events(20, start=100 * i))
        assert decompressor.decompress(compressor.compress(body), p.MAX_FRAME, "answer") == body


def test_a_frame_that_claims_more_than_the_largest_frame_is_refused_before_it_is_allocated():
    bomb = zstandard.ZstdCompressor(level=1).compress(b"\0" * (p.MAX_FRAME + 1))
    assert len(bomb) < 2048  # a few KiB on the wire ...
    with pytest.raises(CorruptCompressed, match=rf"LONG_POLL answer to request 7: the zstd frame claims {p.MAX_FRAME + 1} bytes decompressed, more than the {p.MAX_FRAME}-byte maximum frame: refused"):
        Decompressor().decompress(bomb, p.MAX_FRAME, "LONG_POLL answer to request 7")  # ... never 16 MiB in memory
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 4096)
    with pytest.raises(CorruptCompressed, match="does not state its decompressed size"):
        Decompressor().decompress(unsized, p.MAX_FRAME, "answer")


def test_a_corrupt_frame_is_refused_with_a_clear_error():
    packed = Compressor().compress(b"".join(events(50)))
    assert packed is not None
    with pytest.raises(CorruptCompressed, match=r"READ_ENTRY answer: corrupt zstd frame"):
        Decompressor().decompress(packed[:-20], p.MAX_FRAME, "READ_ENTRY answer")  # cut short
    with pytest.raises(CorruptCompressed, match=r"READ_ENTRY answer: corrupt zstd frame"):
        Decompressor().decompress(packed + b"trailing", p.MAX_FRAME, "READ_ENTRY answer")
    with pytest.raises(CorruptCompressed, match=r"READ_ENTRY answer: not a zstd frame"):
        Decompressor().decompress(b"plain bytes, not zstd", p.MAX_FRAME, "READ_ENTRY answer")


def test_the_flag_on_reads_and_long_polls_and_an_agent_that_refuses_it_as_unknown():
    (read,) = p.decode_frames(p.read_entry_request(3, 5, 2, 9, seen=("c", {"a": 1}), compress=True))
    assert read.flags == p.FLAG_SKIP_SEEN | p.FLAG_COMPRESS and p.decode_request(read).args[:3] == (5, 2, 9)
    (poll,) = p.decode_frames(p.long_poll_request(4, 5, 2, 8, 1000, compress=True))
    assert poll.flags == p.FLAG_COMPRESS and p.decode_request(poll).args == (5, 2, 8, 1000)
    # Switched off, the agent refuses it as one that predates it does: the same BAD_REQUEST.
    for frame, op in ((read, "READ_ENTRY"), (poll, "LONG_POLL")):
        with pytest.raises(p.ProtocolError, match=rf"unknown flags {frame.flags:#x} for {op} in request"):
            p.decode_request(frame, refuse=p.FLAG_COMPRESS)
    with pytest.raises(ValueError, match="fencing read"):
        p.read_entry_request(3, 5, 2, 9, fence=True, compress=True)
    (fenced,) = p.decode_frames(p.encode_frame(p.Op.READ_ENTRY, p.FLAG_FENCE | p.FLAG_COMPRESS, 3, p._ENTRY_REF.pack(5, 2, 9)))
    with pytest.raises(p.ProtocolError, match="FENCE with SKIP_SEEN, SUMMARY or COMPRESS"):
        p.decode_request(fenced)
    (answer,) = p.decode_frames(p.outgoing_bytes(p.ok_response_parts(p.Op.READ_ENTRY, 3, b"zstd frame", p.FLAG_COMPRESSED)))
    assert answer.flags == p.FLAG_COMPRESSED and p.decode_response(answer) == b"zstd frame"


def _entry(entry_id: int, payloads: list[bytes]) -> bytes:
    return encode(Entry(1, 1, entry_id, entry_id - 1, encode_records([Record(0, x) for x in payloads])))


async def _serving(tmp: Path, limits: ServerLimits, go) -> None:
    store = SegmentStore(tmp / "data")
    await store.open()
    server = AgentServer(store, SECRET, "127.0.0.1", 0, limits=limits)
    await server.start()
    client = AgentClient("127.0.0.1", server.address[1], SECRET, name="n1")
    try:
        await go(server, client)
    finally:
        await client.close()
        await server.stop()
        await store.close()


def test_an_agent_answers_reads_and_long_polls_compressed_and_the_client_counts_both_sizes(tmp_path: Path):
    big, small = _entry(0, events(40)), _entry(1, [b"tiny"])

    async def go(server: AgentServer, client: AgentClient) -> None:
        await client.add(big)
        await client.add(small)
        wire = WireStats()
        got = await client.read_entry(1, 1, 0, wire=wire)
        assert encode(got) == big  # decompressed, then CRC-checked as any read
        assert wire.payload == len(big) and wire.wire * 4 < len(big) and wire.agents == {"n1": True} and wire.mode() == ZSTD
        assert server.counters["compressed_answers"] == 1 and server.counters["compressed_saved_bytes"] == len(big) - wire.wire
        lac, entry = await client.long_poll(1, 1, -1, 1.0, wire=wire)  # LAC 0 (entry 1 says so): entry 0 comes along
        assert (lac, entry) == (0, big) and server.counters["compressed_answers"] == 2
        before = wire.wire
        assert encode(await client.read_entry(1, 1, 1, wire=wire)) == small
        assert wire.wire - before == len(small) and server.counters["compressed_answers"] == 2  # too small: plain
        assert encode(await client.read_entry(1, 1, 0)) == big  # a reader that does not ask gets it plain
        assert server.counters["compressed_answers"] == 2 and server.counters["bad_requests"] == 0

    asyncio.run(_serving(tmp_path, ServerLimits(), go))


def test_an_agent_with_compression_off_refuses_the_flag_and_the_client_reads_plain_from_then_on(tmp_path: Path):
    big = _entry(0, events(40))

    async def go(server: AgentServer, client: AgentClient) -> None:
        await client.add(big)
        await client.add(_entry(1, [b"x"]))
        wire = WireStats()
        assert encode(await client.read_entry(1, 1, 0, seen=("c", {"a": 1}), wire=wire)) == big
        assert server.counters["bad_requests"] == 1  # the refused request, asked again without the flag
        assert wire.wire == wire.payload == len(big) and wire.agents == {"n1": False} and wire.mode() == LACKING
        assert (await client.long_poll(1, 1, -1, 1.0, wire=wire))[1] == big
        assert encode(await client.read_entry(1, 1, 0, wire=wire)) == big
        assert server.counters["bad_requests"] == 1 and server.counters["compressed_answers"] == 0  # not asked again
        # A new connection asks again (the agent may have been upgraded meanwhile).
        await client.close()
        again = AgentClient("127.0.0.1", server.address[1], SECRET, name="n1")
        try:
            assert encode(await again.read_entry(1, 1, 0, wire=wire)) == big
        finally:
            await again.close()
        assert server.counters["bad_requests"] == 2

    asyncio.run(_serving(tmp_path, ServerLimits(compression=False), go))


def test_what_a_stream_reports_as_in_effect():
    assert WireStats(ask=False).mode() == "none"
    assert WireStats().mode() == ZSTD  # nothing read yet: what it asks for
    mixed = WireStats(agents={"a1": True, "a2": False, "a3": False})
    assert mixed.mode() == "zstd (plain from a2, a3: they lack zstd)"
    assert WireStats(agents={"a1": False}).mode() == LACKING == "none (source agent lacks zstd)"


def test_the_agent_exports_a_stream_logs_wire_and_payload_bytes_counted_from_the_run_start():
    metrics = AgentMetrics()
    observe = metrics.worker_observer()
    start = WorkerReport("a-to-b", "orders", 10, 50.0, 0.0, 1.0, wire_bytes=1_000, wire_payload_bytes=5_000)  # earlier runs'
    observe(start)
    observe(replace(start, applied_records=20, wire_bytes=1_300, wire_payload_bytes=6_500))
    text = generate_latest(metrics.registry).decode()
    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.labels.get("stream") == "a-to-b"}
    assert got["dlagent_replication_wire_bytes_total"] == 300 and got["dlagent_replication_payload_bytes_total"] == 1_500
    assert got["dlagent_replication_applied_records_total"] == 10
