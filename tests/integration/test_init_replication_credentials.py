"""``init-replication`` installs the source's credentials on the sink's agents over SSH (issue 23).

The sink ``west`` is three agents on real sshd nodes, installed with ``dlctl agent install``: their
agent.toml declares no replication source, and their TLS certificates come from west's own CA,
which the source's agents (the harness CA) do not trust. So records reach west only through what
``init-replication`` delivered: c1's secret, ZooKeeper credentials and a client certificate of
c1's CA. Without it (``--no-install-credentials``) the stream's workers refuse to read an
undeclared source, say so in ``replication status``, and nothing crosses."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from harness.logcluster import CLUSTER, agent_cluster
from harness.procs import free_port, wait_until
from harness.tls import tls_dir_for
from harness.zk import write_harness_zk_auth

from dlctl.certdir import CertDir
from dlctl.meta import paths
from dlctl.secrets import write_secret_file

pytestmark = [pytest.mark.ssh, pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]

SINK = "west"
LOG = "orders"
RECORDS = 300


@pytest.fixture(scope="module")
def source(zk_server, tmp_path_factory):
    yield from agent_cluster(zk_server, tmp_path_factory.mktemp("source-credentials"), "source-credentials")


def write_inventory(path: Path, source, nodes, zk_connect: str, known_hosts: Path, identity) -> None:
    base = path.parent
    first = next(iter(source.agents.values()))
    tls_dir_for(first.secret_file, CLUSTER)  # c1's CA as the operator holds it: the harness CA its agents trust
    write_secret_file(base / "west.secret", b"west-cluster-secret-0123456789ab")
    west_ca = CertDir(base / "west.tls", SINK)
    west_ca.ensure()  # west's own CA: c1's agents refuse its certificates
    (base / "empty_ssh_config").write_text("")
    lines = [
        f"[clusters.{CLUSTER}]",
        f'zookeeper = "{source.ns.connect_string}"',
        f'secret_file = "{first.secret_file}"',
        f'zk_auth_file = "{first.zk_auth_file}"',
        "",
        f"[clusters.{SINK}]",
        f'zookeeper = "{zk_connect}"',
        f'secret_file = "{base / "west.secret"}"',
        f'zk_auth_file = "{write_harness_zk_auth(base / "west.zk-auth")}"',
        f'tls_dir = "{west_ca.path}"',
        f'known_hosts = "{known_hosts}"',
        f'ssh_config = "{base / "empty_ssh_config"}"',
        "",
    ]
    for node in nodes:
        home = base / node.name
        lines += [
            f"[[clusters.{SINK}.regions.{node.region}.racks.rack-{node.name}.nodes]]",
            f'id = "{node.name}"',
            f'host = "{node.address}"',
            f"ssh_port = {node.port}",
            f'ssh_user = "{identity.user}"',
            f'identity_file = "{identity.key_path}"',
            f'home = "{home}"',
            f'data_dir = "{home}/data"',
            f'listen = "{node.address}:{free_port(node.address)}"',
            f"metrics_port = {free_port(node.address)}",
            f'python = "{sys.executable}"',
            "",
        ]
    path.write_text("\n".join(lines))


def dlctl(config: Path, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlctl.cli", *argv], capture_output=True, text=True, timeout=timeout, env={**os.environ, "DLCTL_CONFIG": str(config)}
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-3000:]}"
    return result


def records_at(config: Path, cluster: str) -> list[str]:
    out = ok(dlctl(config, "--cluster", cluster, "-o", "json", "log", "read", LOG, "--limit", str(RECORDS * 2)))
    return [json.loads(line)["payload"] for line in out.stdout.splitlines() if line.strip()]


def stream_errors(config: Path) -> list[str]:
    out = dlctl(config, "--cluster", SINK, "-o", "json", "replication", "status", f"{CLUSTER}-to-{SINK}")
    if out.returncode not in (0, 1):
        return []
    return [row.get("last_error") or "" for row in json.loads(out.stdout)["logs"]]


def test_init_replication_installs_the_source_credentials_the_sink_agents_need(tmp_path, source, ssh_nodes, zk):
    cluster = ssh_nodes(nodes=3, regions=2, fresh=True)
    config = tmp_path / "config.toml"
    write_inventory(config, source, cluster.nodes, zk.connect_string, cluster.known_hosts_path, cluster.identity)
    ok(dlctl(config, "--cluster", SINK, "--yes", "agent", "install", timeout=600))
    try:
        ok(dlctl(config, "--cluster", SINK, "--yes", "agent", "start"))
        admin = zk.client()
        wait_until(lambda: len(admin.get_children(paths.available(SINK))) == 3, 30, message="3 west agents registered")
        assert all("[replication" not in (tmp_path / n.name / "agent.toml").read_text() for n in cluster.nodes), "no source declared by hand"

        ok(dlctl(config, "--cluster", CLUSTER, "--yes", "log", "create", LOG))
        sent = [f"record {i}" for i in range(RECORDS)]
        ok(subprocess.run(
            [sys.executable, "-m", "dlctl.cli", "--cluster", CLUSTER, "--yes", "log", "append", LOG], input="\n".join(sent) + "\n",
            capture_output=True, text=True, timeout=120, env={**os.environ, "DLCTL_CONFIG": str(config)},
        ))

        # Without the credentials: the workers refuse the undeclared source, and say so.
        bare = json.loads(ok(dlctl(config, "-o", "json", "--yes", "init-replication", "--source", CLUSTER, "--sink", SINK, "--no-install-credentials")).stdout)
        assert "install-credentials" not in [s["action"] for s in bare["steps"]]
        wait_until(lambda: any("is not declared on agent" in e for e in stream_errors(config)), 60, message="the stream reports its undeclared source")
        assert not (tmp_path / cluster.nodes[0].name / "sources").exists()

        # Re-run with them (the default): delivered over SSH first, then the stream drains.
        done = json.loads(ok(dlctl(config, "-o", "json", "--yes", "init-replication", "--source", CLUSTER, "--sink", SINK)).stdout)
        step = next(s for s in done["steps"] if s["action"] == "install-credentials")
        assert set(step["result"]) == {n.name for n in cluster.nodes} and all(r["tls"] for r in step["result"].values())
        ok(dlctl(config, "--cluster", SINK, "--yes", "replication", "wait-drain", f"{CLUSTER}-to-{SINK}", "--timeout", "120", timeout=180))
        assert records_at(config, SINK) == sent  # the oracle: what was appended, in order, once

        for node in cluster.nodes:
            home = tmp_path / node.name / "sources" / CLUSTER
            assert (home / "secret").read_bytes() == next(iter(source.agents.values())).secret_file.read_bytes()
            modes = {p.relative_to(home).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [home, *home.rglob("*")]}
            assert modes == {
                ".": 0o700, "secret": 0o600, "zk-auth": 0o600, "tls": 0o700, "tls/ca.pem": 0o600, "tls/client.pem": 0o600, "tls/client.key": 0o600,
                "source.toml": 0o600,
            }, modes
    finally:
        dlctl(config, "--cluster", SINK, "--yes", "agent", "stop", timeout=120)
