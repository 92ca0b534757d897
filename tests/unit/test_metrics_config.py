"""The agent's ``[metrics]`` table and its endpoint: the default beside the protocol server, "off",
port 0, and errors that name the file, the key and the address."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from dlagent.config import METRICS_PORT
from dlagent.metrics import AgentMetrics
from dlagent.metrics_http import MetricsEndpoint
from prometheus_client.parser import text_string_to_metric_families

from dlctl import __version__
from dlctl.errors import ConfigError
from harness.agenttoml import load


def test_by_default_metrics_are_served_on_the_agents_own_host_at_port_9181(tmp_path):
    assert METRICS_PORT == 9181
    assert load(tmp_path).metrics.listen == ("127.0.1.1", 9181)  # the base config listens on 127.0.1.1:3181


@pytest.mark.parametrize(
    "table,expected",
    [
        ('listen = "off"', None),
        ('listen = "127.0.1.1:0"', ("127.0.1.1", 0)),  # any free port: the agent publishes the one it bound
        ('listen = "0.0.0.0:9100"', ("0.0.0.0", 9100)),
        ('listen = "[::1]:9181"', ("::1", 9181)),
        ("", ("127.0.1.1", 9181)),  # an empty table: the default
    ],
)
def test_metrics_listen_values(tmp_path, table, expected):
    assert load(tmp_path, f"[metrics]\n{table}\n").metrics.listen == expected


@pytest.mark.parametrize(
    "table,where",
    [
        ('listen = "9181"', "key 'listen' must be \"host:port\" (port 0: any free port) or \"off\", got '9181'"),
        ('listen = "127.0.0.1:99999"', "got '127.0.0.1:99999'"),
        ('listen = "127.0.0.1:metrics"', "got '127.0.0.1:metrics'"),
        ('listen = ":9181"', "got ':9181'"),
        ("listen = 9181", "got 9181"),
        ("listen = false", "got False"),  # "off" is the word for it
        ('listen = "OFF"', "got 'OFF'"),
        ('listen = "127.0.1.1:3181"', "the agent protocol's own address"),
        ('port = 9181', "unknown key(s) in [metrics]: port"),
    ],
)
def test_bad_metrics_values_name_the_file_and_key(tmp_path, table, where):
    with pytest.raises(ConfigError, match=r"\[metrics\]") as info:
        load(tmp_path, f"[metrics]\n{table}\n")
    assert where in info.value.message and "agent.toml" in info.value.message


def test_metrics_must_be_a_table(tmp_path):
    with pytest.raises(ConfigError, match="key 'metrics' must be a table"):
        load(tmp_path, 'metrics = "off"\n')


def test_an_address_in_use_is_refused_naming_the_key_and_address(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError) as info:
            MetricsEndpoint.start(AgentMetrics().registry, "127.0.0.1", port, advertise_host="127.0.0.1", config_path=tmp_path / "agent.toml")
    message = info.value.message
    assert f"[metrics] listen = '127.0.0.1:{port}'" in message and "address already in use" in message, message
    assert str(tmp_path / "agent.toml") in message
    assert '"off"' in info.value.hint


def test_port_0_serves_on_the_port_bound_and_a_wildcard_is_published_under_the_advertised_host(tmp_path):
    metrics = AgentMetrics(node="n1", cluster="c1", region="r1", rack="a")
    endpoint = MetricsEndpoint.start(metrics.registry, "0.0.0.0", 0, advertise_host="127.0.0.1", config_path=tmp_path / "agent.toml")
    try:
        host, port = endpoint.address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        with urllib.request.urlopen(f"http://{endpoint.address}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        (info,) = [f for f in text_string_to_metric_families(text) if f.name == "dlagent_info"]
        assert [(s.labels, s.value) for s in info.samples] == [({"node": "n1", "cluster": "c1", "region": "r1", "rack": "a", "version": __version__}, 1.0)]
    finally:
        endpoint.close()
