"""One token bucket for every byte-rate limit in dlctl (replication workers, Spark copy tasks,
the auditor's repairs): ``await bucket.take(n)`` before moving ``n`` bytes."""

from __future__ import annotations

import asyncio
import time


class TokenBucket:
    """``rate`` bytes per second with one second of burst; ``rate <= 0`` means unlimited.

    A take larger than the tokens left is let through at once and paid for by sleeping off
    the debt, so a single large item never waits for a bucket that can never hold it."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = float(rate)
        self.stamp = time.monotonic()

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self.tokens = min(float(self.rate), self.tokens + (now - self.stamp) * self.rate) - n
        self.stamp = now
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)
