"""Fixtures over real components: ZooKeeper, sshd nodes, a fault-injection network, processes.

Import the harness as ``harness`` (this directory is put on ``sys.path`` below), e.g.
``from harness.procs import wait_until``.

Tests that use the ZooKeeper or SSH fixtures are marked ``zk`` / ``ssh`` automatically. When
such tests are collected and Java, the ZooKeeper jars or sshd are missing, the run stops with
a failure naming what to install: these tiers are never skipped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from harness import sshd as _sshd  # noqa: E402
from harness import zk as _zk  # noqa: E402
from harness.faultproxy import FaultNetwork  # noqa: E402
from harness.powerfs import detach_dead_mounts  # noqa: E402
from harness.procs import ProcessRegistry, kill_orphans  # noqa: E402
from harness.sshd import ClientIdentity, SshNodeFactory  # noqa: E402
from harness.zk import ZkNamespace, ZooKeeperEnsemble, ZooKeeperServer  # noqa: E402

_ZK_FIXTURES = {"zk", "zk_server", "zk_ensemble", "zk_ensemble_servers", "zk_private_server"}
_SSH_FIXTURES = {"ssh_nodes", "ssh_identity"}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Kill what a previous run that was killed hard (no teardown) left behind."""
    killed = kill_orphans()
    # Their power-loss filesystems' mounts stay behind, dead (ENOTCONN): detach those.
    detached = detach_dead_mounts()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and killed:
        reporter.write_line(f"harness: killed {len(killed)} processes left by a dead test run: {killed}")
    if reporter is not None and detached:
        reporter.write_line(f"harness: detached {len(detached)} dead power-loss mounts: {detached}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _ZK_FIXTURES and item.get_closest_marker("zk") is None:
            item.add_marker(pytest.mark.zk)
        if names & _SSH_FIXTURES and item.get_closest_marker("ssh") is None:
            item.add_marker(pytest.mark.ssh)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fail the run at once if collected tests need tools this machine lacks."""
    missing: list[str] = []
    if any(item.get_closest_marker("zk") for item in session.items):
        missing += _zk.missing_prerequisites()
    if any(item.get_closest_marker("ssh") for item in session.items):
        missing += _sshd.missing_prerequisites()
    if missing:
        pytest.exit(
            "real-component tests need what this machine lacks:\n  - "
            + "\n  - ".join(missing)
            + "\n(install it, or deselect with -m 'not zk and not ssh' for a quick local run)",
            returncode=pytest.ExitCode.TESTS_FAILED,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """On failure, show where each process of the test logged and how its log ended."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    registry = getattr(item, "funcargs", {}).get("procs")
    if isinstance(registry, ProcessRegistry):
        sections = [f"{p!r}\n{p.tail(20)}" for p in registry]
        if sections:
            report.sections.append(
                ("processes of this test (last 20 log lines)", "\n\n".join(sections))
            )


@pytest.fixture(scope="session", autouse=True)
def private_user_config_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """dlctl's user config dir (a user config.toml, the current context `sandbox up` records) is
    the session's own, for this process and every CLI it starts: no test reads or changes the
    developer's, nor is steered by it."""
    previous = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg-config"))
    yield
    if previous is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = previous


# -- processes ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def session_procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessRegistry]:
    """Registry for session-wide servers; everything in it ends with the session."""
    registry = ProcessRegistry(tmp_path_factory.mktemp("session-procs"))
    yield registry
    registry.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[ProcessRegistry]:
    """``procs.start(argv, name=..., env=..., cwd=...)`` -> ManagedProcess, ended at teardown.

    Logs go to ``tmp_path/procs/<name>.log``; a failing test's report shows their tails.
    """
    registry = ProcessRegistry(tmp_path / "procs")
    yield registry
    registry.close()


# -- ZooKeeper ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def zk_server(
    tmp_path_factory: pytest.TempPathFactory, session_procs: ProcessRegistry
) -> Iterator[ZooKeeperServer]:
    """One standalone ZooKeeper for the whole session. Never kill it: use ``zk_private_server``."""
    server = ZooKeeperServer(
        tmp_path_factory.mktemp("zk-session"), session_procs, name="zk-session"
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def zk(zk_server: ZooKeeperServer, request: pytest.FixtureRequest) -> Iterator[ZkNamespace]:
    """This test's chroot on the session server: ``zk.connect_string``, ``zk.client()``."""
    zk_server.ensure_running()
    ns = ZkNamespace(zk_server, label=request.node.name)
    yield ns
    ns.close()


@pytest.fixture
def zk_private_server(
    tmp_path: Path, procs: ProcessRegistry, request: pytest.FixtureRequest
) -> Iterator[ZkNamespace]:
    """A ZooKeeper of this test's own, which it may kill, pause and restart (``.server``)."""
    server = ZooKeeperServer(tmp_path / "zk", procs, name="zk-private")
    server.start()
    ns = ZkNamespace(server, label=request.node.name)
    yield ns
    ns.close()


@pytest.fixture(scope="module")
def zk_ensemble_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperEnsemble]:
    """A 3-server ensemble shared by one test module (healed before each ``zk_ensemble`` use)."""
    registry = ProcessRegistry(tmp_path_factory.mktemp("zk-ensemble-procs"))
    ensemble = ZooKeeperEnsemble(tmp_path_factory.mktemp("zk-ensemble"), registry)
    try:
        ensemble.start()
        yield ensemble
    finally:
        registry.close()


@pytest.fixture
def zk_ensemble(
    zk_ensemble_servers: ZooKeeperEnsemble, request: pytest.FixtureRequest
) -> Iterator[ZkNamespace]:
    """This test's chroot on a 3-server ensemble; ``zk_ensemble.ensemble`` kills/pauses members."""
    zk_ensemble_servers.heal()
    ns = ZkNamespace(zk_ensemble_servers, label=request.node.name)
    yield ns
    ns.close()


# -- SSH nodes ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def ssh_identity(tmp_path_factory: pytest.TempPathFactory) -> ClientIdentity:
    """The test user's key pair, authorized on every node."""
    return ClientIdentity.generate(tmp_path_factory.mktemp("ssh-client"))


@pytest.fixture(scope="session")
def ssh_nodes(
    tmp_path_factory: pytest.TempPathFactory,
    session_procs: ProcessRegistry,
    ssh_identity: ClientIdentity,
) -> SshNodeFactory:
    """``ssh_nodes(nodes=3, regions=1, *, fresh=False, session_env=None) -> SshCluster``.

    Same-shaped clusters are shared across the session and healed (resumed/restarted) on
    every call; ``fresh=True`` makes an unshared one.
    """
    return SshNodeFactory(tmp_path_factory.mktemp("ssh-nodes"), session_procs, ssh_identity)


# -- network faults ----------------------------------------------------------------------------


@pytest.fixture
def fault_network() -> Iterator[FaultNetwork]:
    """A FaultNetwork for this test; every proxy and connection is closed at teardown."""
    network = FaultNetwork()
    yield network
    network.close()


@pytest.fixture(scope="module", autouse=True)
def no_leaked_zookeeper_clients() -> Iterator[None]:
    """A test module must stop every ZooKeeper client it started (set up first, so torn down
    after the module's other fixtures). A leaked client keeps reconnecting to a server that is
    gone and logs about it into whatever test runs next: this names the module that leaked it."""
    import gc

    from kazoo.client import KazooClient

    def running() -> set[int]:
        return {id(o) for o in gc.get_objects() if isinstance(o, KazooClient) and not o._stopped.is_set()}

    before = running()
    yield
    leaked = [o for o in gc.get_objects() if isinstance(o, KazooClient) and not o._stopped.is_set() and id(o) not in before]
    for client in leaked:
        client.stop()
        client.close()
    if leaked:
        pytest.fail(f"{len(leaked)} ZooKeeper client(s) left running by this module: {[c.hosts for c in leaked]}", pytrace=False)
