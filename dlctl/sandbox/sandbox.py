"""``dlctl sandbox up|down|status``: a local multi-region cluster on loopback addresses.

One ZooKeeper (from the pyspark jars) serves every sandbox cluster; each node is a real
``dlagent`` process on its own loopback address — ``127.<100+cluster>.<region>.<node>`` — so
regions are address ranges, exactly as on a fleet. ``up`` writes an inventory
(``<dir>/config.toml``) that every other command uses unchanged, and makes it the current
context (dlctl.current_context) so they find it without ``DLCTL_CONFIG``; ``down`` stops what
``up`` started, by pid, can remove the data, and clears the context if it still names this sandbox.

ZooKeeper serves TLS (client certificates required) on its secure port, and the inventory and
every agent.toml point there with a ``zookeeper_tls`` table: the sandbox's own CA and client
certificate, in ``<dir>/zookeeper/tls``. Its plain port stays on loopback for the health check.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import current_context
from .. import tomltext as toml
from ..certdir import AGENT_CA, AGENT_CERT, AGENT_DIR, AGENT_KEY, CertDir
from ..config import user_config_dir
from ..errors import DlctlError, PartialFailure
from ..meta.zk import ZkTls
from ..plan import Plan, Step
from ..secrets import write_secret_file
from . import zookeeper

STATE_FILE = "sandbox.json"
CLUSTER_NAMES = ("east", "west", "north", "south", "central")
AGENT_PORT = 3181
ZK_PORT = 2181
ZK_TLS_PORT = 2281


@dataclass(frozen=True)
class Layout:
    clusters: int = 1
    regions: int = 3
    nodes_per_region: int = 3

    def __post_init__(self) -> None:
        if not (1 <= self.clusters <= 9 and 1 <= self.regions <= 9 and 1 <= self.nodes_per_region <= 50):
            raise ValueError("sandbox size: 1-9 clusters, 1-9 regions, 1-50 nodes per region")

    def cluster_names(self) -> list[str]:
        return [CLUSTER_NAMES[i] if i < len(CLUSTER_NAMES) else f"c{i + 1}" for i in range(self.clusters)]


def default_dir() -> Path:
    if os.environ.get("DLCTL_SANDBOX_DIR"):
        return Path(os.environ["DLCTL_SANDBOX_DIR"])
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "dlctl" / "sandbox"


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def lock_ports() -> Callable[[], None]:
    """Serialise ``sandbox up`` on this machine (per user): it picks free ports and binds them
    only later (ZooKeeper, then the agents), so two at once could pick the same ones. Waits for
    another ``up`` to finish; returns the release."""
    path = Path(tempfile.gettempdir()) / f"dlctl-sandbox-up-{os.getuid()}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        raise DlctlError(f"cannot lock {path} (it keeps two `sandbox up` from picking the same ports): {exc.strerror}") from None
    return lambda: os.close(fd)


def _pick_port(host: str, preferred: int) -> int:
    return preferred if _port_free(host, preferred) else _any_port(host)


def _any_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def read_state(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise DlctlError(f"{directory / STATE_FILE} is not valid JSON ({exc})", hint="run `dlctl sandbox down --purge` to start over") from None


def is_up(state: dict[str, Any] | None) -> bool:
    return bool(state) and zookeeper.pid_alive(state["zookeeper"]["pid"])


def _node_plan(directory: Path, layout: Layout) -> list[dict[str, Any]]:
    nodes = []
    for ci, cluster in enumerate(layout.cluster_names(), start=1):
        for region in range(1, layout.regions + 1):
            for n in range(1, layout.nodes_per_region + 1):
                host = f"127.{100 + ci}.{region}.{n}"
                node_id = f"{cluster}-r{region}-n{n}"
                nodes.append(
                    {
                        "cluster": cluster,
                        "node_id": node_id,
                        "region": f"region-{region}",
                        "rack": f"rack-{(n - 1) % 2 + 1}",
                        "host": host,
                        "dir": str(directory / cluster / node_id),
                    }
                )
    return nodes


def _zookeeper_tls_lines(zk_tls: ZkTls | None, prefix: str = "") -> list[str]:
    if zk_tls is None:
        return []
    return [toml.line(f"{prefix}{key}", value) for key, value in zk_tls.to_dict().items() if value is not None]


def _tls_dir(cluster_dir: Path, cluster: str) -> Path:
    """Where `cluster init` keeps the sandbox cluster's CA (the inventory's default tls_dir)."""
    return cluster_dir / f"{cluster}.tls"


def _issue_certs(directory: Path, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Each agent's certificate from its cluster's CA, as `agent install` delivers it."""
    for node in nodes:
        certs = CertDir(_tls_dir(directory / node["cluster"], node["cluster"]), node["cluster"])
        issued = certs.issue_agent(node["node_id"], [node["host"]])
        tls = Path(node["dir"]) / AGENT_DIR
        tls.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name, data in ((AGENT_CA, certs.bundle()), (AGENT_KEY, issued.key_pem), (AGENT_CERT, issued.cert_pem)):
            write_secret_file(tls / name, data)
    return {"certificates": len(nodes)}


def _write_agent_config(node: dict[str, Any], zk: str, cluster_dir: Path, zk_tls: ZkTls | None = None) -> None:
    node_dir = Path(node["dir"])
    node_dir.mkdir(parents=True, exist_ok=True)
    (node_dir / "agent.toml").write_text(
        "\n".join(
            [
                toml.line("node_id", node["node_id"]),
                toml.line("cluster", node["cluster"]),
                toml.line("region", node["region"]),
                toml.line("rack", node["rack"]),
                toml.line("data_dir", node_dir / "data"),
                toml.line("listen", f'{node["host"]}:{node["port"]}'),
                toml.line("zookeeper", zk),
                toml.line("secret_file", cluster_dir / "secret"),
                toml.line("zk_auth_file", cluster_dir / "zk-auth"),
                toml.line("session_timeout", 4.0),
                "",
                # Any free port: the agent publishes where it bound (its availability record).
                toml.table("metrics"),
                toml.line("listen", f'{node["host"]}:0'),
                "",
                toml.table("tls"),  # delivered by the issue-certs step, from the cluster CA
                toml.line("ca_file", node_dir / AGENT_DIR / AGENT_CA),
                toml.line("cert_file", node_dir / AGENT_DIR / AGENT_CERT),
                toml.line("key_file", node_dir / AGENT_DIR / AGENT_KEY),
                "",
                *([toml.table("zookeeper_tls"), *_zookeeper_tls_lines(zk_tls), ""] if zk_tls else []),
            ]
        )
    )


def _inventory(directory: Path, layout: Layout, zk: str, nodes: list[dict[str, Any]], zk_tls: ZkTls | None = None) -> str:
    lines = [toml.line("default_cluster", layout.cluster_names()[0]), ""]
    for cluster in layout.cluster_names():
        lines += [
            toml.table("clusters", cluster),
            toml.line("zookeeper", zk),
            toml.line("secret_file", directory / cluster / "secret"),
            toml.line("zk_auth_file", directory / cluster / "zk-auth"),
            "",
            *([toml.table("clusters", cluster, "zookeeper_tls"), *_zookeeper_tls_lines(zk_tls), ""] if zk_tls else []),
            toml.table("clusters", cluster, "defaults"),
            toml.line("python", sys.executable),
            toml.line("transport", "local"),
            "",
        ]
        for node in (n for n in nodes if n["cluster"] == cluster):
            lines += [
                toml.table("clusters", cluster, "regions", node["region"], "racks", node["rack"], "nodes", array=True),
                toml.line("id", node["node_id"]),
                toml.line("host", node["host"]),
                toml.line("listen", f'{node["host"]}:{node["port"]}'),
                toml.line("data_dir", Path(node["dir"]) / "data"),
                toml.line("home", node["dir"]),
                "",
            ]
    return "\n".join(lines)


def _agent_verb(verb: str, node: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    # dlctl never imports the agent: it runs the node-level verb, as it would over SSH.
    argv = [sys.executable, "-m", "dlagent", verb, "--config", str(Path(node["dir"]) / "agent.toml"), "-o", "json"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise DlctlError(f"{node['node_id']}: dlagent {verb} failed: {result.stderr.strip()}")
    return json.loads(result.stdout)


def _fan_out(verb: str, nodes: list[dict[str, Any]], workers: int = 8) -> list[dict[str, Any]]:
    def one(node: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"node": node["node_id"], "ok": True, **_agent_verb(verb, node)}
        except (DlctlError, subprocess.TimeoutExpired, ValueError) as exc:
            return {"node": node["node_id"], "ok": False, "error": str(exc)}

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(one, nodes))
    failed = [r for r in results if not r["ok"]]
    if failed and len(failed) == len(results):
        raise DlctlError(f"dlagent {verb} failed on every node", details=results)
    if failed:
        raise PartialFailure(f"dlagent {verb} failed on {len(failed)} of {len(results)} node(s): {', '.join(r['node'] for r in failed)}", details=results)
    return results


def up_plan(directory: Path, layout: Layout, init_cluster) -> Plan:
    """``init_cluster(inventory_path, cluster_name)`` runs ``cluster init`` (an ops callback, so
    this module stays below the ops layer)."""
    state = read_state(directory)
    if is_up(state):
        return Plan.of("sandbox up", [], notes=[f"the sandbox in {directory} is already up (ZooKeeper pid {state['zookeeper']['pid']})"])
    missing = zookeeper.missing_prerequisites()
    if missing:
        raise DlctlError("the sandbox needs " + "; ".join(missing))
    nodes = _node_plan(directory, layout)
    zk_host = "127.0.0.1"
    zk_port = _pick_port(zk_host, ZK_PORT)
    zk_tls_port = _pick_port(zk_host, ZK_TLS_PORT)
    while zk_tls_port == zk_port:  # both were drawn at random, and the same
        zk_tls_port = _any_port(zk_host)
    # Clients use the TLS port; the plain one (loopback) is for the `srvr` health check.
    zk = f"{zk_host}:{zk_tls_port}"
    zk_dir = directory / "zookeeper"
    zk_files = zookeeper.TlsFiles.under(zk_dir / "tls")
    zk_tls = zk_files.client()
    inventory_path = directory / "config.toml"
    new_state: dict[str, Any] = {
        "created": time.time(),
        "layout": layout.__dict__,
        "zookeeper": {"address": zk, "plain_address": f"{zk_host}:{zk_port}", "tls": zk_tls.to_dict(), "pid": None},
        "nodes": nodes,
        "inventory": str(inventory_path),
    }

    def prepare() -> dict[str, Any]:
        for node in nodes:
            node["port"] = _pick_port(node["host"], AGENT_PORT)
        zookeeper.write_tls(zk_dir / "tls", [zk_host, "localhost"])
        inventory_path.parent.mkdir(parents=True, exist_ok=True)
        inventory_path.write_text(_inventory(directory, layout, zk, nodes, zk_tls))
        for node in nodes:
            _write_agent_config(node, zk, directory / node["cluster"], zk_tls)
        return {"inventory": str(inventory_path), "nodes": len(nodes), "zookeeper_tls": str(zk_dir / "tls")}

    def start_zookeeper() -> dict[str, Any]:
        config = zookeeper.ZooKeeperConfig(zk_dir, zk_host, zk_port, tls=zookeeper.ServerTls.of(zk_files, zk_tls_port))
        pid = zookeeper.start(config)
        new_state["zookeeper"]["pid"] = pid
        (directory / STATE_FILE).write_text(json.dumps(new_state, indent=2))
        return {"pid": pid, "address": zk, "plain_address": f"{zk_host}:{zk_port}"}

    def start_agents() -> list[dict[str, Any]]:
        results = _fan_out("start", nodes)
        (directory / STATE_FILE).write_text(json.dumps(new_state, indent=2))
        return [{"node": r["node"], "pid": r.get("pid")} for r in results]

    steps = [
        Step("write-configs", str(directory), f"write the inventory and {len(nodes)} agent configs under {directory}", run=prepare),
        Step("start-zookeeper", zk, f"start ZooKeeper: TLS with client certificates on {zk}, plain on {zk_host}:{zk_port} (health checks)", run=start_zookeeper),
    ]
    for cluster in layout.cluster_names():
        steps.append(Step("cluster-init", cluster, f"initialise cluster {cluster} (secrets, ZooKeeper layout, node records)", run=lambda c=cluster: init_cluster(inventory_path, c)))
    steps.append(Step("issue-certs", f"{len(nodes)} nodes", "issue each agent a TLS certificate of its cluster's CA", run=lambda: _issue_certs(directory, nodes)))
    steps.append(
        Step(
            "start-agents",
            f"{len(nodes)} nodes",
            f"start {len(nodes)} agents: {layout.clusters} cluster(s) x {layout.regions} region(s) x {layout.nodes_per_region} node(s) on 127.10x.<region>.<node>",
            run=start_agents,
        )
    )
    context = current_context.context_file(user_config_dir())
    steps.append(
        Step(
            "set-context",
            str(context),
            f"make {inventory_path} the current context: commands without --config or DLCTL_CONFIG use it",
            run=lambda: {"context": str(current_context.set_current(user_config_dir(), inventory_path)), "inventory": str(inventory_path)},
        )
    )
    notes = [f"commands now use this sandbox without DLCTL_CONFIG (current context: {context}); `sandbox down` switches back"]
    chosen = os.environ.get("DLCTL_CONFIG")
    if chosen and Path(chosen).absolute() != inventory_path.absolute():
        notes.append(f"DLCTL_CONFIG={chosen} is set and takes precedence over the current context in this shell")
    return Plan.of("sandbox up", steps, notes=notes)


def status(directory: Path) -> dict[str, Any]:
    state = read_state(directory)
    if state is None:
        return {"dir": str(directory), "up": False, "zookeeper": None, "nodes": []}
    nodes = []
    for node in state["nodes"]:
        try:
            info = _agent_verb("status", node)
            nodes.append({"cluster": node["cluster"], "node": node["node_id"], "region": node["region"], "address": f"{node['host']}:{node.get('port')}", "running": info["running"], "pid": info["pid"]})
        except DlctlError as exc:
            nodes.append({"cluster": node["cluster"], "node": node["node_id"], "region": node["region"], "address": None, "running": False, "pid": None, "error": str(exc)})
    return {
        "dir": str(directory),
        "up": is_up(state),
        "inventory": state["inventory"],
        "zookeeper": {
            "address": state["zookeeper"]["address"],
            "plain_address": state["zookeeper"].get("plain_address"),
            "tls": bool(state["zookeeper"].get("tls")),
            "pid": state["zookeeper"]["pid"],
            "running": is_up(state),
        },
        "nodes": nodes,
    }


def _clear_context(directory: Path) -> list[Step]:
    """A step clearing the current context if it names this sandbox's inventory."""
    inventory = directory / "config.toml"
    current = current_context.read(user_config_dir())
    if current is None or current.absolute() != inventory.absolute():
        return []
    context = current_context.context_file(user_config_dir())
    return [Step("clear-context", str(context), f"clear the current context ({context} names this sandbox)", run=lambda: {"cleared": current_context.clear_if(user_config_dir(), inventory)})]


def down_plan(directory: Path, purge: bool) -> Plan:
    state = read_state(directory)
    if state is None:
        if purge and directory.exists():
            return Plan.of("sandbox down", [Step("remove-dir", str(directory), f"remove {directory}", run=lambda: shutil.rmtree(directory)), *_clear_context(directory)])
        return Plan.of("sandbox down", _clear_context(directory), notes=[f"no sandbox in {directory}"])
    nodes = [n for n in state["nodes"] if (Path(n["dir"]) / "agent.toml").exists()]
    steps = [
        Step("stop-agents", f"{len(nodes)} nodes", f"stop {len(nodes)} agents (SIGTERM, then SIGKILL after 20 s)", run=lambda: [{"node": r["node"], "message": r.get("message")} for r in _fan_out("stop", nodes)]),
    ]
    zk_pid = state["zookeeper"]["pid"]
    if zk_pid:
        steps.append(Step("stop-zookeeper", state["zookeeper"]["address"], f"stop ZooKeeper (pid {zk_pid})", run=lambda: {"killed": zookeeper.stop(zk_pid)}))
    if purge:
        steps.append(Step("remove-dir", str(directory), f"remove {directory} and all sandbox data", run=lambda: shutil.rmtree(directory)))
    else:
        steps.append(Step("forget-state", str(directory / STATE_FILE), "mark the sandbox as down (data kept)", run=lambda: (directory / STATE_FILE).unlink()))
    return Plan.of("sandbox down", steps + _clear_context(directory))
