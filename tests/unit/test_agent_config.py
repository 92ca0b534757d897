"""Agent configuration, identity records, names and secret files: bad input gets a clear error."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dlagent import config as agent_config
from dlagent.identity import IDENTITY_FILE, ensure_identity
from dlctl.errors import ConfigError, RefusedError
from dlctl.meta import paths
from dlctl.names import validate_name
from dlctl.secrets import read_secret_file, write_secret_file
from harness.agenttoml import BASE, write

GOOD = BASE + """[storage]
sync = "always"
group_commit_ms = 1.5
"""


def test_good_config_resolves_relative_paths_and_defaults(tmp_path):
    cfg = agent_config.load(write(tmp_path, GOOD))
    assert (cfg.host, cfg.port, cfg.advertise) == ("127.0.1.1", 3181, "127.0.1.1:3181")
    assert cfg.data_dir == (tmp_path / "data").resolve()
    assert cfg.secret_file == (tmp_path / "secret").resolve()
    assert cfg.storage.group_commit_ms == 1.5 and cfg.storage.group_commit_bytes == 512 * 1024
    assert cfg.event_loop == "auto"


@pytest.mark.parametrize("choice,expected", [("asyncio", "asyncio"), ("auto", "uvloop"), ("uvloop", "uvloop")])
def test_the_event_loop_setting_picks_the_loop_the_agent_runs_on(choice, expected):
    from dlagent.cli import run_loop

    async def kind() -> str:
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    assert run_loop(choice, kind()) == expected


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda t: t.replace('node_id = "r1-n1"\n', ""), "missing required key(s): node_id"),
        (lambda t: 'colour = "blue"\n' + t, "unknown key(s): colour"),
        (lambda t: t.replace('"127.0.1.1:3181"', '"nowhere"'), "key 'listen': expected host:port"),
        (lambda t: t.replace('"127.0.0.1:2181/t"', '"127.0.0.1:2181:9/t"'), "key 'zookeeper': not a ZooKeeper connect string"),
        (lambda t: t.replace('"r1-n1"', '"../../etc"'), "invalid node name"),
        (lambda t: t.replace('sync = "always"', 'sync = "sometimes"'), "sync must be 'always' or 'never'"),
        (lambda t: t.replace("group_commit_ms = 1.5", "group_commit_ms = -1"), "group_commit_ms"),
        (lambda t: t.replace("[storage]", "[storage]\nfsync = 1"), "unknown key(s) in [storage]: fsync"),
        (lambda t: t.replace('rack = "rack-a"', "rack = 7"), "key 'rack' must be a string"),
        (lambda t: t + "[[[", "not valid TOML"),
        (lambda t: 'event_loop = "trio"\n' + t, "key 'event_loop' must be one of auto, uvloop, asyncio"),
    ],
)
def test_bad_config_names_file_key_and_problem(tmp_path, edit, message):
    path = write(tmp_path, edit(GOOD))
    with pytest.raises(ConfigError) as info:
        agent_config.load(path)
    assert message in info.value.message
    assert str(path) in info.value.message


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        agent_config.load(tmp_path / "nope.toml")


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a..b", "-lead", "x" * 129, "sp ace", "nul\0", 7])
def test_unsafe_names_are_refused(name):
    with pytest.raises(ValueError):
        validate_name("log", name)


def test_paths_are_built_from_validated_names():
    assert paths.available_node("east", "r1-n1") == "/dlctl/east/available/r1-n1"
    with pytest.raises(ValueError):
        paths.node("east", "../../zookeeper")


def test_identity_is_written_once_and_mismatches_are_refused(tmp_path):
    first = ensure_identity(tmp_path, "east", "n1")
    assert ensure_identity(tmp_path, "east", "n1") == first
    with pytest.raises(RefusedError, match="belongs to node 'n1' of cluster 'east'"):
        ensure_identity(tmp_path, "west", "n1")
    with pytest.raises(RefusedError, match="not node 'n2'"):
        ensure_identity(tmp_path, "east", "n2")


def test_corrupt_identity_is_refused_not_overwritten(tmp_path):
    (tmp_path / IDENTITY_FILE).write_text("{not json")
    with pytest.raises(RefusedError, match="unreadable"):
        ensure_identity(tmp_path, "east", "n1")
    assert (tmp_path / IDENTITY_FILE).read_text() == "{not json"


def test_unidentified_segments_are_not_adopted(tmp_path):
    (tmp_path / "segments").mkdir()
    (tmp_path / "segments" / "x").write_text("data")
    with pytest.raises(RefusedError, match="no identity record"):
        ensure_identity(tmp_path, "east", "n1")
    assert not (tmp_path / IDENTITY_FILE).exists()


def test_identity_record_is_json(tmp_path):
    ensure_identity(tmp_path, "east", "n1")
    data = json.loads((tmp_path / IDENTITY_FILE).read_text())
    assert (data["cluster"], data["node_id"]) == ("east", "n1")


def test_secret_files_must_be_private(tmp_path):
    path = tmp_path / "secret"
    write_secret_file(path, b"s3cret\n")
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_secret_file(path) == b"s3cret"
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600|group or others"):
        read_secret_file(path)
    with pytest.raises(ConfigError, match="does not exist"):
        read_secret_file(tmp_path / "missing")


# -- [tls] ---------------------------------------------------------------------------------------

TLS = '[tls]\nca_file = "tls/ca.pem"\ncert_file = "tls/agent.pem"\nkey_file = "/etc/dlagent/tls/agent.key"\n'


def test_without_a_tls_table_the_agent_serves_plaintext(tmp_path):
    assert agent_config.load(write(tmp_path, GOOD)).tls is None


def test_the_tls_table_gives_the_agents_files_relative_to_the_config_file(tmp_path):
    # [tls] before [storage]: the top-level keys end at the first table either way.
    cfg = agent_config.load(write(tmp_path, GOOD.replace("[storage]", TLS + "[storage]")))
    assert cfg.tls is not None
    assert cfg.tls.ca_file == (tmp_path / "tls" / "ca.pem").resolve()
    assert cfg.tls.cert_file == (tmp_path / "tls" / "agent.pem").resolve()
    assert cfg.tls.key_file == Path("/etc/dlagent/tls/agent.key")  # absolute stays as written
    # Only paths are parsed: the files are read (and their modes checked) when the agent serves.
    assert not (tmp_path / "tls").exists()


@pytest.mark.parametrize(
    "table,message",
    [
        ('[tls]\ncert_file = "a.pem"\nkey_file = "a.key"\n', "[tls] has missing key(s) ca_file"),
        ('[tls]\nca_file = "ca.pem"\nkey_file = "a.key"\n', "[tls] has missing key(s) cert_file"),
        ('[tls]\nca_file = "ca.pem"\ncert_file = "a.pem"\n', "[tls] has missing key(s) key_file"),
        ("[tls]\n", "[tls] has missing key(s) ca_file, cert_file, key_file"),
        (TLS + 'verify = "none"\n', "[tls] has unknown key(s) verify"),
        ('[tls]\nca_file = "ca.pem"\ncert_file = 7\nkey_file = "a.key"\n', "[tls] key 'cert_file' must be a file path"),
        ('[tls]\nca_file = ""\ncert_file = "a.pem"\nkey_file = "a.key"\n', "[tls] key 'ca_file' must be a file path"),
    ],
)
def test_a_bad_tls_table_is_refused_naming_the_file_and_key(tmp_path, table, message):
    path = write(tmp_path, GOOD.replace("[storage]", table + "[storage]"))
    with pytest.raises(ConfigError) as info:
        agent_config.load(path)
    assert message in info.value.message and str(path) in info.value.message


def test_tls_must_be_a_table(tmp_path):
    path = write(tmp_path, 'tls = "on"\n' + GOOD)
    with pytest.raises(ConfigError, match="key 'tls' must be a table"):
        agent_config.load(path)
