"""The safe time's computation (dlctl.replication.safetime): observations of the source's end ->
a log's safe time, checked against a model of a source log whose records' append times the test
knows; monotonic whatever it is told; bounded; the stream's value; persisted and exported."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dlagent.metrics import AgentMetrics
from dlctl.log.dlsn import DLSN
from dlctl.replication.records import Checkpoint
from dlctl.replication.safetime import MAX_PENDING, SafeTime, stream_safe_time
from dlctl.replication.worker import WorkerReport


def at(i: int) -> DLSN:
    """Position of record ``i`` of the model's source log (one record per entry); ``at(n)`` is the
    end of a log holding n records."""
    return DLSN(1, i, 0)


def test_caught_up_the_observation_time_is_safe_and_before_it_is_not():
    safe = SafeTime()
    safe.observe(100.0, at(10))
    assert safe.value_at(at(9)) == 0.0  # record 9 is not at the sink yet
    assert safe.value_at(at(10)) == 100.0
    assert safe.value == 0.0  # only a written checkpoint makes it so
    safe.settle(100.0)
    assert safe.value == 100.0 and safe.pending == ()


def test_lagging_the_newest_observation_the_applied_position_covers():
    safe = SafeTime()
    for t, end in ((10.0, 5), (12.0, 8), (14.0, 20), (16.0, 30)):
        safe.observe(t, at(end))
    assert safe.value_at(at(7)) == 10.0
    assert safe.value_at(at(8)) == 12.0
    assert safe.value_at(at(29)) == 14.0
    safe.settle(safe.value_at(at(29)))
    assert [o.at for o in safe.pending] == [16.0]  # what is covered is forgotten


def test_the_floor_of_an_earlier_worker_holds_and_older_observations_are_ignored():
    safe = SafeTime(500.0)
    safe.observe(400.0, at(1))  # before the floor: nothing to learn
    assert safe.pending == ()
    assert safe.value_at(at(0)) == 500.0
    safe.observe(600.0, at(50))
    assert safe.value_at(at(49)) == 500.0 and safe.value_at(at(50)) == 600.0


def test_a_later_smaller_end_never_takes_the_value_back():
    safe = SafeTime()
    safe.observe(10.0, at(5))
    safe.settle(safe.value_at(at(5)))
    safe.observe(11.0, at(3))  # a replica that answered late: a smaller end, a later time
    safe.settle(safe.value_at(at(5)))
    assert safe.value == 11.0
    safe.observe(12.0, at(9))
    assert safe.value_at(at(5)) == 11.0


def test_pending_observations_stay_bounded_keeping_the_newest_and_the_span():
    safe = SafeTime(limit=8)
    for i in range(1, 1000):
        safe.observe(float(i), at(i))
        assert len(safe.pending) <= 8
    assert safe.pending[-1].at == 999.0
    assert safe.pending[0].at < 999.0 - 8  # thinned, not a window of the last few
    assert safe.value_at(at(999)) == 999.0
    assert SafeTime().limit == MAX_PENDING


def test_stream_safe_time_is_the_oldest_log_and_none_while_a_log_has_none():
    assert stream_safe_time([30.0, 10.0, 20.0]) == 10.0
    assert stream_safe_time([30.0, None]) is None
    assert stream_safe_time([30.0, 0.0]) is None
    assert stream_safe_time([]) is None


# -- the model: a source log with known append times, a worker measuring and applying ----------

steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 5)),
        st.tuples(st.just("measure"), st.just(0)),  # starts a measure of the source's end
        st.tuples(st.just("answer"), st.just(0)),  # the oldest running measure answers (the end now)
        st.tuples(st.just("apply"), st.integers(1, 7)),  # the worker applies and checkpoints
        st.tuples(st.just("restart"), st.just(0)),  # another run (agent) from the checkpoint
    ),
    max_size=120,
)


@given(steps)
def test_model_every_record_appended_by_the_safe_time_is_applied_and_it_never_goes_back(script):
    appended: list[float] = []  # append time of each source record, in log order
    applied = 0  # records at the sink (the checkpoint's next: at(applied))
    persisted = 0.0  # the checkpoint's safe time
    safe = SafeTime()
    measures: list[float] = []  # start times of running measures
    for now, (kind, n) in enumerate(script, start=1):
        t = float(now)  # one step at a time: appends and measures never share an instant
        if kind == "append":
            appended += [t] * n
        elif kind == "measure":
            measures.append(t)
        elif kind == "answer" and measures:
            # The end read now is at least the end when the measure started: a true claim.
            safe.observe(measures.pop(0), at(len(appended)))
        elif kind == "apply":
            applied = min(len(appended), applied + n)
            value = max(persisted, safe.value_at(at(applied)))  # as the worker writes it
            assert value >= persisted
            persisted = value
            safe.settle(value)
            # The oracle: every record appended at or before the safe time is applied.
            assert all(i < applied for i, when in enumerate(appended) if when <= persisted), (persisted, applied, appended)
        elif kind == "restart":
            safe, measures = SafeTime(persisted), []


@given(st.lists(st.tuples(st.floats(0, 1e6), st.integers(0, 1000), st.integers(0, 50)), max_size=60))
def test_monotonic_whatever_the_observations_say(events):
    safe = SafeTime(limit=4)
    applied, previous = 0, 0.0
    for when, end, step in events:
        safe.observe(when, at(end))
        applied += step
        value = safe.value_at(at(applied))
        assert value >= previous
        safe.settle(value)
        previous = value


# -- persisted and exported ------------------------------------------------------------------


def test_the_checkpoint_keeps_the_safe_time_and_reads_one_from_before_it_existed():
    cp = Checkpoint("l", next=at(3), safe_time=1234.5)
    assert Checkpoint.from_json(cp.to_json(), "test").safe_time == 1234.5
    old = cp.to_json().replace(b',"safe_time":1234.5', b"")
    assert b"safe_time" not in old and Checkpoint.from_json(old, "test").safe_time == 0.0


def test_the_agent_exports_each_log_safe_time_once_it_has_one():
    metrics = AgentMetrics()
    observe = metrics.worker_observer()
    observe(WorkerReport("a-to-b", "orders", 0, 0.0, 0.0, 100.0))
    name = "dlagent_replication_safe_timestamp_seconds"

    def value() -> float | None:
        text = generate_latest(metrics.registry).decode()
        found = [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name and s.labels == {"stream": "a-to-b", "log": "orders"}]
        return found[0] if found else None

    assert value() is None  # none yet: left out, not 0 (min by (stream) would take it)
    observe(WorkerReport("a-to-b", "orders", 5, 50.0, 120.0, 100.0, 0, 0, safe_time=119.5))
    assert value() == 119.5
