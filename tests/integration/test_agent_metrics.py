"""Every agent's Prometheus endpoint, scraped from real ``dlagent serve`` processes.

The endpoint is found where the agent publishes it (its availability record; the harness binds
port 0), scraped over HTTP and parsed with prometheus_client's parser. The oracle is what the
test itself did: the entries it wrote and read with the real client, the files it counts in
the data directory, the records it appended at a replication source.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agents import AgentNode, harness_credentials
from harness.logcluster import eventually, run
from harness.procs import wait_until
from harness.twoclusters import Sites, sites_for_test
from prometheus_client.parser import text_string_to_metric_families

from dlctl.errors import ExitCode
from dlctl.log import format as fmt
from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.meta.store import MetaStore
from dlctl.meta.records import LogConfig
from dlctl.ops import replication as ops
from dlctl.ops import streams as stream_ops
from dlctl.plan import apply

pytestmark = [pytest.mark.zk, pytest.mark.agent]

LOG_ID, SEG = 77, 1


def scrape(address: str) -> dict[str, list]:
    """Every sample of the endpoint at ``address``, by sample name."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples carrying ``labels``; None when there is none."""
    found = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(found) if found else None


def entry(entry_id: int, size: int) -> bytes:
    return fmt.encode(fmt.Entry(LOG_ID, SEG, entry_id, entry_id - 1, os.urandom(size)))


@pytest.fixture
def admin(zk):
    return zk.client()


def test_counters_and_histograms_move_by_exactly_what_the_client_did_and_gauges_match_the_disk(procs, tmp_path, zk, admin):
    node = AgentNode(procs, tmp_path, zk.connect_string, sync="always").start(zk=admin)
    address = node.metrics_address(admin)
    assert address is not None and address.rsplit(":", 1)[0] == node.host and int(address.rsplit(":", 1)[1]) > 0
    before = scrape(address)
    assert value(before, "dlagent_info", node=node.node_id, cluster=node.cluster, region=node.region, rack=node.rack) == 1

    entries = [entry(i, 100 + 37 * i) for i in range(25)]  # sizes the test knows
    written = sum(map(len, entries))
    with node.client() as client:
        assert client.stat()["metrics"] == address  # the stat answer names it too
        for e in entries:
            client.add(e)  # one ADD_ENTRY request each
        read_back = [client.read(LOG_ID, SEG, i) for i in range(len(entries))]
        ranged, spans = client.read_range(LOG_ID, SEG, 0, len(entries) - 1, 1 << 20)
    assert read_back == entries and [bytes(ranged[a:b]) for a, b in spans] == entries
    after = scrape(address)

    def grew(name: str, **labels: str) -> float:
        return (value(after, name, **labels) or 0) - (value(before, name, **labels) or 0)

    assert grew("dlagent_written_entries_total") == len(entries)
    assert grew("dlagent_written_bytes_total") == written
    # Every entry went through group commit: the batches' sizes add up to what was written.
    assert grew("dlagent_group_commit_entries_sum") == len(entries)
    assert grew("dlagent_group_commit_bytes_sum") == written
    assert 1 <= grew("dlagent_group_commit_entries_count") <= len(entries)
    assert grew("dlagent_fsync_duration_seconds_count") > 0  # sync = always
    assert grew("dlagent_request_duration_seconds_count", op="add") == len(entries)
    assert grew("dlagent_request_duration_seconds_count", op="read") == len(entries)
    assert grew("dlagent_request_duration_seconds_count", op="read_range") == 1
    assert grew("dlagent_request_duration_seconds_bucket", op="add", le="+Inf") == len(entries)
    assert grew("dlagent_read_entries_total") == 2 * len(entries)  # each entry read alone, then in the range
    assert grew("dlagent_read_bytes_total") == 2 * written

    # State gauges against the data directory, as the test counts it.
    logs = list((node.data_dir / "segments").rglob("*.log"))
    assert value(after, "dlagent_segments") == len(logs) == 1
    assert value(after, "dlagent_segment_bytes") == written
    assert value(after, "dlagent_limbo_replicas") == 0
    # The file holds preallocated space too until the agent trims it (segment idle for a while).
    wait_until(lambda: sum(p.stat().st_size for p in logs) == written, 15, message="idle segment trimmed to its entries")
    assert value(scrape(address), "dlagent_segment_bytes") == sum(p.stat().st_size for p in logs)
    disk = shutil.disk_usage(node.data_dir)
    assert value(after, "dlagent_disk_total_bytes") == disk.total
    assert 0 < value(after, "dlagent_disk_free_bytes") <= disk.total
    # Roles exist as series whether or not this agent holds them; the lone agent is elected auditor.
    wait_until(lambda: value(scrape(address), "dlagent_role", role="auditor") == 1, 15, message="auditor role shown")


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (Linux /proc: its sockets' inodes in LISTEN)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_metrics_off_serves_nothing_and_publishes_no_address(procs, tmp_path, zk, admin):
    host = "127.0.0.91"  # an address of this test alone: nothing else may serve its default metrics port
    node = AgentNode(procs, tmp_path, zk.connect_string, host=host, metrics="off").start(zk=admin)
    assert "metrics" not in node.registration(admin)
    with node.client() as client:
        assert "metrics" not in client.stat()
    assert _listening_ports(node.proc.pid) == {node.port}  # the protocol server, nothing else
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, 9181), timeout=5).close()


def test_a_metrics_address_in_use_fails_the_start_naming_the_key_and_address(procs, tmp_path, zk, admin):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        node = AgentNode(procs, tmp_path, zk.connect_string, metrics=f"127.0.0.1:{port}").start(wait=False)
        assert node.proc.wait(timeout=30) == ExitCode.USAGE
    output = node.proc.output()
    assert f"[metrics] listen = '127.0.0.1:{port}'" in output and "address already in use" in output, output
    assert node.registration(admin) is None


def test_a_replica_deleted_on_a_live_agent_counts_as_reclaimed_there_and_refilled_by_the_auditor(procs, tmp_path, zk, admin):
    # Grace far beyond the test: only the survey of live replicas acts, every 0.3 s.
    auditor = "[auditor]\ncheck_seconds = 0.3\ngrace_seconds = 3600\n"
    nodes = {n: AgentNode(procs, tmp_path, zk.connect_string, node_id=n, extra_config=auditor) for n in ("n1", "n2", "n3")}
    for node in nodes.values():
        node.start(wait=False)
    for node in nodes.values():
        node.wait_ready(admin)
    addresses = {n: node.metrics_address(admin) for n, node in nodes.items()}
    meta = MetaStore(admin, "c1")
    meta.create_log("refilled", LogConfig(3, 3, 2))
    run(append(meta, "refilled", [f"r-{i}".encode() * 20 for i in range(200)]))
    (segment,) = [v.value for v in meta.segments("refilled")]
    log_id = meta.get_log("refilled").value.log_id
    victim = nodes["n3"]
    with victim.client() as client:
        replica_bytes = client.digest(log_id, segment.seq, 0, segment.last_entry_id).bytes
    (log_file,) = [p for p in victim.segment_files() if p.suffix == ".log"]
    wait_until(lambda: log_file.stat().st_size == replica_bytes, 15, message="the idle replica trimmed to its entries")
    freed = sum(p.stat().st_size for p in victim.segment_files() if p.suffix in (".log", ".fenced", ".limbo"))

    def the_auditor() -> str | None:
        leading = [n for n, addr in addresses.items() if value(scrape(addr), "dlagent_role", role="auditor") == 1]
        return leading[0] if len(leading) == 1 else None

    elected = wait_until(the_auditor, 20, message="one agent shows the auditor role")
    before, before_victim = scrape(addresses[elected]), scrape(addresses["n3"])
    with victim.client() as client:
        assert client.delete_segment(log_id, segment.seq)
    after_victim = scrape(addresses["n3"])
    assert value(after_victim, "dlagent_gc_deleted_segments_total") - value(before_victim, "dlagent_gc_deleted_segments_total") == 1
    assert value(after_victim, "dlagent_gc_reclaimed_bytes_total") - value(before_victim, "dlagent_gc_reclaimed_bytes_total") == freed

    def refilled() -> dict | None:
        samples = scrape(addresses[elected])
        done = value(samples, "dlagent_repair_segments_total", result="done") - value(before, "dlagent_repair_segments_total", result="done")
        return samples if done == 1 else None

    samples = wait_until(refilled, 30, message="the auditor's refill counted")
    assert value(samples, "dlagent_repair_copied_bytes_total") - value(before, "dlagent_repair_copied_bytes_total") == replica_bytes
    assert value(samples, "dlagent_repair_segments_total", result="stuck") == value(before, "dlagent_repair_segments_total", result="stuck")
    wait_until(lambda: value(scrape(addresses[elected]), "dlagent_under_replicated_segments") == 0, 15, message="a survey finding nothing under-replicated")
    assert value(scrape(addresses[elected]), "dlagent_repair_pending_segments") == 0
    assert [value(scrape(a), "dlagent_under_replicated_segments") for n, a in sorted(addresses.items()) if n != elected] == [0, 0]
    assert value(scrape(addresses["n3"]), "dlagent_segments") == 1  # the replica is back
    with victim.client() as client:
        assert client.digest(log_id, segment.seq, 0, segment.last_entry_id).bytes == replica_bytes


async def append(meta, name: str, payloads: list[bytes]) -> None:
    pool = AgentPool(meta, harness_credentials())
    try:
        writer = await LogWriter.open(meta, pool, name)
        try:
            for payload in payloads:
                writer.submit(payload)
            await writer.flush()
        finally:
            await writer.close()
    finally:
        await pool.close()


@pytest.fixture
def sites(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, proxied=False)


def test_a_running_streams_lag_and_applied_records_show_on_the_sink_agent_running_it(sites: Sites):
    a, b = sites["a"], sites["b"]
    addresses = {n: node.metrics_address(b.admin) for n, node in b.agents.items()}
    assert all(addresses.values()), addresses
    started = time.time()
    a.meta().create_log("metered", LogConfig())
    run(append(a.meta(), "metered", [f"m-{i}".encode() for i in range(5)]))
    built = ops.init_plan(a.session(), b.session(), patterns=("metered",))
    apply(built.plan)
    labels = {"stream": "a-to-b", "log": "metered"}

    def applied() -> float:
        # Summed over the sink's agents: the worker may move between them; each record counts once.
        return sum(value(scrape(addr), "dlagent_replication_applied_records_total", **labels) or 0 for addr in addresses.values())

    def caught_up() -> dict | None:
        # The agent whose worker runs the log reports its lag; the others leave it out.
        for addr in addresses.values():
            samples = scrape(addr)
            if value(samples, "dlagent_replication_lag_records", **labels) == 0:
                return samples
        return None

    run(eventually(lambda: applied() == 5, timeout=60, message="5 records applied"))
    samples = run(eventually(caught_up, timeout=30, message="a lag of 0 records"))
    assert value(samples, "dlagent_replication_lag_bytes", **labels) == 0
    assert value(samples, "dlagent_replication_lag_seconds", **labels) == 0
    assert started <= value(samples, "dlagent_replication_last_apply_timestamp_seconds", **labels) <= time.time()

    run(append(a.meta(), "metered", [f"m-{i}".encode() for i in range(5, 8)]))
    run(eventually(lambda: applied() == 8, timeout=60, message="8 records applied"))
    run(eventually(caught_up, timeout=30, message="a lag of 0 records again"))
    # What the status command measures agrees.
    status = stream_ops.stream_status(b.session(), a.session(), "a-to-b")
    assert status["logs"][0]["lag_records"] == 0
