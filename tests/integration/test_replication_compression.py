"""Records cross the WAN compressed (issue 23), between real clusters of real agents.

Three one-agent clusters on one ZooKeeper: ``a`` and ``c`` are sources of ``b``; ``c``'s agent
runs with ``[server] compression = false``, so it refuses FLAG_COMPRESS exactly as an agent that
predates it does. Both streams ask for zstd. Judged on what the sink holds (every record once,
in order), on ``replication status`` (the compression in effect and its ratio), and on the
bytes the fault proxy between the clusters forwarded from each source agent to the sink's,
against the test's own count of the payload bytes it wrote.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.faultproxy import FaultNetwork
from harness.logcluster import eventually, run
from harness.procs import ProcessRegistry
from harness.twoclusters import Sites, read_all, replication_sites, run_cli
from test_replication import write

from dlctl.meta.records import LogConfig
from dlctl.ops import streams as stream_ops
from dlctl.replication.store import StreamStore

pytestmark = pytest.mark.zk

ONE = LogConfig(ensemble_size=1, write_quorum=1, ack_quorum=1)


@pytest.fixture
def sites(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    zk_server.ensure_running()
    procs = ProcessRegistry(tmp_path / "procs")
    with FaultNetwork() as network:
        yield from replication_sites(
            zk_server, tmp_path, procs, network, request.node.name, clusters=("a", "b", "c"), nodes=1,
            cluster_options={"c": "[server]\ncompression = false\n"},
        )


def events(source: str, n: int, start: int = 0) -> list[bytes]:
    """JSON-like application events of about 1.5 KB: compressible, as most are, and large
    enough that the payloads outweigh the stream's own traffic (probes, long polls, TLS)."""
    return [
        json.dumps({
            "id": i, "source": source, "type": "order.created", "customer": f"customer-{i % 37:04d}",
            "items": [{"sku": f"SKU-{(i * 7 + k) % 101:05d}", "qty": k + 1, "price_cents": 1999 + 100 * k, "warehouse": f"wh-{k % 3}"} for k in range(16)],
            "status": "pending", "shipping": {"method": "standard", "region": "eu-west-1", "gift": False},
        }).encode()
        for i in range(start, start + n)
    ]


def from_source(sites: Sites, source: str) -> int:
    """Bytes the fault proxies forwarded from ``source``'s agents to ``b``'s (agent traffic)."""
    return sum(p.bytes_forwarded["down"] for p in sites.network.proxies if p.name.endswith("-for-b") and p.name.split("-for-")[0] in sites[source].agents)


def test_a_stream_reads_compressed_and_falls_back_to_plain_from_an_agent_without_zstd(sites: Sites, tmp_path: Path):
    inventory = sites.write_inventory(tmp_path / "inventory.toml")
    written: dict[str, list[bytes]] = {}
    last = {}
    for source in ("a", "c"):
        log = f"{source}-events"
        sites[source].meta().create_log(log, ONE)
        written[source] = events(source, 200)
        run(write(sites[source].meta(), log, written[source]))
        code, out, err = run_cli(inventory, "init-replication", "--source", source, "--sink", "b", "--logs", log, "--compression", "zstd")
        assert code == 0, (out, err)
        more = events(source, 100, start=200)  # written while the stream runs: long polls carry them
        last[source] = run(write(sites[source].meta(), log, more))[-1]
        written[source] += more

    for source in ("a", "c"):
        log = f"{source}-events"
        records = run(read_all(sites["b"].meta(), log, until=300, timeout=60))
        assert [r.payload for r in records] == written[source]
        assert len(run(read_all(sites["b"].meta(), log, idle=1.0))) == 300  # nothing twice
        stream = f"{source}-to-b"
        run(eventually(
            lambda: StreamStore(sites["b"].meta()).get_checkpoint(stream, log).value.next > last[source], timeout=20,
            message=f"{stream}'s checkpoint past its last record",
        ))

    payload = {s: sum(map(len, written[s])) for s in written}
    code, status, err = run_cli(inventory, "replication", "status", "a-to-b", "--sink", "b", "-o", "json")
    assert code == 0, err
    assert status["compression"] == "zstd"
    (row,) = status["logs"]
    assert row["compression"] == "zstd" and row["compression_ratio"] > 3, row
    assert row["wire_bytes"] * 3 < payload["a"] <= row["wire_payload_bytes"], (row, payload)
    # The real wire: everything a's agent sent b's, TLS and probes included, is less than the
    # payloads it carried.
    assert from_source(sites, "a") < payload["a"], (from_source(sites, "a"), payload)

    status = stream_ops.stream_status(sites["b"].session(), sites["c"].session(), "c-to-b")
    (row,) = status["logs"]
    assert row["compression"] == "none (source agent lacks zstd)" and row["compression_ratio"] == 1.0, row
    assert row["wire_bytes"] == row["wire_payload_bytes"] >= payload["c"]
    assert from_source(sites, "c") > payload["c"]

    # Back to plain by the operator's choice: the stream restarts its workers and says so.
    code, out, err = run_cli(inventory, "init-replication", "--source", "a", "--sink", "b", "--logs", "a-events", "--compression", "none")
    assert code == 0, (out, err)
    assert StreamStore(sites["b"].meta()).get_config("a-to-b").value.compression == "none"
