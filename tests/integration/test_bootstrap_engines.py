"""Where the bootstrap copies of an ``init-replication`` run (issue 27 item 3): real ZooKeeper,
real agents of two clusters, real Spark in local mode, the plan applied as the CLI applies it.

* Copies that need Spark (here forced: ``bootstrap_local_below=0``) share one Spark context,
  however many logs the run copies: its start is the plan's first step (in the background), the
  copies report how many contexts the run started, and it is stopped when the plan ends.
* Copies below the threshold (the default, for logs this small) run in-process: no Spark at all.

Either way every source record arrives at the sink once, in order. The in-process path's
verification, job records and resumption after a kill, side by side with the Spark path's:
``test_bootstrap.py`` (``test_killing_the_driver_midway...``, one run per engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agents import harness_credentials
from harness.logcluster import run
from harness.twoclusters import Sites, read_all, sites_for_test

from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.meta.records import LogConfig
from dlctl.ops import replication as ops
from dlctl.plan import apply
from dlctl.spark.engine import contexts_started

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.spark, pytest.mark.slow]

LOGS = ("orders", "payments", "audit")
SEGMENTS, PER_SEGMENT = 3, 40


@pytest.fixture
def pair(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b"))


async def fill(site, name: str) -> None:
    """``SEGMENTS`` completed segments (closing a writer completes its segment)."""
    pool = AgentPool(site.meta(), harness_credentials())
    try:
        for s in range(SEGMENTS):
            writer = await LogWriter.open(site.meta(), pool, name)
            for i in range(PER_SEGMENT):
                writer.submit(f"{name}-{s}-{i}-".encode() + b"." * 500)
            await writer.close()
    finally:
        await pool.close()


def spark_running() -> bool:
    """A SparkContext is active in this process (once a stop that ``SparkEngine.stop`` left to
    finish in the background is done: the JVM side stops at once, PySpark's own after)."""
    from pyspark import SparkContext

    from dlctl.spark import engine

    if engine._stopping is not None:
        engine._stopping.join(60)
    return SparkContext._active_spark_context is not None


@pytest.mark.parametrize(("local_below", "engine"), [(0, "spark"), (None, "local")], ids=["forced-spark", "default-in-process"])
def test_the_copies_of_a_multi_log_init_replication_share_one_spark_start_or_none(pair: Sites, local_below: int | None, engine: str):
    a, b = pair["a"], pair["b"]
    for name in LOGS:
        a.meta().create_log(name, LogConfig())
        asyncio.run(fill(a, name))
    expected = {name: [r.payload for r in run(read_all(a.meta(), name, until=SEGMENTS * PER_SEGMENT), timeout=120)] for name in LOGS}
    assert not spark_running()
    before = contexts_started()

    built = ops.init_plan(a.session(), b.session(), patterns=LOGS, bootstrap="always", bootstrap_local_below=local_below)
    actions = [s.action for s in built.plan.steps]
    assert actions.count("bootstrap") == len(LOGS), actions
    # Spark's start is the plan's first step when a copy needs it (it runs while the steps before
    # the copies do), and no step at all when none does.
    assert ("start-spark" in actions) == (engine == "spark") and actions.index("bootstrap") > 0
    if engine == "spark":
        assert actions[0] == "start-spark"
    assert contexts_started() == before and not spark_running(), "building the plan (a dry run) must start nothing"

    result = apply(built.plan)
    copies = [o.result for o in result.outcomes if o.step.action == "bootstrap"]
    assert [c["engine"] for c in copies] == [engine] * len(LOGS), copies
    starts = 1 if engine == "spark" else 0
    # Each copy reports the contexts started since the run began: one, from the first copy on.
    assert [c["spark_starts"] for c in copies] == [starts] * len(LOGS), copies
    assert contexts_started() - before == starts
    if engine == "spark":
        assert len({c["spark_log"] for c in copies}) == 1 and copies[0]["spark_log"], "one context, one Spark log"
    assert not spark_running(), "the run's Spark context must be stopped when the plan ends"

    for name in LOGS:
        got = run(read_all(b.meta(), name, until=SEGMENTS * PER_SEGMENT), timeout=120)
        assert [r.payload for r in got] == expected[name], f"{name}: the sink must hold every source record once, in order"


def test_spark_is_stopped_when_an_init_replication_fails_after_starting_it(pair: Sites):
    a, b = pair["a"], pair["b"]
    a.meta().create_log("first", LogConfig())
    asyncio.run(fill(a, "first"))
    a.meta().create_log("second", LogConfig())
    asyncio.run(fill(a, "second"))
    # The second copy is refused: its sink log already holds records of its own (txids in the way).
    b.meta().create_log("second", LogConfig())
    asyncio.run(fill(b, "second"))
    built = ops.init_plan(a.session(), b.session(), patterns=("first", "second"), bootstrap="always", bootstrap_local_below=0)
    assert built.plan.steps[0].action == "start-spark"
    from dlctl.plan import PlanFailed

    with pytest.raises(PlanFailed) as failed:
        apply(built.plan)
    outcomes = {o.step.target: o for o in failed.value.result.outcomes if o.step.action == "bootstrap"}
    assert outcomes["b/first"].status.value == "done" and outcomes["b/second"].status.value == "failed", failed.value.result.to_dict()
    assert not spark_running(), "a failed run must still stop the Spark context it started"
