"""Generated TOML reads back as the values written (issue 19: an emoji in a node's data_dir made
an agent.toml the agent could not parse). dlctl.tomltext is the one writer; agent.toml from
`agent install` and the sandbox, and the sandbox's inventory, go through it."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlagent import config as agent_config
from dlctl import inventory
from dlctl import tomltext as toml
from dlctl.inventory import Cluster, Node
from dlctl.ops.agents import agent_config_text
from dlctl.sandbox import sandbox

# Unicode scalar values: everything TOML (UTF-8) can carry. Lone surrogates are refused (below).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
HOSTILE = ["😀 data", 'quo"te', "back\\slash", "C:\\new\\table", "line\nbreak", "tab\tcr\r", "nul\x00 del\x7f", "'single'", "]=#[", "\u2028\ufeff"]
HOSTILE_DIR = '/srv/😀 dätä/"quoted"/back\\slash\\n/with\ttab'


@given(TEXT)
def test_any_string_round_trips_as_a_value(text):
    assert tomllib.loads(toml.line("k", text)) == {"k": text}


@given(TEXT.filter(bool), TEXT)
def test_any_string_round_trips_as_a_key_and_a_table_name(name, text):
    doc = "\n".join([toml.table("kv"), toml.line(name, text), toml.table("t", name), toml.line("v", 1), toml.table("a", name, array=True), toml.line("v", 2), ""])
    assert tomllib.loads(doc) == {"kv": {name: text}, "t": {name: {"v": 1}}, "a": {name: [{"v": 2}]}}


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_strings_round_trip(text):
    assert tomllib.loads(toml.line("k", text))["k"] == text


def test_the_old_writers_output_for_an_emoji_is_not_toml():
    """Why the helper exists: json.dumps writes an emoji as a surrogate pair TOML refuses."""
    with pytest.raises(tomllib.TOMLDecodeError):
        tomllib.loads(f"data_dir = {json.dumps('/srv/😀')}")
    assert tomllib.loads(toml.line("data_dir", "/srv/😀")) == {"data_dir": "/srv/😀"}


def test_other_values_round_trip():
    values = {"b": True, "f": False, "i": -7, "x": 4.0, "big": 2**62, "l": [1, "two", 3.5, ["😀"]], "p": Path("/a b/😀")}
    doc = "\n".join(toml.line(k, v) for k, v in values.items())
    assert tomllib.loads(doc) == values | {"p": "/a b/😀"}
    assert tomllib.loads(toml.line("n", float("inf"))) == {"n": float("inf")}


def test_a_name_that_is_not_unicode_is_refused_naming_it():
    undecodable = b"/srv/\xff-disk".decode("utf-8", "surrogateescape")  # as os.fsdecode makes it
    with pytest.raises(ValueError, match=r"srv.*U\+DCFF.*not valid UTF-8"):
        toml.line("data_dir", undecodable)


def test_agent_install_writes_an_agent_toml_the_agent_reads_back_exactly(tmp_path):
    node = Node(
        id="r1-n1", cluster="east", region="r1", rack="rack-a", host="127.0.1.1", listen="127.0.1.1:3181",
        ssh_user=None, ssh_port=22, identity_file=None, data_dir=HOSTILE_DIR, python=None, home='/opt/😀 "home"\\x',
    )
    cluster = Cluster(name="east", zookeeper="127.0.0.1:2181/chroot", secret_file=tmp_path / "s", zk_auth_file=tmp_path / "z", nodes=(node,))
    path = tmp_path / "agent.toml"
    path.write_text(agent_config_text(cluster, node))
    loaded = agent_config.load(path)
    assert str(loaded.data_dir) == HOSTILE_DIR
    assert str(loaded.secret_file) == node.home + "/secret"
    assert str(loaded.zk_auth_file) == node.home + "/zk-auth"
    assert (loaded.node_id, loaded.cluster, loaded.region, loaded.rack, loaded.zookeeper) == ("r1-n1", "east", "r1", "rack-a", "127.0.0.1:2181/chroot")


def test_agent_install_writes_tls_tables_the_agent_reads_back(tmp_path):
    from dlctl.meta.zk import ZkTls

    node = Node(
        id="r1-n1", cluster="east", region="r1", rack="rack-a", host="127.0.1.1", listen="127.0.1.1:3181",
        ssh_user=None, ssh_port=22, identity_file=None, data_dir="/data", python=None, home="/opt/😀 home",
    )
    zk_tls = ZkTls(tmp_path / "zk-ca.pem", tmp_path / "zk-client.pem", tmp_path / "zk-client.key")
    cluster = Cluster(name="east", zookeeper="127.0.0.1:2281", secret_file=tmp_path / "s", zk_auth_file=tmp_path / "z", nodes=(node,), zookeeper_tls=zk_tls)
    path = tmp_path / "agent.toml"
    path.write_text(agent_config_text(cluster, node, tls=True))
    loaded = agent_config.load(path)
    assert loaded.tls is not None
    assert [str(p) for p in loaded.tls.paths] == [f"{node.home}/tls/ca.pem", f"{node.home}/tls/agent.pem", f"{node.home}/tls/agent.key"]
    assert loaded.zookeeper_tls is not None
    assert (str(loaded.zookeeper_tls.ca_file), str(loaded.zookeeper_tls.cert_file), str(loaded.zookeeper_tls.key_file)) == (
        f"{node.home}/zk-tls/ca.pem", f"{node.home}/zk-tls/client.pem", f"{node.home}/zk-tls/client.key"
    )
    plain = tmp_path / "plain.toml"
    plain.write_text(agent_config_text(replace(cluster, zookeeper_tls=None), node))
    assert agent_config.load(plain).tls is None and agent_config.load(plain).zookeeper_tls is None


def test_the_sandbox_writes_agent_configs_and_an_inventory_that_read_back_exactly(tmp_path):
    directory = tmp_path / 'sand😀box "q" \\b'
    layout = sandbox.Layout(clusters=2, regions=1, nodes_per_region=1)
    nodes = sandbox._node_plan(directory, layout)
    for node in nodes:
        node["port"] = 3181
    zk = "127.0.0.1:2181"
    for node in nodes:
        sandbox._write_agent_config(node, zk, directory / node["cluster"])
        loaded = agent_config.load(Path(node["dir"]) / "agent.toml")
        assert loaded.data_dir == Path(node["dir"]) / "data"
        assert loaded.secret_file == directory / node["cluster"] / "secret"
    text = sandbox._inventory(directory, layout, zk, nodes)
    parsed = inventory.parse(tomllib.loads(text), directory / "config.toml")
    for node in nodes:
        found = parsed.clusters[node["cluster"]].node(node["node_id"])
        assert (found.data_dir, found.home) == (str(Path(node["dir"]) / "data"), node["dir"])


def test_agent_install_points_the_agent_at_the_cold_store_credentials_it_copies(tmp_path):
    from dlctl.cold.config import ColdStorageConfig

    node = Node(
        id="r1-n1", cluster="east", region="r1", rack="rack-a", host="127.0.1.1", listen="127.0.1.1:3181",
        ssh_user=None, ssh_port=22, identity_file=None, data_dir="/data", python=None, home="/opt/😀 home",
    )
    s3 = ColdStorageConfig("s3", bucket="b", credentials_file=tmp_path / "s3.creds")
    cluster = Cluster(name="east", zookeeper="127.0.0.1:2281", secret_file=tmp_path / "s", zk_auth_file=tmp_path / "z", nodes=(node,), cold_storage=s3)
    path = tmp_path / "agent.toml"
    path.write_text(agent_config_text(cluster, node))
    assert str(agent_config.load(path).housekeeping.cold_credentials_file) == f"{node.home}/cold-credentials"
    for other in (None, ColdStorageConfig("filesystem", path=tmp_path), ColdStorageConfig("s3", bucket="b")):
        path.write_text(agent_config_text(replace(cluster, cold_storage=other), node))
        assert agent_config.load(path).housekeeping.cold_credentials_file is None  # nothing to copy
