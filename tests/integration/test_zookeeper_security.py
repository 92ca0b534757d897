"""Secure by default on ZooKeeper (issue 19 item 1), against a real ZooKeeper: `cluster init`
makes digest credentials and puts the cluster's ACL on every znode (the /dlctl root included);
an anonymous client can change nothing; a layout somebody else made first is never adopted;
open ACLs only on an explicit, loudly reported opt-in."""

from __future__ import annotations

import json

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import Permissions

from dlctl.cli.main import main
from dlctl.errors import ExitCode
from dlctl.meta import paths
from dlctl.meta.zk import ZkAuth, acl_for, connect
from harness.cli import write_inventory
from harness.zk import close_client, make_client

pytestmark = pytest.mark.zk


def inventory(tmp_path, zk, monkeypatch, *, extra: str = "") -> None:
    # No zk_auth_file: credentials are the default (c1.zk-auth beside the secret).
    path = write_inventory(tmp_path, zk.connect_string, b"cluster-secret-for-security-tests-01", keys=extra)
    monkeypatch.setenv("DLCTL_CONFIG", str(path))


def dlctl(capsys, *argv):
    code = main(["-o", "json", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), " ".join(err.split())  # rich wraps stderr


def walk(client, path: str):
    yield path
    for child in client.get_children(path):
        yield from walk(client, f"{path.rstrip('/')}/{child}")


def test_init_makes_credentials_and_every_znode_refuses_an_anonymous_client(tmp_path, zk, monkeypatch, capsys):
    inventory(tmp_path, zk, monkeypatch)
    code, result, err = dlctl(capsys, "--yes", "cluster", "init")
    assert code == 0, err
    auth_file = tmp_path / "c1.zk-auth"
    assert auth_file.exists() and auth_file.stat().st_mode & 0o777 == 0o600
    auth = ZkAuth.from_file(auth_file)
    admin = make_client(zk.connect_string, superuser=True)
    anonymous = make_client(zk.connect_string, anonymous=True)
    try:
        root = paths.cluster_root("c1")
        expected = [str(a) for a in acl_for(auth)]
        for path in walk(admin, root):
            acls, _ = admin.get_acls(path)
            assert [str(a) for a in acls] == expected, f"{path}: {acls}"
        top, _ = admin.get_acls(paths.ROOT)
        world = [a for a in top if a.id.scheme == "world"]
        assert world and all(not a.perms & (Permissions.WRITE | Permissions.DELETE | Permissions.ADMIN) for a in world)
        # What the attacks of the issue did, anonymously: each is refused.
        with pytest.raises(NoAuthError):
            anonymous.set(paths.config("c1"), b'{"cluster_id": "mine"}')
        with pytest.raises(NoAuthError):
            anonymous.delete(paths.node("c1", "n1"))
        with pytest.raises(NoAuthError):
            anonymous.create(paths.available_node("c1", "fake-agent"), b"{}")
        with pytest.raises(NoAuthError):
            anonymous.get(paths.config("c1"))
        with pytest.raises(NoAuthError):
            anonymous.delete(root, recursive=True)
    finally:
        close_client(anonymous)
        close_client(admin)
    # Re-running is safe: the layout is recognised as this cluster's, same id.
    def layout(out: dict) -> dict:
        return next(s for s in out["steps"] if s["action"] == "create-layout")["result"]

    first_id = layout(result)["cluster_id"]
    code, again, err = dlctl(capsys, "--yes", "cluster", "init")
    assert code == 0 and layout(again)["cluster_id"] == first_id and layout(again)["adopted"], err
    # The inventory's tls_dir held the harness CA: init kept it (and recorded a TLS cluster).
    assert next(s for s in again["steps"] if s["action"] == "ensure-tls")["result"]["tls_dir"] == "kept"


def test_init_refuses_a_layout_an_attacker_created_first(tmp_path, zk, monkeypatch, capsys):
    inventory(tmp_path, zk, monkeypatch)
    attacker = make_client(zk.connect_string, anonymous=True)
    try:
        attacker.create(paths.config("c1"), json.dumps({"cluster": "c1", "cluster_id": "chosen-by-attacker"}).encode(), makepath=True)
        attacker.create(paths.available_node("c1", "fake-agent"), b"{}", makepath=True)
    finally:
        close_client(attacker)
    code, _, err = dlctl(capsys, "--yes", "cluster", "init")
    assert code == ExitCode.REFUSED and paths.cluster_root("c1") in err and "not made by this cluster" in err
    # The attacker's /dlctl (open to all) was tightened on the way: the world may read and create only.
    admin = make_client(zk.connect_string, superuser=True)
    try:
        top, _ = admin.get_acls(paths.ROOT)
        assert all(not a.perms & (Permissions.WRITE | Permissions.DELETE | Permissions.ADMIN) for a in top if a.id.scheme == "world")
    finally:
        close_client(admin)
    # Even a layout with a marker is refused when the marker is not this secret's.
    admin = make_client(zk.connect_string, superuser=True)
    try:
        admin.set(paths.config("c1"), json.dumps({"cluster": "c1", "cluster_id": "x", "marker": "0" * 64}).encode())
    finally:
        close_client(admin)
    code, _, err = dlctl(capsys, "--yes", "cluster", "init")
    assert code == ExitCode.REFUSED and "marker" in err


def test_open_acls_need_an_explicit_opt_in_and_every_command_then_warns(tmp_path, zk, monkeypatch, capsys):
    inventory(tmp_path, zk, monkeypatch, extra="insecure_zookeeper = true")
    code, _, err = dlctl(capsys, "--yes", "cluster", "init")
    assert code == ExitCode.REFUSED and "--insecure-zookeeper" in err and "world-writable" in err
    code, _, err = dlctl(capsys, "--yes", "cluster", "init", "--insecure-zookeeper")
    assert code == 0, err
    code, _, err = dlctl(capsys, "log", "list")
    assert code == 0 and "without ACLs" in err


def test_recipe_znodes_carry_the_cluster_acl(tmp_path, zk, monkeypatch, capsys):
    """kazoo's recipes (the auditor's and housekeeper's elections) create znodes without an ACL
    argument: the client's default ACL makes them the cluster's too."""
    inventory(tmp_path, zk, monkeypatch)
    assert dlctl(capsys, "--yes", "cluster", "init")[0] == 0
    auth = ZkAuth.from_file(tmp_path / "c1.zk-auth")
    client = connect(zk.connect_string, auth)
    try:
        lock = client.Lock(f"{paths.cluster_root('c1')}/auditor-election", "n1")
        assert lock.acquire(timeout=5)
        (child,) = client.get_children(f"{paths.cluster_root('c1')}/auditor-election")
        acls, _ = client.get_acls(f"{paths.cluster_root('c1')}/auditor-election/{child}")
        assert [str(a) for a in acls] == [str(a) for a in acl_for(auth)]
        lock.release()
    finally:
        client.stop()
        client.close()


def test_debug_logs_never_show_the_zookeeper_credentials_or_the_session_password(tmp_path, zk, monkeypatch, capsys, caplog):
    """At -vv kazoo logs each request it sends with its fields: the digest password of Auth and
    the session password of Connect would be in the operator's terminal and in the agent's log."""
    inventory(tmp_path, zk, monkeypatch)
    code, _, err = dlctl(capsys, "--yes", "cluster", "init")
    assert code == 0, err
    auth = ZkAuth.from_file(tmp_path / "c1.zk-auth")
    # The CLI at -vv, as an operator would run it.
    code, _, err = dlctl(capsys, "-vv", "log", "list")
    assert code == 0, err
    assert "Auth(" in err and "Connect(" in err, "the requests are logged: else this test shows nothing"
    assert auth.password not in err
    # The library as the agent uses it, every level kazoo has (BLATHER is 5).
    with caplog.at_level(1):
        client = connect(zk.connect_string, auth)
        try:
            session_password = client.client_id[1]
        finally:
            client.stop()
            client.close()
    text = caplog.text
    assert "Auth(" in text and "session_passwd" in text
    assert auth.password not in text
    assert repr(session_password) not in text and session_password.hex() not in text


def test_wrong_zookeeper_credentials_are_a_configuration_error_naming_the_file(tmp_path, zk, monkeypatch, capsys):
    """The digest scheme takes any password at connection; the first read was refused with a
    bare NoAuthError, reported as an internal error."""
    inventory(tmp_path, zk, monkeypatch)
    code, _, err = dlctl(capsys, "--yes", "cluster", "init")
    assert code == 0, err
    auth_file = tmp_path / "c1.zk-auth"
    user = ZkAuth.from_file(auth_file).user
    auth_file.write_text(f"{user}:not-the-password\n")
    code, _, err = dlctl(capsys, "log", "list")
    assert code == ExitCode.USAGE, err
    said = "".join(err.split())  # rich may wrap inside the long path
    assert "".join(f"ZooKeeper refuses its metadata to user '{user}' of {auth_file}".split()) in said and "internalerror" not in said, err
