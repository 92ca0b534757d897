"""The remote layer against real sshd processes (and LocalTransport where the contract is shared).

Every node is a real ``sshd`` on its own loopback address; host keys, dead nodes (SIGKILL) and
hung nodes (SIGSTOP) are real. Nothing here touches the operator's ~/.ssh: every test passes
its own ssh config and known_hosts files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from dlctl.errors import ConfigError, DlctlError, ExitCode, PartialFailure, RefusedError
from dlctl.inventory import Node
from dlctl.remote.fanout import HostStatus, outcome, run_on_hosts
from dlctl.remote.local import LocalTransport
from dlctl.remote.ssh import HostKeyChanged, JumpHop, SshOptions, SshPool, SshTransport, UnknownHostKey, fingerprint, load_ssh_config, resolve_endpoint
from dlctl.remote.transport import AuthenticationFailed, CommandTimeout, HostUnreachable, Transport
from harness.procs import wait_until
from harness.sshd import ClientIdentity, SshCluster, SshdNode, SshNodeFactory, generate_key

pytestmark = pytest.mark.ssh

PRINT_ARGV = "import sys, json; print(json.dumps(sys.argv[1:]))"


@pytest.fixture
def cluster(ssh_nodes: SshNodeFactory) -> Iterator[SshCluster]:
    """3 nodes over 2 regions (r1: two nodes, r2: one), healed again after the test."""
    c = ssh_nodes(nodes=3, regions=2)
    yield c
    c.heal()


@pytest.fixture
def options(cluster: SshCluster) -> SshOptions:
    # The fixture's ssh config names its known_hosts (UserKnownHostsFile) and no global file.
    return SshOptions(config_path=cluster.ssh_config_path)


@pytest.fixture
def pool(options: SshOptions) -> Iterator[SshPool]:
    with SshPool(options) as p:
        yield p


@pytest.fixture(params=["ssh", "local"])
def transport(request: pytest.FixtureRequest, ssh_nodes: SshNodeFactory) -> Iterator[Transport]:
    """The same contract, checked on both implementations."""
    if request.param == "local":
        with LocalTransport("sandbox-node") as local:
            yield local
        return
    c = ssh_nodes(nodes=3, regions=2)
    with SshPool(SshOptions(config_path=c.ssh_config_path)) as p:
        yield p.get(c[0].name)


def inventory_node(node: SshdNode, identity: ClientIdentity, *, identity_file: Path | None = None) -> Node:
    """An inventory entry for a fixture node, reached by address (no ssh config involved)."""
    return Node(
        id=node.name,
        cluster="test",
        region=node.region,
        rack="rack1",
        host=node.address,
        listen=f"{node.address}:3181",
        ssh_user=identity.user,
        ssh_port=node.port,
        identity_file=str(identity_file or identity.key_path),
        data_dir="/var/lib/dlagent",
        python="python3",
    )


def inventory_options(cluster: SshCluster, tmp_path: Path) -> SshOptions:
    empty_config = tmp_path / "empty_ssh_config"
    empty_config.write_text("")
    return SshOptions(config_path=empty_config, known_hosts=cluster.known_hosts_path, global_known_hosts=())


def processes_containing(needle: bytes, *, files: tuple[str, ...] = ("cmdline",)) -> list[tuple[int, str]]:
    hits = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        for name in files:
            try:
                if needle in (proc / name).read_bytes():
                    hits.append((int(proc.name), name))
            except OSError:  # gone meanwhile, or a kernel thread
                continue
    return hits


def tcp_peers(pid: int) -> set[tuple[str, int]]:
    """Remote (address, port) of every established IPv4 TCP socket that ``pid`` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    peers = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if inode in inodes and state == "01":  # ESTABLISHED
            hex_addr, hex_port = remote.split(":")
            addr = ".".join(str(b) for b in reversed(bytes.fromhex(hex_addr)))
            peers.add((addr, int(hex_port, 16)))
    return peers


def all_tcp_peers() -> set[tuple[str, int]]:
    peers = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01":
            hex_addr, hex_port = fields[2].split(":")
            peers.add((".".join(str(b) for b in reversed(bytes.fromhex(hex_addr))), int(hex_port, 16)))
    return peers


# -- running commands (both transports) ----------------------------------------------------------


def test_command_returns_stdout_stderr_and_exit_code(transport: Transport) -> None:
    res = transport.run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout=10)
    assert (res.exit_code, res.stdout, res.stderr) == (7, b"out\n", b"err\n")
    assert res.host == transport.host and res.argv == ("sh", "-c", "echo out; echo err >&2; exit 7")
    assert not res.ok and res.duration > 0
    assert transport.run(["true"], timeout=10).ok
    with pytest.raises(DlctlError, match="exited with status 7: err"):
        res.check()


def test_missing_program_exits_127_like_a_shell(transport: Transport) -> None:
    res = transport.run(["dlctl-no-such-program-xyz", "arg"], timeout=10)
    assert res.exit_code == 127
    assert b"dlctl-no-such-program-xyz" in res.stderr


def test_argv_with_shell_metacharacters_arrives_as_literal_arguments(transport: Transport, tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    nasty = [
        "; rm -rf /",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"&& touch {canary} ||",
        "it's \"quoted\"",
        "line one\nline two",
        "  spaces  around  ",
        "",
        "*",
        "$HOME ${PATH}",
        "\\ back\\slash",
        "-n",
        "> /tmp/redirect",
        "ünïcödé ✓",
    ]
    res = transport.run(["python3", "-c", PRINT_ARGV, *nasty], timeout=20).check()
    assert json.loads(res.stdout) == nasty
    assert not canary.exists()


def test_env_values_are_passed_literally(transport: Transport) -> None:
    res = transport.run(["printenv", "DLCTL_TEST_VALUE"], env={"DLCTL_TEST_VALUE": "a b; $(id) 'q'"}, timeout=10).check()
    assert res.stdout == b"a b; $(id) 'q'\n"
    with pytest.raises(DlctlError, match="invalid environment variable name"):
        transport.run(["true"], env={"BAD;NAME": "x"}, timeout=10)


def test_a_shell_string_instead_of_argv_is_refused(transport: Transport) -> None:
    with pytest.raises(DlctlError, match="must be an argv list"):
        transport.run("rm -rf /tmp/x", timeout=10)  # type: ignore[arg-type]


def test_secret_on_stdin_is_never_in_any_process_argv_environment_or_log(transport: Transport, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # everything, paramiko's transport log included
    secret = ("dlctl-secret-" + secrets.token_hex(16)).encode()
    started, release = tmp_path / "started", tmp_path / "release"
    code = "\n".join(
        [
            "import hashlib, os, sys, time",
            "data = sys.stdin.buffer.read()",
            "open(sys.argv[1], 'w').close()",
            "while not os.path.exists(sys.argv[2]):",
            "    time.sleep(0.02)",
            "print(hashlib.sha256(data).hexdigest())",
        ]
    )
    box: dict[str, object] = {}
    runner = threading.Thread(target=lambda: box.setdefault("res", transport.run(["python3", "-c", code, str(started), str(release)], stdin=secret, timeout=30)))
    runner.start()
    try:
        wait_until(started.exists, 20, message="remote command to have read its stdin")
        # The command is running now: scan every process on the machine (this test process,
        # sshd and its session, the remote python) for the secret.
        assert processes_containing(secret, files=("cmdline", "environ")) == []
        # Control: the scan does see the running command by what *is* in its argv.
        assert processes_containing(str(started).encode())
    finally:
        release.touch()
        runner.join(30)
    res = box["res"]
    assert res.check().stdout.decode().strip() == hashlib.sha256(secret).hexdigest()  # type: ignore[attr-defined]
    assert secret.decode() not in caplog.text
    assert any("stdin: %d bytes" % len(secret) in r.getMessage() for r in caplog.records)


def test_timeout_kills_the_command_on_the_node(transport: Transport) -> None:
    # A unique duration makes the command findable among every process on the machine.
    marker = f"97.{secrets.randbelow(10**6):06d}"
    start = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        transport.run(["sh", "-c", f"sleep {marker}; echo never"], timeout=1.0)
    elapsed = time.monotonic() - start
    assert info.value.exit_code == ExitCode.FAILED
    assert transport.host in info.value.message and "did not finish within 1s" in info.value.message
    assert elapsed < 1.0 + 1.0 + 1.5  # timeout + kill grace + one kill round trip
    wait_until(lambda: not processes_containing(marker.encode()), 5, message=f"`sleep {marker}` to be gone")
    # The transport is still usable after a timeout.
    assert transport.run(["true"], timeout=10).ok


def test_upload_is_atomic_sets_the_mode_and_replaces(transport: Transport, tmp_path: Path) -> None:
    src = tmp_path / "agent.secret"
    src.write_bytes(b"first\x00\xffbinary")
    dest = tmp_path / "remote" / "agent.secret"
    dest.parent.mkdir()
    transport.put(src, str(dest), mode=0o600)
    assert dest.read_bytes() == b"first\x00\xffbinary"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600

    src.write_bytes(b"second")
    transport.put(src, str(dest), mode=0o755)
    assert dest.read_bytes() == b"second"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    assert sorted(p.name for p in dest.parent.iterdir()) == ["agent.secret"]  # no temp files left

    with pytest.raises(DlctlError, match="does not exist"):
        transport.put(src, str(tmp_path / "missing-dir" / "x"))
    with pytest.raises(DlctlError, match="absolute file path"):
        transport.put(src, "relative/path")


# -- SSH specifics ---------------------------------------------------------------------------------


def test_one_connection_is_reused_for_several_commands(pool: SshPool, cluster: SshCluster) -> None:
    t = pool.get(cluster[0].name)
    first = t.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout=10).check().text
    second = t.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout=10).check().text
    assert first == second  # same client port: same TCP connection
    assert first.split()[2:] == [cluster[0].address, str(cluster[0].port)]
    assert pool.get(cluster[0].name) is t


def test_concurrent_commands_share_the_connection(pool: SshPool, cluster: SshCluster) -> None:
    t = pool.get(cluster[1].name)
    results: list[str] = []
    threads = [threading.Thread(target=lambda i=i: results.append(t.run(["echo", str(i)], timeout=15).check().text)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert sorted(results) == [f"{i}\n" for i in range(4)]
    assert sum(1 for peer in tcp_peers(os.getpid()) if peer == (cluster[1].address, cluster[1].port)) == 1


def test_ssh_config_supplies_hostname_port_user_and_identity(options: SshOptions, cluster: SshCluster, ssh_identity: ClientIdentity) -> None:
    node = cluster[2]
    with SshTransport(node.name, options=options) as t:
        assert (t.endpoint.hostname, t.endpoint.port, t.endpoint.user) == (node.address, node.port, ssh_identity.user)
        assert t.endpoint.identity_files == (ssh_identity.key_path,)
        assert t.run(["true"], timeout=10).ok


def test_inventory_node_settings_work_without_any_ssh_config(cluster: SshCluster, ssh_identity: ClientIdentity, tmp_path: Path) -> None:
    node = inventory_node(cluster[0], ssh_identity)
    with SshTransport.for_node(node, inventory_options(cluster, tmp_path)) as t:
        res = t.run(["echo", "from", "inventory"], timeout=10).check()
    assert res.host == cluster[0].name and res.stdout == b"from inventory\n"


def test_unknown_host_key_is_refused_naming_host_port_type_fingerprint_and_fix(cluster: SshCluster, tmp_path: Path) -> None:
    node = cluster[0]
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    opts = SshOptions(config_path=cluster.ssh_config_path, known_hosts=empty)
    with SshTransport(node.name, options=opts) as t, pytest.raises(UnknownHostKey) as info:
        t.run(["true"], timeout=10)
    err = info.value
    assert isinstance(err, RefusedError) and err.exit_code == ExitCode.REFUSED == 4
    assert node.address in err.message and str(node.port) in err.message
    assert "ssh-ed25519" in err.message and fingerprint(node.host_key) in err.message
    assert "--ssh-accept-new" in (err.hint or "") and f"ssh-keyscan -p {node.port} {node.address}" in (err.hint or "")
    assert err.details["fingerprint"] == fingerprint(node.host_key)
    assert empty.read_text() == ""  # nothing was recorded


def test_changed_host_key_is_refused_even_with_accept_new(cluster: SshCluster, tmp_path: Path) -> None:
    target, impostor = cluster[0], cluster[1]
    _, keytype, blob = impostor.host_key_line.split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[{target.address}]:{target.port} {keytype} {blob}\n")
    before = wrong.read_text()
    opts = SshOptions(config_path=cluster.ssh_config_path, known_hosts=wrong, accept_new=True)
    with SshTransport(target.name, options=opts) as t, pytest.raises(HostKeyChanged) as info:
        t.run(["true"], timeout=10)
    err = info.value
    assert err.exit_code == ExitCode.REFUSED
    assert "HOST KEY CHANGED" in err.message and "man-in-the-middle" in err.message
    assert fingerprint(target.host_key) in err.message and fingerprint(impostor.host_key) in err.message
    assert "ssh-keygen -R" in (err.hint or "")
    assert wrong.read_text() == before  # the old key was neither replaced nor joined


def test_accept_new_records_a_first_seen_host_which_is_then_trusted_strictly(cluster: SshCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = cluster[1]
    known = tmp_path / "ssh" / "known_hosts"  # directory does not exist yet either
    opts = SshOptions(config_path=cluster.ssh_config_path, known_hosts=known, accept_new=True)
    with caplog.at_level(logging.WARNING), SshTransport(node.name, options=opts) as t:
        assert t.run(["echo", "hello"], timeout=10).check().stdout == b"hello\n"
    assert known.read_text() == node.host_key_line + "\n"
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    assert any("permanently added" in r.getMessage() and fingerprint(node.host_key) in r.getMessage() for r in caplog.records)

    strict = SshOptions(config_path=cluster.ssh_config_path, known_hosts=known)
    with SshTransport(node.name, options=strict) as t:
        assert t.run(["true"], timeout=10).ok
    # Another node is still unknown to that file: accept_new is off now.
    with SshTransport(cluster[2].name, options=strict) as t, pytest.raises(UnknownHostKey):
        t.run(["true"], timeout=10)


def test_hashed_and_wildcard_known_hosts_entries_are_honoured(cluster: SshCluster, tmp_path: Path) -> None:
    hashed_node, wildcard_node = cluster[0], cluster[1]
    _, keytype, blob = hashed_node.host_key_line.split()
    hashed_name = paramiko.HostKeys.hash_host(f"[{hashed_node.address}]:{hashed_node.port}")
    _, wtype, wblob = wildcard_node.host_key_line.split()
    pattern = f"[{wildcard_node.address.rsplit('.', 1)[0]}.*]:{wildcard_node.port},!nothing.example"
    known = tmp_path / "known_hosts"
    known.write_text(f"# comment\n{hashed_name} {keytype} {blob}\n{pattern} {wtype} {wblob}\n")
    opts = SshOptions(config_path=cluster.ssh_config_path, known_hosts=known)
    for node in (hashed_node, wildcard_node):
        with SshTransport(node.name, options=opts) as t:
            assert t.run(["true"], timeout=10).ok


def test_revoked_host_key_is_refused_even_with_accept_new(cluster: SshCluster, tmp_path: Path) -> None:
    node = cluster[0]
    _, keytype, blob = node.host_key_line.split()
    known = tmp_path / "known_hosts"
    known.write_text(f"{node.host_key_line}\n@revoked * {keytype} {blob}\n")
    for accept_new in (False, True):
        opts = SshOptions(config_path=cluster.ssh_config_path, known_hosts=known, accept_new=accept_new)
        with SshTransport(node.name, options=opts) as t, pytest.raises(RefusedError, match="@revoked"):
            t.run(["true"], timeout=10)


def test_connection_is_reopened_after_the_node_restarts(cluster: SshCluster, options: SshOptions) -> None:
    node = cluster[2]
    with SshTransport(node.name, options=options) as t:
        before = t.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout=10).check().text
        node.restart()
        wait_until(lambda: not t.connected, 10, message="the client to notice the dropped connection")
        after = t.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout=10).check().text
    assert before != after  # a new TCP connection (new client port)


def test_wrong_identity_fails_authentication_naming_user_and_key(cluster: SshCluster, ssh_identity: ClientIdentity, tmp_path: Path) -> None:
    stranger = generate_key(tmp_path / "id_stranger", "not-authorized")
    node = inventory_node(cluster[0], ssh_identity, identity_file=stranger)
    opts = inventory_options(cluster, tmp_path)
    with SshTransport.for_node(node, dataclasses.replace(opts, allow_agent=False)) as t, pytest.raises(AuthenticationFailed) as info:
        t.run(["true"], timeout=10)
    assert info.value.exit_code == ExitCode.FAILED
    assert str(stranger) in info.value.message and ssh_identity.user in (info.value.hint or "")


def test_proxyjump_reaches_a_node_through_another(cluster: SshCluster, ssh_identity: ClientIdentity, tmp_path: Path) -> None:
    jump, target, second = cluster[0], cluster[1], cluster[2]
    config = tmp_path / "ssh_config"
    blocks = [cluster.ssh_config_path.read_text()]
    for alias, node in (("behind-jump", target), ("behind-jump-2", second)):
        blocks.append(
            f"Host {alias}\n  HostName {node.address}\n  Port {node.port}\n  User {ssh_identity.user}\n"
            f"  IdentityFile {ssh_identity.key_path}\n  UserKnownHostsFile {cluster.known_hosts_path}\n"
            f"  GlobalKnownHostsFile /dev/null\n  ProxyJump {jump.name}\n"
        )
    config.write_text("\n".join(blocks))
    with SshPool(SshOptions(config_path=config)) as pool:
        t = pool.get("behind-jump")
        assert t.endpoint.jumps == (JumpHop(jump.name),)
        server = t.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout=15).check().text.split()[2:]
        assert server == [target.address, str(target.port)]
        assert pool.get("behind-jump-2").run(["true"], timeout=15).ok

        # The route: this process holds one connection, to the jump host, shared by both
        # targets; the connections to the targets belong to the jump host's sshd.
        mine = tcp_peers(os.getpid())
        assert sum(1 for p in mine if p == (jump.address, jump.port)) == 1
        assert (target.address, target.port) not in mine and (second.address, second.port) not in mine
        everyone = all_tcp_peers()
        assert (target.address, target.port) in everyone and (second.address, second.port) in everyone
        # Commands on the jump host itself ride the same connection.
        jump_transport = pool.get(jump.name)
        assert jump_transport.connected and jump_transport.run(["true"], timeout=10).ok
        assert sum(1 for p in tcp_peers(os.getpid()) if p == (jump.address, jump.port)) == 1


def test_proxyjump_to_a_dead_target_names_the_jump_and_the_target(cluster: SshCluster, ssh_identity: ClientIdentity, tmp_path: Path) -> None:
    jump, target = cluster[0], cluster[1]
    config = tmp_path / "ssh_config"
    config.write_text(
        cluster.ssh_config_path.read_text()
        + f"\nHost dead-behind-jump\n  HostName {target.address}\n  Port {target.port}\n  ProxyJump {jump.name}\n"
        + f"  UserKnownHostsFile {cluster.known_hosts_path}\n  IdentityFile {ssh_identity.key_path}\n"
    )
    target.kill()
    with SshTransport("dead-behind-jump", options=SshOptions(config_path=config)) as t, pytest.raises(HostUnreachable) as info:
        t.run(["true"], timeout=10)
    assert f"jump host {jump.name} could not connect to {target.address}:{target.port}" in info.value.message


def test_connecting_to_a_hung_node_times_out_at_the_deadline(cluster: SshCluster, options: SshOptions) -> None:
    node = cluster[2]
    node.pause()
    start = time.monotonic()
    with SshTransport(node.name, options=options) as t, pytest.raises(CommandTimeout) as info:
        t.run(["true"], timeout=1.0)
    assert time.monotonic() - start < 2.0
    assert node.name in info.value.message and "connecting" in info.value.message


# -- fan-out over real nodes -----------------------------------------------------------------------


def test_dead_node_makes_fanout_a_partial_failure_naming_it(cluster: SshCluster, ssh_identity: ClientIdentity, tmp_path: Path) -> None:
    nodes = [inventory_node(n, ssh_identity) for n in cluster]
    dead = cluster.regions["r2"][0]
    dead.kill()
    with SshPool(inventory_options(cluster, tmp_path)) as pool:
        results = run_on_hosts(nodes, pool.get, ["echo", "alive"], timeout=10, max_concurrency=3)
    by_host = {r.host: r for r in results}
    assert by_host[dead.name].status is HostStatus.FAILED
    assert all(r.ok and r.value is not None and r.value.stdout == b"alive\n" for h, r in by_host.items() if h != dead.name)
    with pytest.raises(PartialFailure) as info:
        outcome(results, action="agent status")
    err = info.value
    assert err.exit_code == ExitCode.PARTIAL == 3
    assert f"{dead.name} [failed] connection refused by {dead.address}:{dead.port}" in err.message
    assert "1 of 3 hosts did not succeed" in err.message
    assert {d["host"]: d["status"] for d in err.details} == {n.name: ("failed" if n is dead else "ok") for n in cluster}


def test_hung_node_times_out_within_the_per_host_timeout_while_the_others_succeed(cluster: SshCluster, options: SshOptions) -> None:
    hung = cluster[1]
    with SshPool(options) as pool:
        # Connections are established first: the node hangs under a live connection.
        for n in cluster:
            pool.get(n.name).run(["true"], timeout=10).check()
        hung.pause()
        start = time.monotonic()
        results = run_on_hosts(list(cluster), lambda n: pool.get(n.name), ["echo", "alive"], timeout=2.0, max_concurrency=3)
        elapsed = time.monotonic() - start
    by_host = {r.host: r for r in results}
    assert by_host[hung.name].status is HostStatus.TIMEOUT
    assert all(by_host[n.name].ok for n in cluster if n is not hung)
    assert elapsed < 2.0 + 1.5, f"fan-out took {elapsed:.2f}s for a 2s per-host timeout"
    with pytest.raises(PartialFailure, match=rf"{hung.name} \[timeout\]"):
        outcome(results, action="agent status")


def test_every_node_down_is_a_plain_failure(ssh_nodes: SshNodeFactory, ssh_identity: ClientIdentity, tmp_path: Path) -> None:
    c = ssh_nodes(nodes=2, regions=1, fresh=True)
    nodes = [inventory_node(n, ssh_identity) for n in c]
    c.stop()
    with SshPool(inventory_options(c, tmp_path)) as pool:
        results = run_on_hosts(nodes, pool.get, ["true"], timeout=5)
    with pytest.raises(DlctlError) as info:
        outcome(results, action="agent stop")
    assert not isinstance(info.value, PartialFailure) and info.value.exit_code == ExitCode.FAILED
    assert all(n.name in info.value.message for n in c)


# -- ssh config handling (no network) --------------------------------------------------------------


def test_proxycommand_is_refused_and_proxyjump_specs_are_parsed(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host viacmd\n  ProxyCommand nc %h %p\nHost chain\n  ProxyJump admin@bastion:2222,ssh://[10.0.0.1]:22,inner\n")
    parsed = load_ssh_config(config)
    with pytest.raises(ConfigError, match="ProxyCommand"):
        resolve_endpoint("viacmd", config=parsed[0], config_file=parsed[1], options=SshOptions())
    ep = resolve_endpoint("chain", config=parsed[0], config_file=parsed[1], options=SshOptions(known_hosts=tmp_path / "kh"))
    assert ep.jumps == (JumpHop("bastion", "admin", 2222), JumpHop("10.0.0.1", None, 22), JumpHop("inner"))
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_endpoint("h", config=parsed[0], config_file=parsed[1], options=SshOptions(), identity_file=tmp_path / "nope")
    with pytest.raises(ConfigError, match="invalid SSH host"):
        resolve_endpoint("-oProxyCommand=x", config=parsed[0], config_file=parsed[1], options=SshOptions())
    with pytest.raises(ConfigError, match="does not exist"):
        load_ssh_config(tmp_path / "missing")


def test_known_hosts_parsing_matches_like_openssh() -> None:
    from dlctl.remote.hostkeys import parse_known_hosts

    salted = paramiko.HostKeys.hash_host("[10.0.0.7]:2222")
    parsed = parse_known_hosts(
        "\n".join(
            [
                "# comment",
                "plain.example,10.0.0.1 ssh-ed25519 AAAAplain",
                f"{salted} ssh-ed25519 AAAAhashed",
                "*.prod.example,!db.prod.example ssh-ed25519 AAAAwild",
                "@cert-authority *.example ssh-ed25519 AAAAca",
                "@revoked * ssh-ed25519 AAAArevoked",
                "garbage",
            ]
        )
    )
    assert parsed.keys_for("plain.example") == [("ssh-ed25519", "AAAAplain")]
    assert parsed.keys_for("10.0.0.1") == [("ssh-ed25519", "AAAAplain")]
    assert parsed.keys_for("[10.0.0.7]:2222") == [("ssh-ed25519", "AAAAhashed")]
    assert parsed.keys_for("[10.0.0.7]:22") == []
    assert parsed.keys_for("web.prod.example") == [("ssh-ed25519", "AAAAwild")]
    assert parsed.keys_for("db.prod.example") == []  # negated
    assert parsed.keys_for("x.example") == []  # CA lines are not host keys
    assert parsed.revoked == frozenset({"AAAArevoked"})


def test_unknown_host_policy_is_paramikos_reject_policy_unless_accept_new(cluster: SshCluster, options: SshOptions, tmp_path: Path) -> None:
    with SshTransport(cluster[0].name, options=options) as t:
        t.connect()
        assert isinstance(t._client._policy, paramiko.RejectPolicy)  # type: ignore[union-attr]
    tofu = dataclasses.replace(options, accept_new=True, known_hosts=tmp_path / "known_hosts")
    with SshTransport(cluster[0].name, options=tofu) as t:
        t.connect()
        policy = t._client._policy  # type: ignore[union-attr]
        assert not isinstance(policy, (paramiko.AutoAddPolicy, paramiko.WarningPolicy, paramiko.RejectPolicy))
