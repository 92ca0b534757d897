"""The agent's ``[housekeeping]`` table: defaults, values, and errors that name the key."""

from __future__ import annotations


import pytest

from dlctl.errors import ConfigError
from harness.agenttoml import load




def test_housekeeping_defaults_keep_every_agent_reclaiming_and_standing_for_election(tmp_path):
    hk = load(tmp_path).housekeeping
    assert (hk.enabled, hk.check_seconds, hk.disk_override_free_bytes, hk.delete_concurrency, hk.delete_rate) == (True, 60.0, 0, 4, 50.0)
    assert hk.offload_bytes_per_second == 32 << 20  # offload is throttled unless told otherwise


def test_housekeeping_values(tmp_path):
    hk = load(tmp_path, "[housekeeping]\nenabled = false\ncheck_seconds = 0.5\ndisk_override_free_bytes = 1073741824\ndelete_concurrency = 2\ndelete_rate = 0\n").housekeeping
    assert (hk.enabled, hk.check_seconds, hk.disk_override_free_bytes, hk.delete_concurrency, hk.delete_rate) == (False, 0.5, 2**30, 2, 0.0)
    assert load(tmp_path, '[housekeeping]\noffload_bytes_per_second = "8MiB"\n').housekeeping.offload_bytes_per_second == 8 << 20
    assert load(tmp_path, "[housekeeping]\noffload_bytes_per_second = 0\n").housekeeping.offload_bytes_per_second == 0


@pytest.mark.parametrize(
    "table,where",
    [
        ("enabled = 1", "'enabled'"),
        ("check_seconds = 0", "'check_seconds'"),
        ("check_seconds = true", "'check_seconds'"),
        ("disk_override_free_bytes = -1", "'disk_override_free_bytes'"),
        ("delete_concurrency = 0", "'delete_concurrency'"),
        ("delete_rate = -5", "'delete_rate'"),
        ("offload_bytes_per_second = -1", "'offload_bytes_per_second'"),
        ("offload_bytes_per_second = true", "'offload_bytes_per_second'"),
        ('offload_bytes_per_second = "fast"', "'offload_bytes_per_second'"),
        ("retention = 3", "unknown key(s) in [housekeeping]: retention"),
    ],
)
def test_bad_housekeeping_values_name_the_key(tmp_path, table, where):
    with pytest.raises(ConfigError, match="housekeeping") as info:
        load(tmp_path, f"[housekeeping]\n{table}\n")
    assert where in info.value.message and "agent.toml" in info.value.message
