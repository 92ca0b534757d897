"""The agent's ``[scrub]`` table: defaults, values with and without units, and errors that name
the file, the key and the fix."""

from __future__ import annotations


import pytest
from dlagent.storage.scrub import DEFAULT_BYTES_PER_SECOND, DEFAULT_INTERVAL

from dlctl.errors import ConfigError
from harness.agenttoml import load




def test_scrubbing_is_on_by_default_at_4_mib_per_second_once_a_week(tmp_path):
    scrub = load(tmp_path).scrub
    assert (scrub.enabled, scrub.bytes_per_second, scrub.interval) == (True, 4 * 1024 * 1024, 7 * 86400.0)
    # One default, whether the agent reads a config or a test builds a Scrubber directly.
    assert (scrub.bytes_per_second, scrub.interval) == (DEFAULT_BYTES_PER_SECOND, DEFAULT_INTERVAL)


@pytest.mark.parametrize(
    "table,expected",
    [
        ("enabled = false", (False, 4 << 20, 604800.0)),
        ("bytes_per_second = 1048576\ninterval = 86400", (True, 1 << 20, 86400.0)),
        ('bytes_per_second = "16MiB"\ninterval = "12h"', (True, 16 << 20, 43200.0)),
        ('bytes_per_second = "10MB"\ninterval = "1d12h"', (True, 10_000_000, 129600.0)),
        ("interval = 0.5", (True, 4 << 20, 0.5)),  # short intervals are for tests: passes then run back to back
    ],
)
def test_scrub_values(tmp_path, table, expected):
    scrub = load(tmp_path, f"[scrub]\n{table}\n").scrub
    assert (scrub.enabled, scrub.bytes_per_second, scrub.interval) == expected


@pytest.mark.parametrize(
    "table,where",
    [
        ("enabled = 1", "key 'enabled' must be true or false"),
        ("bytes_per_second = 0", "key 'bytes_per_second' must be bytes per second in 65536.."),
        ("bytes_per_second = 1000", "key 'bytes_per_second'"),
        ("bytes_per_second = true", "key 'bytes_per_second'"),  # bool is an int in Python
        ("bytes_per_second = 4.5e6", "key 'bytes_per_second'"),
        ('bytes_per_second = "fast"', "got 'fast'"),
        ("interval = 0", "key 'interval' must be seconds in 0.05..31622400"),
        ("interval = -3", "key 'interval'"),
        ('interval = "weekly"', "got 'weekly'"),
        ('interval = "400d"', "key 'interval'"),
        ("interval = nan", "key 'interval'"),
        ("rate = 3", "unknown key(s) in [scrub]: rate"),
    ],
)
def test_bad_scrub_values_name_the_file_and_key(tmp_path, table, where):
    with pytest.raises(ConfigError, match=r"\[scrub\]") as info:
        load(tmp_path, f"[scrub]\n{table}\n")
    assert where in info.value.message and "agent.toml" in info.value.message


def test_a_scrub_key_that_is_not_a_table_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"key 'scrub' must be a table"):
        load(tmp_path, "scrub = true\n")


def test_turning_scrubbing_off_is_the_hint_for_a_zero_rate(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "[scrub]\nbytes_per_second = 0\n")
    assert "enabled = false" in (info.value.hint or "")
