"""Shell completion of log and stream names from a real ZooKeeper (ACLs on, as in production)."""

from __future__ import annotations

import time

import pytest
from click.shell_completion import ShellComplete
from harness.zk import write_harness_zk_auth

from dlctl.cli.main import cli
from dlctl.meta import paths
from dlctl.secrets import write_secret_file

pytestmark = [pytest.mark.zk]


def complete(args: list[str], incomplete: str = "") -> list[str]:
    return [item.value for item in ShellComplete(cli, {}, "dlctl", "_DLCTL_COMPLETE").get_completions(args, incomplete)]


@pytest.fixture
def live(zk, tmp_path, monkeypatch):
    admin = zk.client()
    for name in ("orders", "orders-eu", "audit"):
        admin.ensure_path(paths.log("c1", name))
    admin.ensure_path(paths.stream("c1", "east-to-c1"))
    admin.ensure_path(paths.log("c2", "elsewhere"))
    config = tmp_path / "config.toml"
    auth = write_harness_zk_auth(tmp_path / "c1.zk-auth")
    config.write_text(
        f'default_cluster = "c1"\n[clusters.c1]\nzookeeper = "{zk.connect_string}"\nzk_auth_file = "{auth}"\n'
        f'[clusters.c2]\nzookeeper = "{zk.connect_string}"\nzk_auth_file = "{auth}"\n'
    )
    monkeypatch.setenv("DLCTL_CONFIG", str(config))
    monkeypatch.delenv("DLCTL_CLUSTER", raising=False)
    return config


def test_log_names_come_from_the_clusters_zookeeper(live, capfd):
    began = time.monotonic()
    assert complete(["log", "show"]) == ["audit", "orders", "orders-eu"]
    assert time.monotonic() - began < 5
    assert complete(["log", "append"], "ord") == ["orders", "orders-eu"]
    assert complete(["truncate"], "a") == ["audit"]
    assert complete(["--cluster", "c2", "log", "read"]) == ["elsewhere"]
    assert complete(["log", "create"]) == []  # a new name: nothing to offer
    assert capfd.readouterr() == ("", "")


def test_stream_names_come_from_the_sink_cluster(live):
    assert complete(["replication", "pause"]) == ["east-to-c1"]
    assert complete(["replication", "status", "--sink", "c2"]) == []
    assert complete(["bootstrap", "--stream"], "e") == ["east-to-c1"]


def test_wrong_credentials_offer_nothing_silently(live, tmp_path, capfd):
    write_secret_file(tmp_path / "c1.zk-auth", b"dlctl-harness:not-the-password")
    assert complete(["log", "show"]) == []
    assert capfd.readouterr() == ("", "")
