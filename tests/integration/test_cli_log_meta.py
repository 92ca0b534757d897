"""``dlctl log create|list|show|delete`` and ``config show`` against a real ZooKeeper."""

from __future__ import annotations

import json

import pytest

from harness.cli import dlctl, write_inventory
from harness.zk import close_client, make_client
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl

from dlctl.errors import ExitCode
from dlctl.meta import paths

pytestmark = pytest.mark.zk


@pytest.fixture
def config(tmp_path, zk, monkeypatch):
    path = write_inventory(tmp_path, zk.connect_string, b"cluster-secret-for-cli-tests-0123", zk_auth=b"dlctl:zk-password-for-cli-tests")
    monkeypatch.setenv("DLCTL_CONFIG", str(path))
    return path


def test_create_list_show_delete_round_trip(config, capsys):
    code, plan, _ = dlctl(capsys, "log", "create", "orders", "-e", "3", "-w", "2", "-a", "2", "--dry-run")
    assert code == 0 and plan["dry_run"] and plan["steps"][0]["params"]["config"]["write_quorum"] == 2
    code, listed, _ = dlctl(capsys, "log", "list")
    assert code == 0 and listed == []  # the dry run changed nothing

    code, result, _ = dlctl(capsys, "log", "create", "orders", "-e", "3", "-w", "2", "-a", "2")
    assert code == 0 and result["ok"] and result["steps"][0]["result"]["log_id"] >= 1
    code, listed, _ = dlctl(capsys, "log", "list")
    assert [row["name"] for row in listed] == ["orders"]
    code, shown, _ = dlctl(capsys, "log", "show", "orders")
    assert shown["config"]["write_quorum"] == 2 and shown["segments"] == [] and shown["owner"] is None

    code, _, err = dlctl(capsys, "log", "create", "orders")
    assert code == ExitCode.FAILED and "already exists" in err

    code, _, err = dlctl(capsys, "log", "delete", "orders")
    assert code == ExitCode.REFUSED and "--yes" in err
    code, result, _ = dlctl(capsys, "--yes", "log", "delete", "orders")
    assert code == 0 and result["ok"]
    code, _, err = dlctl(capsys, "log", "show", "orders")
    assert code == ExitCode.FAILED and "does not exist" in err


def test_invalid_quorums_and_names_are_usage_errors(config, capsys):
    code, _, err = dlctl(capsys, "log", "create", "x", "-e", "2", "-w", "3")
    assert code == ExitCode.USAGE and "E >= W >= A" in err
    # A bad name is the operator's mistake, whatever the command: exit 2 and what is allowed,
    # never "internal error" (it was, with exit 1, for every command that takes a log name).
    for argv in (["log", "create", "../etc"], ["log", "create", "a/b"], ["log", "show", "a b"], ["log", "tail", ".."],
                 ["--yes", "log", "delete", "../etc"], ["fence", "../etc"], ["--yes", "truncate", "../etc", "--before", "1h"],
                 ["--yes", "recover", "node", "../n"]):
        code, _, err = dlctl(capsys, *argv)
        kind = "node" if "recover" in argv else "log"
        assert code == ExitCode.USAGE and f"invalid {kind} name" in err and "internal error" not in err, (argv, code, err)


def test_log_znodes_carry_the_cluster_acl(config, capsys, zk):
    assert dlctl(capsys, "log", "create", "acl-check")[0] == 0
    admin = make_client(zk.connect_string, superuser=True)
    try:
        for path in (paths.log("c1", "acl-check"), paths.log_segments("c1", "acl-check")):
            acls, _ = admin.get_acls(path)
            assert [a.id.scheme for a in acls] == ["digest"] and acls[0].id.id.startswith("dlctl:")
    finally:
        close_client(admin)
    with pytest.raises(NoAuthError):  # and a client without the credentials cannot read it
        zk.client().get(paths.log("c1", "acl-check"))


def test_delete_is_refused_while_a_writer_owns_the_log(config, capsys, zk):
    assert dlctl(capsys, "log", "create", "busy")[0] == 0
    from dlctl.meta.zk import ZkAuth, connect

    owner = connect(zk.connect_string, ZkAuth("dlctl", "zk-password-for-cli-tests"))
    try:
        owner.create(paths.log_owner("c1", "busy"), b"writer-7", ephemeral=True)
        code, _, err = dlctl(capsys, "--yes", "log", "delete", "busy")
        assert code == ExitCode.REFUSED and "writer-7" in err
    finally:
        owner.stop()
        owner.close()


def test_config_show_never_prints_secrets(config, capsys):
    code, shown, _ = dlctl(capsys, "config", "show")
    assert code == 0 and shown["source"] == "DLCTL_CONFIG" and shown["clusters"][0]["nodes"][0]["id"] == "n1"
    text = json.dumps(shown)
    assert "cluster-secret-for-cli-tests" not in text and "zk-password" not in text


def test_a_znode_whose_acl_refuses_the_cluster_s_credentials_is_named(config, capsys, zk):
    """Created by hand as ZooKeeper's superuser (its own ACL): dlctl cannot read it. That was
    'internal error: NoAuthError:' with nothing to go on."""
    assert dlctl(capsys, "log", "create", "foreign")[0] == 0
    admin = make_client(zk.connect_string, superuser=True)
    try:
        where = paths.segment("c1", "foreign", 1)
        admin.create(where, b"{}", acl=[make_digest_acl("someone", "else", all=True)])
        code, _, err = dlctl(capsys, "log", "show", "foreign")
        flat = "".join(err.split())
        assert code == ExitCode.FAILED and f"ZooKeeperrefusedaccesstoznode{where}:" in flat and "internalerror" not in flat, err
    finally:
        close_client(admin)
