"""A source cluster's credentials, delivered to the agents of a sink (``init-replication``).

A sink agent reads a source only when an operator declared it (``dlagent.replication_config``):
by hand in agent.toml, or with this step, which writes ``<home>/sources/<source>/`` on every node
of the sink that the inventory lists, over the fleet's transport (SSH, or local for the sandbox):

    secret              the source cluster's secret (the HMAC handshake with its agents)
    zk-auth             its ZooKeeper digest credentials, when it has them
    tls/ca.pem          the source's CA bundle, and a client-only certificate its CA issued to
    tls/client.pem      this agent (client.key beside it), when this operator holds that CA
    zk-tls/...          what TLS to the source's ZooKeeper needs, when it uses TLS
    source.toml         the source's ZooKeeper connect string and the paths above, relative

Every file is 0600 in 0700 directories, uploaded by SFTP (never in argv, never through a shell),
and ``source.toml`` goes last: a present one names a complete set. Delivering again (re-running
init-replication) replaces them all with fresh ones, the certificate included; a worker already
reading the source keeps its open connections.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import pki
from .. import tomltext as toml
from ..certdir import CertDir
from ..errors import ConfigError
from ..inventory import Cluster, Node
from ..plan import Step
from ..remote.fanout import Deadline, FanoutEvent, fan_out, outcome
from ..remote.transport import Transport
from . import certs
from .agents import Fleet, FleetOptions, zk_tls_names

SOURCES_DIR = "sources"  # under an agent's home: what dlagent's [replication] sources_dir defaults to
SOURCE_FILE = "source.toml"
TLS_FILES = (("tls_ca_file", "tls/ca.pem"), ("tls_cert_file", "tls/client.pem"), ("tls_key_file", "tls/client.key"))


def source_dir(node: Node, source: str) -> str:
    return f"{node.home}/{SOURCES_DIR}/{source}"


def _source_ca(source: Cluster) -> CertDir | None:
    """The source's CA, when this operator holds it (``cluster init`` made it here)."""
    certdir = CertDir(source.tls_dir, source.name) if source.tls_dir is not None else None
    return certdir if certdir is not None and certdir.exists() else None


def bundle_for(source: Cluster, sink: str, node: Node, ca: CertDir | None) -> list[tuple[str, bytes]]:
    """(path under the node's ``sources/<source>/``, content) of every file to deliver, in
    delivery order, ``source.toml`` last. Reads the operator's files for the source now."""
    files: list[tuple[str, bytes]] = []
    keys: list[tuple[str, str]] = [("zookeeper", source.zookeeper)]
    assert source.secret_file is not None  # checked by credentials_step
    files.append(("secret", source.secret_file.read_bytes()))
    keys.append(("secret_file", "secret"))
    if source.zk_auth_file is not None:
        files.append(("zk-auth", source.zk_auth_file.read_bytes()))
        keys.append(("zk_auth_file", "zk-auth"))
    if ca is not None:
        issued = pki.issue(ca.ca(), f"dlagent {node.id} of {sink}, replication sink of {source.name}", server=False)
        for (key, name), data in zip(TLS_FILES, (ca.bundle(), issued.cert_pem, issued.key_pem)):
            files.append((name, data))
            keys.append((key, name))
    if source.zookeeper_tls is not None:
        for key, name in zk_tls_names(source.zookeeper_tls):
            files.append((f"zk-tls/{name}", Path(getattr(source.zookeeper_tls, key)).read_bytes()))
            keys.append((f"zookeeper_tls_{key}", f"zk-tls/{name}"))
    header = f"# Credentials of source cluster {source.name} for this agent (a sink of {sink}), installed by `dlctl init-replication`.\n"
    files.append((SOURCE_FILE, (header + "".join(toml.line(k, v) + "\n" for k, v in keys)).encode()))
    return files


def _deliver(t: Transport, node: Node, source: str, files: Sequence[tuple[str, bytes]], remaining: Callable[[], float]) -> None:
    t.run(["mkdir", "-p", "-m", "700", f"{node.home}/{SOURCES_DIR}"], timeout=remaining()).check()
    certs.upload_private(t, source_dir(node, source), files, remaining)


def credentials_step(
    source: Cluster, sink: Cluster, options: FleetOptions | None = None, progress: Callable[[FanoutEvent], None] | None = None, *,
    partial_ok: bool = False,
) -> tuple[Step | None, str | None]:
    """The step delivering ``source``'s credentials to every node of ``sink`` in the inventory,
    and a note for the plan (why there is no step, or what the agents will use). The step fails
    (``PartialFailure``, exit 3) when a node could not be reached, unless ``partial_ok`` (a
    failover must not wait for an agent that is down): then it reports the nodes it missed."""
    if not sink.nodes:
        return None, (
            f"credentials of {source.name}: the inventory lists no node of {sink.name}, so none are installed; "
            f"each {sink.name} agent must declare [replication.sources.{source.name}] in its agent.toml"
        )
    if source.secret_file is None or not source.secret_file.exists():
        raise ConfigError(
            f"cannot install the credentials of source cluster {source.name!r} on {sink.name!r}: its secret_file "
            + (f"{source.secret_file} does not exist" if source.secret_file else "is not in the inventory"),
            hint=f"run init-replication where the inventory has {source.name}'s secrets, or pass --no-install-credentials and declare the source in each agent's agent.toml",
        )
    ca = _source_ca(source)
    note = None if ca is not None else (
        f"credentials of {source.name}: this operator holds no CA of {source.name}, so {sink.name}'s agents reach it with their own TLS files"
    )
    nodes = list(sink.nodes)

    def deliver_all() -> dict[str, Any]:
        fleet = Fleet(sink, options or FleetOptions())

        def one(node: Node, deadline: Deadline) -> dict[str, Any]:
            files = bundle_for(source, sink.name, node, ca)
            _deliver(fleet.transport(node), node, source.name, files, lambda: max(1.0, deadline.remaining()))
            return {"directory": source_dir(node, source.name), "files": [name for name, _ in files], "tls": ca is not None}

        try:
            results = fan_out(nodes, one, timeout=max(fleet.options.timeout, 60.0), max_concurrency=fleet.options.max_concurrency, progress=progress)
        finally:
            fleet.close()
        if partial_ok and any(r.ok for r in results):
            return {
                **{r.host: r.value for r in results if r.ok},
                **{r.host: {"missed": r.error or r.status.value, "hint": f"re-run init-replication --source {source.name} --sink {sink.name} once it is back"} for r in results if not r.ok},
            }
        return outcome(results, action=f"install the credentials of {source.name}")

    what = "secret" + (", ZooKeeper credentials" if source.zk_auth_file else "") + (", a TLS client certificate of its CA" if ca else "") + (", its ZooKeeper's TLS files" if source.zookeeper_tls else "")
    step = Step(
        "install-credentials", f"{sink.name}: {', '.join(n.id for n in nodes)}",
        f"install {source.name}'s credentials ({what}; 0600) into <home>/{SOURCES_DIR}/{source.name}/ on {len(nodes)} agent(s) of {sink.name}",
        run=deliver_all,
    )
    return step, note
