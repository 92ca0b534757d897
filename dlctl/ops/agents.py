"""``dlctl agent install|start|stop|restart|status|logs``: the same package on every node.

Each cluster-level verb runs the node-level ``dlagent`` verb on every selected node, over SSH
(or locally for the sandbox), with bounded concurrency and optionally one region at a time;
per-node results come back as data, and some-failed/all-failed map to exit 3/1.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from .. import tomltext as toml
from ..certdir import CertDir
from ..errors import ConfigError, DlctlError
from ..inventory import Cluster, Node
from ..meta.zk import ZkTls
from ..plan import Plan, Step
from ..remote.fanout import Deadline, FanoutEvent, fan_out, outcome
from ..remote.local import LocalTransport
from ..remote.ssh import SshOptions, SshPool
from ..remote.transport import Transport
from . import certs, supervision

VERB_TIMEOUT = 90.0


@dataclass(frozen=True)
class FleetOptions:
    ssh_accept_new: bool = False
    max_concurrency: int = 16
    region_serial: bool = False
    timeout: float = VERB_TIMEOUT


class Fleet:
    """Transports to a cluster's nodes: one SSH connection per host (shared), or local."""

    def __init__(self, cluster: Cluster, options: FleetOptions) -> None:
        self.cluster = cluster
        self.options = options
        self._ssh = SshPool(SshOptions(config_path=cluster.ssh_config, known_hosts=cluster.known_hosts, accept_new=options.ssh_accept_new))
        self._local: dict[str, LocalTransport] = {}

    def transport(self, node: Node) -> Transport:
        if node.transport == "local":
            return self._local.setdefault(node.id, LocalTransport(node.id))
        return self._ssh.get(node)

    def close(self) -> None:
        self._ssh.close()
        for t in self._local.values():
            t.close()

    def run_verbs(self, nodes: Sequence[Node], verbs: Sequence[str], progress: Callable[[FanoutEvent], None] | None = None) -> dict[str, Any]:
        """Run ``dlagent VERB`` for each verb in turn on one node before the fan-out moves on
        (a rolling restart is stop+start per node); {node: result} or PartialFailure/DlctlError."""

        def op(node: Node, deadline: Deadline) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for verb in verbs:
                result = self.transport(node).run(agent_argv(node, verb), timeout=max(1.0, deadline.remaining())).check()
                try:
                    out[verb] = json.loads(result.stdout)
                except ValueError:
                    raise DlctlError(f"{node.id}: dlagent {verb} printed no JSON: {result.text[:200]!r}") from None
            return out[verbs[0]] if len(verbs) == 1 else out

        results = fan_out(
            list(nodes),
            op,
            timeout=self.options.timeout * len(verbs),
            max_concurrency=self.options.max_concurrency,
            region_serial=self.options.region_serial,
            progress=progress,
        )
        return outcome(results, action=f"dlagent {'+'.join(verbs)}")


def agent_argv(node: Node, verb: str) -> list[str]:
    return [node.agent_python, "-m", "dlagent", verb, "--config", node.agent_config, "-o", "json"]


def select_nodes(cluster: Cluster, node_ids: Sequence[str], region: str | None) -> list[Node]:
    nodes = [cluster.node(n) for n in node_ids] if node_ids else list(cluster.nodes)
    if region is not None:
        nodes = [n for n in nodes if n.region == region]
        if not nodes:
            raise ConfigError(f"no node of cluster {cluster.name!r} is in region {region!r}", hint=f"regions: {', '.join(cluster.regions())}")
    if not nodes:
        raise ConfigError(f"cluster {cluster.name!r} has no nodes in the inventory")
    return nodes


ACTIONS = {"start": ("start",), "stop": ("stop",), "restart": ("stop", "start")}


def lifecycle_plan(fleet: Fleet, nodes: Sequence[Node], action: str, progress: Callable[[FanoutEvent], None] | None = None) -> Plan:
    verbs = ACTIONS[action]
    how = "one region at a time" if fleet.options.region_serial else "all regions"
    return Plan.of(
        f"agent {action}",
        [
            Step(
                f"agent-{action}",
                ", ".join(n.id for n in nodes),
                f"dlagent {' then '.join(verbs)} on {len(nodes)} node(s), {fleet.options.max_concurrency} at a time, {how}",
                run=lambda: fleet.run_verbs(nodes, verbs, progress),
            )
        ],
    )


def status(fleet: Fleet, nodes: Sequence[Node]) -> tuple[list[dict[str, Any]], DlctlError | None]:
    """Per-node status rows (unreachable nodes are rows too), and the error the command should
    end with when some or all nodes could not be asked (exit 3, 1, or 4 if all were refused)."""
    results = fan_out(
        list(nodes),
        lambda node, deadline: json.loads(fleet.transport(node).run(agent_argv(node, "status"), timeout=max(1.0, deadline.remaining())).check().stdout),
        timeout=fleet.options.timeout,
        max_concurrency=fleet.options.max_concurrency,
    )
    rows = []
    for node, r in zip(nodes, results):
        base = {"region": node.region, "rack": node.rack, "node": node.id, "host": node.host}
        if r.ok:
            v = r.value
            rows.append({**base, "running": v.get("running"), "pid": v.get("pid"), "version": v.get("version"), "address": v.get("address"), "supervisor": v.get("supervisor"), "data_bytes": v.get("data_bytes"), "disk_free_bytes": v.get("disk_free_bytes")})
        else:
            rows.append({**base, "running": None, "error": r.error})
    try:
        outcome(results, action="dlagent status")
    except DlctlError as exc:
        exc.details = None  # the rows already carry every node's result
        return rows, exc
    return rows, None


def logs(fleet: Fleet, node: Node, lines: int) -> str:
    """The agent's last lines, newest last: ``dlagent logs`` reads its unit's journal where
    systemd runs it, else its rotated log files."""
    argv = [node.agent_python, "-m", "dlagent", "logs", "--config", node.agent_config, "--lines", str(lines)]
    result = fleet.transport(node).run(argv, timeout=fleet.options.timeout)
    if not result.ok:
        raise DlctlError(f"{node.id}: cannot read the agent's log: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout.decode(errors="replace")


# -- install --------------------------------------------------------------------------------------


def source_root() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "agent").is_dir() else None


def build_wheels(target: Path) -> list[Path]:
    """dlctl and its runtime dependencies as wheels, so nodes install offline."""
    root = source_root()
    if root is None:
        raise DlctlError("cannot build the dlctl wheel: this dlctl is not installed from a source checkout", hint="pass --wheel-dir with prebuilt wheels")
    cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(target), str(root)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise DlctlError(f"building wheels failed ({shlex.join(cmd)}): {result.stderr.strip()[-500:]}")
    return sorted(target.glob("*.whl"))


def agent_config_text(cluster: Cluster, node: Node, *, tls: bool = False) -> str:
    lines = [
        toml.line("node_id", node.id),
        toml.line("cluster", cluster.name),
        toml.line("region", node.region),
        toml.line("rack", node.rack),
        toml.line("data_dir", node.data_dir),
        toml.line("listen", node.listen),
        toml.line("zookeeper", cluster.zookeeper),
        toml.line("secret_file", node.home + "/secret"),
    ]
    if cluster.zk_auth_file is not None:
        lines.append(toml.line("zk_auth_file", node.home + "/zk-auth"))
    text = "\n".join(lines) + "\n"
    if node.metrics_listen:
        text += "\n" + toml.table("metrics") + "\n" + toml.line("listen", node.metrics_listen) + "\n"
    if _cold_credentials(cluster) is not None:
        # The cluster's cold store (S3) is reached with the inventory's credentials, copied 0600.
        text += "\n" + toml.table("housekeeping") + "\n" + toml.line("cold_credentials_file", f"{node.home}/{COLD_CREDENTIALS}") + "\n"
    if cluster.zookeeper_tls is not None:
        zk = cluster.zookeeper_tls
        text += "\n" + toml.table("zookeeper_tls") + "\n" + "".join(
            toml.line(key, f"{node.home}/{ZK_TLS_DIR}/{name}") + "\n" for key, name in zk_tls_names(zk)
        )
    return text + "\n" + certs.tls_table(node) if tls else text


ZK_TLS_DIR = "zk-tls"  # under an agent's home: the ensemble's CA (and the client certificate it wants)
COLD_CREDENTIALS = "cold-credentials"  # under an agent's home: the cold store's S3 credentials (0600)


def _cold_credentials(cluster: Cluster) -> Path | None:
    cold = cluster.cold_storage
    return cold.credentials_file if cold is not None and cold.kind == "s3" else None


def zk_tls_names(zk: ZkTls) -> list[tuple[str, str]]:
    """(agent.toml key, file name under ZK_TLS_DIR) for each file the inventory names."""
    names = [("ca_file", "ca.pem")]
    if zk.cert_file is not None:
        names += [("cert_file", "client.pem"), ("key_file", "client.key")]
    return names


def _refuse_shared_metrics_endpoints(cluster: Cluster) -> None:
    """Two agents of one host serving metrics on one port: the second would not start."""
    seen: dict[str, str] = {}
    for node in cluster.nodes:
        if node.metrics_listen in ("", "off"):
            continue
        if node.metrics_listen in seen:
            raise ConfigError(
                f"nodes {seen[node.metrics_listen]!r} and {node.id!r} of cluster {cluster.name!r} would both serve metrics on {node.metrics_listen}",
                hint="give one of them its own metrics_port in the inventory (or \"off\")",
            )
        seen[node.metrics_listen] = node.id


def install_plan(fleet: Fleet, nodes: Sequence[Node], wheel_dir: Path | None, progress: Callable[[FanoutEvent], None] | None = None) -> Plan:
    cluster = fleet.cluster
    _refuse_shared_metrics_endpoints(cluster)
    for f in (cluster.secret_file, cluster.zk_auth_file):
        if f is not None and not f.exists():
            raise ConfigError(f"{f} does not exist", hint="run `dlctl cluster init` first: it creates the cluster's secrets")
    if cluster.secret_file is None:
        raise ConfigError(f"cluster {cluster.name!r} has no secret_file in the inventory")
    # TLS when this operator holds the cluster CA (`cluster init` made it; --no-tls did not).
    certdir = CertDir(cluster.tls_dir, cluster.name) if cluster.tls_dir is not None else None
    tls = certdir is not None and certdir.exists()
    needs_venv = [n for n in nodes if n.python is None]
    state: dict[str, Any] = {"wheels": sorted(wheel_dir.glob("*.whl")) if wheel_dir else None}
    scratch = tempfile.TemporaryDirectory(prefix="dlctl-install-")

    def build() -> dict[str, Any]:
        state["wheels"] = build_wheels(Path(scratch.name))
        return {"wheels": len(state["wheels"])}

    def install_one(node: Node, deadline: Deadline) -> dict[str, Any]:
        t = fleet.transport(node)
        remaining = lambda: max(1.0, deadline.remaining())  # noqa: E731
        # Private from creation: `-m 700` applies to the directories mkdir makes (the agent
        # tightens an existing data dir itself at start, saying so in its log).
        t.run(["mkdir", "-p", "-m", "700", node.home, node.data_dir], timeout=remaining()).check()
        t.run(["chmod", "700", node.home], timeout=remaining()).check()
        done: dict[str, Any] = {"home": node.home}
        if node.python is None:
            t.run(["mkdir", "-p", f"{node.home}/wheels"], timeout=remaining()).check()
            for wheel in state["wheels"]:
                t.put(wheel, f"{node.home}/wheels/{wheel.name}", 0o644, timeout=remaining())
            t.run(["python3", "-m", "venv", f"{node.home}/venv"], timeout=remaining()).check()
            pip = [f"{node.home}/venv/bin/python", "-m", "pip", "install", "--quiet", "--no-index", "--find-links", f"{node.home}/wheels", "--upgrade", f"dlctl=={__version__}"]
            t.run(pip, timeout=remaining()).check()
            done["venv"] = f"{node.home}/venv"
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as cfg:
            cfg.write(agent_config_text(cluster, node, tls=tls))
        try:
            t.put(cfg.name, node.agent_config, 0o600, timeout=remaining())
        finally:
            Path(cfg.name).unlink()
        # Secrets travel by SFTP into files created 0600 (the mode is in the create request
        # itself: dlctl.remote.ssh): never in argv, never through a shell.
        t.put(cluster.secret_file, f"{node.home}/secret", 0o600, timeout=remaining())
        if cluster.zk_auth_file is not None:
            t.put(cluster.zk_auth_file, f"{node.home}/zk-auth", 0o600, timeout=remaining())
        cold_credentials = _cold_credentials(cluster)
        if cold_credentials is not None:
            t.put(cold_credentials, f"{node.home}/{COLD_CREDENTIALS}", 0o600, timeout=remaining())
            done["cold_credentials"] = True
        if tls:
            assert certdir is not None
            done["tls"] = certs.deliver_certificate(t, node, certdir, remaining)
        if cluster.zookeeper_tls is not None:
            # The ensemble's CA and the client certificate the inventory uses for it, 0600.
            t.run(["mkdir", "-p", "-m", "700", f"{node.home}/{ZK_TLS_DIR}"], timeout=remaining()).check()
            for key, name in zk_tls_names(cluster.zookeeper_tls):
                t.put(getattr(cluster.zookeeper_tls, key), f"{node.home}/{ZK_TLS_DIR}/{name}", 0o600, timeout=remaining())
            done["zookeeper_tls"] = True
        version = t.run([node.agent_python, "-m", "dlagent", "--version"], timeout=remaining()).check().text.strip()
        done["supervisor"] = supervision.install_unit(t, cluster, node, remaining)
        return {**done, "agent": version}

    def install_all() -> dict[str, Any]:
        try:
            results = fan_out(list(nodes), install_one, timeout=max(fleet.options.timeout, 600.0), max_concurrency=fleet.options.max_concurrency, region_serial=fleet.options.region_serial, progress=progress)
            return outcome(results, action="agent install")
        finally:
            scratch.cleanup()

    steps = []
    if needs_venv and state["wheels"] is None:
        steps.append(Step("build-wheels", "operator host", "build wheels of dlctl and its dependencies", run=build))
    steps.append(
        Step(
            "install",
            ", ".join(n.id for n in nodes),
            f"on {len(nodes)} node(s): create home dirs, "
            + (f"upload wheels and install into a venv on {len(needs_venv)}, " if needs_venv else "")
            + "write agent.toml, upload the secrets (0600)"
            + (" and a TLS certificate of the cluster CA" if tls else " (no TLS: the operator holds no cluster CA)")
            + "; a systemd unit where the node runs systemd and the SSH user is root (else a detached process)",
            run=install_all,
        )
    )
    return Plan.of("agent install", steps)
