"""Inventory parsing: the hierarchy, defaults, and errors that name file, key and fix."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dlctl.config import ConfigLocation
from dlctl.errors import ConfigError
from dlctl.inventory import load, parse

GOOD = """
default_cluster = "east"

[clusters.east]
zookeeper = "127.0.0.1:2181/east"
secret_file = "east.secret"

[clusters.east.defaults]
ssh_user = "ops"
agent_port = 4000

[[clusters.east.regions.us-east.racks.r1.nodes]]
id = "e1"
host = "127.0.1.1"

[[clusters.east.regions.us-east.racks.r1.nodes]]
id = "e2"
host = "127.0.1.2"
ssh_port = 2222

[[clusters.east.regions.us-west.racks.r9.nodes]]
id = "w1"
host = "127.0.2.1"
listen = "127.0.2.1:5000"

[clusters.west]
zookeeper = "127.0.0.1:2181/west"
"""

PATH = Path("/etc/dlctl/config.toml")


def inv(text: str = GOOD):
    return parse(tomllib.loads(text), PATH)


def test_hierarchy_defaults_and_overrides():
    east = inv().cluster(None)
    assert [n.id for n in east.nodes] == ["e1", "e2", "w1"]
    assert {r: list(racks) for r, racks in east.regions().items()} == {"us-east": ["r1"], "us-west": ["r9"]}
    e1, e2, w1 = east.nodes
    assert (e1.ssh_user, e1.ssh_port, e1.listen) == ("ops", 22, "127.0.1.1:4000")
    assert e2.ssh_port == 2222
    assert w1.listen == "127.0.2.1:5000"
    assert east.secret_file == Path("/etc/dlctl/east.secret")


def test_cluster_selection():
    inventory = inv()
    assert inventory.cluster("west").zookeeper.endswith("/west")
    with pytest.raises(ConfigError, match="cluster 'north' is not in"):
        inventory.cluster("north")
    no_default = inv(GOOD.replace('default_cluster = "east"', ""))
    with pytest.raises(ConfigError, match="several clusters"):
        no_default.cluster(None)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda t: t.replace('zookeeper = "127.0.0.1:2181/west"', ""), "[clusters.west]: 'zookeeper' (the connect string, e.g. \"10.0.0.5:2181\") is required"),
        (lambda t: t.replace('zookeeper = "127.0.0.1:2181/west"', 'zookeeper = "127.0.0.1:2181:9/west"'), "'zookeeper': not a ZooKeeper connect string (host:port,host:port/chroot): Port could not be cast"),
        (lambda t: t.replace('zookeeper = "127.0.0.1:2181/west"', 'zookeeper = ",/west"'), "'zookeeper': not a ZooKeeper connect string"),
        (lambda t: t.replace('listen = "127.0.2.1:5000"', 'listen = "127.0.2.1:99999"'), "'listen' must be host:port with a port in 1..65535, got '127.0.2.1:99999'"),
        (lambda t: t.replace('listen = "127.0.2.1:5000"', 'listen = ":5000"'), "'listen' must be host:port"),
        (lambda t: t.replace('zookeeper = "127.0.0.1:2181/west"', "zookeeper = 2181"), "[clusters.west]: 'zookeeper' must be a connect string in quotes (e.g. \"10.0.0.5:2181\"), got 2181"),
        (lambda t: t.replace('id = "e2"', 'id = "e1"'), "duplicate node id(s): e1"),
        (lambda t: t.replace('id = "w1"', 'id = "w1; rm -rf /"'), "invalid node name"),
        (lambda t: t.replace('host = "127.0.1.1"', 'host = "-oProxyCommand=x"'), "'host' must be a host name"),
        (lambda t: t.replace("ssh_port = 2222", "ssh_port = 70000"), "'ssh_port' must be a port number"),
        (lambda t: t.replace('ssh_user = "ops"', 'ssh_user = "ops"\ncolour = 1'), "unknown key(s): colour"),
        (lambda t: t.replace('default_cluster = "east"', 'default_cluster = "south"'), "default_cluster 'south'"),
        (lambda t: t.replace('listen = "127.0.2.1:5000"', 'listen = "127.0.1.1:4000"'), "already used by node 'e1'"),
        (lambda t: t.replace("[clusters.west]", "[clusters.'../west']"), "invalid cluster name"),
    ],
)
def test_bad_inventory_names_the_place(edit, message):
    with pytest.raises(ConfigError) as info:
        inv(edit(GOOD))
    assert message in info.value.message and str(PATH) in info.value.message


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="from DLCTL_CONFIG.*does not exist|does not exist"):
        load(ConfigLocation(tmp_path / "none.toml", "DLCTL_CONFIG"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[clusters")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(ConfigLocation(bad, "--config"))
    assert load(ConfigLocation(None, "none")).clusters == {}


def test_agent_user_is_optional_and_validated():
    east = inv().cluster(None)
    assert all(n.agent_user is None for n in east.nodes)
    text = GOOD.replace('ssh_user = "ops"', 'ssh_user = "root"\nagent_user = "dlagent"')
    assert {n.agent_user for n in inv(text).cluster(None).nodes} == {"dlagent"}
    for bad in ('"root"', '"Bad User"', '"a;b"', "7"):
        with pytest.raises(ConfigError, match="agent_user"):
            inv(GOOD.replace('ssh_user = "ops"', f"agent_user = {bad}"))


def test_each_agent_gets_a_metrics_port_and_agent_install_refuses_two_nodes_of_one_host_sharing_one():
    e1, e2, w1 = inv().cluster(None).nodes
    assert (e1.metrics_listen, e2.metrics_listen, w1.metrics_listen) == ("127.0.1.1:9181", "127.0.1.2:9181", "127.0.2.1:9181")
    off = inv(GOOD.replace('ssh_port = 2222', 'ssh_port = 2222\nmetrics_port = "off"')).cluster(None).nodes[1]
    assert off.metrics_listen == "off"
    from dlctl.ops.agents import _refuse_shared_metrics_endpoints

    shared = GOOD.replace('host = "127.0.1.2"', 'host = "127.0.1.1"\nlisten = "127.0.1.1:4001"')
    with pytest.raises(ConfigError, match="'e1' and 'e2' of cluster 'east' would both serve metrics on 127.0.1.1:9181"):
        _refuse_shared_metrics_endpoints(inv(shared).cluster(None))  # what agent install checks first
    _refuse_shared_metrics_endpoints(inv(shared.replace('listen = "127.0.1.1:4001"', 'listen = "127.0.1.1:4001"\nmetrics_port = 9182')).cluster(None))
    with pytest.raises(ConfigError, match="'metrics_port' must be a port number"):
        inv(GOOD.replace("agent_port = 4000", "agent_port = 4000\nmetrics_port = 70000"))


def test_agent_toml_names_the_nodes_metrics_endpoint():
    from dlctl.ops.agents import agent_config_text

    cluster = inv().cluster(None)
    text = agent_config_text(cluster, cluster.nodes[0])
    assert tomllib.loads(text)["metrics"] == {"listen": "127.0.1.1:9181"}
