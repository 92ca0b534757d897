"""The pulled copy's own logic (``dlctl.spark.segment_pull.pull_segment``), with the agents faked:
a source that answers READ_RANGE from entries built here, and recorders standing for the local
store and the other members. Real agents pull in tests/integration/test_bootstrap.py; here the
distribution is checked exhaustively against an oracle written from the striping rule itself
(entry e of an ensemble of E goes to members e mod E, e+1 mod E, ... W of them)."""

from __future__ import annotations

import asyncio
import hashlib
import struct

import pytest

from dlctl.log import format as fmt
from dlctl.log import protocol as p
from dlctl.log.dlsn import DLSN
from dlctl.log.errors import AgentIOError
from dlctl.log.records import Record, decode_records, encode_records
from dlctl.log.recovery import totals_record
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.replication.origin import decode_source_position
from dlctl.spark.segment_pull import BATCH_BYTES, PullRequest, pull_segment

SEQ = 4
FIRST, LAST = 2, 41  # entries 0 and 1 truncated away


def source_entry(entry_id: int) -> bytes:
    # Entries of about 300 KiB: the copy spans several batches per member.
    records = [Record(entry_id * 10 + i, bytes([entry_id % 251]) * (30_000 + entry_id)) for i in range(10)]
    body = encode_records(records + [totals_record(records[-1].txid, 10 * (entry_id + 1), 1)])
    return fmt.encode(fmt.Entry(7, SEQ, entry_id, entry_id - 1, body))


ENTRIES = {e: source_entry(e) for e in range(LAST + 1)}


class SourceAgent:
    async def read_range(self, log_id, seq, first, last, max_bytes, **_):
        assert (log_id, seq) == (7, SEQ)
        data, spans, e = b"", [], first
        while e <= last and (not spans or len(data) + len(ENTRIES[e]) <= max_bytes):
            spans.append((len(data), len(data) + len(ENTRIES[e])))
            data += ENTRIES[e]
            e += 1
        return data, spans


class SourcePool:
    nodes = {"s1": {}, "s2": {}, "s3": {}}

    async def client(self, node):
        return SourceAgent()


def request(ensemble=("w1", "w2", "w3", "w4"), w=2, forward=True, throttle=None) -> PullRequest:
    source = SegmentRecord(
        SEQ, SegmentState.COMPLETED, (EnsembleChange(0, ("s1", "s2", "s3")),), 3, 2, 1.0, last_entry_id=LAST,
        bytes=sum(len(v) for v in ENTRIES.values()), min_active_entry=FIRST,
    )
    return PullRequest(
        log="orders", source_cluster="east", source_log_id=7, source=source, sink_log_id=9, sink_seq=17, ensemble=ensemble,
        write_quorum=w, start_vv={"east": 100}, window=16, throttle=throttle, forward=forward,
    )


class Members:
    """Records what each member was handed, and how many batches it had on the way at once."""

    def __init__(self, fail: str | None = None) -> None:
        self.got: dict[str, list[bytes]] = {}
        self.batches: dict[str, list[int]] = {}
        self.in_flight: dict[str, int] = {}
        self.most_in_flight = 0
        self.fail = fail

    async def take(self, node: str, batch) -> None:
        self.in_flight[node] = self.in_flight.get(node, 0) + 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight[node])
        await asyncio.sleep(0.001)  # durable a moment later: the next batch fills meanwhile
        self.in_flight[node] -= 1
        if node == self.fail:
            raise AgentIOError(f"{node}: disk full")
        self.got.setdefault(node, []).extend(bytes(e) for e in batch)
        self.batches.setdefault(node, []).append(sum(len(e) for e in batch))


def striped(ensemble: tuple[str, ...], w: int, entry_id: int) -> set[str]:
    return {ensemble[(entry_id + i) % len(ensemble)] for i in range(w)}


def digest(entries: list[bytes]) -> str:
    h = hashlib.sha256()
    for raw in entries:
        # (entry id, the CRC-32C in its header), as the agents' DIGEST packs them
        h.update(struct.pack(">qI", fmt.decode(raw).entry_id, struct.unpack_from(">I", raw, fmt.HEADER_SIZE - 4)[0]))
    return h.hexdigest()


def run(req: PullRequest, members: Members, node: str = "w1"):
    return asyncio.run(pull_segment(req, SourcePool(), node, lambda batch: members.take(node, batch), members.take))


@pytest.mark.parametrize(("ensemble", "w"), [(("w1", "w2", "w3", "w4"), 2), (("w1", "w2", "w3"), 3), (("w1",), 1)])
def test_every_member_is_handed_exactly_its_write_sets_entries_in_order_with_their_content_and_origin(ensemble, w):
    members = Members()
    result = run(request(ensemble, w), members)
    for node in ensemble:
        want = [e for e in range(FIRST, LAST + 1) if node in striped(ensemble, w, e)]
        got = members.got.get(node, [])
        assert [fmt.decode(raw).entry_id for raw in got] == want, node
        for raw in got:
            entry = fmt.decode(raw)  # checks the CRC the copy wrote
            assert (entry.log_id, entry.segment_seq) == (9, 17)
            source = list(decode_records(fmt.decode(ENTRIES[entry.entry_id]).payload))
            copied = list(decode_records(entry.payload))
            # (the last record of an entry is the writer's totals, rewritten with the sink's own)
            assert [r.payload for r in copied[:-1]] == [r.payload for r in source[:-1]]
            assert decode_source_position(copied[0].headers) == ("east", DLSN(SEQ, entry.entry_id, 0))
        assert result["replicas"][node] == {"entries": len(want), "digest": digest(got)}
    assert sorted(result["replicas"]) == sorted(ensemble)
    assert result["entries"] == LAST - FIRST + 1 and result["source_digest"] == result["sink_digest"]


def test_batches_stay_within_the_batch_size_and_one_per_member_is_on_its_way_at_a_time():
    members = Members()
    run(request(), members)
    largest = max(len(e) for e in ENTRIES.values()) * 2  # a re-encoded entry, generously
    for node, sizes in members.batches.items():
        assert len(sizes) >= 2, node
        assert all(s <= min(BATCH_BYTES + largest, p.MAX_BATCH_BYTES) for s in sizes), (node, sizes)
    assert members.most_in_flight == 1


def test_without_forward_only_the_pullers_own_entries_are_stored():
    members = Members()
    result = run(request(forward=False), members)
    assert set(members.got) == {"w1"} and set(result["replicas"]) == {"w1"}


def test_a_member_that_fails_to_store_fails_the_pull_naming_it():
    members = Members(fail="w3")
    with pytest.raises(AgentIOError, match="w3: disk full"):
        run(request(), members)
