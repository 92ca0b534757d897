"""PULL_SEGMENT's request: what a task sends round-trips, and a malformed body is refused naming
the field — it comes from the network, and names a directory under the agent's sources_dir."""

from __future__ import annotations

import json

import pytest

from dlctl.log import protocol as p
from dlctl.log.quorum import write_set_of
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.spark.segment_pull import MAX_WINDOW, PullRequest


def request(**over) -> PullRequest:
    seg = SegmentRecord(7, SegmentState.COMPLETED, (EnsembleChange(0, ("e1", "e2", "e3")),), 3, 2, 1.0, last_entry_id=41, bytes=9000, min_active_entry=2)
    fields = dict(
        log="orders", source_cluster="east", source_log_id=12, source=seg, sink_log_id=5, sink_seq=3, ensemble=("w1", "w2", "w3", "w4"),
        write_quorum=2, start_vv={"east": 10, "north": 4}, settled={"old": 3}, assume_local=True, window=64, throttle=1e6,
    )
    fields.update(over)
    return PullRequest(**fields)


def test_a_request_round_trips_through_its_json():
    req = request()
    assert PullRequest.from_json(req.to_json()) == req
    assert PullRequest.from_json(request(throttle=None).to_json()).throttle is None


def test_entries_of_counts_the_entries_of_a_members_write_sets():
    req = request()
    for node in req.ensemble:
        assert req.entries_of(node) == sum(1 for e in range(2, 42) if node in write_set_of(req.ensemble, 2, e))
    assert sum(req.entries_of(n) for n in req.ensemble) == 2 * 40


def body(**over) -> bytes:
    raw = json.loads(request().to_json())
    for key, value in over.items():
        if value is KeyError:
            del raw[key]
        else:
            raw[key] = value
    return json.dumps(raw).encode()


@pytest.mark.parametrize(
    ("data", "names"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (body(extra=1), "unknown fields ['extra']"),
        (body(sink_seq=KeyError), "lacks ['sink_seq']"),
        (body(source_cluster="../etc"), "cluster"),
        (body(source_cluster=""), "'source_cluster' must be a non-empty string"),
        (body(source_log_id=-1), "'source_log_id' must be an integer >= 0"),
        (body(sink_seq=True), "'sink_seq' must be an integer"),
        (body(ensemble=["a", "a"]), "'ensemble' must be a list of distinct node ids"),
        (body(ensemble=[]), "'ensemble' must be a list"),
        (body(write_quorum=5), "'write_quorum' 5 is larger than its ensemble of 4"),
        (body(write_quorum=0), "'write_quorum' must be an integer >= 1"),
        (body(start_vv={"east": -1}), "'start_vv' must map locations to counters"),
        (body(window=MAX_WINDOW + 1), f"'window' {MAX_WINDOW + 1} is above {MAX_WINDOW}"),
        (body(throttle=0), "'throttle' must be a positive number"),
        (body(source={"seq": 1}), "PULL_SEGMENT 'source'"),
    ],
)
def test_a_malformed_request_is_refused_naming_what_is_wrong(data: bytes, names: str):
    with pytest.raises(ValueError) as err:
        PullRequest.from_json(data)
    assert names in str(err.value)


def test_the_frame_carries_the_body_and_the_uncached_flag_and_refuses_an_empty_or_huge_one():
    data = request().to_json()
    for uncached in (True, False):
        (frame,) = p.decode_frames(p.pull_segment_request(4, data, uncached))
        req = p.decode_request(frame)
        assert (req.op, req.request_id, req.args) == (p.Op.PULL_SEGMENT, 4, (data,))
        assert bool(frame.flags & p.FLAG_UNCACHED) == uncached
    for bad in (b"", b"x" * (p.MAX_PULL_SEGMENT_BODY + 1)):
        with pytest.raises(ValueError):
            p.pull_segment_request(1, bad)
        (frame,) = p.decode_frames(p.encode_frame(p.Op.PULL_SEGMENT, 0, 9, bad))
        with pytest.raises(p.ProtocolError, match="PULL_SEGMENT request 9"):
            p.decode_request(frame)
