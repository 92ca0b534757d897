"""dlctl.ratelimit.TokenBucket: the one byte-rate limit (replication, Spark copies, repairs)."""

from __future__ import annotations

import asyncio

from dlctl import ratelimit


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def run_takes(monkeypatch, rate: float, sizes: list[int], gap: float = 0.0) -> FakeClock:
    clock = FakeClock()
    monkeypatch.setattr(ratelimit.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(ratelimit.asyncio, "sleep", clock.sleep)

    async def body() -> None:
        bucket = ratelimit.TokenBucket(rate)
        for n in sizes:
            await bucket.take(n)
            clock.now += gap

    asyncio.run(body())
    return clock


def test_a_long_run_of_takes_averages_the_rate_after_one_second_of_burst(monkeypatch):
    clock = run_takes(monkeypatch, 1000, [100] * 100)  # 10,000 bytes at 1,000 B/s
    assert abs((clock.now - 100.0) - 9.0) < 1e-6  # 1 s of burst is free, the other 9,000 bytes take 9 s


def test_a_take_larger_than_the_bucket_passes_and_pays_its_debt(monkeypatch):
    clock = run_takes(monkeypatch, 1000, [5000])
    assert clock.slept == [4.0]


def test_idle_time_refills_only_up_to_one_second_of_burst(monkeypatch):
    clock = run_takes(monkeypatch, 1000, [1000, 1000], gap=60.0)
    assert clock.slept == []
    clock = run_takes(monkeypatch, 1000, [1000, 1500], gap=60.0)
    assert clock.slept == [0.5]


def test_rate_zero_is_unlimited(monkeypatch):
    assert run_takes(monkeypatch, 0, [10**9] * 3).slept == []
