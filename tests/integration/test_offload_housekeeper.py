"""Offload on truncation by the agents' elected housekeeper (issue 25 item 2), with real agents
and ZooKeeper and a filesystem cold store: once the cluster requires cold copies, the
housekeeper copies each truncated segment to the store and only then collects it; copies past
the log's cold retention are deleted, and only those (another log's stay). And with a real S3-compatible server (moto's, behind the
fault proxy so its requests are slow enough to be caught midway): the housekeeper SIGKILLed
between a segment's upload and its manifest, the next one elected resumes — every truncated
record copied exactly once, no segment collected without its copy. The oracle is the store read
directly (objects decoded with the wire format; S3 through its own API) and the segment records
in ZooKeeper."""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import replace

import pytest

from dlctl.cold.config import ColdStorageConfig
from dlctl.log.dlsn import DLSN
from dlctl.log.writer import LogWriter
from dlctl.meta import coldpolicy, roles
from dlctl.meta.records import LogConfig
from dlctl.meta.truncation import TruncationStore
from harness.coldcopies import segment_payloads
from harness.faultproxy import FaultNetwork
from harness.logcluster import LogEnv, agent_cluster, eventually, healed_env, run
from harness.s3server import s3_with_bucket

pytestmark = [pytest.mark.zk, pytest.mark.agent]


BUCKET = "offload"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from s3_with_bucket(tmp_path_factory, BUCKET)


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory, s3):
    config = f'[housekeeping]\ncheck_seconds = 0.3\ncold_credentials_file = "{s3.credentials_file}"\noffload_bytes_per_second = "1MiB"\n'
    yield from agent_cluster(zk_server, tmp_path_factory.mktemp("offload-agents"), "offload", extra_config=config)


@pytest.fixture
def env(cluster, request):
    yield from healed_env(cluster, request.node.name, LogEnv)


def payloads_in(store_dir) -> list[bytes]:
    return segment_payloads(p.read_bytes() for p in sorted(store_dir.rglob("*.segment")))


async def write_three(env) -> list[bytes]:
    """Three segments of 25 records (a writer of their own each)."""
    written = []
    for tag in ("a", "b", "c"):
        writer = await env.writer()
        batch = [f"{tag}-{i}".encode() for i in range(25)]
        await asyncio.gather(*(writer.submit(p) for p in batch))
        await writer.close()
        written += batch
    return written


async def write_segments(env, meta, name: str, count: int) -> None:
    """``count`` segments of 10 records in log ``name`` (a writer of their own each)."""
    pool = env.pool(meta)
    try:
        for i in range(count):
            writer = await LogWriter.open(meta, pool, name)
            await asyncio.gather(*(writer.submit(f"{name}-{i}-{j}".encode()) for j in range(10)))
            await writer.close()
    finally:
        await pool.close()


def test_the_housekeeper_copies_truncated_segments_before_collecting_them_and_sweeps_old_copies(env, tmp_path):
    env.create_log(LogConfig(3, 3, 2))
    meta = env.meta()
    store_dir = tmp_path / "cold"
    store_dir.mkdir()
    coldpolicy.publish(meta, ColdStorageConfig("filesystem", path=store_dir), None)
    try:
        written = run(write_three(env))
        TruncationStore(meta).advance(env.name, DLSN(3, 0, 0), reason="test", by="test")
        run(eventually(lambda: {s.value.seq for s in meta.segments(env.name)} == {3}, 30, "the housekeeper to collect segments 1 and 2"))
        assert payloads_in(store_dir) == written[:50], "collected without a complete copy"
        assert len(list(store_dir.rglob("*.manifest.json"))) == 2
        # Another log whose copies keep the cluster's retention (for ever).
        kept = f"{env.name}-kept"
        meta.create_log(kept, LogConfig(3, 3, 2))
        run(write_segments(env, meta, kept, 2))
        TruncationStore(meta).advance(kept, DLSN(2, 0, 0), reason="test", by="test")
        run(eventually(lambda: {s.value.seq for s in meta.segments(kept)} == {2}, 30, "the housekeeper to collect the other log's segment 1"))
        kept_copies = sorted(p.name for p in (store_dir / "logs" / kept).rglob("*") if p.is_file())
        assert len(kept_copies) == 2, kept_copies

        # The log's own cold retention (the cluster keeps copies for ever): they now outlive it.
        current = meta.get_log(env.name)
        meta.update_log_config(env.name, replace(current.value.config, cold_retention_seconds=0.5), current.version)
        mine = store_dir / "logs" / env.name
        run(eventually(lambda: not any(mine.rglob("*.segment")) and not any(mine.rglob("*.manifest.json")), 30, "expired copies to be deleted"))
        assert sorted(p.name for p in (store_dir / "logs" / kept).rglob("*") if p.is_file()) == kept_copies, "a copy within its retention was deleted"
    finally:
        coldpolicy.clear(meta)


def test_a_housekeeper_killed_between_upload_and_manifest_is_resumed_without_duplicates(env, cluster, s3):
    env.create_log(LogConfig(3, 3, 2))
    meta = env.meta()
    client, prefix = s3.client(), f"killed-{env.name}"
    host, port = s3.endpoint.removeprefix("http://").split(":")
    with FaultNetwork() as network:
        slow = network.proxy((host, int(port)))
        slow.set_delay(0.4)  # each request takes 0.8 s at least: a kill lands between two of them
        config = ColdStorageConfig("s3", bucket=BUCKET, prefix=prefix, endpoint=f"http://{slow.host}:{slow.port}", region="us-east-1")
        coldpolicy.publish(meta, config, None)
        try:
            written = run(write_three(env))
            log_id = meta.get_log(env.name).value.log_id
            key = f"{prefix}/logs/{env.name}/{log_id}/{2:019d}"

            def held() -> set[str]:
                listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
                return {o["Key"] for o in listed}

            TruncationStore(meta).advance(env.name, DLSN(3, 0, 0), reason="test", by="test")
            # Segment 2's object is stored and checked while its manifest is not written yet.
            run(eventually(lambda: f"{key}.segment" in held() and f"{key}.manifest.json" not in held(), 60, "segment 2 uploaded without its manifest"), 70)
            keeper = roles.holders(cluster.admin, meta.cluster, "housekeeping").holder
            cluster.agents[keeper].proc.kill()
            assert 2 in {s.value.seq for s in meta.segments(env.name)}, "segment 2 was collected before its manifest was written"
            slow.set_delay(0.0)

            run(eventually(lambda: {s.value.seq for s in meta.segments(env.name)} == {3}, 60, "another housekeeper to finish and collect"), 70)
            keys = held()
            segments = sorted(k for k in keys if k.endswith(".segment"))
            assert segments == [f"{prefix}/logs/{env.name}/{log_id}/{q:019d}.segment" for q in (1, 2)], keys
            assert keys == set(segments) | {k.replace(".segment", ".manifest.json") for k in segments}, "stray objects in the store"
            objects = [client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in segments]
            assert segment_payloads(objects) == written[:50], "a truncated record is missing or copied twice"
            manifests = [json.loads(client.get_object(Bucket=BUCKET, Key=k.replace(".segment", ".manifest.json"))["Body"].read()) for k in segments]
            assert [m["sha256"] for m in manifests] == [hashlib.sha256(o).hexdigest() for o in objects]
        finally:
            coldpolicy.clear(meta)
