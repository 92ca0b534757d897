"""ZooKeeper TLS settings (issue 19 item 2): the inventory's ``[clusters.<c>.zookeeper_tls]``,
agent.toml's ``[zookeeper_tls]`` and a replication source's ``zookeeper_tls_*`` keys read back
as ``ZkTls``; a missing CA, a certificate without its key or an unknown key is a ConfigError
naming the file and the key; bad files are refused before any connection is tried."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dlagent import config as agent_config
from dlctl import inventory, pki
from dlctl.errors import ConfigError
from dlctl.meta.zk import ZkTls, connect, loopback_only, parse_tls
from dlctl.sandbox import sandbox
from dlctl.secrets import write_secret_file
from harness.agenttoml import load as load_agent

INVENTORY = """
[clusters.east]
zookeeper = "10.0.0.5:2281"
secret_file = "east.secret"
{table}
[[clusters.east.regions.r1.racks.a.nodes]]
id = "n1"
host = "10.0.1.1"
"""



def parse_inventory(tmp_path: Path, table: str) -> inventory.Inventory:
    path = tmp_path / "config.toml"
    return inventory.parse(tomllib.loads(INVENTORY.format(table=table)), path)


FULL = """
[clusters.east.zookeeper_tls]
ca_file = "zk/ca.pem"
cert_file = "zk/client.pem"
key_file = "/etc/zk/client.key"
"""


def test_the_inventory_reads_a_zookeeper_tls_table_relative_to_itself(tmp_path):
    cluster = parse_inventory(tmp_path, FULL).cluster("east")
    assert cluster.zookeeper_tls == ZkTls(tmp_path / "zk" / "ca.pem", tmp_path / "zk" / "client.pem", Path("/etc/zk/client.key"))
    assert cluster.to_dict()["zookeeper_tls"] == {"ca_file": str(tmp_path / "zk/ca.pem"), "cert_file": str(tmp_path / "zk/client.pem"), "key_file": "/etc/zk/client.key"}
    only_ca = parse_inventory(tmp_path, '[clusters.east.zookeeper_tls]\nca_file = "ca.pem"\n').cluster("east")
    assert only_ca.zookeeper_tls == ZkTls(tmp_path / "ca.pem")
    plain = parse_inventory(tmp_path, "").cluster("east")
    assert plain.zookeeper_tls is None and plain.to_dict()["zookeeper_tls"] is None


BAD_TABLES = [
    ('cert_file = "c.pem"\nkey_file = "c.key"', "key 'ca_file' is required"),
    ('ca_file = "ca.pem"\ncert_file = "c.pem"', "key 'cert_file' without 'key_file'"),
    ('ca_file = "ca.pem"\nkey_file = "c.key"', "key 'key_file' without 'cert_file'"),
    ('ca_file = "ca.pem"\ncafile = "x"', "unknown key(s): cafile"),
    ('ca_file = ""', "key 'ca_file' must be a file path"),
    ("ca_file = 3", "key 'ca_file' must be a file path"),
]


@pytest.mark.parametrize("body,message", BAD_TABLES)
def test_a_bad_inventory_table_names_the_file_the_table_and_the_key(tmp_path, body, message):
    with pytest.raises(ConfigError) as info:
        parse_inventory(tmp_path, f"[clusters.east.zookeeper_tls]\n{body}\n")
    text = str(info.value)
    assert str(tmp_path / "config.toml") in text and "[clusters.east.zookeeper_tls]" in text and message in text, text


def test_the_inventory_refuses_zookeeper_tls_that_is_not_a_table(tmp_path):
    path = tmp_path / "config.toml"
    text = INVENTORY.format(table="").replace('secret_file = "east.secret"', 'secret_file = "east.secret"\nzookeeper_tls = "ca.pem"')
    with pytest.raises(ConfigError, match=r"\[clusters\.east\.zookeeper_tls\] must be a table"):
        inventory.parse(tomllib.loads(text), path)


def test_the_agent_reads_a_zookeeper_tls_table(tmp_path):
    cfg = load_agent(tmp_path, '[zookeeper_tls]\nca_file = "zk/ca.pem"\ncert_file = "zk/agent.pem"\nkey_file = "zk/agent.key"\n')
    assert cfg.zookeeper_tls == ZkTls(tmp_path / "zk/ca.pem", tmp_path / "zk/agent.pem", tmp_path / "zk/agent.key")
    assert load_agent(tmp_path, "").zookeeper_tls is None


@pytest.mark.parametrize("body,message", BAD_TABLES)
def test_a_bad_agent_table_names_the_file_the_table_and_the_key(tmp_path, body, message):
    with pytest.raises(ConfigError) as info:
        load_agent(tmp_path, f"[zookeeper_tls]\n{body}\n")
    text = str(info.value)
    assert str(tmp_path / "agent.toml") in text and "[zookeeper_tls]" in text and message in text, text


SOURCE = """
[replication.sources.west]
zookeeper = "10.9.0.5:2281"
{keys}
"""


def test_a_replication_source_reads_its_own_zookeeper_tls_or_defaults_to_none(tmp_path):
    keys = 'zookeeper_tls_ca_file = "west-zk/ca.pem"\nzookeeper_tls_cert_file = "west-zk/c.pem"\nzookeeper_tls_key_file = "west-zk/c.key"'
    cfg = load_agent(tmp_path, SOURCE.format(keys=keys))
    assert cfg.replication.sources["west"].zookeeper_tls == ZkTls(tmp_path / "west-zk/ca.pem", tmp_path / "west-zk/c.pem", tmp_path / "west-zk/c.key")
    cfg = load_agent(tmp_path, SOURCE.format(keys='zookeeper_tls_ca_file = "ca.pem"'))
    assert cfg.replication.sources["west"].zookeeper_tls == ZkTls(tmp_path / "ca.pem")
    # None: the worker uses the agent's own [zookeeper_tls] (SourceLink.open's default).
    assert load_agent(tmp_path, SOURCE.format(keys="")).replication.sources["west"].zookeeper_tls is None


@pytest.mark.parametrize(
    "keys,message",
    [
        ('zookeeper_tls_cert_file = "c.pem"\nzookeeper_tls_key_file = "c.key"', "key 'zookeeper_tls_ca_file' is required"),
        ('zookeeper_tls_ca_file = "ca.pem"\nzookeeper_tls_cert_file = "c.pem"', "key 'zookeeper_tls_cert_file' without 'zookeeper_tls_key_file'"),
        ('zookeeper_tls_ca = "ca.pem"', "unknown key(s): zookeeper_tls_ca"),
    ],
)
def test_a_bad_replication_source_names_the_file_the_table_and_the_key(tmp_path, keys, message):
    with pytest.raises(ConfigError) as info:
        load_agent(tmp_path, SOURCE.format(keys=keys))
    text = str(info.value)
    assert str(tmp_path / "agent.toml") in text and "[replication.sources.west]" in text and message in text, text


def test_parse_tls_directly():
    assert parse_tls(None, "f: [t]", Path("/b")) is None
    assert parse_tls({"x": 1}, "f: [t]", Path("/b"), prefix="zookeeper_tls_") is None
    assert parse_tls({"ca_file": "~/ca.pem"}, "f: [t]", Path("/b")).ca_file == Path("~/ca.pem").expanduser()
    with pytest.raises(ValueError):
        ZkTls(Path("/ca"), Path("/cert"))


def _material(tmp_path: Path) -> tuple[Path, Path, Path]:
    ca = pki.new_ca("zk-unit")
    client = pki.issue(ca, "client", server=False)
    paths = tmp_path / "ca.pem", tmp_path / "client.pem", tmp_path / "client.key"
    for path, data in zip(paths, (ca.cert_pem, client.cert_pem, client.key_pem)):
        write_secret_file(path, data)
    return paths


def test_bad_files_are_refused_before_any_connection_naming_the_file(tmp_path):
    ca, cert, key = _material(tmp_path)
    ZkTls(ca, cert, key).context()  # a good set loads
    # 192.0.2.1 (TEST-NET) would hang a connection: each refusal comes before one is tried.
    with pytest.raises(ConfigError, match=f"CA file {tmp_path / 'missing.pem'} cannot be loaded"):
        connect("192.0.2.1:2281", tls=ZkTls(tmp_path / "missing.pem"), timeout=30)
    with pytest.raises(ConfigError, match=f"certificate {cert} with key {ca} cannot be loaded"):
        connect("192.0.2.1:2281", tls=ZkTls(ca, cert, ca), timeout=30)
    key.chmod(0o644)
    with pytest.raises(ConfigError, match="accessible by group or others"):
        connect("192.0.2.1:2281", tls=ZkTls(ca, cert, key), timeout=30)


def test_loopback_only():
    assert loopback_only("127.0.0.1:2181,localhost:2182/chroot")
    assert not loopback_only("127.0.0.1:2181,10.0.0.5:2181")
    assert not loopback_only("zk1.example.com:2281")


def test_the_sandbox_points_the_inventory_and_every_agent_at_zookeeper_over_tls(tmp_path):
    directory = tmp_path / "sbx"
    layout = sandbox.Layout(clusters=2, regions=1, nodes_per_region=1)
    nodes = sandbox._node_plan(directory, layout)
    for node in nodes:
        node["port"] = 3181
    zk_tls = ZkTls(directory / "zookeeper/tls/ca.pem", directory / "zookeeper/tls/client.pem", directory / "zookeeper/tls/client.key")
    for node in nodes:
        sandbox._write_agent_config(node, "127.0.0.1:2281", directory / node["cluster"], zk_tls)
        loaded = agent_config.load(Path(node["dir"]) / "agent.toml")
        assert loaded.zookeeper_tls == zk_tls
        # No source declared by hand: init-replication installs each one's credentials, its
        # ZooKeeper's TLS files included (tests/unit/test_source_credentials.py).
        assert loaded.replication.sources == {}
    parsed = inventory.parse(tomllib.loads(sandbox._inventory(directory, layout, "127.0.0.1:2281", nodes, zk_tls)), directory / "config.toml")
    assert all(c.zookeeper_tls == zk_tls for c in parsed.clusters.values())
