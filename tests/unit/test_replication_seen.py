"""Source-side filtering (issue 21): the FLAG_SKIP_SEEN request field and the stubs a source
agent answers in place of the records a stream's sink holds (pure logic)."""

from __future__ import annotations

import pytest

from dlctl.log import format as fmt
from dlctl.log import protocol as p
from dlctl.log.dlsn import DLSN
from dlctl.log.records import Record, decode_records, encode_records
from dlctl.replication.origin import ORIGIN_CLUSTER, ORIGIN_DLSN, VECTOR_TIME, encode_vt
from dlctl.replication.seen import SEEN_MARK, stub_seen


def relayed(origin: str, vt: dict[str, int], payload: bytes = b"p" * 100) -> Record:
    headers = {ORIGIN_CLUSTER: origin.encode(), ORIGIN_DLSN: str(DLSN(1, vt[origin], 0)).encode(), VECTOR_TIME: encode_vt(vt), "app": b"kept"}
    return Record(7, payload, b"key", headers)


def entry(records: list[Record], flags: int = 0) -> bytes:
    return fmt.encode(fmt.Entry(5, 2, 9, 8, encode_records(records), flags))


def test_records_the_sink_holds_come_as_stubs_and_the_entry_keeps_its_ids_and_a_valid_crc():
    records = [
        Record(1, b"local", b"k"),  # written at the source: no vector time, always whole
        relayed("a", {"a": 3}),  # the sink (vv a=5) holds it
        relayed("a", {"a": 6}),  # not yet
        relayed("b", {"b": 1, "a": 2}),  # concurrent with nothing the sink lacks: held
        relayed("c", {"c": 4}),  # the sink's own event coming back: held
        relayed("b", {"b": 2, "x": 1}),  # x unknown at the sink: not held
    ]
    raw = entry(records)
    out = stub_seen(raw, "c", {"a": 5, "b": 1})
    decoded = fmt.decode(out)  # CRC checked
    assert (decoded.log_id, decoded.segment_seq, decoded.entry_id, decoded.lac) == (5, 2, 9, 8)
    got = list(decode_records(decoded.payload))
    stubbed = [SEEN_MARK in r.headers for r in got]
    assert stubbed == [False, True, False, True, True, False]
    for before, after, stub in zip(records, got, stubbed):
        assert after.txid == before.txid
        if stub:  # headers (origin, vector time, the application's) stay; key and payload do not
            assert after.payload == b"" and after.key == b"" and {k: v for k, v in after.headers.items() if k != SEEN_MARK} == before.headers
        else:
            assert after == before
    assert len(out) < len(raw)


def test_nothing_held_control_entries_and_unparsable_records_come_back_unchanged():
    raw = entry([relayed("a", {"a": 9})])
    assert stub_seen(raw, "c", {"a": 5}) is raw
    control = fmt.encode(fmt.Entry(5, 2, 9, 8, encode_records([Record(1, b"", control=True)]), fmt.FLAG_CONTROL))
    assert stub_seen(control, "c", {"a": 99}) is control
    broken = fmt.encode(fmt.Entry(5, 2, 9, 8, b"\x00\x00\x00\xffjunk", 0))
    with pytest.raises(ValueError):
        stub_seen(broken, "c", {"a": 1})  # the agent then sends the entry whole


def test_the_seen_field_round_trips_on_reads_and_long_polls_and_bad_ones_are_refused():
    seen = ("c", {"a": 5, "b": 2**40})
    for frame in (p.read_entry_request(3, 5, 2, 9, seen=seen), p.long_poll_request(4, 5, 2, 8, 1000, seen=seen)):
        (decoded,) = p.decode_frames(frame)
        request = p.decode_request(decoded)
        assert request.flags == p.FLAG_SKIP_SEEN and request.args[-1] == seen
    (plain,) = p.decode_frames(p.read_entry_request(3, 5, 2, 9))
    assert p.decode_request(plain).args == (5, 2, 9)
    with pytest.raises(ValueError):
        p.read_entry_request(3, 5, 2, 9, fence=True, seen=seen)
    (good,) = p.decode_frames(p.read_entry_request(3, 5, 2, 9, seen=seen))
    body = good.body
    for bad_body, flags in ((body[:-3], p.FLAG_SKIP_SEEN), (body + b"x", p.FLAG_SKIP_SEEN), (body, p.FLAG_SKIP_SEEN | p.FLAG_FENCE), (body, 0)):
        with pytest.raises(p.ProtocolError):
            p.decode_request(good._replace(flags=flags, body=bad_body))


def test_a_summary_read_keeps_the_slots_and_the_totals_and_drops_every_payload():
    from dlctl.log.recovery import entry_summary
    from dlctl.replication.seen import summary_only

    totals = Record(12, (2).to_bytes(8, "big") + (105).to_bytes(8, "big"), control=True)
    raw = entry([Record(10, b"x" * 100, b"k"), relayed("a", {"a": 1}, b"y" * 5), totals])
    out = summary_only(raw)
    got = list(decode_records(fmt.decode(out).payload))
    assert [r.control for r in got] == [False, False, True] and [r.payload for r in got[:2]] == [b"", b""]
    assert got[2] == totals and entry_summary(out) == entry_summary(raw)
    assert len(out) < len(raw)
    (frame,) = p.decode_frames(p.read_entry_request(3, 5, 2, 9, summary=True))
    assert p.decode_request(frame).flags == p.FLAG_SUMMARY


def test_an_agent_that_predates_trimmed_reads_is_asked_again_for_whole_entries():
    """Pure client logic: the first answer is the old agent's BAD_REQUEST naming the flags."""
    import asyncio

    from dlctl.log.client import AgentClient
    from dlctl.log.errors import BadRequestError

    whole = entry([relayed("a", {"a": 1})])
    client = AgentClient("127.0.0.1", 1, b"s" * 32)
    sent: list[bytes] = []

    async def call(op, build, *args, **kwargs):
        frame = build(1, *args)
        sent.append(frame)
        if p.decode_request(p.decode_frames(frame)[0]).flags:
            raise BadRequestError("unknown flags 0x2 for READ_ENTRY in request 1")
        return whole

    client._call = call  # type: ignore[method-assign]
    got = asyncio.run(client.read_entry(5, 2, 9, seen=("c", {"a": 5})))
    assert fmt.encode(got) == whole and len(sent) == 2
    asyncio.run(client.read_entry(5, 2, 9, summary=True))  # remembered: no trimmed request again
    assert len(sent) == 3 and p.decode_request(p.decode_frames(sent[-1])[0]).flags == 0
