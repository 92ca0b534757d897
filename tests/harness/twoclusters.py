"""Several clusters (replication locations) of real agents on one ZooKeeper server, for the
replication tests: each cluster has its own name, agents, and (shared) test secret, and each
sink agent reaches the source clusters' agents and ZooKeeper through a ``FaultNetwork`` proxy,
so tests can partition or delay the link between two clusters.

Proxies are labelled with the *cluster* as region: ``network.partition("a", "b")`` cuts every
connection a sink agent of ``b`` has to cluster ``a`` (agents and ZooKeeper) and vice versa.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
from collections.abc import Iterator
from typing import Any
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

from kazoo.client import KazooClient

from dlctl.inventory import Cluster
from dlctl.log.dlsn import DLSN
from dlctl.log.pool import AgentPool
from dlctl.log.reader import LogReader, ReadRecord
from dlctl.meta.store import MetaStore
from dlctl.session import ClusterSession

from .agents import DEFAULT_SECRET, AgentNode, harness_credentials, heal_agents
from .faultproxy import FaultNetwork
from .tls import tls_dir_for
from .procs import ProcessRegistry
from .zk import ZkNamespace, ZooKeeperServer


@dataclass
class Site:
    name: str
    ns: ZkNamespace
    agents: dict[str, AgentNode]
    admin: KazooClient
    _sessions: list[ClusterSession] = field(default_factory=list)

    def meta(self) -> MetaStore:
        return MetaStore(self.admin, self.name)

    def session(self) -> ClusterSession:
        """A ``ClusterSession`` as the CLI would open it (closed at teardown)."""
        first = next(iter(self.agents.values()))
        session = ClusterSession(
            Cluster(self.name, self.ns.connect_string, first.secret_file, first.zk_auth_file, tls_dir=self.tls_dir())
        )
        self._sessions.append(session)
        return session

    def tls_dir(self) -> Path:
        """The operator's tls_dir of this site (the inventory's default: beside its secret_file),
        holding the harness CA."""
        first = next(iter(self.agents.values()))
        return tls_dir_for(first.secret_file, self.name)

    def start_agents(self) -> None:
        for node in self.agents.values():
            node.start(wait=False)
        for node in self.agents.values():
            node.wait_ready(self.admin)

    def wipe_disks(self) -> None:
        """Disks replaced: every agent is SIGKILLed, loses its data dir and starts empty (the
        location's ZooKeeper is left as it is)."""
        for node in self.agents.values():
            node.proc.kill()
        for node in self.agents.values():
            shutil.rmtree(node.data_dir, ignore_errors=True)
        self.start_agents()

    def heal(self) -> None:
        heal_agents(self.agents.values(), self.admin)


@dataclass
class Sites:
    ns: ZkNamespace
    network: FaultNetwork
    sites: dict[str, Site]

    def __getitem__(self, name: str) -> Site:
        return self.sites[name]

    def write_inventory(self, path: Path, default: str = "b") -> Path:
        """A dlctl inventory naming every site (for the CLI under test)."""
        lines = [f'default_cluster = "{default}"']
        for name, site in self.sites.items():
            first = next(iter(site.agents.values()))
            site.tls_dir()  # the default tls_dir (beside secret_file), with the harness CA
            lines += [
                f"[clusters.{name}]", f'zookeeper = "{site.ns.connect_string}"', f'secret_file = "{first.secret_file}"',
                f'zk_auth_file = "{first.zk_auth_file}"', "",
            ]
        path.write_text("\n".join(lines))
        return path


def replication_extra(
    sources: dict[str, tuple[str, dict[str, str]]], *, poll: float = 0.2, grace: float = 2.0, checkpoint: float = 0.2, pin: float = 0.5, options: str = "",
) -> str:
    """The ``[replication]`` table of a sink agent; ``sources``: cluster -> (zookeeper, addresses);
    ``options``: more ``key = value`` lines of the table."""
    lines = ["[replication]", f"poll_seconds = {poll}", f"claim_grace_seconds = {grace}", f"checkpoint_seconds = {checkpoint}", f"pin_seconds = {pin}"]
    lines += [line for line in options.splitlines() if line.strip()]
    for name, (zookeeper, addresses) in sources.items():
        lines.append(f"[replication.sources.{name}]")
        lines.append(f'zookeeper = "{zookeeper}"')
        lines.append("addresses = { " + ", ".join(f'"{n}" = "{a}"' for n, a in addresses.items()) + " }")
    return "\n".join(lines) + "\n"


def sites_for_test(zk_server: ZooKeeperServer, tmp_path: Path, request: Any, **options: Any) -> Iterator[Sites]:
    """Body of a test's fixture: ``yield from sites_for_test(zk_server, tmp_path, request, ...)``
    — the sites of ``replication_sites(**options)`` behind a fault network of their own, on the
    session's ZooKeeper, named after the test."""
    zk_server.ensure_running()
    procs = ProcessRegistry(tmp_path / "procs")
    with FaultNetwork() as network:
        yield from replication_sites(zk_server, tmp_path, procs, network, request.node.name, **options)


def replication_sites(
    zk_server: ZooKeeperServer,
    base: Path,
    procs: ProcessRegistry,
    network: FaultNetwork,
    label: str,
    clusters: tuple[str, ...] = ("a", "b"),
    nodes: int = 3,
    proxied: bool = True,
    agent_options: str = "",
    private_zk: dict[str, ZooKeeperServer] | None = None,
    replication_options: str = "",
    cluster_options: dict[str, str] | None = None,
    pin_seconds: float = 0.5,
) -> Iterator[Sites]:
    """Body of a fixture: ``yield from replication_sites(...)``. Every cluster is a sink of
    every other one (agents are configured for all sources; streams decide what runs).
    ``proxied=False``: sink agents reach sources directly (no fault proxy in the path).
    ``private_zk``: clusters that get a ZooKeeper server of their own (a test may kill it with
    the cluster's agents: the whole location goes down); the others share ``zk_server``.
    ``replication_options``: more lines of every agent's ``[replication]`` table.
    ``cluster_options``: more TOML tables for the agents of one cluster (e.g. ``[server]``).
    ``pin_seconds``: how often workers refresh their retention pins (and so look at them)."""
    ns = ZkNamespace(zk_server, label=label)
    spaces = {c: ZkNamespace(server, label=f"{label}-{c}") for c, server in (private_zk or {}).items()}
    try:
        agents: dict[str, dict[str, AgentNode]] = {}
        # Ports are chosen when an AgentNode is made, so proxies can be set up before any starts.
        ids = {c: [f"{c}{i + 1}" for i in range(nodes)] for c in clusters}
        routes: dict[str, dict[str, tuple[str, dict[str, str]]]] = {c: {} for c in clusters}
        placeholders: dict[str, dict[str, AgentNode]] = {}
        for c in clusters:
            spaces.setdefault(c, ns)
            placeholders[c] = {}
            for n in ids[c]:
                placeholders[c][n] = AgentNode(procs, base / c, spaces[c].connect_string, cluster=c, node_id=n, region=f"r-{c}", secret=DEFAULT_SECRET)
        for sink in clusters:
            for source in clusters:
                if source == sink:
                    continue
                if not proxied:  # declared all the same: a sink agent reads only declared sources
                    routes[sink][source] = (spaces[source].connect_string, {})
                    continue
                zk_host, zk_port = spaces[source].hosts.split(",")[0].rsplit(":", 1)
                zk_proxy = network.proxy((zk_host, int(zk_port)), node=f"zk-{source}", region=source, client_region=sink, name=f"zk-{source}-for-{sink}")
                addresses = {}
                for n, node in placeholders[source].items():
                    p = network.proxy((node.host, node.port), node=n, region=source, client_region=sink, name=f"{n}-for-{sink}")
                    addresses[n] = f"{p.host}:{p.port}"
                routes[sink][source] = (f"{zk_proxy.host}:{zk_proxy.port}{spaces[source].path}", addresses)
        for c in clusters:
            extra = agent_options + (cluster_options or {}).get(c, "") + replication_extra(routes[c], options=replication_options, pin=pin_seconds)
            agents[c] = {}
            for n, node in placeholders[c].items():
                # Rewrite the config with the replication table (AgentNode wrote it already).
                node.config_path.write_text(node.config_path.read_text() + extra)
                agents[c][n] = node
        admins = {c: spaces[c].client() for c in clusters}
        for c in clusters:
            for node in agents[c].values():
                node.start(wait=False)
        for c in clusters:
            for node in agents[c].values():
                node.wait_ready(admins[c])
        sites = {c: Site(c, spaces[c], agents[c], admins[c]) for c in clusters}
        yield Sites(ns, network, sites)
        for site in sites.values():
            for s in site._sessions:
                s.close()
    finally:
        procs.close()
        for space in {id(s): s for s in spaces.values()}.values():
            space.close()
        ns.close()


async def read_all(meta: MetaStore, name: str, *, until: int | None = None, timeout: float = 60.0, idle: float = 1.0) -> list[ReadRecord]:
    """Every record of log ``name`` through the log reader: until ``until`` records were read
    (waiting up to ``timeout``), or until nothing came for ``idle`` seconds."""
    pool = AgentPool(meta, harness_credentials())
    out: list[ReadRecord] = []
    try:
        async with LogReader(meta, pool, name) as reader:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while until is None or len(out) < until:
                wait = idle if until is None else max(0.05, deadline - loop.time())
                record = await reader.read_next(wait)
                if record is None:
                    break
                out.append(record)
    finally:
        await pool.close()
    return out


def origin_of(record: ReadRecord) -> tuple[str, DLSN] | None:
    from dlctl.replication.origin import Origin

    origin = Origin.from_headers(record.headers)
    return (origin.cluster, origin.dlsn) if origin else None


def not_done(out: dict | list | str) -> str:
    """A plan's JSON result as an assertion message: its steps that did not finish, whole (pytest
    cuts a dict or list message to a line, which once hid the error of a failed step)."""
    steps = out.get("steps") if isinstance(out, dict) else None
    if not steps:
        return json.dumps(out, indent=1, default=str) if not isinstance(out, str) else out
    return json.dumps([s for s in steps if s.get("status") != "done"], indent=1, default=str)


def sink_now(site: Site) -> str:
    """What the streams into ``site`` are doing, read at the sink alone (state, claims, each
    log's checkpoint and last error), and the end of its agents' logs: for a timeout's message."""
    from dlctl.replication.store import StreamStore

    lines = []
    try:
        store = StreamStore(site.meta())
        for stream in store.list_streams():
            claims = {log: c.get("node") for log, c in store.claims(stream).items()}
            lines.append(f"{stream}: {store.get_state(stream).value.state.value}, claims {claims}")
            for log in store.checkpoints(stream):
                cp = store.get_checkpoint(stream, log).value
                lines.append(f"  {log}: next {cp.next}, last error {cp.last_error}")
    except Exception as exc:  # noqa: BLE001 - a diagnosis must not hide the failure it explains
        lines.append(f"no stream state ({exc!r})")
    for node_id, node in site.agents.items():
        lines.append(f"--- agent {node_id}, last lines ---\n" + "\n".join(node.proc.output().splitlines()[-15:]))
    return "\n".join(lines)


def streams_now(sites: Sites, sink: str) -> str:
    """The state of the streams into ``sink`` and the end of its agents' logs, for the message of
    a timeout."""
    from dlctl.ops.streams import stream_status

    lines = []
    for source in sites.sites:
        if source == sink:
            continue
        stream = f"{source}-to-{sink}"
        try:
            rows = stream_status(sites[sink].session(), sites[source].session(), stream)["logs"]
            lines += [f"{stream} {row['log']}: {row['state']}, last applied {row['last_applied']}, last error {row['last_error']}" for row in rows]
        except Exception as exc:  # noqa: BLE001 - a diagnosis must not hide the failure it explains
            lines.append(f"{stream}: no status ({exc!r})")
    for node_id, node in sites[sink].agents.items():
        lines.append(f"--- agent {node_id}, last lines ---\n" + "\n".join(node.proc.output().splitlines()[-15:]))
    return "\n".join(lines)


def run_cli(inventory: Path, *argv: str) -> tuple[int, dict | list | str, str]:
    """Run the dlctl CLI in this process as an operator would (``--config inventory --yes``):
    (exit code, stdout parsed as JSON when it is, stderr)."""
    from dlctl.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["--config", str(inventory), "--yes", *argv])
    text = out.getvalue()
    try:
        return code, json.loads(text), err.getvalue()
    except ValueError:
        return code, text, err.getvalue()
