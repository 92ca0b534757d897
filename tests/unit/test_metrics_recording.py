"""The agent's metrics without a network: what the replication workers' reports become, the
state read on the event loop at scrape time, and the request ops' fixed label set."""

from __future__ import annotations

import asyncio
import threading

import pytest
from dlagent import metrics as agent_metrics
from dlagent.metrics import AgentMetrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dlctl.log.protocol import Op
from dlctl.replication.records import lag_seconds
from dlctl.replication.worker import WorkerReport


def samples(metrics: AgentMetrics) -> dict[tuple[str, tuple], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def report(applied: int, lag: int | None = None, *, caught_up_at: float = 0.0, created: float = 100.0) -> WorkerReport:
    return WorkerReport("a-to-b", "orders", applied, 50.0 if applied else 0.0, caught_up_at, created, lag, None if lag is None else lag * 10)


LABELS = (("log", "orders"), ("stream", "a-to-b"))


def test_a_worker_run_counts_only_what_it_applied_after_its_start():
    metrics = AgentMetrics()
    first = metrics.worker_observer()
    first(report(1000))  # the checkpoint at the run's start: earlier runs (maybe on other agents)
    first(report(1040))
    first(report(1040))
    assert samples(metrics)[("dlagent_replication_applied_records_total", LABELS)] == 40
    second = metrics.worker_observer()  # a restarted run: a new baseline
    second(report(1040))
    second(report(1043))
    assert samples(metrics)[("dlagent_replication_applied_records_total", LABELS)] == 43


def test_lag_is_shown_while_a_worker_runs_here_and_the_counter_stays_after_it_stops():
    metrics = AgentMetrics()
    observe = metrics.worker_observer()
    observe(report(0))
    got = samples(metrics)
    assert ("dlagent_replication_lag_records", LABELS) not in got  # not measured yet: left out, not 0
    observe(report(5, lag=0, caught_up_at=120.0))
    got = samples(metrics)
    assert (got[("dlagent_replication_lag_records", LABELS)], got[("dlagent_replication_lag_bytes", LABELS)]) == (0, 0)
    assert got[("dlagent_replication_lag_seconds", LABELS)] == 0
    assert got[("dlagent_replication_last_apply_timestamp_seconds", LABELS)] == 50.0
    metrics.worker_stopped("a-to-b", "orders")
    got = samples(metrics)
    assert ("dlagent_replication_lag_records", LABELS) not in got  # another agent's to report now
    assert got[("dlagent_replication_applied_records_total", LABELS)] == 5


def test_lag_seconds_follows_the_status_rule():
    assert lag_seconds(None, 0.0, 10.0, 100.0) is None
    assert lag_seconds(0, 0.0, 10.0, 100.0) == 0.0
    assert lag_seconds(3, 90.0, 10.0, 100.0) == 10.0  # since it last had everything
    assert lag_seconds(3, 0.0, 10.0, 100.0) == 90.0  # never caught up: since the stream began


def test_unknown_ops_are_counted_as_other():
    metrics = AgentMetrics()
    metrics.request(Op.ADD_ENTRY, 0.001)
    metrics.request(Op.AUTH, 0.001)
    metrics.request(-1, 0.001)
    got = samples(metrics)
    assert got[("dlagent_request_duration_seconds_count", (("op", "add"),))] == 1
    assert got[("dlagent_request_duration_seconds_count", (("op", "other"),))] == 2
    ops = {dict(k[1]).get("op") for k in got if k[0] == "dlagent_request_duration_seconds_count"}
    assert ops == set(agent_metrics.REQUEST_OPS.values()) | {"other"}  # a fixed set, all present from the start


class FakeStore:
    def __init__(self) -> None:
        self.threads: list[int] = []

    def stat(self) -> dict:
        self.threads.append(threading.get_ident())
        return {
            "segments": 3, "bytes": 4096, "limbo": 1, "disk_total_bytes": 1000, "disk_free_bytes": 400,
            "read_entries": 7, "read_bytes": 700, "reclaimed_bytes": 9, "reclaimed_replicas": 2,
        }


def test_state_is_read_on_the_event_loop_when_scraped_from_another_thread():
    async def body() -> tuple[dict, list[int], int]:
        metrics = AgentMetrics()
        store = FakeStore()
        metrics.watch(store)
        got = await asyncio.to_thread(samples, metrics)  # the endpoint's thread
        return got, store.threads, threading.get_ident()

    got, threads, loop_thread = asyncio.run(body())
    assert threads == [loop_thread]
    assert got[("dlagent_segments", ())] == 3 and got[("dlagent_segment_bytes", ())] == 4096
    assert got[("dlagent_limbo_replicas", ())] == 1
    assert (got[("dlagent_disk_free_bytes", ())], got[("dlagent_disk_total_bytes", ())]) == (400, 1000)
    assert (got[("dlagent_read_entries_total", ())], got[("dlagent_read_bytes_total", ())]) == (7, 700)
    assert (got[("dlagent_gc_reclaimed_bytes_total", ())], got[("dlagent_gc_deleted_segments_total", ())]) == (9, 2)


def test_a_loop_that_does_not_answer_leaves_the_state_out_instead_of_holding_the_scrape(monkeypatch):
    monkeypatch.setattr(agent_metrics, "SNAPSHOT_TIMEOUT", 0.2)

    got: dict = {}

    async def body() -> None:
        metrics = AgentMetrics()
        metrics.watch(FakeStore())
        scraper = threading.Thread(target=lambda: got.update(samples(metrics)))
        scraper.start()
        scraper.join(5.0)  # the loop's thread waits here, blocked past the timeout
        assert not scraper.is_alive()

    asyncio.run(body())
    assert ("dlagent_segments", ()) not in got
    assert ("dlagent_written_bytes_total", ()) in got  # what does not need the loop is still there


@pytest.mark.parametrize("held", [True, False])
def test_roles_are_always_present_as_0_or_1(held):
    metrics = AgentMetrics()
    metrics.role("auditor", held)
    got = samples(metrics)
    assert got[("dlagent_role", (("role", "auditor"),))] == (1 if held else 0)
    assert got[("dlagent_role", (("role", "housekeeper"),))] == 0
