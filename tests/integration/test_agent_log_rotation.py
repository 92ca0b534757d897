"""A detached agent's log rotates by size ([log] in agent.toml), bounded in files and bytes, and
``dlctl agent logs`` prints its newest lines across the rotated files (the local transport)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.agents import AgentNode
from harness.procs import pid_alive
from harness.twoclusters import run_cli

from dlagent.logconfig import log_files

pytestmark = [pytest.mark.zk, pytest.mark.agent]

MAX_BYTES, BACKUPS = 1024, 2


def verb(node: AgentNode, name: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "dlagent", name, "--config", str(node.config_path)], capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def node(procs, tmp_path, zk):
    node = AgentNode(procs, tmp_path, zk.connect_string, extra_config=f"\n[log]\nmax_bytes = {MAX_BYTES}\nbackups = {BACKUPS}\n")
    yield node
    # The daemon lives in its own session, outside the test's process registry: end it here.
    status = verb(node, "status")
    if status.get("pid") and pid_alive(status["pid"]):
        os.kill(status["pid"], signal.SIGKILL)


def local_inventory(node: AgentNode, path: Path) -> Path:
    path.write_text(
        "\n".join(
            [
                "[clusters.c1]",
                'zookeeper = "127.0.0.1:1"',
                f"[[clusters.c1.regions.{node.region}.racks.{node.rack}.nodes]]",
                f'id = "{node.node_id}"',
                f'host = "{node.host}"',
                f'listen = "{node.address}"',
                'transport = "local"',
                f'python = "{sys.executable}"',
                f'home = "{node.dir}"',  # agent.toml lives there
                f'data_dir = "{node.data_dir}"',
                "",
            ]
        )
    )
    return path


def test_rotated_files_are_bounded_and_agent_logs_prints_the_newest_lines(node, tmp_path):
    # Each start and clean stop logs a few hundred bytes (startup, ready, shutting down): cycle
    # until every backup exists, then once more to see the oldest one dropped, not kept.
    for _ in range(20):
        assert verb(node, "start")["supervisor"] == "process"  # no systemd on this machine
        assert verb(node, "stop")["message"] == "stopped cleanly"
        if len(log_files(node.data_dir)) == BACKUPS + 1:
            break
    else:
        pytest.fail(f"the log never rotated {BACKUPS} times: {log_files(node.data_dir)}")
    verb(node, "start")
    verb(node, "stop")

    files = log_files(node.data_dir)
    assert [p.name for p in files] == ["dlagent.log.2", "dlagent.log.1", "dlagent.log"]
    assert not (node.data_dir / "dlagent.log.3").exists()
    assert all(p.stat().st_size <= MAX_BYTES for p in files), {p.name: p.stat().st_size for p in files}
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files)
    everything = "".join(p.read_text() for p in files).splitlines()
    assert any("shutting down" in line for line in everything[-20:]), everything[-20:]  # the last run's end

    inventory = local_inventory(node, tmp_path / "config.toml")
    code, out, err = run_cli(inventory, "agent", "logs", node.node_id, "-n", "3")
    assert code == 0, err
    assert out.splitlines() == everything[-3:]
    # More lines than the newest file holds: they come from the rotated ones, oldest first.
    code, out, err = run_cli(inventory, "agent", "logs", node.node_id, "-n", "1000")
    assert code == 0, err
    assert out.splitlines() == everything
    assert len(everything) > len(files[-1].read_text().splitlines())
