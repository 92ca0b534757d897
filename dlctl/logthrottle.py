"""Rate-limited logging for events an outsider can cause at will (refused connections, failed
handshakes, reads failing for want of descriptors): at most one line per reason per interval,
and the lines held back are counted and reported, so a flood costs a few lines a second on the
data disk rather than one per event, and the log still says how big the flood was.

    throttle = LogThrottle(log)
    throttle.warning("handshake-timeout", "closing connection from %s: handshake timed out", peer)

The first event of a reason is logged at once; the next ones within ``interval`` seconds are
counted; the next line logged for that reason (or ``flush``, which an owner calls from a timer so
the count of a burst that just ended is not lost) says how many were held back. Reasons are a
small fixed set of strings chosen by the caller, never built from input (the table is kept for
the life of the throttle).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class LogThrottle:
    def __init__(self, logger: logging.Logger, interval: float = 1.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        if interval <= 0:
            raise ValueError(f"log throttle interval must be positive, got {interval}")
        self.logger = logger
        self.interval = interval
        self._clock = clock
        # reason -> [time of the last line logged, events held back since, level of the last of them]
        self._state: dict[str, list] = {}
        self.logged = 0  # lines written, suppression reports included (for tests and stat)
        self.suppressed = 0  # events held back, ever

    def log(self, level: int, reason: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``reason`` was logged less than ``interval`` ago (then
        count it). True if the line was written."""
        now = self._clock()
        state = self._state.get(reason)
        if state is not None and now - state[0] < self.interval:
            state[1] += 1
            state[2] = max(state[2], level)
            self.suppressed += 1
            return False
        held = state[1] if state is not None else 0
        if held:
            msg += " (and %d more %s since the last such line, not logged)"
            args = (*args, held, reason)
        self._state[reason] = [now, 0, level]
        self.logged += 1
        self.logger.log(level, msg, *args)
        return True

    def warning(self, reason: str, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, reason, msg, *args)

    def info(self, reason: str, msg: str, *args: object) -> bool:
        return self.log(logging.INFO, reason, msg, *args)

    def flush(self) -> None:
        """Report the events held back for each reason whose interval has passed."""
        now = self._clock()
        for reason, state in self._state.items():
            if state[1] and now - state[0] >= self.interval:
                held, level, since = state[1], state[2], now - state[0]
                state[0], state[1] = now, 0
                self.logged += 1
                self.logger.log(level, "%d more %s in the last %.1fs, not logged one by one", held, reason, since)


__all__ = ["LogThrottle"]
