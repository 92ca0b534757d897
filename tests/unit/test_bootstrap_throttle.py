"""``dlctl bootstrap --throttle`` caps the job's rate: each task gets the cap divided by the
number of tasks the engine runs at once — also when ``--parallelism`` is left to its default,
where the engine still runs several (one per core in-process, ``local[N]`` on Spark)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from dlctl.spark import job
from dlctl.spark.engine import EngineOptions
from dlctl.spark.local import LocalEngine


def _session(name: str, secret) -> SimpleNamespace:
    """What ``_endpoints`` reads of a cluster session: names, nodes, the secret's path, TLS."""
    return SimpleNamespace(cluster=SimpleNamespace(name=name, secret_file=secret), meta=SimpleNamespace(available_nodes=lambda: ["n1", "n2"]), tls=None)


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(b"0123456789abcdef0123456789abcdef")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("parallelism", [None, 3])
def test_the_tasks_running_at_once_share_the_jobs_throttle(secret, monkeypatch, parallelism):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)  # a default engine runs 4 tasks at once
    options = EngineOptions(parallelism=parallelism)
    engine = LocalEngine(options.parallelism)
    endpoints = job._endpoints(engine, _session("east", secret), _session("west", secret), {"n1": {}, "n2": {}}, 400_000.0, options)
    running = engine.slots
    assert running == (parallelism or 4)
    # Every slot copying at its own cap adds up to the job's cap, not more.
    assert endpoints.throttle is not None
    assert endpoints.throttle * running == pytest.approx(400_000.0)


def test_no_throttle_means_none_per_task(secret):
    options = EngineOptions()
    endpoints = job._endpoints(LocalEngine(2), _session("east", secret), _session("west", secret), {"n1": {}, "n2": {}}, None, options)
    assert endpoints.throttle is None
