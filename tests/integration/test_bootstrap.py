"""``dlctl bootstrap`` on real clusters: a two-cluster sandbox (real ZooKeeper, six real agents),
real Spark in local mode, the CLI run as a real subprocess (killed for real), real bit flips in
agents' segment files and the real ``dlctl truncate``.

Each test checks what the sink really holds, read back from its agents: every source record
exactly once, in source order, with its origin (``dl.origin.*``, ``dl.vt``, ``dl.src``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dlctl import inventory
from dlctl.config import ConfigLocation
from dlctl.errors import ExitCode, RefusedError
from dlctl.log import format as fmt
from dlctl.log.client import SyncAgentClient
from dlctl.log.dlsn import DLSN
from dlctl.log.pool import AgentPool
from dlctl.log.reader import LogReader
from dlctl.log.readpolicy import speculative_order
from dlctl.log.writer import LogWriter
from dlctl.meta import roles
from dlctl.meta.pins import PinStore
from dlctl.meta.records import LogConfig
from dlctl.ops.source_credentials import credentials_step, source_dir
from dlctl.session import ClusterSession
from dlctl.replication.causal import SourceClock
from dlctl.replication.origin import SOURCE_POSITION, Origin, decode_source_position, encode_source_position
from dlctl.spark import jobplan
from harness.logcluster import read_back
from harness.procs import pid_alive, process_tree, wait_until

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.spark, pytest.mark.slow]

SOURCE, SINK = "east", "west"


def dlctl(env: dict[str, str], *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dlctl.cli", *argv], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})


def start_dlctl(env: dict[str, str], *argv: str, log: Path) -> subprocess.Popen:
    out = open(log, "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-m", "dlctl.cli", *argv], stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    base = tmp_path_factory.mktemp("bootstrap-sbx")
    env = {"DLCTL_SANDBOX_DIR": str(base), "DLCTL_CONFIG": str(base / "config.toml")}
    up = dlctl(env, "--yes", "sandbox", "up", "--clusters", "2", "--regions", "1", "--nodes-per-region", "3")
    assert up.returncode == 0, up.stderr
    yield env
    dlctl(env, "--yes", "sandbox", "down", "--purge")


def session(env: dict[str, str], name: str) -> ClusterSession:
    return ClusterSession(inventory.load(ConfigLocation(Path(env["DLCTL_CONFIG"]), "test")).cluster(name))


async def fill(src: ClusterSession, name: str, segments: int, per_segment: int, size: int, first: int = 0) -> None:
    """``segments`` completed segments of ``per_segment`` records each (one writer per segment:
    closing a writer completes its segment)."""
    pool = AgentPool(src.meta, src.credentials)
    try:
        i = first
        for _ in range(segments):
            writer = await LogWriter.open(src.meta, pool, name)
            for _ in range(per_segment):
                writer.submit(b"r%08d-" % i + b"." * (size - 10))
                i += 1
            await writer.close()
    finally:
        await pool.close()


def create_source_log(env: dict[str, str], name: str, segments: int, per_segment: int, size: int) -> None:
    with session(env, SOURCE) as src:
        src.meta.create_log(name, LogConfig())
        asyncio.run(fill(src, name, segments, per_segment, size))


def records_of(env: dict[str, str], cluster: str, name: str) -> list:
    with session(env, cluster) as s:
        return s.with_pool(lambda pool: read_back(s.meta, pool, name))


def assert_sink_holds_source(source: list, sink: list, *, origin: str = SOURCE) -> None:
    """Every source record once, in order, with its origin headers naming where it was."""
    assert len(sink) == len(source), f"sink holds {len(sink)} records, source {len(source)}"
    for (src_dlsn, src_rec), (sink_dlsn, rec) in zip(source, sink):
        where = decode_source_position(rec.headers)
        assert where == (origin, src_dlsn), f"sink record {sink_dlsn} says it came from {where}, expected {origin}@{src_dlsn}"
        o = Origin.from_headers(rec.headers)
        assert o is not None and o.cluster == origin and o.dlsn == src_dlsn
        assert (rec.txid, rec.payload, rec.key) == (src_rec.txid, src_rec.payload, src_rec.key)
        assert {k: v for k, v in rec.headers.items() if not k.startswith("dl.")} == dict(src_rec.headers)


def sink_segments(env: dict[str, str], name: str) -> list:
    with session(env, SINK) as s:
        if name not in s.meta.list_logs():
            return []
        return [v.value for v in s.meta.segments(name)]


def bootstrap(env: dict[str, str], name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return dlctl(env, "-o", "json", "--yes", "bootstrap", "--source", SOURCE, "--sink", SINK, "--logs", name, *extra)


# -- 200 segments, concurrent source writes, then streaming from the snapshot point ----------------


class SourceWriter(threading.Thread):
    """Appends to the source log until stopped (its own event loop and ZooKeeper session)."""

    def __init__(self, env: dict[str, str], name: str, first: int) -> None:
        super().__init__(daemon=True)
        self.env, self.name, self.first = env, name, first
        self.stop = threading.Event()
        self.written = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with session(self.env, SOURCE) as src:
                asyncio.run(self._write(src))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    async def _write(self, src: ClusterSession) -> None:
        pool = AgentPool(src.meta, src.credentials)
        writer = await LogWriter.open(src.meta, pool, self.name, roll_bytes=16 * 1024)
        try:
            i = self.first
            while not self.stop.is_set():
                await writer.append(b"c%08d-" % i + b"+" * 290)
                i += 1
                self.written += 1
                await asyncio.sleep(0.002)
        finally:
            await writer.close()
            await pool.close()


async def stream_from(src: ClusterSession, dst: ClusterSession, name: str, snapshot: DLSN, source_vv: dict, count: int) -> int:
    """A stand-in for the replication worker (issue 8): read the source from the snapshot
    point and append each record to the sink with its origin, as a stream would."""
    src_pool, dst_pool = AgentPool(src.meta, src.credentials), AgentPool(dst.meta, dst.credentials)
    clock = SourceClock(SOURCE, source_vv)
    writer = await LogWriter.open(dst.meta, dst_pool, name)
    appended = 0
    try:
        async with LogReader(src.meta, src_pool, name, start_dlsn=snapshot) as reader:
            while appended < count:
                record = await reader.read_next(timeout=10)
                assert record is not None, f"the source ran dry after {appended} of {count} records past the snapshot"
                origin = Origin.from_headers(record.headers)
                vt = clock.stamp(origin)
                headers = dict(record.headers)
                if origin is None:
                    headers.update(Origin(SOURCE, record.dlsn, vt).headers())
                headers[SOURCE_POSITION] = encode_source_position(SOURCE, record.dlsn)
                writer.submit(record.payload, record.txid, key=record.key, headers=headers)
                appended += 1
        await writer.flush()
    finally:
        await writer.close()
        await src_pool.close()
        await dst_pool.close()
    return appended


def test_bootstrap_of_200_segments_then_streaming_under_concurrent_writes_gives_every_record_once_in_order(sandbox, tmp_path):
    name = "orders"
    create_source_log(sandbox, name, segments=200, per_segment=20, size=300)
    writer = SourceWriter(sandbox, name, first=200 * 20)
    writer.start()
    wait_until(lambda: writer.written > 50 or writer.error, 30, message="the concurrent writer to get going")
    result = bootstrap(sandbox, name)
    assert result.returncode == 0, result.stderr
    after_copy = writer.written  # the writer keeps appending after the copy: the stream must carry those too
    wait_until(lambda: writer.written >= after_copy + 50 or writer.error, 30, message="50 more appends after the copy")
    writer.stop.set()
    writer.join(30)
    assert writer.error is None, writer.error
    report = json.loads(result.stdout)
    (logres,) = report["logs"]
    assert logres["segments"] >= 200 and logres["copied"] == logres["segments"] and logres["committed"]
    snapshot = DLSN.parse(logres["snapshot"])

    source = records_of(sandbox, SOURCE, name)
    copied = records_of(sandbox, SINK, name)
    # The copy ends exactly at the snapshot point: every source record before it, none after.
    before = [r for r in source if r[0] < snapshot]
    assert_sink_holds_source(before, copied)
    assert all(s.state.value == "completed" for s in sink_segments(sandbox, name))
    # The vector clocks of the copied records count the source's own records from the first one.
    assert [Origin.from_headers(rec.headers).vt for _, rec in copied[:3]] == [{SOURCE: 1}, {SOURCE: 2}, {SOURCE: 3}]
    assert logres["source_vv"] == {SOURCE: len(before)}

    # Streaming continues from the snapshot point: together, the sink holds the source.
    after = len(source) - len(before)
    assert after > 0, "the concurrent writer wrote nothing past the snapshot"
    with session(sandbox, SOURCE) as src, session(sandbox, SINK) as dst:
        asyncio.run(stream_from(src, dst, name, snapshot, logres["source_vv"], after))
    assert_sink_holds_source(source, records_of(sandbox, SINK, name))
    with session(sandbox, SOURCE) as src:
        assert PinStore(src.meta).pins_of_log(name) == [], "the bootstrap pin must be released"


# -- killing the driver --------------------------------------------------------------------------


def sink_adds(env: dict[str, str]) -> int:
    with session(env, SINK) as s:
        total = 0
        secret, tls = s.secret, s.tls
        for info in s.meta.available_nodes().values():
            host, _, port = info["address"].rpartition(":")
            with SyncAgentClient(host, int(port), secret, tls=tls) as client:
                total += int(client.stat()["adds"])
        return total


# A copy this small runs in-process by default (below --local-below); --local-below 0 forces
# Spark. Both paths must verify, record and resume exactly alike.
ENGINE_ARGS = {"local": (), "spark": ("--local-below", "0")}


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_killing_the_driver_midway_leaves_nothing_visible_and_a_rerun_copies_only_unverified_segments(sandbox, tmp_path, engine):
    name = f"killed-{engine}"
    create_source_log(sandbox, name, segments=24, per_segment=50, size=2000)
    holder = jobplan.default_holder(SOURCE, SINK)
    proc = start_dlctl(
        sandbox, "-o", "json", "--yes", "bootstrap", "--source", SOURCE, "--sink", SINK, "--logs", name, "--parallelism", "1", "--throttle", "400K", *ENGINE_ARGS[engine],
        log=tmp_path / "first.log",
    )

    def verified() -> set[int]:
        with session(sandbox, SINK) as s:
            try:
                record = s.meta.get_op(jobplan.op_id(holder, name)).value
            except Exception:  # noqa: BLE001 - not created yet
                return set()
            return {int(k) for k in record.get("progress", {}).get("verified", {})}

    try:
        wait_until(lambda: verified() or proc.poll() is not None, 120, message="a first verified segment")
        assert proc.poll() is None, "the job finished before it could be killed; slow it down further"
        family = process_tree(proc.pid) - {proc.pid}  # Spark's JVM and its Python workers
        # The in-process path starts no JVM at all; the Spark path copies in Spark's workers.
        assert bool(family) == (engine == "spark"), f"{engine} copy: the driver's child processes are {family}"
        os.kill(proc.pid, signal.SIGKILL)  # the driver only: its JVM and workers follow on their own
        proc.wait(10)
        # Nothing of the killed job may still write when the re-run starts (and is measured).
        wait_until(lambda: not any(pid_alive(p) for p in family), 60, message="the killed driver's JVM and workers to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
    kept = verified()
    assert 1 <= len(kept) < 24
    assert sink_segments(sandbox, name) == [], "a killed job must leave no segment visible at the sink"
    with session(sandbox, SOURCE) as src:
        assert [p.value.holder for p in PinStore(src.meta).pins_of_log(name)] == [holder], "the pin stays while the job is unfinished"
        entries = {v.value.seq: v.value.last_entry_id + 1 for v in src.meta.segments(name)}

    adds_before = sink_adds(sandbox)
    result = bootstrap(sandbox, name, *ENGINE_ARGS[engine])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["engine"], report["spark_starts"]) == (engine, 1 if engine == "spark" else 0)
    (logres,) = report["logs"]
    assert logres["reused"] == len(kept) and logres["copied"] == 24 - len(kept)
    # What the sink agents stored during the re-run (their own counters): W = 3 replicas of every
    # entry of the segments not verified before the kill, nothing for the verified ones.
    adds = sink_adds(sandbox) - adds_before
    assert adds == 3 * sum(n for seq, n in entries.items() if seq not in kept)
    assert_sink_holds_source(records_of(sandbox, SOURCE, name), records_of(sandbox, SINK, name))
    assert [s.seq for s in sink_segments(sandbox, name)] == list(range(1, 25))


# -- corruption at the source ----------------------------------------------------------------------


def replica_file(env: dict[str, str], node_id: str, log_id: int, seq: int) -> Path:
    node = inventory.load(ConfigLocation(Path(env["DLCTL_CONFIG"]), "test")).cluster(SOURCE).node(node_id)
    return Path(node.data_dir) / "segments" / f"{log_id:016x}" / f"{seq:016x}.log"


def flip_bit(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))
        f.flush()
        os.fsync(f.fileno())


def segment_info(env: dict[str, str], name: str, seq: int):
    with session(env, SOURCE) as src:
        return src.meta.get_log(name).value.log_id, src.meta.get_segment(name, seq).value


def limbo_replicas(env: dict[str, str], node_id: str) -> int:
    with session(env, SOURCE) as s:
        host, _, port = s.meta.available_nodes()[node_id]["address"].rpartition(":")
        with SyncAgentClient(host, int(port), s.secret, tls=s.tls) as client:
            return int(client.stat()["limbo"])


def test_a_bit_flip_in_one_source_replica_is_caught_and_another_replica_is_copied(sandbox):
    name = "flipped-once"
    create_source_log(sandbox, name, segments=4, per_segment=30, size=500)
    expected = records_of(sandbox, SOURCE, name)
    log_id, seg = segment_info(sandbox, name, 2)
    # Entry 0 is asked first of the replica its hash draw ranks first (the copy's reader knows
    # no region, so all replicas are equally near, readpolicy.speculative_order).
    first_choice = speculative_order(seg.write_set(0), {n: {} for n in seg.write_set(0)}, salt=(log_id, 2, 0))[0]
    assert limbo_replicas(sandbox, first_choice) == 0
    # The source's auditor would refill the caught replica at its next check: off while we look.
    with session(sandbox, SOURCE) as s:
        roles.write_auditor_switch(s.meta.client, SOURCE, False, s.zk_auth)
    try:
        flip_bit(replica_file(sandbox, first_choice, log_id, 2), fmt.HEADER_SIZE + 40)
        result = bootstrap(sandbox, name)
        assert result.returncode == 0, result.stderr
        assert limbo_replicas(sandbox, first_choice) == 1, "the flipped replica should have been caught by its CRC"
    finally:
        with session(sandbox, SOURCE) as s:
            roles.write_auditor_switch(s.meta.client, SOURCE, True, s.zk_auth)
    assert_sink_holds_source(expected, records_of(sandbox, SINK, name))


def test_a_bit_flip_in_every_replica_of_an_entry_fails_the_job_naming_the_segment_and_commits_nothing(sandbox):
    name = "flipped-everywhere"
    create_source_log(sandbox, name, segments=4, per_segment=30, size=500)
    log_id, seg = segment_info(sandbox, name, 3)
    for node in seg.ensembles[0].nodes:
        flip_bit(replica_file(sandbox, node, log_id, 3), fmt.HEADER_SIZE + 40)

    result = bootstrap(sandbox, name)
    assert result.returncode == ExitCode.PARTIAL, (result.returncode, result.stderr)
    message = " ".join(result.stderr.split())
    assert f"segment 3 of log '{name}'" in message and "entry 0" in message, message
    assert sink_segments(sandbox, name) == [], "no part of a failed copy may be visible"


# -- truncation at the source while the job runs -------------------------------------------------


def test_truncating_the_source_during_the_job_cannot_remove_pinned_segments(sandbox, tmp_path):
    name = "truncated-meanwhile"
    create_source_log(sandbox, name, segments=16, per_segment=40, size=2000)
    expected = records_of(sandbox, SOURCE, name)
    holder = jobplan.default_holder(SOURCE, SINK)
    proc = start_dlctl(sandbox, "-o", "json", "--yes", "bootstrap", "--source", SOURCE, "--sink", SINK, "--logs", name, "--parallelism", "1", "--throttle", "100K", log=tmp_path / "job.log")
    try:
        with session(sandbox, SOURCE) as src:
            pins = PinStore(src.meta)
            wait_until(lambda: pins.pins_of_log(name) or proc.poll() is not None, 60, message="the bootstrap's pin")
        assert proc.poll() is None, "the job ended before the truncation could race it"
        refused = dlctl(sandbox, "--cluster", SOURCE, "--yes", "truncate", name, "--to", "10/0/0")
        assert proc.poll() is None, "the job ended before the truncation could race it; slow it down further"
        assert refused.returncode == ExitCode.REFUSED, refused.stderr
        assert holder in refused.stderr
        with session(sandbox, SOURCE) as src:
            assert all(v.value.state.value == "completed" for v in src.meta.segments(name))
        assert proc.wait(240) == 0, (tmp_path / "job.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_sink_holds_source(expected, records_of(sandbox, SINK, name))
    # Once the job is done its pin is gone, and the same truncation goes through.
    done = dlctl(sandbox, "--cluster", SOURCE, "--yes", "truncate", name, "--to", "10/0/0")
    assert done.returncode == 0, done.stderr


# -- decision support and refusals -----------------------------------------------------------------


def test_dry_run_prints_range_size_estimate_and_snapshot_and_changes_nothing(sandbox):
    name = "planned"
    create_source_log(sandbox, name, segments=3, per_segment=20, size=1000)
    result = dlctl(sandbox, "-o", "json", "bootstrap", "--source", SOURCE, "--sink", SINK, "--logs", "plan*", "--dry-run")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    (step,) = plan["steps"]
    info = step["params"]
    assert info["source_range"] == [1, 3] and info["segments"] == 3 and info["snapshot"] == "4/0/0"
    assert info["bytes"] > 60 * 1000 and info["records"] == 60
    assert info["estimated_seconds"] is not None and info["measured_rate_bytes_per_second"] > 0
    assert any("agents that read east" in n and "pull the segments themselves" in n for n in plan["notes"]), plan["notes"]
    relayed = json.loads(dlctl(sandbox, "-o", "json", "bootstrap", "--source", SOURCE, "--sink", SINK, "--logs", "plan*", "--dry-run", "--relay").stdout)
    assert any("relayed through the copying tasks (--relay)" in n for n in relayed["notes"]), relayed["notes"]
    with session(sandbox, SINK) as dst:
        assert name not in dst.meta.list_logs()
    with session(sandbox, SOURCE) as src:
        assert PinStore(src.meta).pins_of_log(name) == []


def test_a_live_writer_on_the_sink_log_refuses_the_bootstrap_and_the_commit(sandbox):
    name = "sink-busy"
    create_source_log(sandbox, name, segments=2, per_segment=10, size=100)
    with session(sandbox, SINK) as dst:
        dst.meta.create_log(name, LogConfig())

        async def hold_and_try() -> subprocess.CompletedProcess[str]:
            pool = AgentPool(dst.meta, dst.credentials)
            writer = await LogWriter.open(dst.meta, pool, name)
            try:
                return await asyncio.get_running_loop().run_in_executor(None, lambda: bootstrap(sandbox, name))
            finally:
                await writer.close()
                await pool.close()

        refused = asyncio.run(hold_and_try())
        assert refused.returncode == ExitCode.REFUSED, refused.stderr
        assert "has an owner" in " ".join(refused.stderr.split())
        # The commit itself re-checks atomically: an owner that appears after the copy, or a
        # segment created since the reservation, makes it change nothing.
        reserved = dst.meta.reserve_segment_seqs(name, dst.meta.get_log(name), 1)
        segment = SegmentRecord_for(1)
        dst.meta.claim_owner(name, b"someone")
        with pytest.raises(RefusedError, match="has an owner"):
            dst.meta.commit_segments(name, reserved, [segment])
        dst.meta.release_owner(name, dst.meta.client.client_id[0])
        moved = dst.meta.reserve_segment_seqs(name, reserved, 1)  # as a writer creating a segment would
        with pytest.raises(RefusedError, match="changed since the copy reserved"):
            dst.meta.commit_segments(name, reserved, [segment])
        assert dst.meta.segments(name) == []
        dst.meta.commit_segments(name, moved, [segment])
        assert [v.value.seq for v in dst.meta.segments(name)] == [1]


def SegmentRecord_for(seq: int):  # noqa: N802 - a record factory
    from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState

    return SegmentRecord(seq, SegmentState.COMPLETED, (EnsembleChange(0, ("a", "b", "c")),), 3, 2, 0.0, last_entry_id=-1)


# -- a source whose clock was raised (dr recover) -------------------------------------------------


def test_the_bootstrap_stamps_a_log_with_a_raised_clock_exactly_as_a_stream_does(sandbox):
    from dlctl.log.dlsn import INITIAL
    from dlctl.replication.clock import ClockStore

    name = "raised-clock"
    create_source_log(sandbox, name, segments=2, per_segment=15, size=200)
    with session(sandbox, SOURCE) as src:
        # What `dr recover` does to a location: from the next segment on, count from 1000.
        start = DLSN(src.meta.get_log(name).value.max_segment_seq + 1, 0, 0)
        steps = ClockStore(src.meta).raise_to(name, {SOURCE: 1000}, start, reason="test")
        asyncio.run(fill(src, name, segments=2, per_segment=15, size=200, first=30))
    source = records_of(sandbox, SOURCE, name)
    clock = SourceClock(SOURCE, base=steps, start=INITIAL)  # a stream from the beginning
    expected = [clock.stamp(None, dlsn) for dlsn, _ in source]

    result = bootstrap(sandbox, name)
    assert result.returncode == 0, result.stderr
    copied = records_of(sandbox, SINK, name)
    assert_sink_holds_source(source, copied)
    got = [Origin.from_headers(rec.headers).vt for _, rec in copied]
    assert got == expected
    assert [vt[SOURCE] for vt in got] == list(range(1, 31)) + list(range(1001, 1031)), "records after the step count from the raised floor"
    (logres,) = json.loads(result.stdout)["logs"]
    assert logres["source_vv"] == {SOURCE: 1030}


# -- sink agents that read the source pull the segments themselves (PULL_SEGMENT) -----------------


@pytest.fixture
def declared(sandbox):
    """The source's credentials installed on every sink agent, as ``init-replication`` does, so
    they can read it; removed afterwards (the module's other tests relay)."""
    with session(sandbox, SOURCE) as src, session(sandbox, SINK) as dst:
        step, _note = credentials_step(src.cluster, dst.cluster)
        assert step is not None and step.run is not None
        step.run()
        dirs = {n.id: Path(source_dir(n, SOURCE)) for n in dst.cluster.nodes}
    assert all((d / "source.toml").exists() for d in dirs.values())
    yield dirs
    for d in dirs.values():
        shutil.rmtree(d, ignore_errors=True)


def pull_counters(env: dict[str, str]) -> dict[str, dict[str, int]]:
    """Each sink agent's own count of the pulls it ran and refused (its STAT)."""
    with session(env, SINK) as s:
        out = {}
        for node, info in s.meta.available_nodes().items():
            host, _, port = info["address"].rpartition(":")
            with SyncAgentClient(host, int(port), s.secret, tls=s.tls) as client:
                out[node] = dict(client.stat().get("pull", {}))
        return out


def pulls_since(before: dict, after: dict, key: str = "segment_pulls") -> dict[str, int]:
    return {node: after[node].get(key, 0) - before.get(node, {}).get(key, 0) for node in after}


def test_sink_agents_that_read_the_source_pull_every_segment_and_the_sink_holds_every_record_once_in_order(sandbox, declared):
    name = "pulled"
    create_source_log(sandbox, name, segments=6, per_segment=200, size=2000)
    before = pull_counters(sandbox)
    result = bootstrap(sandbox, name)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["pulled_segments"] == 6, report
    # The agents' own counters, not the job's word: one member per segment pulled (taking
    # turns), and handed the other two members of its W = 3 ensemble their entries.
    after = pull_counters(sandbox)
    assert sum(pulls_since(before, after).values()) == 6
    # (re-encoded entries carry origin headers: at least the source bytes, to each of two members)
    assert sum(pulls_since(before, after, "segment_forwarded_bytes").values()) >= 2 * sum(pulls_since(before, after, "segment_pulled_bytes").values()) > 0
    assert_sink_holds_source(records_of(sandbox, SOURCE, name), records_of(sandbox, SINK, name))


def test_with_relay_or_a_sink_agent_that_does_not_read_the_source_every_segment_is_relayed(sandbox, declared):
    name = "relayed"
    create_source_log(sandbox, name, segments=3, per_segment=100, size=2000)
    before = pull_counters(sandbox)
    result = bootstrap(sandbox, name, "--relay")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["pulled_segments"] == 0
    assert pulls_since(before, pull_counters(sandbox)) == {n: 0 for n in declared}
    assert_sink_holds_source(records_of(sandbox, SOURCE, name), records_of(sandbox, SINK, name))

    # Members without the source's credentials refuse before storing anything (even with a link
    # still open from the copy above): the job relays, and the copy is whole.
    for d in declared.values():
        shutil.rmtree(d)
    name = "relayed-after-refusal"
    create_source_log(sandbox, name, segments=3, per_segment=100, size=2000)
    before = pull_counters(sandbox)
    result = bootstrap(sandbox, name)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["pulled_segments"] == 0
    after = pull_counters(sandbox)
    assert sum(pulls_since(before, after, "segment_pulls_refused").values()) >= 1
    assert sum(pulls_since(before, after).values()) == 0
    assert_sink_holds_source(records_of(sandbox, SOURCE, name), records_of(sandbox, SINK, name))


def test_pulls_carry_on_from_the_last_source_replica_while_two_of_three_are_paused(sandbox, declared, tmp_path):
    name = "pulled-paused"
    create_source_log(sandbox, name, segments=4, per_segment=400, size=2000)
    before = pull_counters(sandbox)
    status = json.loads(dlctl(sandbox, "-o", "json", "sandbox", "status").stdout)
    sources = sorted((n["node"], n["pid"]) for n in status["nodes"] if n["cluster"] == SOURCE)
    paused = [pid for _node, pid in sources[:2]]
    proc = start_dlctl(
        sandbox, "-o", "json", "--yes", "bootstrap", "--source", SOURCE, "--sink", SINK, "--logs", name, "--parallelism", "1", "--throttle", "600K",
        log=tmp_path / "job.log",
    )
    try:
        wait_until(lambda: sum(pulls_since(before, pull_counters(sandbox)).values()) or proc.poll() is not None, 120, message="the sink agents to start pulling")
        assert proc.poll() is None, "the job finished before the source agents could be paused; slow it down further"
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        assert proc.wait(180) == 0, (tmp_path / "job.log").read_text()
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "job.log").read_text()
    report = json.loads(out[out.index("{"):])
    assert report["pulled_segments"] == 4, report
    assert_sink_holds_source(records_of(sandbox, SOURCE, name), records_of(sandbox, SINK, name))


def test_killing_the_driver_stops_the_sink_agents_pulls_at_once_and_a_rerun_copies_everything(sandbox, declared, tmp_path):
    name = "pulled-killed"
    create_source_log(sandbox, name, segments=2, per_segment=2000, size=2000)
    before = pull_counters(sandbox)
    # 4 MB segments at 50 KB/s each: a pull left running would go on for over a minute.
    proc = start_dlctl(
        sandbox, "-o", "json", "--yes", "bootstrap", "--source", SOURCE, "--sink", SINK, "--logs", name, "--parallelism", "1", "--throttle", "100K",
        log=tmp_path / "first.log",
    )
    try:
        wait_until(lambda: sum(pulls_since(before, pull_counters(sandbox)).values()) or proc.poll() is not None, 120, message="the sink agents to start pulling")
        assert proc.poll() is None, (tmp_path / "first.log").read_text()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Each agent's own gauge: no pull of the dead driver's goes on storing into the sink.
    wait_until(lambda: not any(c.get("segment_pulls_running", 0) for c in pull_counters(sandbox).values()), 15, message="the sink agents to stop the dead driver's pulls")
    assert sum(pulls_since(before, pull_counters(sandbox), "segment_pulls_abandoned").values()) >= 1
    assert sink_segments(sandbox, name) == []
    result = bootstrap(sandbox, name)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["pulled_segments"] == 2
    assert_sink_holds_source(records_of(sandbox, SOURCE, name), records_of(sandbox, SINK, name))
