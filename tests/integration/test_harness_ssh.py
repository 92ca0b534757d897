"""The sshd nodes are real: host keys are checked strictly, and nodes die and hang for real."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import paramiko
import pytest

from harness.procs import pid_alive, wait_until
from harness.sshd import SshCluster, SshNodeFactory

pytestmark = pytest.mark.ssh


def run(client: paramiko.SSHClient, command: str) -> tuple[int, str]:
    _, stdout, _ = client.exec_command(command, timeout=10)
    out = stdout.read().decode()
    return stdout.channel.recv_exit_status(), out


@pytest.fixture
def cluster(ssh_nodes: SshNodeFactory) -> SshCluster:
    return ssh_nodes(nodes=4, regions=2)


def test_nodes_are_spread_over_regions_on_their_own_addresses(cluster: SshCluster) -> None:
    assert sorted(cluster.regions) == ["r1", "r2"]
    assert [len(v) for v in cluster.regions.values()] == [2, 2]
    for node in cluster:
        region_number = int(node.region[1:])
        assert node.address.startswith(f"127.0.{region_number}.")
    assert len({n.address for n in cluster}) == len(cluster)


def test_reject_policy_with_generated_known_hosts_runs_a_command(cluster: SshCluster) -> None:
    for node in (cluster[0], cluster[-1]):
        client = cluster.connect(node)
        try:
            assert isinstance(client._policy, paramiko.RejectPolicy)
            assert run(client, "echo hi") == (0, "hi\n")
        finally:
            client.close()


def test_unknown_host_key_is_refused(cluster: SshCluster, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        cluster[0].connect(known_hosts=empty)

    # Knowing another node's key does not make this node known.
    other_only = tmp_path / "other_known_hosts"
    other_only.write_text(cluster[1].host_key_line + "\n")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        cluster[0].connect(known_hosts=other_only)


def test_wrong_host_key_is_refused(cluster: SshCluster, tmp_path: Path) -> None:
    target, impostor = cluster[0], cluster[1]
    # The right host and port, but another node's key: a man in the middle.
    _, keytype, blob = impostor.host_key_line.split()
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"[{target.address}]:{target.port} {keytype} {blob}\n")
    with pytest.raises(paramiko.BadHostKeyException):
        target.connect(known_hosts=wrong)


def test_openssh_client_with_generated_ssh_config(cluster: SshCluster) -> None:
    node = cluster[2]
    done = subprocess.run(
        cluster.ssh_argv(node, "echo", "from-cli"), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "from-cli\n"


def test_killed_node_refuses_and_restarted_node_keeps_its_identity(
    ssh_nodes: SshNodeFactory,
) -> None:
    cluster = ssh_nodes(nodes=2, regions=1)
    node = cluster[0]
    client = cluster.connect(node)
    client.close()

    node.kill()
    with pytest.raises((paramiko.ssh_exception.NoValidConnectionsError, ConnectionRefusedError)):
        cluster.connect(node, timeout=2)

    node.start()  # same address, port and host key: the cluster's known_hosts still holds
    client = cluster.connect(node)
    try:
        assert run(client, "echo back") == (0, "back\n")
    finally:
        client.close()


def test_paused_node_hangs_instead_of_refusing(ssh_nodes: SshNodeFactory) -> None:
    cluster = ssh_nodes(nodes=2, regions=1)
    node = cluster[1]
    node.pause()
    with pytest.raises(socket.timeout):
        node.banner(timeout=0.5)  # the kernel accepts, but nobody speaks
    node.resume()
    assert node.banner().startswith(b"SSH-2.0-")


def test_shared_clusters_are_healed_when_requested_again(ssh_nodes: SshNodeFactory) -> None:
    first = ssh_nodes(nodes=4, regions=2)
    first[0].kill()
    first[1].pause()
    again = ssh_nodes(nodes=4, regions=2)
    assert again is first
    for node in again:
        assert node.running and not node.paused
        assert node.ready()

    fresh = ssh_nodes(nodes=4, regions=2, fresh=True)
    try:
        assert fresh is not first
        assert not {n.address for n in fresh} & {n.address for n in first}
    finally:
        fresh.stop()


def test_killing_a_node_ends_what_runs_on_it_even_detached_daemons(
    ssh_nodes: SshNodeFactory,
) -> None:
    cluster = ssh_nodes(nodes=2, regions=1)
    node = cluster[0]
    client = cluster.connect(node)
    try:
        # setsid + nohup + & : a daemon no longer related to sshd by parent links.
        status, out = run(client, "setsid nohup sleep 720 >/dev/null 2>&1 < /dev/null & echo $!")
        assert status == 0
    finally:
        client.close()
    daemon = int(out.strip())
    wait_until(lambda: pid_alive(daemon), 5, message="the daemon to start")

    node.kill()

    wait_until(lambda: not pid_alive(daemon), 5, message=f"daemon {daemon} on {node.name} to die")


def test_sftp_subsystem_works(cluster: SshCluster, tmp_path: Path) -> None:
    client = cluster.connect(cluster[1])
    try:
        sftp = client.open_sftp()
        remote = str(tmp_path / "shipped.txt")
        with sftp.open(remote, "w") as f:
            f.write("payload")
        sftp.close()
        assert run(client, f"cat {remote}") == (0, "payload")
    finally:
        client.close()


def test_session_env_reaches_remote_commands(ssh_nodes: SshNodeFactory) -> None:
    cluster = ssh_nodes(nodes=1, regions=1, session_env={"DLCTL_TEST_GREETING": "hello world"})
    client = cluster.connect(cluster[0])
    try:
        assert run(client, 'echo "$DLCTL_TEST_GREETING"') == (0, "hello world\n")
    finally:
        client.close()
