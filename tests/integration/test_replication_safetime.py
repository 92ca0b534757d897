"""A stream's safe time (issue 23) between two clusters of real agents: one stream over two logs,
records appended at the source the whole time, one log's source cut off from the sink.

The oracle is the test's own record: every record it appended, with the time its append was
acknowledged (the test's clock: a callback on the append's future), and every record a real
log reader finds at the sink. Whatever safe time ``replication status`` reports, every record
acknowledged at or before it (less ``LAC_TOLERANCE``) must already be at the sink; the safe
time never goes back; it is held back by the cut-off log while the other log's goes on; it
passes the heal once the stream has caught up, and the end of the load once the load stops.

Tolerances (every process here shares one clock, so none for clock skew):

* ``LAC_TOLERANCE``: a record acknowledged to its writer becomes readable at the source once
  its entry's LAC is published (with the writer's next entry, or ``lac_delay`` after it goes
  idle, and stored by a replica); the safe time covers what was readable, so records
  acknowledged in the last ``LAC_TOLERANCE`` before it are not checked.
* ``VISIBLE_WITHIN``: the sink holds a record once the worker's append is acknowledged; the
  test's tailing reader sees it once the sink's LAC is published and the read comes back. A
  record the safe time covers may take this long to show up, no longer (while a log is cut
  off, its missing records cannot arrive at all).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from harness.agents import harness_credentials
from harness.logcluster import eventually, log_writer, run
from harness.twoclusters import Sites, sites_for_test
from prometheus_client.parser import text_string_to_metric_families

from dlctl.log.pool import AgentPool
from dlctl.log.reader import LogReader
from dlctl.meta.records import LogConfig, SegmentState
from dlctl.ops import replication as ops
from dlctl.ops import streams as stream_ops
from dlctl.plan import apply

pytestmark = pytest.mark.zk

LAC_TOLERANCE = 0.5
VISIBLE_WITHIN = 3.0
STEADY, CUT = "steady", "cut"  # the cut log has one replica (E=W=A=1), so one proxy cuts it off
STREAM = "a-to-b"


@pytest.fixture
def sites(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request)


class TimedLoad:
    """Appends numbered records to a source log until stopped; ``acked`` holds each record's
    payload and when its append was acknowledged, in log order (futures resolve in order)."""

    def __init__(self, meta, name: str) -> None:
        self.meta, self.name = meta, name
        self.acked: list[tuple[bytes, float]] = []
        self._stop = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def _on_ack(self, payload: bytes, future: asyncio.Future) -> None:
        if not future.cancelled() and future.exception() is None:
            self.acked.append((payload, time.time()))

    async def _run(self) -> None:
        async with log_writer(self.meta, self.name) as writer:
            i = 0
            while not self._stop.is_set():
                for _ in range(10):
                    payload = f"{self.name}-{i}".encode()
                    writer.submit(payload).add_done_callback(lambda f, p=payload: self._on_ack(p, f))
                    i += 1
                await writer.flush()
                await asyncio.sleep(0.05)  # about 200 records a second: a steady trickle

    async def stop(self) -> None:
        self._stop.set()
        await self._task


class SinkTail:
    """A real log reader tailing a sink log: the payloads the sink holds, in order."""

    def __init__(self, meta, name: str) -> None:
        self.meta, self.name = meta, name
        self.payloads: list[bytes] = []
        self._stop = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        pool = AgentPool(self.meta, harness_credentials())
        try:
            async with LogReader(self.meta, pool, self.name) as reader:
                while not self._stop.is_set():
                    record = await reader.read_next(0.2)
                    if record is not None:
                        self.payloads.append(record.payload)
        finally:
            await pool.close()

    async def stop(self) -> None:
        self._stop.set()
        await self._task


@dataclass
class Watch:
    """Status reads so far: the highest safe times seen (they must never go back)."""

    stream: float = 0.0
    logs: dict[str, float] = field(default_factory=dict)
    reads: int = 0


def scrape_safe_times(sites: Sites) -> dict[str, float]:
    """log -> dlagent_replication_safe_timestamp_seconds of the stream, from every sink agent."""
    out: dict[str, float] = {}
    b = sites["b"]
    for node in b.agents.values():
        address = node.metrics_address(b.admin)
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "dlagent_replication_safe_timestamp_seconds" and s.labels.get("stream") == STREAM:
                    out[s.labels["log"]] = max(out.get(s.labels["log"], 0.0), s.value)
    return out


def test_safe_time_covers_every_record_acknowledged_before_it_holds_back_for_a_cut_off_log_and_advances_after(sites: Sites):
    a, b = sites["a"], sites["b"]
    a.meta().create_log(STEADY, LogConfig())
    a.meta().create_log(CUT, LogConfig(1, 1, 1))
    built = ops.init_plan(a.session(), b.session(), patterns=(STEADY, CUT))
    apply(built.plan)
    source, sink = a.session(), b.session()
    watch = Watch()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loads = {name: TimedLoad(a.meta(), name) for name in (STEADY, CUT)}
        tails = {name: SinkTail(b.meta(), name) for name in (STEADY, CUT)}

        async def status() -> dict:
            """One status read, judged: monotonic, never ahead of now, and every record
            acknowledged by a log's safe time (less the tolerance) is at the sink."""
            asked = time.time()
            got = await loop.run_in_executor(None, stream_ops.stream_status, sink, source, STREAM)
            watch.reads += 1
            per_log = {r["log"]: r["safe_time"] or 0.0 for r in got["logs"]}
            stream = got["safe_time"] or 0.0
            assert stream >= watch.stream, f"the stream's safe time went back: {stream} < {watch.stream}"
            assert stream <= asked, f"a safe time in the future: {stream} > {asked}"
            for name, value in per_log.items():
                assert value >= watch.logs.get(name, 0.0), f"{name}: safe time went back: {value} < {watch.logs[name]}"
            assert stream == (min(per_log.values()) if all(per_log.values()) else 0.0), got
            watch.stream, watch.logs = stream, per_log
            for name, value in per_log.items():
                if not value:
                    continue
                due = [p for p, acked in list(loads[name].acked) if acked <= value - LAC_TOLERANCE]
                tail = tails[name]
                await eventually(
                    lambda: len(tail.payloads) >= len(due), timeout=VISIBLE_WITHIN,
                    message=f"{name}: the {len(due)} records acknowledged by its safe time {value:.3f} at the sink (has {len(tail.payloads)})",
                )
                assert tail.payloads[: len(due)] == due, f"{name}: the sink holds other records than the source acknowledged by {value:.3f}"
            return got

        def safe_past(t: float, name: str | None = None):
            """A condition to await: the stream's (or log ``name``'s) safe time is past ``t``;
            every status read on the way is judged."""

            async def predicate() -> bool:
                got = await status()
                value = got["safe_time"] if name is None else next(r["safe_time"] for r in got["logs"] if r["log"] == name)
                return (value or 0.0) > t

            return predicate

        try:
            started = time.time()
            await eventually(safe_past(started + 1.0), timeout=60, message="a stream safe time past the load's start")

            # Cut the sink off the cut log's only replica (the steady log's reads go to its others).
            (segment,) = [s.value for s in a.meta().segments(CUT) if s.value.state is SegmentState.INPROGRESS]
            (node,) = segment.ensembles[-1].nodes
            proxy = next(p for p in sites.network.proxies if p.name == f"{node}-for-b")
            proxy.blackhole(True)
            cut_at = time.time()
            cut_acked = len(loads[CUT].acked)

            # The steady log's safe time goes on, the stream's stays behind the cut.
            await eventually(safe_past(cut_at + 5.0, STEADY), timeout=60, message="the steady log's safe time past the cut")
            got = await status()
            assert (got["safe_time"] or 0.0) <= cut_at + LAC_TOLERANCE, f"the cut-off log did not hold the stream's safe time back: {got}"
            assert len(tails[CUT].payloads) < len(loads[CUT].acked) - 500, "the cut did not stop the cut log"  # else this proves nothing
            assert len(loads[CUT].acked) > cut_acked + 500  # the source went on taking records

            proxy.blackhole(False)
            healed_at = time.time()
            await eventually(safe_past(healed_at), timeout=90, message="the stream's safe time past the heal")
        finally:
            for load in loads.values():
                await asyncio.wait_for(load.stop(), 60)
        last_ack = max(acked for load in loads.values() for _, acked in load.acked)
        try:
            # Idle now: the safe time passes the last record (measures of an idle source move it).
            await eventually(safe_past(last_ack), timeout=60, message="the stream's safe time past the last record")
            for name, load in loads.items():
                await eventually(lambda name=name: len(tails[name].payloads) >= len(loads[name].acked), timeout=30, message=f"{name}: every record at the sink")
                assert tails[name].payloads == [p for p, _ in load.acked], f"{name}: the sink log differs from the source's"
        finally:
            for tail in tails.values():
                await asyncio.wait_for(tail.stop(), 30)

        # The agents export each log's safe time; the stream's is the oldest (PromQL: min by (stream)).
        before = watch.stream
        exported = await loop.run_in_executor(None, scrape_safe_times, sites)
        assert set(exported) == {STEADY, CUT}, exported
        assert before <= min(exported.values()) <= time.time(), (before, exported)

    run(scenario(), timeout=360)
    assert watch.reads > 10
