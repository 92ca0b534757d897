"""``dlctl agent install|start|status|stop|logs`` over real sshd nodes in two regions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.procs import free_port, wait_until
from harness.tls import tls_dir_for
from harness.zk import write_harness_zk_auth

from dlctl.errors import ExitCode
from dlctl.meta import paths
from dlctl.secrets import write_secret_file

pytestmark = [pytest.mark.ssh, pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]


def write_inventory(path: Path, cluster, zk_connect: str, *, python_for: dict[str, str | None], known_hosts: Path) -> None:
    base = path.parent
    write_secret_file(base / "secret", b"ssh-test-cluster-secret-0123456789")
    tls_dir_for(base / "secret", "c1")  # the inventory's default tls_dir: the harness CA
    lines = [
        "[clusters.c1]",
        f'zookeeper = "{zk_connect}"',
        f'secret_file = "{base / "secret"}"',
        f'zk_auth_file = "{write_harness_zk_auth(base / "c1.zk-auth")}"',
        f'known_hosts = "{known_hosts}"',
        f'ssh_config = "{base / "empty_ssh_config"}"',
        "",
    ]
    (base / "empty_ssh_config").write_text("")
    for node in cluster.nodes:
        home = base / node.name
        lines += [
            f"[[clusters.c1.regions.{node.region}.racks.rack-1.nodes]]",
            f'id = "{node.name}"',
            f'host = "{node.address}"',
            f"ssh_port = {node.port}",
            f'ssh_user = "{cluster.identity.user}"',
            f'identity_file = "{cluster.identity.key_path}"',
            f'home = "{home}"',
            f'data_dir = "{home}/data"',
            f'listen = "{node.address}:{free_port(node.address)}"',
            f"metrics_port = {free_port(node.address)}",  # 9181 may be another test's (parallel workers)
        ]
        if python_for.get(node.name):
            lines.append(f'python = "{python_for[node.name]}"')
        lines.append("")
    path.write_text("\n".join(lines))


def dlctl(config: Path, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlctl.cli", *argv], capture_output=True, text=True, timeout=timeout, env={**os.environ, "DLCTL_CONFIG": str(config)}
    )


@pytest.fixture
def fleet(tmp_path, ssh_nodes, zk):
    cluster = ssh_nodes(nodes=3, regions=2, fresh=True)
    config = tmp_path / "config.toml"
    # One node gets a venv from uploaded wheels (the full install); the others use an
    # interpreter that already has dlctl (the "configured python" path).
    first = cluster.nodes[0].name
    write_inventory(config, cluster, zk.connect_string, python_for={n.name: (None if n.name == first else sys.executable) for n in cluster.nodes}, known_hosts=cluster.known_hosts_path)
    yield cluster, config
    dlctl(config, "--yes", "agent", "stop", timeout=120)


def test_install_start_status_stop_over_ssh_in_two_regions(fleet, zk):
    cluster, config = fleet
    install = dlctl(config, "-o", "json", "--yes", "agent", "install")
    assert install.returncode == 0, install.stderr
    installed = json.loads(install.stdout)["steps"][-1]["result"]
    first = cluster.nodes[0].name
    assert installed[first]["venv"].endswith("/venv") and "dlagent" in installed[first]["agent"]
    # No systemd on these nodes (nor in CI's containers): the detached process, and why.
    assert all(r["supervisor"]["kind"] == "process" and "no systemd" in r["supervisor"]["why"] for r in installed.values())
    home = config.parent / first
    assert (home / "secret").stat().st_mode & 0o777 == 0o600
    # Least privilege (issue 19): the config is private too, and the directories install made.
    assert {p: (home / p).stat().st_mode & 0o777 for p in ("agent.toml", "zk-auth", ".", "data")} == {"agent.toml": 0o600, "zk-auth": 0o600, ".": 0o700, "data": 0o700}

    start = dlctl(config, "-o", "json", "--yes", "agent", "start", "--region-serial")
    assert start.returncode == 0, start.stderr
    admin = zk.client()
    wait_until(lambda: len(admin.get_children(paths.available("c1"))) == 3, 30, message="3 agents registered")

    status = json.loads(dlctl(config, "-o", "json", "agent", "status").stdout)
    assert [r["running"] for r in status] == [True, True, True]
    assert {r["region"] for r in status} == {"r1", "r2"}

    again = json.loads(dlctl(config, "-o", "json", "--yes", "agent", "start").stdout)
    assert all(r["changed"] is False for r in again["steps"][0]["result"].values())

    log = dlctl(config, "agent", "logs", first, "-n", "50")
    assert log.returncode == 0 and "ready" in log.stdout

    stop = dlctl(config, "-o", "json", "--yes", "agent", "stop")
    assert stop.returncode == 0, stop.stderr
    assert all(r["message"] == "stopped cleanly" for r in json.loads(stop.stdout)["steps"][0]["result"].values())
    assert admin.get_children(paths.available("c1")) == []


def test_a_dead_node_gives_exit_3_and_the_others_succeed(fleet):
    cluster, config = fleet
    assert dlctl(config, "--yes", "agent", "install").returncode == 0
    dead = cluster.nodes[1]
    dead.kill()
    try:
        result = dlctl(config, "-o", "json", "--yes", "agent", "start", "--timeout", "20")
        assert result.returncode == ExitCode.PARTIAL, result.stderr
        detail = {r["host"]: r for r in json.loads(result.stdout)["steps"][0]["result"]}
        assert detail[dead.name]["status"] != "ok"
        assert all(detail[n.name]["status"] == "ok" for n in cluster.nodes if n is not dead)
        assert dead.name in result.stderr
    finally:
        dead.restart()


def test_an_unknown_host_key_is_refused(tmp_path, fleet):
    cluster, config = fleet
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    config.write_text(config.read_text().replace(str(cluster.known_hosts_path), str(empty)))
    result = dlctl(config, "-o", "json", "agent", "status", "--node", cluster.nodes[0].name)
    assert result.returncode == ExitCode.REFUSED, result.stderr
    assert "is not known" in result.stderr and "refusing to connect" in result.stderr
    assert "ssh-keyscan" in result.stderr and "--ssh-accept-new" in result.stderr
    start = dlctl(config, "--yes", "agent", "start")
    assert start.returncode == ExitCode.REFUSED and "refusing to connect" in start.stderr


@pytest.mark.parametrize("bad", ["n1; touch /tmp/dlctl-pwned", "$(touch /tmp/dlctl-pwned)", "a b", "`id`"])
def test_names_with_shell_metacharacters_are_rejected_before_anything_runs(tmp_path, bad):
    canary = Path("/tmp/dlctl-pwned")
    canary.unlink(missing_ok=True)
    config = tmp_path / "config.toml"
    config.write_text(
        f"""
[clusters.c1]
zookeeper = "127.0.0.1:1"
[[clusters.c1.regions.r1.racks.a.nodes]]
id = {json.dumps(bad)}
host = "127.0.0.1"
"""
    )
    result = dlctl(config, "--yes", "agent", "start", timeout=60)
    assert result.returncode == ExitCode.USAGE and "invalid node name" in result.stderr
    log = dlctl(config, "log", "create", bad, timeout=60)
    assert log.returncode != 0
    assert not canary.exists()
