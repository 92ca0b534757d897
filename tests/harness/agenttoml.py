"""A minimal valid agent.toml for unit tests of the agent's configuration, and its loader."""

from __future__ import annotations

from pathlib import Path

from dlagent import config as agent_config

BASE = """
node_id = "r1-n1"
cluster = "east"
region = "r1"
rack = "rack-a"
data_dir = "data"
listen = "127.0.1.1:3181"
zookeeper = "127.0.0.1:2181/t"
secret_file = "secret"
"""


def load(tmp_path: Path, extra: str = "") -> agent_config.AgentConfig:
    """``BASE`` plus ``extra`` (tables of the test) written to tmp_path/agent.toml and loaded."""
    path = tmp_path / "agent.toml"
    path.write_text(BASE + extra)
    return agent_config.load(path)
