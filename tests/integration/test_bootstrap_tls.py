"""``dlctl bootstrap`` between clusters whose agents serve mutual TLS only: real agents, real
ZooKeeper, real Spark in local mode, the CLI run as a subprocess.

Each TLS cluster has a CA of its own (``CertDir.ensure``, as ``dlctl cluster init`` makes it)
and its agents certificates issued from it (as ``dlctl agent install`` delivers them), so a
Spark task that presented one cluster's certificate to the other's agents would be refused in
the TLS handshake: the copy succeeds only if each executor-side pool speaks TLS with its own
cluster's material. A plaintext source (no tls_dir: ``ClusterSession.tls`` is None) must keep
working beside a TLS sink.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from harness.agents import AgentNode
from harness.logcluster import read_back
from harness.procs import wait_until
from harness.spark import SECURITY_SETTINGS, SparkStandalone

from dlctl import inventory
from dlctl import tomltext as toml
from dlctl.certdir import CertDir
from dlctl.config import ConfigLocation
from dlctl.log.client import AgentClient
from dlctl.log.errors import AgentUnavailableError
from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.meta.records import LogConfig
from dlctl.session import ClusterSession
from dlctl.replication.origin import decode_source_position
from dlctl.secrets import write_secret_file

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.spark, pytest.mark.slow]

SOURCE, SINK = "east", "west"
HOST = "127.0.0.1"


def tls_cluster(base: Path, name: str) -> CertDir:
    """The operator's tls_dir of ``name``: a CA of its own and the operator's certificate."""
    certs = CertDir(base / f"{name}.tls", name)
    certs.ensure()
    return certs


def start_cluster(procs, base: Path, zk_connect: str, name: str, certs: CertDir | None, nodes: int = 3) -> list[AgentNode]:
    agents = []
    for i in range(nodes):
        node_id = f"{name}{i + 1}"
        extra = ""
        if certs is not None:  # the agent's files, as `agent install` delivers them
            tls = base / name / node_id / "tls"
            tls.mkdir(mode=0o700, parents=True)
            issued = certs.issue_agent(node_id, [HOST])
            for fname, data in (("ca.pem", certs.bundle()), ("agent.pem", issued.cert_pem), ("agent.key", issued.key_pem)):
                write_secret_file(tls / fname, data)
            extra = "\n".join([toml.table("tls"), toml.line("ca_file", tls / "ca.pem"), toml.line("cert_file", tls / "agent.pem"), toml.line("key_file", tls / "agent.key"), ""])
        agents.append(AgentNode(procs, base / name, zk_connect, cluster=name, node_id=node_id, region=f"r-{name}", host=HOST, tls=False, extra_config=extra))
    for node in agents:
        node.start(wait=False)
    return agents


def write_inventory(path: Path, zk_connect: str, clusters: dict[str, tuple[list[AgentNode], CertDir | None]]) -> Path:
    lines = [f'default_cluster = "{SINK}"']
    for name, (agents, certs) in clusters.items():
        lines += [
            f"[clusters.{name}]",
            toml.line("zookeeper", zk_connect),
            toml.line("secret_file", agents[0].secret_file),
            toml.line("zk_auth_file", agents[0].zk_auth_file),
            # A plaintext cluster's tls_dir does not exist: its session has no TLS (warned about).
            toml.line("tls_dir", certs.path if certs is not None else path.parent / f"{name}.no-tls"),
            "",
        ]
    path.write_text("\n".join(lines))
    return path


def session(inv: Path, name: str) -> ClusterSession:
    return ClusterSession(inventory.load(ConfigLocation(inv, "test")).cluster(name))


async def fill(s: ClusterSession, name: str, segments: int, per_segment: int) -> None:
    pool = AgentPool(s.meta, s.credentials)
    try:
        i = 0
        for _ in range(segments):
            writer = await LogWriter.open(s.meta, pool, name)
            for _ in range(per_segment):
                writer.submit(b"r%08d-" % i + b"." * 300)
                i += 1
            await writer.close()
    finally:
        await pool.close()


def records_of(inv: Path, cluster: str, name: str) -> list:
    with session(inv, cluster) as s:
        return s.with_pool(lambda pool: read_back(s.meta, pool, name))


async def refused(address: str, secret: bytes, tls) -> bool:
    host, _, port = address.rpartition(":")
    client = AgentClient(host, int(port), secret, tls=tls, connect_timeout=2.0)
    try:
        await client.stat()
        return False
    except AgentUnavailableError:
        return True
    finally:
        await client.close()


def setup_clusters(zk, procs, tmp_path: Path, *, source_tls: bool, name: str) -> tuple[Path, bytes]:
    """Two clusters (the sink always TLS) and a source log of 3 segments; returns the inventory
    and the sink operator's key (which must show nowhere)."""
    base = tmp_path / "clusters"
    source_certs = tls_cluster(base, SOURCE) if source_tls else None
    sink_certs = tls_cluster(base, SINK)
    admin = zk.client()
    clusters = {
        SOURCE: (start_cluster(procs, base, zk.connect_string, SOURCE, source_certs), source_certs),
        SINK: (start_cluster(procs, base, zk.connect_string, SINK, sink_certs), sink_certs),
    }
    for agents, _ in clusters.values():
        for node in agents:
            node.wait_ready(admin)
    inv = write_inventory(tmp_path / "inventory.toml", zk.connect_string, clusters)
    with session(inv, SOURCE) as src, session(inv, SINK) as dst:
        assert (src.tls is not None) == source_tls and dst.tls is not None
        src.meta.create_log(name, LogConfig())
        asyncio.run(fill(src, name, segments=3, per_segment=20))
        secret = dst.secret
        # The sink's agents serve TLS only, and only to certificates of the sink's own CA.
        sink_address = dst.meta.available_nodes()[f"{SINK}1"]["address"]
        assert asyncio.run(refused(sink_address, secret, None))
        if source_tls:
            assert asyncio.run(refused(sink_address, secret, src.tls))
        return inv, dst.tls.key_file.read_bytes()


def bootstrap(inv: Path, name: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlctl.cli", "--config", str(inv), "-o", "json", "--yes", "bootstrap", "--source", SOURCE, "--sink", SINK, "--logs", name, *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SPARK_LOCAL_IP": HOST, **(env or {})},
    )


def assert_copied(inv: Path, name: str, result: subprocess.CompletedProcess[str], sink_key: bytes) -> dict:
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert sink_key.decode() not in result.stdout + result.stderr
    report = json.loads(result.stdout)
    (logres,) = report["logs"]
    assert logres["copied"] == 3 and logres["committed"]
    source, sink = records_of(inv, SOURCE, name), records_of(inv, SINK, name)
    assert len(source) == 60 and len(sink) == len(source)
    for (src_dlsn, src_rec), (_sink_dlsn, rec) in zip(source, sink):
        assert decode_source_position(rec.headers) == (SOURCE, src_dlsn)
        assert rec.payload == src_rec.payload
    return report


@pytest.mark.parametrize("source_tls", [True, False], ids=["tls-source-own-ca", "plaintext-source"])
def test_bootstrap_copies_between_clusters_over_mutual_tls_with_each_clusters_own_certificate(source_tls, zk, procs, tmp_path):
    name = "tls-copy"
    inv, sink_key = setup_clusters(zk, procs, tmp_path, source_tls=source_tls, name=name)
    assert_copied(inv, name, bootstrap(inv, name, "--parallelism", "2"), sink_key)


def test_on_a_standalone_spark_cluster_executors_get_the_tls_files_by_broadcast_in_private_scratch(zk, procs, tmp_path):
    """The files travel as broadcasts (Spark authentication and encryption on); each executor
    writes them under its own scratch dir (0700, files 0600), which Spark removes afterwards."""
    name = "tls-broadcast"
    inv, sink_key = setup_clusters(zk, procs, tmp_path, source_tls=True, name=name)
    spark = SparkStandalone(tmp_path / "spark", procs, cores=2, memory="1g").start()
    conf = {**SECURITY_SETTINGS, "spark.pyspark.python": sys.executable, "spark.executor.memory": "512m"}

    seen: dict[Path, tuple[int, list[int]]] = {}  # each TLS dir an executor made: its mode, its files'
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            try:
                found = list(spark.local_dir.rglob("dlctl-tls-*"))
            except OSError:  # a directory went while walking (Spark cleans up): look again
                continue
            for d in found:
                try:
                    # The fullest look wins: one may catch the files still being written, or
                    # Spark already removing them.
                    look = (stat.S_IMODE(d.stat().st_mode), sorted(stat.S_IMODE(f.stat().st_mode) for f in d.iterdir()))
                    if d not in seen or len(look[1]) >= len(seen[d][1]):
                        seen[d] = look
                except OSError:  # removed meanwhile
                    pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = bootstrap(inv, name, "--spark-master", spark.url, *(a for k, v in conf.items() for a in ("--conf", f"{k}={v}")), env={"SPARK_CONF_DIR": str(spark.client_conf_dir())})
    finally:
        done.set()
        watcher.join()
    report = assert_copied(inv, name, result, sink_key)
    assert {d.name.split("-")[2] for d in seen} == {SOURCE, SINK}, seen
    assert all(m == (0o700, [0o600, 0o600, 0o600]) for m in seen.values()), seen
    # Nothing of the key in what Spark logged (the driver's log, the master's and worker's).
    with open(report["spark_log"], errors="replace") as driver_log:
        assert sink_key.decode() not in driver_log.read()
    for proc in procs:
        assert sink_key.decode() not in proc.output(), proc.describe()
    # The application's scratch, TLS files included, is deleted once it is over.
    wait_until(lambda: not list(spark.local_dir.rglob("dlctl-tls-*")), 30, message="the executors' TLS dirs to be removed", watch=[spark.worker])
