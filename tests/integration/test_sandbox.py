"""``dlctl sandbox up|status|down`` and ``cluster init|status`` on a real local cluster."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from harness.procs import pid_alive, wait_until

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]


def dlctl(*argv: str, env: dict[str, str | None] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``env`` adds variables to this process's; a None value removes one."""
    environment = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    result = subprocess.run([sys.executable, "-m", "dlctl.cli", *argv], capture_output=True, text=True, timeout=180, env=environment)
    if check and result.returncode != 0:
        raise AssertionError(f"dlctl {' '.join(argv)} exited {result.returncode}:\n{result.stderr}")
    return result


def listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def sandbox(tmp_path):
    env = {
        "DLCTL_SANDBOX_DIR": str(tmp_path / "sbx"),
        "DLCTL_CONFIG": str(tmp_path / "sbx" / "config.toml"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),  # where `sandbox up` records the current context
    }
    yield env
    dlctl("--yes", "sandbox", "down", "--purge", env=env, check=False)


def test_sandbox_up_status_and_down_leave_nothing_behind(sandbox):
    up = json.loads(dlctl("-o", "json", "--yes", "sandbox", "up", "--regions", "2", "--nodes-per-region", "2", env=sandbox).stdout)
    assert up["ok"]
    status = json.loads(dlctl("-o", "json", "sandbox", "status", env=sandbox).stdout)
    assert status["up"] and len(status["nodes"]) == 4 and all(n["running"] for n in status["nodes"])
    pids = [n["pid"] for n in status["nodes"]] + [status["zookeeper"]["pid"]]
    addresses = [n["address"] for n in status["nodes"]] + [status["zookeeper"]["address"]]
    assert all(listening(a) for a in addresses)
    # Regions are address ranges: 127.101.<region>.<node>.
    assert sorted(a.rsplit(":", 1)[0] for a in addresses[:4]) == ["127.101.1.1", "127.101.1.2", "127.101.2.1", "127.101.2.2"]

    again = json.loads(dlctl("-o", "json", "--yes", "sandbox", "up", env=sandbox).stdout)
    assert again["steps"] == [] and "already up" in again["notes"][0]

    # The current context: a command finds the sandbox without DLCTL_CONFIG (as after `kind create`).
    context = Path(sandbox["XDG_CONFIG_HOME"]) / "dlctl" / "current"
    assert context.read_text().strip() == sandbox["DLCTL_CONFIG"] and context.stat().st_mode & 0o777 == 0o600
    assert up["steps"][-1]["action"] == "set-context"
    found = dlctl("-vv", "-o", "json", "cluster", "status", env={**sandbox, "DLCTL_CONFIG": None})
    assert "current-context" in found.stderr  # -vv says which configuration it used, and why
    nodes = json.loads(found.stdout)
    assert len(nodes) == 4 and all(n["state"] == "up" and n["segments"] == 0 for n in nodes)
    assert {n["region"] for n in nodes} == {"region-1", "region-2"}

    down = json.loads(dlctl("-o", "json", "--yes", "sandbox", "down", env=sandbox).stdout)
    assert down["ok"]
    assert not context.exists(), "`sandbox down` leaves the current context naming a stopped sandbox"
    assert not any(pid_alive(p) for p in pids), "a sandbox process outlived `sandbox down`"
    assert not any(listening(a) for a in addresses), "a sandbox port is still open after `sandbox down`"
    assert json.loads(dlctl("-o", "json", "sandbox", "status", env=sandbox).stdout)["up"] is False


def test_secrets_never_appear_in_any_process_argv(sandbox):
    dlctl("--yes", "sandbox", "up", "--regions", "1", "--nodes-per-region", "2", env=sandbox)
    base = Path(sandbox["DLCTL_SANDBOX_DIR"])
    secrets = [(base / "east" / "secret").read_bytes().strip(), (base / "east" / "zk-auth").read_bytes().strip().split(b":", 1)[1]]
    assert all(len(s) >= 16 for s in secrets)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        for secret in secrets:
            assert secret not in cmdline, f"a secret appears in the argv of pid {entry.name}"
    for secret_file in (base / "east" / "secret", base / "east" / "zk-auth"):
        assert secret_file.stat().st_mode & 0o777 == 0o600
    logs = b"".join(p.read_bytes() for p in base.rglob("*.log"))
    assert logs and not any(s in logs for s in secrets), "a secret appears in a log file"


def test_cluster_init_is_idempotent(sandbox):
    dlctl("--yes", "sandbox", "up", "--regions", "1", "--nodes-per-region", "1", env=sandbox)
    result = json.loads(dlctl("-o", "json", "cluster", "init", env=sandbox).stdout)
    steps = {s["action"]: s["result"] for s in result["steps"]}
    assert steps["ensure-secrets"]["secret_file"] == "kept"
    assert steps["create-layout"]["created"] == []
    assert set(steps["register-nodes"].values()) == {"unchanged"}


def test_main_job_survives_an_agent_killed_between_appends(sandbox):
    """The README demo as a test: write, kill an ensemble member, write more, read everything.

    Two agents per region: after the kill a fresh ensemble of E=3 live agents exists (with
    exactly three agents no new segment could be placed, as in BookKeeper)."""
    dlctl("--yes", "sandbox", "up", "--regions", "3", "--nodes-per-region", "2", env=sandbox)
    dlctl("log", "create", "orders", env=sandbox)

    def append(first: int, last: int) -> dict:
        payload = "".join(f"order-{i}\n" for i in range(first, last + 1))
        result = subprocess.run(
            [sys.executable, "-m", "dlctl.cli", "-o", "json", "--yes", "log", "append", "orders"],
            input=payload, capture_output=True, text=True, timeout=120, env={**os.environ, **sandbox},
        )
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["steps"][0]["result"]

    assert append(1, 3000)["records"] == 3000
    ensemble = json.loads(dlctl("-o", "json", "log", "show", "orders", env=sandbox).stdout)["segments"][-1]["ensemble"].split(",")
    nodes = json.loads(dlctl("-o", "json", "sandbox", "status", env=sandbox).stdout)["nodes"]
    victim = next(n for n in nodes if n["node"] == ensemble[0])
    os.kill(victim["pid"], 9)

    # E=W=3, A=2: the writer leaves the dead agent out of its new ensemble.
    assert append(3001, 6000)["records"] == 3000
    lines = dlctl("-o", "json", "log", "read", "orders", env=sandbox).stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["payload"] for r in records] == [f"order-{i}" for i in range(1, 6001)]
    assert [r["txid"] for r in records] == sorted(r["txid"] for r in records)

    def victim_state() -> str:
        rows = json.loads(dlctl("-o", "json", "cluster", "status", env=sandbox).stdout)
        return next(r["state"] for r in rows if r["node"] == victim["node"])

    assert victim_state() in {"unreachable", "down"}
    wait_until(lambda: victim_state() == "down", 30, message=f"{victim['node']} to be reported down after its session expired")
