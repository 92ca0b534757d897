"""Shell completion of names through click's completion API on the real command tree: clusters and
nodes from the inventory; live names never wait long nor print when ZooKeeper is unreachable."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from click.shell_completion import ShellComplete

from dlctl.cli.main import cli

INVENTORY = """
default_cluster = "east"
[clusters.east]
zookeeper = "{zk}"
[[clusters.east.regions.r1.racks.a.nodes]]
id = "east-1"
host = "127.0.0.1"
[[clusters.east.regions.r1.racks.a.nodes]]
id = "east-2"
host = "127.0.0.2"
[[clusters.east.regions.r2.racks.a.nodes]]
id = "other-3"
host = "127.0.0.3"
[clusters.west]
zookeeper = "{zk}"
[[clusters.west.regions.r1.racks.a.nodes]]
id = "west-1"
host = "127.0.0.4"
"""


def complete(args: list[str], incomplete: str = "") -> list[str]:
    """What ``dlctl ARGS INCOMPLETE<TAB>`` offers (the words click's shell scripts print)."""
    return [item.value for item in ShellComplete(cli, {}, "dlctl", "_DLCTL_COMPLETE").get_completions(args, incomplete)]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.fixture
def inventory(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(INVENTORY.format(zk=f"127.0.0.1:{closed_port()}"))
    monkeypatch.setenv("DLCTL_CONFIG", str(path))
    monkeypatch.delenv("DLCTL_CLUSTER", raising=False)
    return path


def test_cluster_names_come_from_the_inventory(inventory):
    assert complete(["--cluster"]) == ["east", "west"]
    assert complete(["--cluster"], "w") == ["west"]
    assert complete(["failover", "--to"], "e") == ["east"]
    assert complete(["init-replication", "--source", "east", "--sink"]) == ["east", "west"]


def test_node_names_come_from_the_selected_cluster(inventory, tmp_path):
    assert complete(["agent", "logs"]) == ["east-1", "east-2", "other-3"]
    assert complete(["agent", "start", "--node"], "east") == ["east-1", "east-2"]
    assert complete(["--cluster", "west", "recover", "node"]) == ["west-1"]
    # --config typed on the command line wins over DLCTL_CONFIG, as for the command itself.
    other = tmp_path / "other.toml"
    other.write_text('[clusters.solo]\nzookeeper = "127.0.0.1:1"\n[[clusters.solo.regions.r.racks.a.nodes]]\nid = "solo-1"\nhost = "127.0.0.9"\n')
    assert complete(["--config", str(other), "agent", "logs"]) == ["solo-1"]


def test_without_a_configuration_nothing_is_offered_and_nothing_printed(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("DLCTL_CONFIG", str(tmp_path / "missing.toml"))
    assert complete(["--cluster"]) == []
    assert complete(["agent", "logs"]) == []
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize("args", [["log", "show"], ["replication", "pause"], ["fence"], ["cluster", "check", "--log"]])
def test_a_closed_zookeeper_port_offers_nothing_at_once_and_silently(inventory, capfd, args):
    began = time.monotonic()
    assert complete(args) == []
    assert time.monotonic() - began < 1.0  # refused at once: not the connect timeout
    assert capfd.readouterr() == ("", "")


def test_a_zookeeper_that_never_answers_offers_nothing_within_the_bound(inventory, capfd):
    """A server that accepts TCP and then says nothing (overloaded, half dead): one second."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes handshakes; nobody ever reads or answers
        inventory.write_text(INVENTORY.format(zk=f"127.0.0.1:{silent.getsockname()[1]}"))
        began = time.monotonic()
        assert complete(["log", "tail"]) == []
        assert time.monotonic() - began < 2.0
    assert capfd.readouterr() == ("", "")
