"""Scrubbing in real agent processes: bit rot under a live agent is found by its scrubber before
anyone reads it, the replica goes to limbo, and the log still reads back exactly from the others.

Three real agents (regions r1, r2, r3, so a reader in r1 asks n1 first) scrub every half second;
a real writer fills and completes a segment; the damage is a real bit flipped in n1's file while
n1 runs. Nothing reads the segment before the scrubber's finding is awaited, so the finding can
only be the scrubber's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from dlctl.log import format as fmt
from dlctl.log.errors import AgentError, LimboError
from dlctl.log.reader import LogReader, ReadAhead
from dlctl.meta import roles
from dlctl.meta.records import SegmentState
from harness.agents import AgentNode
from harness.logcluster import CLUSTER, AgentCluster, LogEnv, run
from harness.procs import ProcessRegistry, wait_until
from harness.zk import ZkNamespace

pytestmark = [pytest.mark.zk, pytest.mark.agent]

NODES = ("n1", "n2", "n3")
# The default rate, passes back to back. Auditing is switched off cluster-wide until the end: it
# would refill n1's replica from its peers (in place) at its next check, maybe before this test
# has looked at what the scrubber did; then it is switched on and must repair the replica.
SCRUB = "[scrub]\ninterval = 0.5\n[auditor]\ncheck_seconds = 0.5\n"


@pytest.fixture
def cluster(zk_server, tmp_path) -> Iterator[AgentCluster]:
    zk_server.ensure_running()
    ns = ZkNamespace(zk_server, label="test_scrub")
    procs = ProcessRegistry(tmp_path / "procs")
    try:
        admin = ns.client()
        roles.write_auditor_switch(admin, CLUSTER, False)
        agents = {
            node: AgentNode(procs, tmp_path, ns.connect_string, cluster=CLUSTER, node_id=node, region=f"r{i}", extra_config=SCRUB)
            for i, node in enumerate(NODES, start=1)
        }
        for node in agents.values():
            node.start(wait=False)
        for node in agents.values():
            node.wait_ready(admin)
        yield AgentCluster(ns, procs, agents, admin, tmp_path)
    finally:
        procs.close()
        ns.close()


def stat_when(client, condition) -> dict | None:
    """The agent's stat once ``condition(stat)`` holds (for ``wait_until``)."""
    stat = client.stat()
    return stat if condition(stat) else None


def entry_offset(data: bytes, entry_id: int) -> int:
    """Where entry ``entry_id`` starts in a replica file (walking the headers)."""
    pos = 0
    while pos < len(data):
        header = fmt.decode_header(data[pos : pos + fmt.HEADER_SIZE])
        if header.entry_id == entry_id:
            return pos
        pos += header.total_size
    raise AssertionError(f"entry {entry_id} not in the file")


def test_a_bit_flipped_under_a_live_agent_is_found_by_its_scrubber_and_readers_get_the_data_from_the_others(cluster):
    env = LogEnv(cluster, "scrubbed")
    records = [f"record-{i:04d}-".encode() * 40 for i in range(300)]
    try:
        env.create_log()

        async def write() -> None:
            writer = await env.writer(batch_bytes=8192)
            for first in range(0, len(records), 50):
                await asyncio.gather(*(writer.submit(r) for r in records[first : first + 50]))
            await writer.close()

        run(write())
        meta = env.meta()
        (seg,) = [s.value for s in meta.segments(env.name)]
        assert seg.state is SegmentState.COMPLETED and seg.last_entry_id >= 10
        log_id = meta.get_log(env.name).value.log_id
        n1 = cluster.agents["n1"]
        path = n1.data_dir / "segments" / f"{log_id:016x}" / f"{seg.seq:016x}.log"
        data = path.read_bytes()
        victim = seg.last_entry_id // 2
        at = entry_offset(data, victim)
        with open(path, "r+b") as f:  # bit rot in a durable entry of a completed segment, n1 running
            f.seek(at + fmt.HEADER_SIZE + 17)
            byte = f.read(1)
            f.seek(at + fmt.HEADER_SIZE + 17)
            f.write(bytes([byte[0] ^ 0x08]))

        with n1.client() as c:
            stat = wait_until(lambda: stat_when(c, lambda s: s["scrub_damaged"] >= 1), 30, message="n1's scrubber to find the flipped bit", watch=n1.proc)
            assert stat["scrub_damaged"] == 1 and stat["limbo"] == 1 and stat["scrub_enabled"]
            for entry_id in (0, victim, seg.last_entry_id):  # the whole replica stops serving
                with pytest.raises(LimboError):
                    c.read(log_id, seg.seq, entry_id)
        marker = wait_until(lambda: path.with_suffix(".limbo").exists() and json.loads(path.with_suffix(".limbo").read_text()), 10, message="the durable limbo marker")
        assert marker["offset"] == at and marker["reason"].startswith(f"found by scrubbing: entry {victim}: CRC-32C mismatch")
        assert f"{path} in limbo: found by scrubbing: entry {victim}" in n1.proc.output()  # logged with file and reason
        assert f"at offset {at}" in n1.proc.output()

        for node in ("n2", "n3"):  # their copies were scrubbed too, and are sound
            with cluster.agents[node].client() as c:
                stat = wait_until(lambda c=c: stat_when(c, lambda s: s["scrub_entries"] > seg.last_entry_id), 30, message=f"{node} scrubbing the segment")
                assert stat["scrub_damaged"] == 0 and stat["limbo"] == 0

        async def read_all() -> tuple[list[bytes], int]:
            pool = env.pool(meta)
            try:
                async with LogReader(meta, pool, env.name, region="r1", read_ahead=ReadAhead(max_entries=1)) as reader:
                    got = []
                    for _ in records:
                        record = await reader.read_next(10)
                        assert record is not None, f"timed out after {len(got)} records"
                        got.append(record.payload)
                    return got, reader.replicas.stats.replica_failures
            finally:
                await pool.close()

        got, failures = run(read_all())
        assert got == records  # every record, byte for byte (CRCs verified end to end)
        assert failures >= 1  # n1, in r1 like the reader, was asked first and answered limbo
        assert path.read_bytes()[at + fmt.HEADER_SIZE + 17] == data[at + fmt.HEADER_SIZE + 17] ^ 0x08  # left for re-replication

        # Auditing on: the elected auditor finds the limbo replica and refills it in place.
        roles.write_auditor_switch(cluster.admin, CLUSTER, True)

        def repaired() -> bool:
            with n1.client() as c1, cluster.agents["n2"].client() as c2:
                try:
                    mine = c1.digest(log_id, seg.seq, 0, seg.last_entry_id)
                except AgentError:  # limbo still, or deleted and not yet refilled
                    return False
                theirs = c2.digest(log_id, seg.seq, 0, seg.last_entry_id)
                return (mine.entries, mine.digest) == (theirs.entries, theirs.digest) == (seg.last_entry_id + 1, theirs.digest)

        wait_until(repaired, 60, message="the auditor refilling n1's limbo replica", watch=n1.proc)
        with n1.client() as c:
            assert c.read(log_id, seg.seq, victim) == data[at : at + len(c.read(log_id, seg.seq, victim))]  # the original bytes
    finally:
        env.close()
