"""The pure parts of ``dlctl bench replication``: which records count, how a lag is computed,
how records of other writers are told apart, the percentiles, and the refusals that come before
any metadata is read or written."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dlctl.errors import DlctlError, UsageError
from dlctl.ops import bench_replication
from dlctl.ops.bench import STAMP, percentiles
from dlctl.ops.bench_lag import MIN_RECORD_SIZE, PRIME_SEQ, LagSpec, _Tail, difference, first_measured, lag_samples

TAG = b"\x01" * 8


def payload(seq: int, tag: bytes = TAG) -> bytes:
    return STAMP.pack(123, seq) + tag + b"pad"


def test_lag_counts_records_after_the_warmup_that_were_acknowledged_and_seen() -> None:
    acked = [1_000_000_000, 2_000_000_000, None, 4_000_000_000, 5_000_000_000]
    seen = {0: 1_100_000_000, 1: 2_250_000_000, 2: 3_000_000_000, 4: 5_500_000_000}  # 3 never seen
    assert lag_samples(acked, seen, first=1) == [0.25, 0.5]  # 0: warm-up; 2: not acknowledged; 3: not seen
    assert lag_samples(acked, seen, first=0) == [0.1, 0.25, 0.5]
    assert lag_samples([], {}, first=0) == []


def test_the_warmup_is_the_writers_first_records() -> None:
    assert first_measured(1000, 1.0) == 1000
    assert first_measured(200, 0.5) == 100
    assert first_measured(5000, 0.0) == 0


def test_percentiles_with_p90_are_nearest_rank() -> None:
    samples = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert percentiles(samples, quantiles=(0.5, 0.9, 0.99)) == {"samples": 100, "p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
    assert percentiles([], quantiles=(0.5, 0.9)) == {"samples": 0, "p50": None, "p90": None, "max": None}
    # The default keys stay what `bench write|read` print.
    assert set(percentiles([0.001])) == {"samples", "p50", "p99", "p999", "max"}


def test_difference_is_per_percentile_and_keeps_unknowns_unknown() -> None:
    lag = {"samples": 10, "p50": 80.5, "p90": 120.0, "max": 300.0}
    base = {"samples": 10, "p50": 6.25, "p90": 20.0, "max": None}
    assert difference(lag, base) == {"p50": 74.25, "p90": 100.0, "max": None}


def test_a_tail_keeps_this_runs_records_once_and_counts_the_rest() -> None:
    tail = _Tail("sink", TAG)
    assert tail.take(payload(0), 10) == 0
    assert tail.take(payload(1), 20) == 1
    assert tail.take(payload(1), 30) == 1  # delivered twice: counted, first time kept
    assert tail.take(payload(2, tag=b"\x02" * 8), 40) is None  # another run's (or an application's)
    assert tail.take(b"short", 50) is None
    assert tail.take(payload(PRIME_SEQ), 60) == PRIME_SEQ  # the stream's proof of life: not a sample
    assert tail.seen_ns == {0: 10, 1: 20}
    assert (tail.repeated, tail.foreign) == (1, 2)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"log": "../x"}, "invalid log name"),
        ({"lag": LagSpec(rate=0)}, "--rate"),
        ({"lag": LagSpec(seconds=0)}, "--seconds"),
        ({"lag": LagSpec(record_size=MIN_RECORD_SIZE - 1)}, "--record-size"),
    ],
)
def test_spec_refuses_what_cannot_be_measured(kwargs: dict, words: str) -> None:
    with pytest.raises(UsageError, match=words.replace("-", r"\-")):
        bench_replication.ReplicationBenchSpec(**kwargs)


def fake_session(name: str, agents: int) -> SimpleNamespace:
    """A session as far as the first checks read it: the cluster's name, its available agents."""
    meta = SimpleNamespace(available_nodes=lambda: {f"{name}{i}": {} for i in range(agents)})
    return SimpleNamespace(cluster=SimpleNamespace(name=name), meta=meta)


def test_build_refuses_one_cluster_as_both_ends_and_a_cluster_without_agents() -> None:
    spec = bench_replication.ReplicationBenchSpec(create=True)
    with pytest.raises(UsageError, match="same cluster"):
        bench_replication.build(fake_session("a", 3), fake_session("a", 3), spec)  # type: ignore[arg-type]
    with pytest.raises(DlctlError, match="sink cluster 'b' has no available agent") as caught:
        bench_replication.build(fake_session("a", 3), fake_session("b", 0), spec)  # type: ignore[arg-type]
    assert caught.value.exit_code == 1 and "agent start" in (caught.value.hint or "")
