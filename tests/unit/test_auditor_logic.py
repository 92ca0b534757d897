"""The auditor's pure bookkeeping (who has been gone longer than the grace) and its settings."""

from __future__ import annotations


import pytest
from dlagent.auditor import GoneTracker

from dlctl.errors import ConfigError
from harness.agenttoml import load

UP = {"a": "r1", "b": "r2", "c": "r3"}


def without(*gone: str) -> dict[str, str]:
    return {n: r for n, r in UP.items() if n not in gone}


def test_never_due_before_the_grace_and_due_strictly_after_it():
    t = GoneTracker(grace=10)
    t.observe(0, {}, UP)
    t.observe(5, {}, without("b"))  # first seen missing at 5
    assert t.due(5) == [] and t.due(15) == []  # exactly the grace is not "longer than"
    t.observe(15.01, {}, without("b"))
    assert t.due(15.01) == ["b"]
    assert t.regions["b"] == "r2"  # remembered from when it was seen


def test_the_grace_is_measured_from_the_first_observation_not_from_each():
    t = GoneTracker(grace=10)
    t.observe(0, {}, UP)
    for now in (1, 4, 8, 11.5):
        t.observe(now, {}, without("a"))
    assert t.missing_since == {"a": 1}
    assert t.due(11.5) == ["a"]


def test_coming_back_within_the_grace_resets_it():
    t = GoneTracker(grace=10)
    t.observe(0, {}, UP)
    t.observe(1, {}, without("c"))
    t.observe(9, {}, UP)  # back before the grace ran out
    t.observe(10, {}, without("c"))  # gone again: a new absence
    assert t.due(19) == [] and t.due(20.5) == ["c"]


def test_registered_agents_count_even_if_never_seen_and_unknown_ones_never():
    t = GoneTracker(grace=1)
    t.observe(0, {"a": "r1", "z": "r9"}, {"a": "r1"})  # z: registered by `cluster init`, down
    t.observe(2, {"a": "r1", "z": "r9"}, {"a": "r1"})
    assert t.due(2) == ["z"] and t.regions["z"] == "r9"
    # An agent this auditor never saw and that is not registered cannot be told apart from one
    # that never existed: it is never due.
    assert "ghost" not in t.missing_since


def test_agents_seen_only_in_available_count_too_and_several_can_be_due():
    t = GoneTracker(grace=2)
    t.observe(0, {}, UP)
    t.observe(1, {}, {})
    assert t.due(3) == [] and t.due(3.5) == ["a", "b", "c"]


def test_reset_forgets_every_absence_so_the_grace_starts_again():
    t = GoneTracker(grace=2)
    t.observe(0, {}, UP)
    t.observe(1, {}, without("a"))
    t.reset()
    assert t.due(100) == []
    t.observe(100, {}, without("a"))
    assert t.due(101) == [] and t.due(102.5) == ["a"]


def test_an_unknown_region_does_not_overwrite_a_known_one():
    t = GoneTracker(grace=1)
    t.observe(0, {}, {"a": "r1"})
    t.observe(1, {"a": None}, {"a": None})  # a follower lists names only
    assert t.regions["a"] == "r1"


# -- [auditor] settings -------------------------------------------------------------------------




def test_auditor_defaults_are_on_with_five_minutes_grace(tmp_path):
    a = load(tmp_path, "").auditor
    assert (a.enabled, a.grace_seconds, a.check_seconds, a.max_bytes_per_second) == (True, 300.0, 10.0, 64 * 1024 * 1024)
    a = load(tmp_path, "[auditor]\nenabled = false\ngrace_seconds = 2\ncheck_seconds = 0.5\nmax_bytes_per_second = 0\n").auditor
    assert (a.enabled, a.grace_seconds, a.check_seconds, a.max_bytes_per_second) == (False, 2.0, 0.5, 0.0)


@pytest.mark.parametrize(
    "extra,message",
    [
        ('[auditor]\nenabled = "yes"\n', "[auditor] key 'enabled' must be true or false"),
        ("[auditor]\ngrace_seconds = 0\n", "[auditor] key 'grace_seconds' must be seconds"),
        ("[auditor]\ngrace_seconds = true\n", "[auditor] key 'grace_seconds' must be seconds"),
        ('[auditor]\ncheck_seconds = "10"\n', "[auditor] key 'check_seconds' must be seconds"),
        ("[auditor]\ncheck_seconds = -1\n", "[auditor] key 'check_seconds' must be seconds"),
        ("[auditor]\ngrace = 3\n", "unknown key(s) in [auditor]: grace"),
        ("[auditor]\nmax_bytes_per_second = -1\n", "[auditor] key 'max_bytes_per_second' must be a number of bytes per second >= 0"),
        ('[auditor]\nmax_bytes_per_second = "fast"\n', "[auditor] key 'max_bytes_per_second' must be a number"),
        ('auditor = "off"\n', "key 'auditor' must be a table"),
    ],
)
def test_bad_auditor_settings_name_file_and_key(tmp_path, extra, message):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, extra)
    assert message in str(err.value) and str(tmp_path / "agent.toml") in str(err.value)


def test_agents_seen_while_reset_stay_known():
    # While auditing is off the auditor observes then resets: it keeps learning who exists.
    t = GoneTracker(grace=1)
    t.observe(0, {}, UP)
    t.reset()
    t.observe(1, {}, without("a"))
    assert t.due(2.5) == ["a"]
