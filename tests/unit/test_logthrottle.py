"""dlctl.logthrottle.LogThrottle: at most one line per reason per interval, and what was held
back is counted and reported, so a flood costs a few lines but the log still adds up."""

from __future__ import annotations

import logging
import re

import pytest

from dlctl.logthrottle import LogThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def throttled(caplog):
    caplog.set_level(logging.INFO, logger="test.throttle")
    clock = Clock()
    return LogThrottle(logging.getLogger("test.throttle"), 1.0, clock=clock), clock, caplog


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.throttle"]


def test_the_first_event_is_logged_and_the_rest_of_the_interval_only_counted(throttled):
    throttle, clock, caplog = throttled
    assert throttle.warning("refused", "refusing %s", "a")
    for i in range(99):
        clock.now += 0.005
        assert not throttle.warning("refused", "refusing %s", i)
    assert messages(caplog) == ["refusing a"]
    assert (throttle.logged, throttle.suppressed) == (1, 99)


def test_the_next_line_after_the_interval_says_how_many_were_held_back(throttled):
    throttle, clock, caplog = throttled
    throttle.warning("refused", "refusing %s", "a")
    for _ in range(5):
        throttle.warning("refused", "refusing %s", "b")
    clock.now += 1.0
    assert throttle.warning("refused", "refusing %s", "c")
    assert messages(caplog) == ["refusing a", "refusing c (and 5 more refused since the last such line, not logged)"]
    clock.now += 1.0
    throttle.warning("refused", "refusing %s", "d")
    assert messages(caplog)[-1] == "refusing d"  # nothing held back this time: no count


def test_flush_reports_a_burst_that_ended_and_only_once(throttled):
    throttle, clock, caplog = throttled
    throttle.info("timeouts", "timeout %d", 1)
    throttle.info("timeouts", "timeout %d", 2)
    throttle.info("timeouts", "timeout %d", 3)
    throttle.flush()  # the interval has not passed: nothing yet
    assert messages(caplog) == ["timeout 1"]
    clock.now += 1.5
    throttle.flush()
    throttle.flush()
    [first, report] = messages(caplog)
    assert re.fullmatch(r"2 more timeouts in the last 1\.5s, not logged one by one", report), report
    assert caplog.records[-1].levelno == logging.INFO


def test_reasons_are_throttled_independently_and_the_report_keeps_the_highest_level(throttled):
    throttle, clock, caplog = throttled
    throttle.info("a", "a1")
    throttle.warning("b", "b1")
    throttle.info("a", "a2")
    throttle.warning("a", "a3")
    assert messages(caplog) == ["a1", "b1"]
    clock.now += 2
    throttle.flush()
    assert messages(caplog)[-1].startswith("2 more a ") and caplog.records[-1].levelno == logging.WARNING


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError):
        LogThrottle(logging.getLogger("x"), 0)
