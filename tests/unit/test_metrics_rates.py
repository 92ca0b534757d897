"""``dlctl top``'s arithmetic over two scrapes (dlctl.metrics): rates, quantiles, lag rows. The
expositions come from a real prometheus_client registry fed known observations."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from dlctl.metrics.rates import agent_row, growth, log_rows, quantile, stream_rows
from dlctl.metrics.scrape import parse


class Agent:
    """A registry with a few of the agent's metrics, under the agent's names."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.written = Counter("dlagent_written_entries_total", "", registry=r)
        self.requests = Histogram("dlagent_request_duration_seconds", "", ["op"], buckets=(0.001, 0.002, 0.004, 0.008), registry=r)
        self.lag = Gauge("dlagent_replication_lag_records", "", ["stream", "log"], registry=r)
        self.applied = Counter("dlagent_replication_applied_records_total", "", ["stream", "log"], registry=r)
        self.queue = Gauge("dlagent_proxy_queue_bytes", "", ["log"], registry=r)
        self.producers = Gauge("dlagent_proxy_producers", "", ["log"], registry=r)
        self.safe = Gauge("dlagent_replication_safe_timestamp_seconds", "", ["stream", "log"], registry=r)
        self.wire = Counter("dlagent_replication_wire_bytes", "", ["stream", "log"], registry=r)
        self.payload = Counter("dlagent_replication_payload_bytes", "", ["stream", "log"], registry=r)

    def snapshot(self, at: float):
        return parse(generate_latest(self.registry).decode(), at=at)


def test_rates_are_counter_growth_over_the_time_between_scrapes():
    agent = Agent()
    agent.written.inc(100)
    before = agent.snapshot(10.0)
    agent.written.inc(50)
    row = agent_row("n1", before, agent.snapshot(12.0))
    assert row["write_entries_per_s"] == 25.0 and row["written_entries"] == 150
    assert agent_row("n1", None, agent.snapshot(12.0))["write_entries_per_s"] is None  # first round: totals only


def test_a_counter_that_went_down_counts_from_zero():
    before = parse("# TYPE dlagent_written_entries_total counter\ndlagent_written_entries_total 500\n", at=0)
    after = parse("# TYPE dlagent_written_entries_total counter\ndlagent_written_entries_total 30\n", at=1)
    assert growth(before, after, "dlagent_written_entries_total") == 30  # the agent restarted


def test_write_latency_quantiles_come_from_the_buckets_that_grew_in_the_interval():
    agent = Agent()
    for _ in range(1000):
        agent.requests.labels("add").observe(0.0075)  # slow, before the interval: not counted
    before = agent.snapshot(0.0)
    for seconds in [0.0005] * 90 + [0.003] * 10:
        agent.requests.labels("add").observe(seconds)
    for _ in range(50):
        agent.requests.labels("long_poll").observe(0.0079)  # not a write
    row = agent_row("n1", before, agent.snapshot(1.0))
    assert 0 < row["add_p50_ms"] <= 1.0  # 90 % below 1 ms
    assert 2.0 < row["add_p99_ms"] <= 4.0  # the slowest 10 % in (2, 4] ms


def test_quantile_interpolates_within_a_bucket_as_prometheus_does():
    buckets = [(1.0, 10.0), (2.0, 30.0), (float("inf"), 30.0)]
    assert quantile(0.5, buckets) == pytest.approx(1.25)  # rank 15: a quarter into (1, 2]
    assert quantile(0.1, buckets) == pytest.approx(0.3)
    assert quantile(0.99, [(1.0, 1.0), (float("inf"), 10.0)]) == 1.0  # beyond the last bound: that bound
    assert quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None


def test_stream_and_log_rows_come_from_the_agent_that_reports_them():
    worker, owner = Agent(), Agent()
    worker.lag.labels("a-to-b", "ledger").set(7)
    worker.applied.labels("a-to-b", "ledger").inc(10)
    before = {"w": worker.snapshot(0.0), "o": owner.snapshot(0.0)}
    worker.applied.labels("a-to-b", "ledger").inc(40)
    owner.queue.labels("ledger").set(4096)
    owner.producers.labels("ledger").set(3)
    after = {"w": worker.snapshot(2.0), "o": owner.snapshot(2.0)}
    [row] = stream_rows(before, after, wall_now=1000.0)
    assert (row["stream"], row["log"], row["worker"], row["lag_records"], row["applied_per_s"]) == ("a-to-b", "ledger", "w", 7, 20.0)
    assert row["safe_time_ago_s"] is None and row["compression_ratio"] is None  # not measured yet
    worker.safe.labels("a-to-b", "ledger").set(990.0)
    worker.wire.labels("a-to-b", "ledger").inc(1000)
    worker.payload.labels("a-to-b", "ledger").inc(6500)
    [row] = stream_rows(before, {**after, "w": worker.snapshot(2.0)}, wall_now=1000.0)
    assert (row["safe_time_ago_s"], row["compression_ratio"]) == (10.0, 6.5)
    assert log_rows(after) == [{"log": "ledger", "owner": "o", "queue_bytes": 4096, "producers": 3}]


def test_text_that_is_not_the_exposition_format_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="not the Prometheus text format"):
        parse("dlagent_written_entries_total{ 12\n")
