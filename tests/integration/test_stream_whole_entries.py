"""A stream worker applying whole entries of local records in C (dlctl.replication.fastpath)
leaves the very sink log its per-record path leaves: two workers run in this process against
real agents and ZooKeeper — a -> b with whole entries, a -> c record by record — over a source
log mixing entries of plain and keyed local records (a full entry splits into several sink
entries), application headers and a relayed record (those entries, or their rest, go record by
record in the first worker too). Both sink logs must hold the same records (txid, key, payload,
headers); their origin headers are also checked by hand against the source's positions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agents import harness_credentials
from harness.logcluster import eventually, run
from harness.twoclusters import Sites, read_all, sites_for_test

from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.meta.records import LogConfig
from dlctl.ops import replication as ops
from dlctl.plan import Plan, apply
from dlctl.replication.origin import ORIGIN_CLUSTER, ORIGIN_DLSN, VECTOR_TIME
from dlctl.replication.store import StreamStore
from dlctl.replication.worker import StreamWorker, WorkerOptions

pytestmark = pytest.mark.zk

LOG = "mixed"
RELAYED = {ORIGIN_CLUSTER: b"z", ORIGIN_DLSN: b"4/0/0", VECTOR_TIME: b"z=1"}


@pytest.fixture
def sites(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b", "c"), proxied=False)


async def write_source(meta) -> int:
    """Entries of: 3,000 plain records (more than one sink entry's worth once the headers are
    added), keyed records, records with an application header, a relayed record, plain again."""
    pool = AgentPool(meta, harness_credentials())
    count = 0
    try:
        writer = await LogWriter.open(meta, pool, LOG)
        try:
            groups = [
                [(b"plain-%05d" % i + b"." * 90, b"", None) for i in range(3000)],
                [(b"keyed-%d" % i, b"k%d" % (i % 3), None) for i in range(50)],
                [(b"before", b"", None), (b"app", b"", {"app": b"v"}), (b"after", b"", None)],
                [(b"relayed", b"", RELAYED), (b"local-after-relayed", b"", None)],
                [(b"tail-%d" % i, b"", None) for i in range(500)],
            ]
            for group in groups:
                for payload, key, headers in group:
                    writer.submit(payload, key=key, headers=headers)
                    count += 1
                await writer.flush()  # each group in entries of its own
        finally:
            await writer.close()
    finally:
        await pool.close()
    return count


def registered_not_started(sites: Sites, sink: str) -> None:
    """The stream a -> ``sink`` set up as init-replication does, but not activated: the sink's
    agents leave it alone, and the test runs its worker."""
    built = ops.init_plan(sites["a"].session(), sites[sink].session(), patterns=(LOG,))
    steps = [step for step in built.plan.steps if step.action != "activate"]
    assert len(steps) < len(built.plan.steps)
    apply(Plan.of(built.plan.operation, steps))


async def replicate(sites: Sites, sink: str, total: int, whole_entries: bool) -> StreamWorker:
    stream_id = f"a-to-{sink}"
    sink_meta, source_meta = sites[sink].meta(), sites["a"].meta()
    streams = StreamStore(sink_meta)
    config = streams.get_config(stream_id).value
    sink_pool, source_pool = AgentPool(sink_meta, harness_credentials()), AgentPool(source_meta, harness_credentials())
    stop = asyncio.Event()
    worker = StreamWorker(
        config, LOG, f"{sink}-test", sink_meta=sink_meta, sink_pool=sink_pool, source_meta=source_meta, source_pool=source_pool, stop=stop,
        options=WorkerOptions(checkpoint_interval=0.1, pin_interval=1e9, whole_entries=whole_entries),
    )
    task = asyncio.ensure_future(worker.run())
    try:
        await eventually(lambda: task.done() or streams.get_checkpoint(stream_id, LOG).value.applied_records == total, 60, f"{sink} to apply {total} records")
    finally:
        stop.set()
        await task  # raises what the run raised
        await sink_pool.close()
        await source_pool.close()
    return worker


def test_whole_entries_in_c_leave_the_sink_log_the_per_record_path_leaves(sites: Sites):
    sites["a"].meta().create_log(LOG, LogConfig())
    total = run(write_source(sites["a"].meta()))
    registered_not_started(sites, "b")
    registered_not_started(sites, "c")
    fast = run(replicate(sites, "b", total, whole_entries=True))
    slow = run(replicate(sites, "c", total, whole_entries=False))
    # The first worker took most records in C, and the entries with headers record by record;
    # the second never used the C loop.
    assert fast.stats_whole_records == 3000 + 50 + 500, fast.stats_whole_records
    assert slow.stats_whole_records == 0

    source = run(read_all(sites["a"].meta(), LOG, until=total))
    in_b = run(read_all(sites["b"].meta(), LOG, until=total))
    in_c = run(read_all(sites["c"].meta(), LOG, until=total))

    def content(records):
        return [(r.txid, r.key, r.payload, dict(r.headers)) for r in records]

    assert len(in_b) == len(in_c) == total
    assert content(in_b) == content(in_c)
    assert [r.txid for r in in_b] == list(range(in_b[0].txid, in_b[0].txid + total))  # the sink writer's, one by one
    # By hand: a local record's origin is a at its position there; its time counts a's records
    # (the relayed one's z component joins and stays); the relayed one keeps its origin.
    local = 0
    seen_z = False
    for at_source, at_sink in zip(source, in_b, strict=True):
        assert at_sink.payload == at_source.payload and at_sink.key == at_source.key
        if at_source.headers.get(ORIGIN_CLUSTER) == b"z":
            seen_z = True
            assert at_sink.headers[ORIGIN_CLUSTER] == b"z" and at_sink.headers[ORIGIN_DLSN] == b"4/0/0" and at_sink.headers[VECTOR_TIME] == b"z=1"
            continue
        local += 1
        assert at_sink.headers[ORIGIN_CLUSTER] == b"a"
        assert at_sink.headers[ORIGIN_DLSN] == str(at_source.dlsn).encode()
        assert at_sink.headers[VECTOR_TIME] == (b"a=%d,z=1" % local if seen_z else b"a=%d" % local)
        assert at_sink.headers.get("app") == at_source.headers.get("app")
