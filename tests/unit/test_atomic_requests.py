"""Atomic producer requests end to end (issue #20 item 5), without a cluster: the producer
never cuts a request inside a group (``LogProducer.submit_group``), and a replication worker
hands the records of one source request (``dl.p``) to its sink appender together, taking
checkpoints only between source requests."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from dlctl.errors import NotFoundError
from dlctl.log.dlsn import DLSN
from dlctl.log.idempotence import PRODUCER_HEADER, ProducerMark
from dlctl.log.producer import LogProducer, ProducerOptions
from dlctl.log.reader import ReadRecord
from dlctl.log.records import Record, encode_record
from dlctl.meta.records import Versioned
from dlctl.replication import worker as worker_mod
from dlctl.replication.origin import ORIGIN_CLUSTER, ORIGIN_DLSN, VECTOR_TIME
from dlctl.replication.positions import AppliedPosition
from dlctl.replication.records import Checkpoint, StreamConfig

# -- LogProducer: a group is never cut across requests ------------------------------------------


def _producer(**options) -> LogProducer:
    producer = LogProducer(SimpleNamespace(cluster="c"), SimpleNamespace(nodes={}), "orders", options=ProducerOptions(**options))
    producer._task = asyncio.get_running_loop().create_future()  # no sender: the test cuts the requests
    return producer


def _cut(producer: LogProducer) -> list[list[bytes]]:
    requests = []
    while (request := producer._take_request()) is not None:
        requests.append([i.encoded for i in request.items])
    return requests


def test_a_group_goes_out_in_one_request_where_single_records_would_be_cut():
    async def scenario() -> None:
        size = len(encode_record(b"x" * 100))
        records = [Record(0, b"x" * 100) for _ in range(5)]
        # Room for 3 records per request: one by one, a cut falls inside the 5 records...
        singles = _producer(max_request_bytes=3 * size)
        singles.submit(b"x" * 100)
        for r in records[:3]:
            singles.submit(r)
        assert [len(r) for r in _cut(singles)] == [3, 1]
        # ... as a group they never share a request they do not fit in whole.
        grouped = _producer(max_request_bytes=3 * size)
        lone = grouped.submit(b"x" * 100)
        futures = grouped.submit_group(records[:3])
        assert len(futures) == 3 and lone not in futures
        assert [len(r) for r in _cut(grouped)] == [1, 3]
        # Whole groups pack a request as long as they fit; records are counted too.
        packed = _producer(max_request_bytes=6 * size, max_request_records=5)
        packed.submit_group(records[:2])
        packed.submit_group(records[:2])
        packed.submit_group(records[:2])
        packed.submit(b"x" * 100)
        assert [len(r) for r in _cut(packed)] == [4, 3]

    asyncio.run(scenario())


def test_a_group_larger_than_a_request_is_refused_and_nothing_of_it_queued():
    async def scenario() -> None:
        size = len(encode_record(b"x" * 100))
        producer = _producer(max_request_bytes=3 * size, max_request_records=3)
        with pytest.raises(ValueError, match="exceeds the request limit"):
            producer.submit_group([Record(0, b"x" * 100) for _ in range(4)])
        with pytest.raises(ValueError, match="exceeds the request limit"):
            producer.submit_group([Record(0, b"x" * 100), Record(0, b"x" * 100, headers={"h": b"v" * 200})])
        assert not producer._pending and producer._unsettled_bytes == 0
        assert producer.submit_group([]) == []

    asyncio.run(scenario())


def test_cancelled_records_of_a_group_are_dropped_and_the_rest_stays_together():
    async def scenario() -> None:
        producer = _producer(max_request_bytes=1000)
        futures = producer.submit_group([Record(0, f"r{i}".encode()) for i in range(4)])
        futures[1].cancel()
        producer.submit(b"after")
        [request] = _cut(producer)
        assert [p[-2:] for p in request] == [b"r0", b"r2", b"r3", b"er"]
        assert producer._unsettled_bytes == sum(len(p) for p in request)

    asyncio.run(scenario())


# -- the replication worker: one source request, one sink submission ------------------------------


def _rec(seg: int, entry: int, slot: int, payload: str, count: int = 0, origin: str | None = None) -> ReadRecord:
    headers: dict[str, bytes] = {"app": b"kept"}
    if count:
        headers[PRODUCER_HEADER] = ProducerMark(7, 0, slot + 1, count).encode()
    if origin is not None:
        headers.update({ORIGIN_CLUSTER: origin.encode(), ORIGIN_DLSN: b"1/99/0", VECTOR_TIME: f"{origin}=1".encode()})
    return ReadRecord(DLSN(seg, entry, slot), 0, payload.encode(), b"", headers)


class FakeReader:
    """The source: ``records`` in order; ``stop_at``: set the worker's stop as that record is
    handed out; past the end, sets stop and reads as caught up."""

    def __init__(self, records: list[ReadRecord], stop: asyncio.Event, stop_at: str | None = None) -> None:
        self.records, self.stop, self.stop_at = list(records), stop, stop_at
        self.handed: list[str] = []
        self.truncation_skips: list = []  # (the source is never truncated under it here)

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def read_next(self, timeout: float | None = None) -> ReadRecord | None:
        if not self.records:
            self.stop.set()
            await asyncio.sleep(0)
            return None
        record = self.records.pop(0)
        self.handed.append(record.payload.decode())
        if record.payload.decode() == self.stop_at:
            self.stop.set()
        return record


class FakeAppender:
    def __init__(self, group_limit: int | None = None) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.headers: list[dict[str, bytes]] = []
        self.group_limit = group_limit
        self._next = 0

    def _done(self) -> asyncio.Future[DLSN]:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(DLSN(1, self._next, 0))
        self._next += 1
        return fut

    def submit(self, payload, *, key=b"", headers=None):
        self.calls.append(("one", [payload.decode()]))
        self.headers.append(dict(headers or {}))
        return self._done()

    def submit_group(self, records):
        if self.group_limit is not None and len(records) > self.group_limit:
            raise ValueError("too large for one request")
        self.calls.append(("group", [r.payload.decode() for r in records]))
        self.headers += [dict(r.headers) for r in records]
        return [self._done() for _ in records]

    async def wait_writable(self) -> None:
        pass

    async def flush(self) -> None:
        pass

    async def close(self) -> None:
        pass


class FakeStreams:
    def __init__(self, meta) -> None:
        self.written: list[Checkpoint] = []

    def get_checkpoint(self, stream_id, log):
        return Versioned(Checkpoint(log), 0)

    def update_checkpoint(self, stream_id, current, new):
        self.written.append(new)
        return Versioned(new, current.version + 1)


class FakePins:
    def __init__(self, meta) -> None:
        pass

    def get(self, stream_id, log):
        raise NotFoundError("no pin")

    def set(self, pin):
        return Versioned(SimpleNamespace(needs_bootstrap=False, reason=""), 1)


def run_worker(monkeypatch, records, *, bidirectional=False, already=None, stop_at=None, appender=None):
    """Run a StreamWorker over ``records``; (appender, written checkpoints, records handed out)."""
    appender = appender or FakeAppender()
    monkeypatch.setattr(worker_mod, "StreamStore", FakeStreams)
    monkeypatch.setattr(worker_mod, "PinStore", FakePins)
    monkeypatch.setattr(worker_mod, "ClockStore", lambda meta: SimpleNamespace(steps=lambda log: []))
    monkeypatch.setattr(worker_mod, "settle", SimpleNamespace(SettledFloors=lambda meta: SimpleNamespace(of=lambda log: {})))

    async def open_appender(*args, **kwargs):
        return appender

    async def find_applied(*args, **kwargs):
        return AppliedPosition(already, DLSN(1, 0, 0)) if already is not None else None

    async def log_end(*args, **kwargs):
        raise OSError("not measured in this test")

    monkeypatch.setattr(worker_mod, "open_appender", open_appender)
    monkeypatch.setattr(worker_mod, "find_applied", find_applied)
    monkeypatch.setattr(worker_mod, "log_end", log_end)
    source_meta = SimpleNamespace(get_log=lambda name: Versioned(SimpleNamespace(max_segment_seq=0), 0), segments=lambda name: [])
    pool = SimpleNamespace(nodes={}, refresh=lambda: asyncio.sleep(0, {}))

    async def scenario():
        stop = asyncio.Event()
        reader = FakeReader(records, stop, stop_at)
        monkeypatch.setattr(worker_mod, "LogReader", lambda *args, **kwargs: reader)
        config = StreamConfig("a-to-b", "a", "zk", "b", ("orders",), bidirectional=bidirectional)
        w = worker_mod.StreamWorker(
            config, "orders", "b1", sink_meta=None, sink_pool=pool, source_meta=source_meta, source_pool=pool, stop=stop,
            options=worker_mod.WorkerOptions(checkpoint_interval=0.0, pin_interval=1e9, contact_interval=1e9),
        )
        await asyncio.wait_for(w.run(), 10)
        return w.streams.written, reader.handed

    written, handed = asyncio.run(scenario())
    return appender, written, handed


# Source segment 1. Entry 0: a lone record, request A (3), request B (2), a request of one.
# Entry 1: request C says 4 records but the entry holds 2 (larger than the source writer's
# entry: not atomic at the source either). Entry 2: a record without a mark, request D (3)
# whose middle record came from the sink itself (the causal filter drops it there).
SOURCE = [
    _rec(1, 0, 0, "x"),
    _rec(1, 0, 1, "a0", 3), _rec(1, 0, 2, "a1"), _rec(1, 0, 3, "a2"),
    _rec(1, 0, 4, "b0", 2), _rec(1, 0, 5, "b1"),
    _rec(1, 0, 6, "y", 1),
    _rec(1, 1, 0, "c0", 4), _rec(1, 1, 1, "c1"),
    _rec(1, 2, 0, "z"),
    _rec(1, 2, 1, "d0", 3), _rec(1, 2, 2, "d1", origin="b"), _rec(1, 2, 3, "d2"),
]
# Positions right after the end of a source request: the only ones a checkpoint may name.
BOUNDARIES = {DLSN(1, 0, 1), DLSN(1, 0, 4), DLSN(1, 0, 6), DLSN(1, 0, 7), DLSN(1, 2, 1), DLSN(1, 2, 4)}


def test_the_worker_submits_each_source_request_together_and_checkpoints_only_between_requests(monkeypatch):
    # x and a0 are in the sink already (an earlier run), d1 is the sink's own record: all
    # dropped, the rest of their requests still goes out together.
    appender, written, _ = run_worker(monkeypatch, SOURCE, bidirectional=True, already=DLSN(1, 0, 1))
    assert appender.calls == [
        ("group", ["a1", "a2"]),
        ("group", ["b0", "b1"]),
        ("one", ["y"]),
        ("group", ["c0", "c1"]),  # ended by the next entry
        ("one", ["z"]),
        ("group", ["d0", "d2"]),
    ]
    assert all(PRODUCER_HEADER not in h and h["app"] == b"kept" and h[ORIGIN_CLUSTER] == b"a" for h in appender.headers)
    nexts = [cp.next for cp in written]
    assert len(nexts) > 4 and set(nexts) <= BOUNDARIES, nexts
    assert nexts[-1] == DLSN(1, 2, 4) and written[-1].processed_records == len(SOURCE) and written[-1].applied_records == 10


def test_stopping_inside_a_source_request_finishes_it_first(monkeypatch):
    appender, written, handed = run_worker(monkeypatch, SOURCE, stop_at="a0")
    assert appender.calls == [("one", ["x"]), ("group", ["a0", "a1", "a2"])]
    assert handed == ["x", "a0", "a1", "a2"]  # nothing read past the request
    assert written[-1].next == DLSN(1, 0, 4) and {cp.next for cp in written} <= BOUNDARIES


def test_a_request_too_large_for_one_sink_request_is_applied_record_by_record(monkeypatch):
    appender, written, _ = run_worker(monkeypatch, SOURCE[:6], appender=FakeAppender(group_limit=2))
    assert appender.calls == [("one", ["x"]), ("one", ["a0"]), ("one", ["a1"]), ("one", ["a2"]), ("group", ["b0", "b1"])]
    assert written[-1].next == DLSN(1, 0, 6)
