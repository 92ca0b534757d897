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


def write(tmp_path: Path, text: str) -> Path:
    """``text`` as tmp_path/agent.toml."""
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def load(tmp_path: Path, extra: str = "") -> agent_config.AgentConfig:
    """``BASE`` plus ``extra`` (tables of the test) written to tmp_path/agent.toml and loaded."""
    return agent_config.load(write(tmp_path, BASE + extra))
