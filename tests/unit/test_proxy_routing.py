"""Pure logic of write-proxy routing and the APPEND/RELEASE wire format."""

from __future__ import annotations

import pytest

from dlctl.log import protocol as p
from dlctl.log.errors import NotOwnerError, OrderBarrierError, error_for_status
from dlctl.log.producer import ProxyRouter
from dlctl.log.records import decode_records, encode_record


class FakePool:  # only the node table the router reads
    def __init__(self, nodes: dict[str, dict]) -> None:
        self.nodes = nodes


def nodes(count: int, regions: int = 3) -> dict[str, dict]:
    return {f"n{i}": {"region": f"r{i % regions}", "address": f"127.0.0.{i + 1}:3181"} for i in range(count)}


def test_candidates_prefer_the_producers_region_then_rank_the_rest():
    router = ProxyRouter(FakePool(nodes(9)), region="r1")
    order = router.candidates("orders")
    assert {n for n in order[:3]} == {"n1", "n4", "n7"} and len(order) == 9


def test_rendezvous_hashing_moves_only_the_logs_of_a_removed_agent():
    table = nodes(10, regions=1)
    before = {f"log-{i}": ProxyRouter(FakePool(table), "r0").choose(f"log-{i}") for i in range(500)}
    smaller = {k: v for k, v in table.items() if k != "n3"}
    after = {name: ProxyRouter(FakePool(smaller), "r0").choose(name) for name in before}
    moved = [name for name in before if before[name] != after[name]]
    assert moved and all(before[name] == "n3" for name in moved)
    assert len(set(before.values())) == 10, "logs spread over every agent"


def test_hint_then_cached_owner_then_candidates_and_suspects_are_skipped():
    router = ProxyRouter(FakePool(nodes(4)), region="r1")
    first = router.choose("orders")
    router.owners["orders"] = "n2"
    assert router.choose("orders") == "n2"
    assert router.choose("orders", hint="n3") == "n3"
    router.suspect("n2")
    assert "orders" not in router.owners and router.choose("orders") == first
    assert router.node_at("127.0.0.4:3181") == "n3" and router.node_at("10.0.0.1:1") is None


def test_append_request_round_trip():
    records = encode_record(b"a") + encode_record(b"b", key=b"k", headers={"h": b"v"})
    frame = p.decode_frames(p.append_request(7, "orders", 2**62, 2, records, reset_order=True))[0]
    req = p.decode_request(frame)
    assert req.op is p.Op.APPEND and req.flags == p.FLAG_RESET_ORDER and req.request_id == 7
    name, producer, count, body, epoch, seq = req.args
    assert (name, producer, count, epoch, seq) == ("orders", 2**62, 2, None, None)
    assert [r.payload for r in decode_records(body)] == [b"a", b"b"]


def test_an_idempotent_append_request_carries_its_epoch_and_sequence():
    records = encode_record(b"a")
    frame = p.decode_frames(p.append_request(7, "orders", 5, 1, records, epoch=3, seq=2**40))[0]
    req = p.decode_request(frame)
    assert req.flags == p.FLAG_IDEMPOTENT
    name, producer, count, body, epoch, seq = req.args
    assert (name, producer, count, epoch, seq) == ("orders", 5, 1, 3, 2**40)
    assert [r.payload for r in decode_records(body)] == [b"a"]
    with pytest.raises(ValueError, match="sequence >= 1"):
        p.append_request(7, "orders", 5, 1, records, epoch=3, seq=0)
    zero = b"\x00\x01a" + bytes(8) + bytes(4) + bytes(8) + bytes(4) + records
    with pytest.raises(p.ProtocolError, match="sequence 0"):
        p.decode_request(p.decode_frames(p.encode_frame(p.Op.APPEND, p.FLAG_IDEMPOTENT, 1, zero))[0])
    with pytest.raises(p.ProtocolError, match="no producer id, epoch, sequence and record count"):
        p.decode_request(p.decode_frames(p.encode_frame(p.Op.APPEND, p.FLAG_IDEMPOTENT, 1, b"\x00\x01a" + bytes(12)))[0])


@pytest.mark.parametrize(
    "body, complaint",
    [
        (b"", "no log name"),
        (b"\x00\x05ab", "overruns"),
        (b"\x00\x01a", "no producer id"),
        (b"\x00\x01a" + bytes(8) + bytes(4), "no records"),
        (b"\x00\x02\xff\xfe" + bytes(12), "not UTF-8"),
    ],
)
def test_malformed_append_bodies_are_refused_with_a_reason(body, complaint):
    frame = p.decode_frames(p.encode_frame(p.Op.APPEND, 0, 1, body))[0]
    with pytest.raises(p.ProtocolError, match=complaint):
        p.decode_request(frame)


def test_dlsn_results_and_release_results_round_trip_and_reject_garbage():
    class D:
        def __init__(self, s, e, sl):
            self.segment_seq, self.entry_id, self.slot = s, e, sl

    assert p.decode_dlsns(p.encode_dlsns([D(1, 2, 3), D(4, 5, 6)])) == [(1, 2, 3), (4, 5, 6)]
    with pytest.raises(p.ProtocolError):
        p.decode_dlsns(p.encode_dlsns([D(1, 2, 3)])[:-1])
    assert p.decode_released(b"\x01") and not p.decode_released(b"\x00")
    with pytest.raises(p.ProtocolError):
        p.decode_released(b"\x02")
    release = p.decode_request(p.decode_frames(p.release_request(3, "orders"))[0])
    assert release.op is p.Op.RELEASE and release.args == ("orders",)


def test_not_owner_carries_the_owner_address_and_new_statuses_map_back():
    frame = p.decode_frames(p.error_response(p.Op.APPEND, 9, NotOwnerError.status, "owned elsewhere", owner="127.0.0.9:3181"))[0]
    with pytest.raises(NotOwnerError) as err:
        p.decode_response(frame)
    assert err.value.owner == "127.0.0.9:3181"
    assert isinstance(error_for_status(OrderBarrierError.status, "x"), OrderBarrierError)
