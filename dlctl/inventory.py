"""The inventory: clusters, their ZooKeeper ensembles and secrets, and regions → racks → nodes.

    default_cluster = "east"

    [clusters.east]
    zookeeper    = "10.0.0.5:2181,10.0.0.6:2181/prod"   # connect string, optional chroot
    secret_file  = "secrets/east.secret"                 # cluster secret (0600), for agents
    zk_auth_file = "secrets/east.zk-auth"                # 'user:password' (0600); default: <cluster>.zk-auth
                                                         # beside secret_file (`cluster init` creates it)
    # insecure_zookeeper = true                          # no ZooKeeper ACLs: refused by `cluster init` unless
                                                         # --insecure-zookeeper; every command then warns
    tls_dir      = "secrets/east.tls"                    # the cluster CA and this operator's certificate
                                                         # (0700); default: <cluster>.tls beside secret_file
                                                         # (`cluster init` creates it unless --no-tls)

    ssh_config   = "~/.ssh/config"                       # optional; default ~/.ssh/config
    known_hosts  = "~/.ssh/known_hosts"                  # optional; default ~/.ssh/known_hosts

    [clusters.east.zookeeper_tls]       # optional: TLS to the ensemble (its secureClientPort in
                                        # `zookeeper`); absent: plaintext, digest password included
    ca_file   = "secrets/zk-ca.pem"     # the CA of the ensemble's server certificates (required)
    cert_file = "secrets/zk-client.pem" # optional, with key_file: the client certificate an
    key_file  = "secrets/zk-client.key" # ensemble with ssl.clientAuth=need asks for (key 0600)

    [clusters.east.cold_storage]        # optional: where segments are backed up (dlctl.cold.config)
    kind = "filesystem"                 # or "s3": bucket, prefix, endpoint, region, credentials_file
    path = "/mnt/backup/dlctl-east"

    [clusters.east.defaults]            # per-node settings, overridable on each node
    ssh_user = "dlctl"
    ssh_port = 22
    identity_file = "~/.ssh/id_ed25519"
    home = "/opt/dlagent"               # agent.toml, secrets, venv/ (from `dlctl agent install`)
    data_dir = "/var/lib/dlagent"
    # python = "/usr/bin/python3"       # an interpreter that already has dlctl (skips the venv)
    agent_port = 3181
    transport = "ssh"                   # or "local" for nodes on this machine (the sandbox)
    # agent_user = "dlagent"            # the system user a systemd unit runs the agent as (it must
                                        # exist on the node; install chowns home and data_dir to it).
                                        # Needs systemd and ssh_user root; unset: the SSH user

    [[clusters.east.regions.us-east.racks.r1.nodes]]
    id   = "use-1"
    host = "10.0.1.1"                  # SSH host (or an alias in ~/.ssh/config)
    listen = "10.0.1.1:3181"           # optional; default host:agent_port

Relative paths are relative to the inventory file. Errors name the file, the key and the fix.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import current_context
from .cold.config import ColdStorageConfig
from .cold.config import parse as parse_cold_storage
from .config import ConfigLocation, user_config_dir
from .errors import ConfigError, NotFoundError
from .meta.zk import ZkTls, check_connect_string, parse_tls
from .names import validate_name
from .systemd import validate_user

_CLUSTER_KEYS = {"cold_storage", "zookeeper", "zookeeper_tls", "secret_file", "zk_auth_file", "tls_dir", "insecure_zookeeper", "defaults", "regions", "ssh_config", "known_hosts"}
_NODE_KEYS = {"id", "host", "listen", "ssh_user", "ssh_port", "identity_file", "data_dir", "python", "agent_port", "metrics_port", "home", "transport", "agent_user"}
_DEFAULT_KEYS = _NODE_KEYS - {"id", "host", "listen"}
# python = None: `dlctl agent install` creates <home>/venv and the agent runs from it; a path
# names an interpreter that already has dlctl installed (nothing is installed then).
_NODE_DEFAULTS: dict[str, Any] = {
    "ssh_user": None,
    "ssh_port": 22,
    "identity_file": None,
    "data_dir": "/var/lib/dlagent",
    "python": None,
    "agent_port": 3181,
    "metrics_port": 9181,  # the agent's /metrics on its host ("off": none); nodes sharing a host need their own
    "home": "/opt/dlagent",
    "transport": "ssh",
    "agent_user": None,
}
TRANSPORTS = ("ssh", "local")


@dataclass(frozen=True)
class Node:
    id: str
    cluster: str
    region: str
    rack: str
    host: str
    listen: str
    ssh_user: str | None
    ssh_port: int
    identity_file: str | None
    data_dir: str
    python: str | None
    home: str = "/opt/dlagent"
    transport: str = "ssh"
    agent_user: str | None = None  # a systemd unit's User= (dlctl.systemd); None: the SSH user
    metrics_listen: str = ""  # [metrics] listen of its agent.toml ("off": none; "": the agent's default)

    @property
    def agent_python(self) -> str:
        """The interpreter that runs ``dlagent`` on the node."""
        return self.python or f"{self.home}/venv/bin/python"

    @property
    def agent_config(self) -> str:
        return f"{self.home}/agent.toml"

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("id", "region", "rack", "host", "listen", "metrics_listen", "transport", "ssh_user", "ssh_port", "identity_file", "home", "data_dir", "python", "agent_user")}


@dataclass(frozen=True)
class Cluster:
    name: str
    zookeeper: str
    secret_file: Path | None
    zk_auth_file: Path | None  # None only for an insecure_zookeeper cluster
    nodes: tuple[Node, ...] = ()
    ssh_config: Path | None = None
    known_hosts: Path | None = None
    insecure_zookeeper: bool = False  # the operator's explicit choice of open ZooKeeper ACLs
    tls_dir: Path | None = None  # the cluster CA and the operator's certificate (dlctl.ops.certs)
    zookeeper_tls: ZkTls | None = None  # [clusters.<c>.zookeeper_tls]; None: plaintext ZooKeeper
    cold_storage: ColdStorageConfig | None = None  # [clusters.<c>.cold_storage]; None: no cold store

    def regions(self) -> dict[str, dict[str, list[Node]]]:
        """region → rack → nodes, in inventory order."""
        out: dict[str, dict[str, list[Node]]] = {}
        for node in self.nodes:
            out.setdefault(node.region, {}).setdefault(node.rack, []).append(node)
        return out

    def node(self, node_id: str) -> Node:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise NotFoundError(f"node {node_id!r} is not in cluster {self.name!r}", hint="list nodes with `dlctl config show`")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "zookeeper": self.zookeeper,
            "zookeeper_tls": self.zookeeper_tls.to_dict() if self.zookeeper_tls else None,
            "secret_file": str(self.secret_file) if self.secret_file else None,
            "zk_auth_file": str(self.zk_auth_file) if self.zk_auth_file else None,
            "insecure_zookeeper": self.insecure_zookeeper,
            "tls_dir": str(self.tls_dir) if self.tls_dir else None,
            "ssh_config": str(self.ssh_config) if self.ssh_config else None,
            "known_hosts": str(self.known_hosts) if self.known_hosts else None,
            "cold_storage": self.cold_storage.to_dict() if self.cold_storage else None,
            "nodes": [n.to_dict() for n in self.nodes],
        }


@dataclass(frozen=True)
class Inventory:
    path: Path | None
    clusters: Mapping[str, Cluster] = field(default_factory=dict)
    default_cluster: str | None = None

    def cluster(self, name: str | None) -> Cluster:
        chosen = name or self.default_cluster or (next(iter(self.clusters)) if len(self.clusters) == 1 else None)
        if chosen is None:
            if not self.clusters:
                raise ConfigError(
                    "no cluster is configured" + (f" in {self.path}" if self.path else " (no configuration file found)"),
                    hint="pass --config FILE or set DLCTL_CONFIG (see README: Configuration)",
                )
            raise ConfigError(f"several clusters are configured ({', '.join(self.clusters)}); choose one with --cluster or DLCTL_CLUSTER")
        try:
            return self.clusters[chosen]
        except KeyError:
            raise ConfigError(f"cluster {chosen!r} is not in {self.path}", hint=f"known clusters: {', '.join(self.clusters) or 'none'}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path) if self.path else None, "default_cluster": self.default_cluster, "clusters": [c.to_dict() for c in self.clusters.values()]}


def load(location: ConfigLocation) -> Inventory:
    if location.path is None:
        return Inventory(None)
    path = location.path.expanduser()
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        hint = None
        if location.source == "current-context":
            hint = f"the current context ({current_context.context_file(user_config_dir())}) names it: `dlctl sandbox up` makes it again; or remove that file"
        raise ConfigError(f"configuration file {path} (from {location.source}) does not exist", hint=hint) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse(raw, path)


def parse(raw: dict[str, Any], path: Path) -> Inventory:
    unknown = set(raw) - {"default_cluster", "clusters"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s): {', '.join(sorted(unknown))}")
    clusters_raw = raw.get("clusters", {})
    if not isinstance(clusters_raw, dict):
        raise ConfigError(f"{path}: 'clusters' must be a table of [clusters.NAME]")
    clusters = {name: _cluster(name, body, path) for name, body in clusters_raw.items()}
    default = raw.get("default_cluster")
    if default is not None and default not in clusters:
        raise ConfigError(f"{path}: default_cluster {default!r} is not one of the clusters ({', '.join(clusters) or 'none'})")
    seen: dict[str, str] = {}
    for cluster in clusters.values():
        for node in cluster.nodes:
            for key in (node.listen,):
                if key in seen:
                    raise ConfigError(f"{path}: node {node.id!r} of cluster {cluster.name!r} listens on {key}, already used by {seen[key]}")
                seen[key] = f"node {node.id!r} of cluster {cluster.name!r}"
    return Inventory(path, clusters, default)


def _where(path: Path, *keys: str) -> str:
    return f"{path}: [{'.'.join(keys)}]"


def _cluster(name: str, body: Any, path: Path) -> Cluster:
    try:
        validate_name("cluster", name)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    where = _where(path, "clusters", name)
    if not isinstance(body, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = set(body) - _CLUSTER_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s): {', '.join(sorted(unknown))}", hint=f"allowed: {', '.join(sorted(_CLUSTER_KEYS))}")
    if "zookeeper" not in body:
        raise ConfigError(f"{where}: 'zookeeper' (the connect string, e.g. \"10.0.0.5:2181\") is required")
    if not isinstance(body["zookeeper"], str) or not body["zookeeper"]:
        raise ConfigError(f"{where}: 'zookeeper' must be a connect string in quotes (e.g. \"10.0.0.5:2181\"), got {body['zookeeper']!r}")
    check_connect_string(body["zookeeper"], f"{where}: 'zookeeper'")
    defaults = {**_NODE_DEFAULTS, **_table(body.get("defaults", {}), f"{where}.defaults", _DEFAULT_KEYS)}
    nodes: list[Node] = []
    for region, region_body in _table(body.get("regions", {}), f"{where}.regions", None).items():
        racks = _table(region_body, f"{where}.regions.{region}", {"racks"}).get("racks", {})
        for rack, rack_body in _table(racks, f"{where}.regions.{region}.racks", None).items():
            node_list = _table(rack_body, f"{where}.regions.{region}.racks.{rack}", {"nodes"}).get("nodes", [])
            if not isinstance(node_list, list):
                raise ConfigError(f"{where}.regions.{region}.racks.{rack}: 'nodes' must be an array of tables ([[...nodes]])")
            for i, node_body in enumerate(node_list):
                nodes.append(_node(name, region, rack, node_body, defaults, f"{where}.regions.{region}.racks.{rack}.nodes[{i}]"))
    ids = [n.id for n in nodes]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ConfigError(f"{where}: duplicate node id(s): {', '.join(duplicates)}")
    secret_file = _path(body.get("secret_file"), path, f"{where}.secret_file")
    insecure = body.get("insecure_zookeeper", False)
    if not isinstance(insecure, bool):
        raise ConfigError(f"{where}.insecure_zookeeper must be true or false, got {insecure!r}")
    zk_auth_file = _path(body.get("zk_auth_file"), path, f"{where}.zk_auth_file")
    if insecure and zk_auth_file is not None:
        raise ConfigError(f"{where}: insecure_zookeeper = true and zk_auth_file contradict each other", hint="remove one of them")
    if zk_auth_file is None and not insecure and secret_file is not None:
        # Secure by default: ZooKeeper credentials beside the cluster secret (`cluster init` makes them).
        zk_auth_file = secret_file.with_name(f"{name}.zk-auth")
    tls_dir = _path(body.get("tls_dir"), path, f"{where}.tls_dir")
    if tls_dir is None and secret_file is not None:
        tls_dir = secret_file.with_name(f"{name}.tls")
    return Cluster(
        name=name,
        zookeeper=body["zookeeper"],
        zookeeper_tls=parse_tls(body.get("zookeeper_tls"), _where(path, "clusters", name, "zookeeper_tls"), path.parent),
        secret_file=secret_file,
        zk_auth_file=zk_auth_file,
        insecure_zookeeper=insecure,
        tls_dir=tls_dir,
        nodes=tuple(nodes),
        ssh_config=_path(body.get("ssh_config"), path, f"{where}.ssh_config"),
        known_hosts=_path(body.get("known_hosts"), path, f"{where}.known_hosts"),
        cold_storage=parse_cold_storage(body["cold_storage"], f"{where}.cold_storage", path.parent) if "cold_storage" in body else None,
    )


def _table(value: Any, where: str, allowed: set[str] | None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table")
    if allowed is not None:
        unknown = set(value) - allowed
        if unknown:
            raise ConfigError(f"{where}: unknown key(s): {', '.join(sorted(unknown))}", hint=f"allowed: {', '.join(sorted(allowed))}")
    return value


def _node(cluster: str, region: str, rack: str, body: Any, defaults: dict[str, Any], where: str) -> Node:
    settings = {**defaults, **_table(body, where, _NODE_KEYS)}
    try:
        node_id = validate_name("node", settings.get("id"))
        validate_name("region", region)
        validate_name("rack", rack)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    host = settings.get("host")
    if not isinstance(host, str) or not host or host.startswith("-") or any(c.isspace() for c in host):
        raise ConfigError(f"{where}: 'host' must be a host name or address (got {host!r})")
    for key in ("ssh_port", "agent_port"):
        if not isinstance(settings[key], int) or not 0 < settings[key] < 65536:
            raise ConfigError(f"{where}: '{key}' must be a port number, got {settings[key]!r}")
    metrics_port = settings["metrics_port"]
    if metrics_port != "off" and (isinstance(metrics_port, bool) or not isinstance(metrics_port, int) or not 0 < metrics_port < 65536):
        raise ConfigError(f"{where}: 'metrics_port' must be a port number or \"off\", got {metrics_port!r}")
    listen = settings.get("listen") or f"{host}:{settings['agent_port']}"
    listen_host, sep, port = str(listen).rpartition(":")
    if not sep or not listen_host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where}: 'listen' must be host:port with a port in 1..65535, got {listen!r}")
    for key in ("ssh_user", "identity_file", "data_dir", "python", "home"):
        if settings[key] is not None and (not isinstance(settings[key], str) or not settings[key]):
            raise ConfigError(f"{where}: '{key}' must be a non-empty string")
    for key in ("data_dir", "home"):
        if not settings[key].startswith("/") or "\n" in settings[key]:
            raise ConfigError(f"{where}: '{key}' must be an absolute path on the node, got {settings[key]!r}")
    if settings["agent_user"] is not None:
        validate_user(settings["agent_user"], f"{where}: 'agent_user'")
    if settings["transport"] not in TRANSPORTS:
        raise ConfigError(f"{where}: 'transport' must be one of {', '.join(TRANSPORTS)}, got {settings['transport']!r}")
    return Node(
        id=node_id,
        cluster=cluster,
        region=region,
        rack=rack,
        host=host,
        listen=listen,
        ssh_user=settings["ssh_user"],
        ssh_port=settings["ssh_port"],
        identity_file=settings["identity_file"],
        data_dir=settings["data_dir"],
        python=settings["python"],
        home=settings["home"],
        transport=settings["transport"],
        agent_user=settings["agent_user"],
        metrics_listen="off" if metrics_port == "off" else f"{listen.rpartition(':')[0]}:{metrics_port}",
    )


def _path(value: Any, base: Path, where: str) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a path")
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base.parent / p)


def iter_nodes(cluster: Cluster, region: str | None = None) -> Iterator[Node]:
    for node in cluster.nodes:
        if region is None or node.region == region:
            yield node
