"""Which engine a bootstrap copy gets (``dlctl.spark.engines``) and the in-process engine's stage
contract (``dlctl.spark.local``): the same as ``SparkEngine.run``'s, without a JVM."""

from __future__ import annotations

import threading

import pytest

from dlctl.errors import DlctlError, RefusedError
from dlctl.spark.engine import EngineOptions
from dlctl.spark.engines import DEFAULT_LOCAL_BELOW, Engines
from dlctl.spark.local import MAX_DEFAULT_SLOTS, PULLS_PER_SINK_AGENT, LocalEngine

MIB = 1024 * 1024


def test_a_copy_below_the_threshold_runs_in_process_and_one_at_or_above_it_needs_spark():
    engines = Engines(EngineOptions(parallelism=3), local_below=64 * MIB)
    assert not engines.needs_spark(64 * MIB - 1) and engines.needs_spark(64 * MIB)
    small = engines.for_copy(MIB)
    assert isinstance(small, LocalEngine) and small.kind == "local" and small.slots == 3
    assert engines.spark_starts == 0


def test_by_default_an_in_process_copy_keeps_two_pulls_per_sink_agent_going_and_a_relay_one_per_core(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    pulled = Engines(EngineOptions()).for_copy(MIB, sink_agents=5)
    assert pulled.slots == PULLS_PER_SINK_AGENT * 5 == 10
    # Relayed, the copy runs on this process's cores, whatever the sink.
    assert Engines(EngineOptions(relay=True)).for_copy(MIB, sink_agents=5).slots == 2
    # Never fewer than the cores, never more than the cap, and --parallelism always wins.
    assert Engines(EngineOptions()).for_copy(MIB, sink_agents=0).slots == 2
    assert Engines(EngineOptions()).for_copy(MIB, sink_agents=1000).slots == MAX_DEFAULT_SLOTS
    assert Engines(EngineOptions(parallelism=3)).for_copy(MIB, sink_agents=5).slots == 3


def test_an_explicit_master_or_a_zero_threshold_always_means_spark():
    assert Engines(EngineOptions(master="spark://h:7077")).needs_spark(0)
    assert Engines(EngineOptions(), local_below=0).needs_spark(0)
    assert not Engines(EngineOptions()).needs_spark(DEFAULT_LOCAL_BELOW - 1)
    with pytest.raises(ValueError):
        Engines(EngineOptions(), local_below=-1)


def test_a_spark_start_that_fails_in_the_background_is_raised_to_the_copy_that_needs_it():
    pytest.importorskip("pyspark")
    # A real cluster master without Spark authentication and encryption: the start refuses
    # before any JVM (the secrets must not travel in the clear).
    engines = Engines(EngineOptions(master="spark://127.0.0.1:7077"))
    engines.prestart()
    with pytest.raises(RefusedError, match="without authentication and encryption"):
        engines.for_copy(1)
    assert engines.spark_starts == 0
    engines.close()


def test_the_in_process_engine_returns_every_result_in_item_order_and_reports_each_as_its_item_finishes():
    engine = LocalEngine(parallelism=2)
    release_first = threading.Event()
    seen: list[int] = []
    progress: list[tuple[int, int]] = []

    def fn(item: int) -> list[dict]:
        if item == 0:
            assert release_first.wait(10), "the other items' results were not delivered while the first ran"
        return [{"item": item, "part": 0, "bytes": 10}, {"item": item, "part": 1, "bytes": 5}]

    def on_result(r: dict) -> None:
        seen.append(r["item"])
        if len(seen) == 6:  # items 1..3 delivered, on the other thread, while item 0 still runs
            release_first.set()

    results = engine.run(fn, [0, 1, 2, 3], description="test", count=lambda _i: 2, result_bytes=lambda r: r["bytes"],
                         on_result=on_result, on_progress=lambda p: progress.append((p.completed, p.bytes_done)))
    assert [(r["item"], r["part"]) for r in results] == [(i, p) for i in range(4) for p in (0, 1)]
    assert seen[-2:] == [0, 0], "the slow first item's results are delivered when it finishes, after the others'"
    assert progress[-1] == (8, 60)


def test_a_task_that_raises_fails_the_stage_with_its_error():
    def fn(item: int) -> list[dict]:
        raise OSError(f"item {item}: no such file")

    with pytest.raises(DlctlError, match="OSError: item 0: no such file"):
        LocalEngine(parallelism=1).run(fn, [0], description="copy")
