"""SFTP uploads are private from the server's first instant (issue 19), against a real sshd.

``SFTPClient.open`` asks the server to create a file with no mode, so it is made with the
server's default (0644 under the usual umask) and chmod'ed afterwards; whoever opens it in
between keeps a descriptor that reads the secret once written. These tests look at the file
from the server side (the sshd nodes share this machine's filesystem) at the moment the server
has created it and handed back its handle, before the client has done anything else with it.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from dlctl.errors import DlctlError
from dlctl.remote import ssh as ssh_mod
from dlctl.remote.ssh import SshOptions, SshPool
from harness.sshd import SshCluster, SshNodeFactory

pytestmark = pytest.mark.ssh


@pytest.fixture
def cluster(ssh_nodes: SshNodeFactory) -> Iterator[SshCluster]:
    c = ssh_nodes(nodes=1, regions=1)
    yield c
    c.heal()


@pytest.fixture
def pool(cluster: SshCluster) -> Iterator[SshPool]:
    with SshPool(SshOptions(config_path=cluster.ssh_config_path)) as p:
        yield p


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def spy_on_created_files(monkeypatch: pytest.MonkeyPatch, directory: Path) -> list[tuple[str, int, int]]:
    """(name, mode, size) of every file in ``directory`` each time the client receives a file
    handle from the server: the file exists then, and the client has not yet chmod'ed it or
    written a byte."""
    seen: list[tuple[str, int, int]] = []
    real_init = paramiko.SFTPFile.__init__

    def spying_init(self, sftp, handle, mode="r", bufsize=-1):
        for p in directory.iterdir():
            st = p.lstat()
            seen.append((p.name, stat.S_IMODE(st.st_mode), st.st_size))
        real_init(self, sftp, handle, mode, bufsize)

    monkeypatch.setattr(paramiko.SFTPFile, "__init__", spying_init)
    return seen


def test_the_servers_default_mode_would_expose_a_file(cluster: SshCluster, tmp_path: Path) -> None:
    """The premise of the test below: a file the client creates without asking for a mode is
    readable by others on this server. (If this fails, the sshd runs with a private umask
    and the next test cannot tell a fixed upload from a broken one.)"""
    probe = tmp_path / "probe"
    client = cluster.connect(cluster[0])
    try:
        with client.open_sftp() as sftp, sftp.open(str(probe), "w"):
            pass
    finally:
        client.close()
    assert mode(probe) & 0o044, f"the server created {probe} {mode(probe):04o}"


def test_an_uploaded_secret_is_0600_from_the_moment_the_server_creates_it(cluster: SshCluster, pool: SshPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "local.secret"
    src.write_bytes(b"s3cret-" * 10_000)  # several SFTP writes
    remote = tmp_path / "remote"
    remote.mkdir()
    remote.chmod(0o755)
    seen = spy_on_created_files(monkeypatch, remote)

    pool.get(cluster[0].name).put(src, str(remote / "agent.secret"), mode=0o600)

    temps = [(name, m, size) for name, m, size in seen if name.startswith(".agent.secret.dlctl-tmp-")]
    assert len(temps) == 1, seen  # the upload went through a temp file, seen at its creation
    _, created_mode, size_then = temps[0]
    assert size_then == 0, "looked too late: bytes were already written"
    assert created_mode == 0o600, f"the temp file was created {created_mode:04o}"
    assert (remote / "agent.secret").read_bytes() == src.read_bytes() and mode(remote / "agent.secret") == 0o600


def test_a_wider_mode_is_set_exactly_and_still_before_the_first_byte(cluster: SshCluster, pool: SshPool, tmp_path: Path) -> None:
    src = tmp_path / "dlctl.whl"
    src.write_bytes(b"wheel")
    remote = tmp_path / "remote"
    remote.mkdir()
    pool.get(cluster[0].name).put(src, str(remote / "dlctl.whl"), mode=0o644)
    assert mode(remote / "dlctl.whl") == 0o644


def test_a_symlink_planted_under_the_temp_name_is_not_written_through(cluster: SshCluster, pool: SshPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temp name is random; should someone have it in advance and link it elsewhere, the
    create (O_EXCL) fails instead of writing the secret where the link points."""
    remote = tmp_path / "remote"
    remote.mkdir()
    victim = tmp_path / "attacker-reads-this"
    victim.write_bytes(b"")
    monkeypatch.setattr(ssh_mod._random, "token_hex", lambda n=None: "planted")
    (remote / ".agent.secret.dlctl-tmp-planted").symlink_to(victim)
    src = tmp_path / "local.secret"
    src.write_bytes(b"s3cret")
    with pytest.raises(DlctlError):
        pool.get(cluster[0].name).put(src, str(remote / "agent.secret"), mode=0o600)
    assert victim.read_bytes() == b""
    assert not (remote / "agent.secret").exists()
