"""The protocol server's limits: agent.toml's [server] table (names file, key and problem) and
ServerLimits' own checks. The limits' effect is tested on real agents in
tests/integration/test_agent_limits.py."""

from __future__ import annotations


import pytest

from dlagent import config as agent_config
from dlagent.limits import CONFIG_KEYS, ServerLimits
from dlctl.errors import ConfigError
from harness.agenttoml import BASE, load




def test_without_a_server_table_the_safe_defaults_apply(tmp_path):
    limits = load(tmp_path, "").server
    assert limits == ServerLimits()
    assert (limits.max_connections, limits.max_unauthenticated, limits.max_unauthenticated_per_peer) == (1024, 256, 128)
    assert limits.max_unauthenticated_frame == 4096 and limits.max_response_bytes == 16 * 1024 * 1024
    assert limits.max_unauthenticated_frame < limits.max_frame  # small until AUTH, the protocol's maximum after


def test_every_key_is_read_and_sizes_and_durations_take_units(tmp_path):
    limits = load(
        tmp_path,
        "[server]\nmax_connections = 100\nmax_connections_per_peer = 50\nmax_unauthenticated = 40\n"
        "max_unauthenticated_per_peer = 4\nmax_unauthenticated_frame = \"8KiB\"\nmax_response_bytes = \"4MiB\"\n"
        "max_in_flight = 16\nmax_in_flight_bytes = 1048576\nhandshake_timeout = \"30s\"\nidle_timeout = \"15m\"\n"
        "frame_timeout = 5\nmax_long_poll = 2.5\n",
    ).server
    assert limits == ServerLimits(
        max_connections=100, max_connections_per_peer=50, max_unauthenticated=40, max_unauthenticated_per_peer=4,
        max_unauthenticated_frame=8192, max_response_bytes=4 << 20, max_in_flight=16, max_in_flight_bytes=1 << 20,
        handshake_timeout=30.0, idle_timeout=900.0, frame_timeout=5, max_long_poll=2.5,
    )
    assert "max_frame" not in CONFIG_KEYS  # the protocol's bound, not a setting


@pytest.mark.parametrize(
    "table,message",
    [
        ("max_conections = 10", "unknown key(s) in [server]: max_conections"),
        ("max_connections = 0", "max_connections must be an integer of at least 1, got 0"),
        ("max_connections = true", "max_connections must be an integer of at least 1, got True"),
        ("max_unauthenticated = 2.5", "max_unauthenticated must be an integer"),
        ("handshake_timeout = 0", "handshake_timeout must be a positive number of seconds"),
        ("handshake_timeout = \"soon\"", "key 'handshake_timeout' must be a number or a duration with units"),
        ("max_response_bytes = \"lots\"", "key 'max_response_bytes' must be a number or a size with units"),
        ("max_unauthenticated_frame = 64", "max_unauthenticated_frame must be in 256.."),
        ("max_unauthenticated_frame = 999999999", "max_unauthenticated_frame must be in 256.."),
        ("max_unauthenticated = 8\nmax_unauthenticated_per_peer = 9", "must not exceed max_unauthenticated"),
        ("max_connections_per_peer = 8", "must not exceed max_connections_per_peer"),
    ],
)
def test_a_bad_server_key_names_file_key_and_problem(tmp_path, table, message):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "[server]\n" + table + "\n")
    assert message in info.value.message
    assert str(tmp_path / "agent.toml") in info.value.message and "[server]" in info.value.message


def test_server_must_be_a_table(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text("server = 5\n" + BASE)
    with pytest.raises(ConfigError, match="key 'server' must be a table"):
        agent_config.load(path)
