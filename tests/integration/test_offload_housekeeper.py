"""Offload on truncation by the agents' elected housekeeper (issue 25 item 2), with real agents
and ZooKeeper and a filesystem cold store: once the cluster requires cold copies, the
housekeeper copies each truncated segment to the store and only then collects it; copies past
the log's cold retention are deleted. The oracle is the store read directly (objects decoded with the
wire format) and the segment records in ZooKeeper."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from dlctl.cold.config import ColdStorageConfig
from dlctl.log.dlsn import DLSN
from dlctl.meta import coldpolicy
from dlctl.meta.records import LogConfig
from dlctl.meta.truncation import TruncationStore
from harness.coldcopies import segment_payloads
from harness.logcluster import LogEnv, agent_cluster, eventually, healed_env, run

pytestmark = [pytest.mark.zk, pytest.mark.agent]


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    yield from agent_cluster(zk_server, tmp_path_factory.mktemp("offload-agents"), "offload", extra_config="[housekeeping]\ncheck_seconds = 0.3\n")


@pytest.fixture
def env(cluster, request):
    yield from healed_env(cluster, request.node.name, LogEnv)


def payloads_in(store_dir) -> list[bytes]:
    return segment_payloads(p.read_bytes() for p in sorted(store_dir.rglob("*.segment")))


def test_the_housekeeper_copies_truncated_segments_before_collecting_them_and_sweeps_old_copies(env, tmp_path):
    env.create_log(LogConfig(3, 3, 2))
    meta = env.meta()
    store_dir = tmp_path / "cold"
    store_dir.mkdir()
    coldpolicy.publish(meta, ColdStorageConfig("filesystem", path=store_dir), None)
    try:

        async def write() -> list[bytes]:
            written = []
            for tag in ("a", "b", "c"):
                writer = await env.writer()
                batch = [f"{tag}-{i}".encode() for i in range(25)]
                await asyncio.gather(*(writer.submit(p) for p in batch))
                await writer.close()
                written += batch
            return written

        written = run(write())
        TruncationStore(meta).advance(env.name, DLSN(3, 0, 0), reason="test", by="test")
        run(eventually(lambda: {s.value.seq for s in meta.segments(env.name)} == {3}, 30, "the housekeeper to collect segments 1 and 2"))
        assert payloads_in(store_dir) == written[:50], "collected without a complete copy"
        assert len(list(store_dir.rglob("*.manifest.json"))) == 2

        # The log's own cold retention (the cluster keeps copies for ever): they now outlive it.
        current = meta.get_log(env.name)
        meta.update_log_config(env.name, replace(current.value.config, cold_retention_seconds=0.5), current.version)
        run(eventually(lambda: not any(store_dir.rglob("*.segment")) and not any(store_dir.rglob("*.manifest.json")), 30, "expired copies to be deleted"))
    finally:
        coldpolicy.clear(meta)
