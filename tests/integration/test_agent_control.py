"""``dlagent start|stop|status``: idempotent node-level lifecycle of a real agent daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from harness.agents import AgentNode
from harness.procs import pid_alive, wait_until

pytestmark = [pytest.mark.zk, pytest.mark.agent]


def verb(node: AgentNode, name: str) -> tuple[int, dict | None, str]:
    result = subprocess.run(
        [sys.executable, "-m", "dlagent", name, "--config", str(node.config_path)], capture_output=True, text=True, timeout=90
    )
    return result.returncode, (json.loads(result.stdout) if result.stdout.strip() else None), result.stderr


@pytest.fixture
def node(procs, tmp_path, zk):
    node = AgentNode(procs, tmp_path, zk.connect_string)
    yield node
    # The daemon lives in its own session, outside the test's process registry: end it here.
    code, status, _ = verb(node, "status")
    if status and status.get("pid") and pid_alive(status["pid"]):
        os.kill(status["pid"], signal.SIGKILL)


def test_start_is_idempotent_and_registers(node, zk):
    admin = zk.client()
    code, first, _ = verb(node, "start")
    assert code == 0 and first["changed"] and first["running"]
    wait_until(lambda: node.registration(admin) is not None, 15, message="registration after start")
    code, again, _ = verb(node, "start")
    assert code == 0 and not again["changed"] and again["message"] == "already running" and again["pid"] == first["pid"]
    code, status, _ = verb(node, "status")
    assert status["running"] and status["pid"] == first["pid"] and status["address"] == node.address


def test_stop_is_clean_and_idempotent(node, zk):
    admin = zk.client()
    assert verb(node, "start")[0] == 0
    wait_until(lambda: node.registration(admin) is not None, 15, message="registration after start")
    code, stopped, _ = verb(node, "stop")
    assert code == 0 and stopped["changed"] and stopped["message"] == "stopped cleanly"
    assert not pid_alive(stopped["pid"])
    assert node.registration(admin) is None
    code, again, _ = verb(node, "stop")
    assert code == 0 and not again["changed"] and again["message"] == "already stopped"
    assert verb(node, "status")[1]["running"] is False


def test_stop_of_a_crashed_agent_reports_stopped(node, zk):
    code, started, _ = verb(node, "start")
    os.kill(started["pid"], signal.SIGKILL)
    wait_until(lambda: not verb(node, "status")[1]["running"], 15, message="the lock to be released by the dead agent")
    code, stopped, _ = verb(node, "stop")
    assert code == 0 and stopped["message"] == "already stopped"


def test_start_failure_reports_the_agent_log(node):
    node.secret_file.chmod(0o644)  # the agent refuses a world-readable secret
    code, _, err = verb(node, "start")
    assert code == 1
    assert "exited with code" in err and "chmod 600" in err
