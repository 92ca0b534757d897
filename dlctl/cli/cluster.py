"""``dlctl cluster init|status|check|roles|certs|rotate-certs`` and ``dlctl cluster auditor enable|disable``."""

from __future__ import annotations

import click

from ..ops import agents
from ..ops import certs as certs_ops
from ..ops import cluster as cluster_ops
from ..ops import health as health_ops
from ..ops import offload as offload_ops
from ..ops import roles as roles_ops
from ..output import Table, human_bytes
from ..plan import Plan
from .agent import fleet_from, fleet_progress, fleet_options
from .complete import complete_log
from .context import AppContext, command_options, mutating, pass_app
from .truncate import DURATION


@click.group("cluster")
def cluster_group() -> None:
    """Initialise a cluster and see the state of its nodes."""


@cluster_group.command("init")
@click.option("--insecure-zookeeper", is_flag=True, help="Allow a cluster whose inventory says insecure_zookeeper = true: world-writable znodes.")
@click.option("--tls/--no-tls", default=True, show_default=True, help="Create the cluster CA and the operator's certificate (tls_dir); --no-tls: plaintext agent traffic, warned about by every command.")
@mutating(confirm=False)
def cluster_init(app: AppContext, insecure_zookeeper: bool, tls: bool) -> Plan:
    """Create the cluster's secrets (0600 files, if missing: the cluster secret and the ZooKeeper
    digest credentials), its certificate authority and the operator's TLS certificate (tls_dir;
    agents get theirs from `dlctl agent install`), its ZooKeeper layout with the cluster's ACL on
    every znode, marked as made by this cluster's secret, and a record for every node of the
    inventory. Safe to re-run; an existing layout it did not make (no matching marker) is
    refused (exit 4), naming it."""
    return cluster_ops.init_plan(app.session(), insecure_zookeeper=insecure_zookeeper, tls=tls)


@cluster_group.command("certs")
@command_options
@pass_app
def cluster_certs(app: AppContext) -> None:
    """The cluster's TLS as this operator holds it: the CAs trusted, the one signing, the
    operator's certificate and its expiry, and whether a CA rotation is under way."""
    app.render(certs_ops.status(app.session().certdir))


@cluster_group.command("rotate-certs")
@fleet_options(region_serial_default=False, concurrency_default=4)
@click.option("--new-ca", is_flag=True, help="Also replace the CA (three rounds: trust both, re-issue, trust only the new); resumes an interrupted one.")
@mutating(confirm=True)
def cluster_rotate_certs(app: AppContext, node_ids, region, max_concurrency, region_serial, timeout, ssh_accept_new, new_ca: bool) -> Plan:
    """Issue every agent a new certificate and deliver it (SFTP, 0600); each agent picks it up
    for its next connections without a restart, and each is checked to present it. Open
    connections keep working throughout. With --new-ca the CA itself is replaced."""
    session = app.session()
    certdir = session.certdir
    if certdir is None:
        raise click.UsageError(f"cluster {session.cluster.name!r} has no tls_dir")
    nodes = agents.select_nodes(session.cluster, node_ids, region)
    if new_ca and (node_ids or region):
        raise click.UsageError("--new-ca replaces the CA of every agent: it cannot be limited with --node or --region")
    fleet = fleet_from(app, ssh_accept_new, max_concurrency, region_serial, timeout)
    return certs_ops.rotate_plan(fleet, certdir, nodes, new_ca=new_ca, progress=fleet_progress(app, len(nodes)))


@cluster_group.command("status")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=3.0, show_default=True, help="Per-agent timeout for its statistics.")
@command_options
@pass_app
def cluster_status(app: AppContext, timeout: float) -> None:
    """Nodes by region and rack: up, down or unreachable; address, metrics endpoint, version,
    segments, disk, and the space reclaimed by deleting replicas (garbage collection of
    truncated segments); the cluster's cold store, if any (config show -o json has it too)."""
    rows = cluster_ops.status(app.session(), timeout)
    reclaimed = sum(r.get("reclaimed_bytes") or 0 for r in rows)
    cold = app.session().cluster.cold_storage
    app.render(
        Table(
            rows,
            columns=["region", "rack", "node", "address", "metrics", "state", "version", "segments", "data_bytes", "reclaimed_bytes", "disk_free_bytes", "limbo"],
            title=f"cluster {app.session().cluster.name}",
            caption=f"reclaimed by garbage collection: {human_bytes(reclaimed)} on the agents that answered; "
            f"cold store: {cold.describe() if cold else 'none'}",
        )
    )


@cluster_group.command("metrics-targets")
@command_options
@pass_app
def cluster_metrics_targets(app: AppContext) -> None:
    """Where the cluster's agents serve their Prometheus metrics, as Prometheus file_sd target
    groups (-o json writes the file Prometheus reads; see deploy/prometheus/prometheus.yml):
    every agent of the inventory at its last published endpoint, labelled cluster, node, region
    and rack. A dead agent stays listed, so Prometheus reports it down."""
    groups = cluster_ops.metrics_targets(app.session())
    if app.output == "table":
        rows = [{"node": g["labels"]["node"], "target": g["targets"][0], "region": g["labels"]["region"], "rack": g["labels"]["rack"]} for g in groups]
        app.render(Table(rows, columns=["node", "target", "region", "rack"], title=f"metrics targets of cluster {app.session().cluster.name}"))
    else:
        app.render(groups)


@cluster_group.command("check")
@click.option("--log", "logs", multiple=True, shell_complete=complete_log, help="Check only this log (repeatable); default: every log.")
@click.option("--deep", is_flag=True, help="Also compare the members' digests of every completed segment (one request per replica).")
@command_options
@pass_app
def cluster_check(app: AppContext, logs: tuple[str, ...], deep: bool) -> None:
    """Monitoring check of replica health: exit 0 healthy, 1 degraded (an under-replicated
    completed segment, a limbo replica, an agent down), 2 critical (some entry has fewer healthy
    copies than its ack quorum). Lists each under-replicated segment with its members' causes:
    missing, limbo (corrupt, cut, or lost with a replaced disk), short, recorded short, unreachable,
    agent down; with --deep also divergent (its digest differs from the majority's) or conflict."""
    result = health_ops.check(app.session(), logs or None, deep=deep)
    if app.output == "table":
        app.stdout.print(
            f"{result['status']}: cluster {result['cluster']}: {result['segments_checked']} completed segment(s) checked, "
            f"{result['under_replicated_segments']} under-replicated" + "".join(f"\n  {p}" for p in result["findings"]),
            markup=False, highlight=False,
        )
    else:
        app.render(result)
    if result["code"]:
        raise click.exceptions.Exit(result["code"])


@cluster_group.command("roles")
@command_options
@pass_app
def cluster_roles(app: AppContext) -> None:
    """The cluster-wide roles agents hold by election: the re-replication auditor and the
    housekeeper (retention, GC). Shows the holder, the agents standing behind it (the first
    takes over when the holder goes), and whether auditing is switched on."""
    app.render(Table(roles_ops.status(app.session()), columns=["role", "holder", "contenders", "enabled", "problem"], title=f"roles in {app.session().cluster.name}"))


@cluster_group.group("auditor")
def auditor_group() -> None:
    """Switch re-replication of lost agents on or off for the whole cluster."""


@auditor_group.command("enable")
@mutating(confirm=False)
def auditor_enable(app: AppContext) -> Plan:
    """Let the elected auditor re-replicate agents gone for longer than their grace period
    (the default). The grace period starts again from now."""
    return roles_ops.auditor_switch_plan(app.session(), True)


@auditor_group.command("disable")
@mutating()
def auditor_disable(app: AppContext) -> Plan:
    """Stop re-replicating lost agents in the whole cluster (e.g. during planned maintenance of
    a rack, so its agents are not copied elsewhere while they are down on purpose). Agents'
    own ``[auditor] enabled`` settings are unaffected."""
    return roles_ops.auditor_switch_plan(app.session(), False)


@cluster_group.group("cold-storage")
def cold_storage_group() -> None:
    """Require (or stop requiring) a cold copy before truncated segments leave the cluster."""


@cold_storage_group.command("enable")
@click.option("--retention", type=DURATION, metavar="DURATION", help="Delete cold copies this long after they were stored (e.g. 90d); default: keep them.")
@mutating(confirm=False)
def cold_storage_enable(app: AppContext, retention: float | None) -> Plan:
    """Publish the inventory's [clusters.<c>.cold_storage] as the cluster's cold store: from then
    on the agents' housekeeper and `dlctl gc` copy every truncated segment there (read back and
    checked) before its record and replicas are removed; a segment whose copy fails stays. With
    --retention, copies older than it are deleted. Credentials are never published: agents use
    [housekeeping] cold_credentials_file in agent.toml."""
    session = app.session()
    return offload_ops.enable_plan(session, retention)


@cold_storage_group.command("disable")
@mutating()
def cold_storage_disable(app: AppContext) -> Plan:
    """Stop requiring cold copies: truncated segments are collected without one from then on
    (the copies already made stay)."""
    session = app.session()
    return offload_ops.disable_plan(session)
