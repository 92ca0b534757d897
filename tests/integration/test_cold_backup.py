"""`dlctl log backup` and `dlctl log restore` (issue 25 items 5 and 4) on a real sandbox, into a filesystem cold store and into
a real S3-compatible server (moto's standalone server as a process).

The oracle is what the test wrote, and the store read directly (files, or the S3 API through
boto3): each object is decoded entry by entry with the wire format, never through the backup
code. Checked: a dry run writes nothing; a backup copies every completed segment, each record
once and in order; a second run copies nothing; an upload interrupted before its manifest is
completed by the next run without a duplicate; only new segments are copied later; a damaged
object is refused with its name; an unreachable store fails clearly and changes nothing. A log
deleted after its backup is restored into a new log with every record's txid, key and headers,
in order, and with the timestamps a replication stream derives for its local records (counted by
hand: local records, replicated ones, a raised clock); a damaged copy or a missing one refuses
the restore with nothing written.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

import pytest
from harness.coldcopies import segment_payloads
from harness.procs import free_port
from harness.s3server import s3_with_bucket
from harness.sandbox import dlctl, sandbox_up, session_for

from dlctl.cold.history import read_with_history
from dlctl.cold.store import FilesystemStore
from dlctl.log.dlsn import DLSN
from dlctl.log.pool import AgentPool
from dlctl.log.reader import LogReader
from dlctl.log.records import Record
from dlctl.log.writer import LogWriter
from dlctl.replication.causal import SourceClock
from dlctl.replication.clock import ClockStore
from dlctl.replication.origin import Origin

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]

BUCKET = "dl-cold"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    yield from sandbox_up(tmp_path_factory.mktemp("sbx"))


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from s3_with_bucket(tmp_path_factory, BUCKET)


class Target:
    """A cold store as the test sees it: the inventory table, and the objects read directly."""

    def __init__(self, kind: str, tmp: Path, s3=None, prefix: str = "") -> None:
        self.kind, self.tmp, self.s3, self.prefix = kind, tmp, s3, prefix
        self.root = tmp / "cold"
        self.root.mkdir()

    def table(self, cluster: str) -> str:
        if self.kind == "filesystem":
            return f'\n[clusters.{cluster}.cold_storage]\nkind = "filesystem"\npath = "{self.root}"\n'
        return self.s3.inventory_table(cluster, BUCKET, self.prefix)

    def objects(self) -> dict[str, bytes]:
        if self.kind == "filesystem":
            return {str(p.relative_to(self.root)): p.read_bytes() for p in self.root.rglob("*") if p.is_file()}
        client = self.s3.client()
        listed = client.list_objects_v2(Bucket=BUCKET, Prefix=self.prefix + "/").get("Contents", [])
        return {o["Key"][len(self.prefix) + 1 :]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}

    def delete(self, key: str) -> None:
        if self.kind == "filesystem":
            (self.root / key).unlink()
        else:
            self.s3.client().delete_object(Bucket=BUCKET, Key=f"{self.prefix}/{key}")

    def replace(self, key: str, data: bytes) -> None:
        if self.kind == "filesystem":
            (self.root / key).write_bytes(data)
        else:
            self.s3.client().put_object(Bucket=BUCKET, Key=f"{self.prefix}/{key}", Body=data)


def configured(sandbox: dict[str, str], name: str, table_of) -> dict[str, str]:
    """The sandbox's environment with an inventory (beside the sandbox's: its relative paths
    hold) that adds a cold store."""
    config = Path(sandbox["DLCTL_CONFIG"])
    (cluster,) = tomllib.loads(config.read_text())["clusters"]
    variant = config.with_name(f"config-{name}.toml")
    variant.write_text(config.read_text() + table_of(cluster))
    return {**sandbox, "DLCTL_CONFIG": str(variant)}


def run_json(env: dict[str, str], *argv: str):
    proc = dlctl(env, "-o", "json", *argv)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


async def write_segment(session, name: str, tag: str, count: int) -> list[bytes]:
    """``count`` records by a writer of their own: closing it completes their segment."""
    pool = AgentPool(session.meta, session.credentials)
    writer = await LogWriter.open(session.meta, pool, name)
    payloads = [f"{tag}-{i}".encode() for i in range(count)]
    await asyncio.gather(*(writer.submit(p) for p in payloads))
    await writer.close()
    await pool.close()
    return payloads


def records_of(objects: dict[str, bytes]) -> list[bytes]:
    """The data records of every segment object, in segment order, decoded with the wire format."""
    return segment_payloads(objects[k] for k in sorted(k for k in objects if k.endswith(".segment")))


async def three_segments(session, name: str, count: int) -> list[bytes]:
    written = []
    for tag in ("a", "b", "c"):
        written += await write_segment(session, name, tag, count)
    return written


def steps_run(result) -> list[dict]:
    return [s for s in result["steps"] if s.get("status") == "done"]


@pytest.mark.parametrize("kind", ["filesystem", "s3"])
def test_backup_copies_completed_segments_once_and_refuses_damage(sandbox, s3, tmp_path, kind):
    name = f"backed-up-{kind}"
    target = Target(kind, tmp_path, s3 if kind == "s3" else None, prefix=f"east-{kind}")
    env = configured(sandbox, kind, target.table)
    assert dlctl(env, "log", "create", name).returncode == 0
    session = session_for(env)
    try:
        written = asyncio.run(three_segments(session, name, 50))
        backup_scenario(env, name, target, session, written)
    finally:
        session.close()


def backup_scenario(env, name: str, target: Target, session, written: list[bytes]) -> None:

    plan = run_json(env, "log", "backup", name, "--dry-run")
    assert len(plan["steps"]) == 3 and target.objects() == {}, "a dry run wrote something"

    first = run_json(env, "log", "backup", name)
    assert len(steps_run(first)) == 3
    held = target.objects()
    assert len([k for k in held if k.endswith(".segment")]) == 3 and len([k for k in held if k.endswith(".manifest.json")]) == 3
    assert records_of(held) == written, "the cold copies do not hold exactly the log's records, in order"

    again = run_json(env, "log", "backup", name)
    assert steps_run(again) == [] and target.objects() == held, "a second run copied again"

    # An upload interrupted after its object, before its manifest: the next run completes it.
    manifests = sorted(k for k in held if k.endswith(".manifest.json"))
    target.delete(manifests[1])
    resumed = run_json(env, "log", "backup", name)
    interrupted = int(Path(manifests[1]).name.split(".")[0])  # <seq, 19 digits>.manifest.json
    assert [int(s["target"].rsplit("/", 1)[1]) for s in steps_run(resumed)] == [interrupted]
    assert target.objects().keys() == held.keys() and records_of(target.objects()) == written

    written += asyncio.run(write_segment(session, name, "d", 20))
    later = run_json(env, "log", "backup", name)
    assert len(steps_run(later)) == 1 and records_of(target.objects()) == written, "only the new segment is copied"

    # A damaged copy is named, never taken for good.
    segment_key = sorted(k for k in held if k.endswith(".segment"))[0]
    damaged = bytearray(held[segment_key])
    damaged[len(damaged) // 2] ^= 0x40
    target.replace(segment_key, bytes(damaged))
    check = dlctl(env, "log", "backup", name, "--verify")
    assert check.returncode != 0 and segment_key in check.stderr and "SHA-256" in check.stderr, check.stderr


def test_an_unreachable_cold_store_fails_clearly_and_changes_nothing(sandbox, s3, tmp_path):
    name = "backup-unreachable"
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = configured(
        sandbox, "unreachable",
        lambda c: f'\n[clusters.{c}.cold_storage]\nkind = "s3"\nbucket = "{BUCKET}"\nendpoint = "{down}"\ncredentials_file = "{s3.credentials_file}"\n',
    )
    assert dlctl(env, "log", "create", name).returncode == 0
    session = session_for(env)
    try:
        asyncio.run(write_segment(session, name, "x", 10))
    finally:
        session.close()
    proc = dlctl(env, "log", "backup", name)
    assert proc.returncode != 0 and "cold store" in proc.stderr and down.split("//")[1] in proc.stderr, proc.stderr
    missing = configured(sandbox, "unmounted", lambda c: f'\n[clusters.{c}.cold_storage]\nkind = "filesystem"\npath = "{tmp_path / "not-mounted"}"\n')
    proc = dlctl(missing, "log", "backup", name)
    said = " ".join(proc.stderr.split())  # (rich wraps long lines)
    assert proc.returncode != 0 and "not a directory" in said and "fix [cold_storage] path" in said, proc.stderr
    assert not (tmp_path / "not-mounted").exists()


async def write_identified(session, name: str, first_txid: int, count: int) -> list[tuple[int, bytes, bytes, dict]]:
    """Records whose identity a restore must keep: application txids with gaps, keys, headers
    (as a replicated record's origin headers); one writer, so one segment."""
    pool = AgentPool(session.meta, session.credentials)
    writer = await LogWriter.open(session.meta, pool, name)
    rows = [(first_txid + 3 * i, f"id-{first_txid + 3 * i}".encode(), f"k{i % 4}".encode(), {"origin": f"o{i % 3}".encode()}) for i in range(count)]
    await asyncio.gather(*(writer.submit(Record(t, p, k, h)) for t, p, k, h in rows))
    await writer.close()
    await pool.close()
    return rows


async def read_all(session, name: str) -> list[tuple[int, bytes, bytes, dict]]:
    pool = AgentPool(session.meta, session.credentials)
    out = []
    async with LogReader(session.meta, pool, name, start_dlsn=DLSN(1, 0, 0)) as reader:
        while (record := await reader.read_next(timeout=2.0)) is not None:
            out.append((record.txid, record.payload, record.key, dict(record.headers)))
    await pool.close()
    return out


@pytest.mark.parametrize("kind", ["filesystem", "s3"])
def test_restore_rebuilds_a_deleted_log_with_its_records_identities(sandbox, s3, tmp_path, kind):
    name, new = f"lost-{kind}", f"restored-{kind}"
    target = Target(kind, tmp_path, s3 if kind == "s3" else None, prefix=f"restore-{kind}")
    env = configured(sandbox, f"restore-{kind}", target.table)
    assert dlctl(env, "log", "create", name).returncode == 0
    session = session_for(env)
    try:
        written = []
        for first in (100, 1000, 5000):
            written += asyncio.run(write_identified(session, name, first, 40))
        run_json(env, "log", "backup", name)
        assert dlctl(env, "--yes", "log", "delete", name).returncode == 0  # the disaster

        run_json(env, "log", "restore", name, "--to-log", new)
        assert asyncio.run(read_all(session, new)) == written, "the restored log differs from what was written"
        # A txid range, across two copies: exactly the records in it.
        run_json(env, "log", "restore", name, "--to-log", f"{new}-range", "--from-txid", "1030", "--to-txid", "5015")
        assert asyncio.run(read_all(session, f"{new}-range")) == [r for r in written if 1030 <= r[0] <= 5015]
        nothing = dlctl(env, "log", "restore", name, "--to-log", f"{new}-none", "--from-txid", "900000")
        assert nothing.returncode != 0 and "no record of log" in " ".join(nothing.stderr.split()), nothing.stderr

        # A damaged copy refuses the whole restore: nothing is written, not even the new log.
        held = target.objects()
        segment_key = sorted(k for k in held if k.endswith(".segment"))[-1]
        target.replace(segment_key, held[segment_key][:-1] + bytes([held[segment_key][-1] ^ 1]))
        refused = dlctl(env, "log", "restore", name, "--to-log", f"{new}-2")
        assert refused.returncode != 0 and segment_key in refused.stderr, refused.stderr
        assert f"{new}-2" not in session.meta.list_logs()
        target.replace(segment_key, held[segment_key])

        # A copy missing between two others: refused, naming the segment.
        middle = sorted(k for k in held if k.endswith(".manifest.json"))[1]
        target.delete(middle)
        gap = dlctl(env, "log", "restore", name, "--to-log", f"{new}-3")
        seq = int(Path(middle).name.split(".")[0])
        assert gap.returncode != 0 and f"lack segment(s) {seq}" in gap.stderr, gap.stderr
        assert f"{new}-3" not in session.meta.list_logs()
    finally:
        session.close()


async def write_records(session, name: str, records: list[Record]) -> None:
    """``records`` by a writer of their own: one segment."""
    pool = AgentPool(session.meta, session.credentials)
    writer = await LogWriter.open(session.meta, pool, name)
    await asyncio.gather(*(writer.submit(r) for r in records))
    await writer.close()
    await pool.close()


async def derived_stamps(session, name: str, *, steps) -> dict[int, dict[str, int]]:
    """txid -> the timestamp a stream reading ``name`` from its beginning derives (the worker's
    rule: ``SourceClock`` over the log's clock steps)."""
    pool = AgentPool(session.meta, session.credentials)
    clock = SourceClock(session.meta.cluster, base=steps)
    out = {}
    async with LogReader(session.meta, pool, name, start_dlsn=DLSN(1, 0, 0)) as reader:
        while (record := await reader.read_next(timeout=2.0)) is not None:
            out[record.txid] = clock.stamp(Origin.from_headers(record.headers), record.dlsn)
    await pool.close()
    return out


def test_restore_keeps_the_timestamps_replication_derived(sandbox, tmp_path):
    """A stream's sinks know a log's local records by derived timestamps: a restored log must
    derive the same ones, or its streams would skip new records or repeat old ones."""
    name, new = "stamped", "stamped-restored"
    target, env, session = log_with_filesystem_store(sandbox, tmp_path, name)
    here = session.meta.cluster
    try:
        # The oracle, counted by hand: 20 local records, 10 replicated from west (their own
        # vector times), the clock raised to 1000 at segment 3 (as `dr recover` does), 20 more.
        expected: dict[int, dict[str, int]] = {t: {here: t} for t in range(1, 21)}
        west = [Record(20 + i, b"w", headers=Origin("west", DLSN(1, 0, i), {"west": i, here: 20}).headers()) for i in range(1, 11)]
        expected |= {20 + i: {"west": i, here: 20} for i in range(1, 11)}
        expected |= {30 + i: {"west": 10, here: 1000 + i} for i in range(1, 21)}
        asyncio.run(write_records(session, name, [Record(t, b"l") for t in range(1, 21)]))
        asyncio.run(write_records(session, name, west))
        ClockStore(session.meta).raise_to(name, {here: 1000}, DLSN(3, 0, 0), reason="test")
        asyncio.run(write_records(session, name, [Record(t, b"l") for t in range(31, 51)]))
        assert asyncio.run(derived_stamps(session, name, steps=ClockStore(session.meta).steps(name))) == expected

        run_json(env, "log", "backup", name)
        clocks = {k: json.loads(v)["clock"] for k, v in target.objects().items() if k.endswith(".manifest.json")}
        assert [(c["before"], c["after"]) for _, c in sorted(clocks.items())] == [
            ({}, {here: 20}), ({here: 20}, {here: 20, "west": 10}), ({here: 1000, "west": 10}, {here: 1020, "west": 10})
        ], clocks
        assert dlctl(env, "--yes", "log", "delete", name).returncode == 0

        run_json(env, "log", "restore", name, "--to-log", new)
        restored_steps = ClockStore(session.meta).steps(new)
        assert asyncio.run(derived_stamps(session, new, steps=restored_steps)) == expected
        # The check could fail: without its clock steps the restored log counts differently.
        assert asyncio.run(derived_stamps(session, new, steps=())) != expected
        # A range starting inside the raised segment counts from where the original stood there.
        run_json(env, "log", "restore", name, "--to-log", f"{new}-r", "--from-txid", "35")
        ranged = asyncio.run(derived_stamps(session, f"{new}-r", steps=ClockStore(session.meta).steps(f"{new}-r")))
        assert ranged == {t: v for t, v in expected.items() if t >= 35}
        # A range across the raise: the new log's clock is raised where the original's was.
        run_json(env, "log", "restore", name, "--to-log", f"{new}-x", "--from-txid", "15", "--to-txid", "40")
        across = asyncio.run(derived_stamps(session, f"{new}-x", steps=ClockStore(session.meta).steps(f"{new}-x")))
        assert across == {t: v for t, v in expected.items() if 15 <= t <= 40}
        assert [vv for _, vv in ClockStore(session.meta).steps(f"{new}-x")] == [{here: 14}, {here: 1000, "west": 10}]
    finally:
        session.close()


async def read_history(session, name: str, store) -> list[bytes]:
    pool = AgentPool(session.meta, session.credentials)
    try:
        return [r.payload async for r in read_with_history(session.meta, pool, name, store, idle_timeout=1.0)]
    finally:
        await pool.close()


def log_with_filesystem_store(sandbox, tmp_path, name: str):
    """A new log in a cluster whose inventory has a filesystem cold store: (store, env, session)."""
    target = Target("filesystem", tmp_path)
    env = configured(sandbox, name, target.table)
    assert dlctl(env, "log", "create", name).returncode == 0
    return target, env, session_for(env)


def test_reading_from_cold_joins_the_truncated_history_and_the_hot_log(sandbox, tmp_path):
    name = "history"
    target, env, session = log_with_filesystem_store(sandbox, tmp_path, name)
    try:
        written = asyncio.run(three_segments(session, name, 30))
        run_json(env, "log", "backup", name)
        assert dlctl(env, "--yes", "truncate", name, "--to", "3/0/0").returncode == 0
        assert dlctl(env, "--yes", "gc").returncode == 0  # segments 1 and 2 leave the cluster
        assert {s.value.seq for s in session.meta.segments(name)} == {3}
        written += asyncio.run(write_segment(session, name, "d", 10))

        def read(*extra: str) -> list[dict]:
            proc = dlctl(env, "-o", "json", "log", "read", name, *extra)
            assert proc.returncode == 0, proc.stderr
            return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]

        hot = read()
        assert [r["payload"].encode() for r in hot] == written[60:]
        both = read("--from-cold")
        assert [r["payload"].encode() for r in both] == written, "cold and hot do not join exactly at the truncation point"
        dlsns = [tuple(map(int, r["dlsn"].split("/"))) for r in both]
        assert dlsns == sorted(set(dlsns)) and both[60:] == hot, "positions repeat, go back, or differ from the hot log's"
        assert all(r["time"] for r in both[:60]), "cold records lost their append times"
        # The same for an application, through the library.
        assert asyncio.run(read_history(session, name, FilesystemStore(target.root))) == written


        # A damaged copy: its records are never given out, and the error names it (exit 1, not
        # an internal error); the copy before it was read whole first, and printed.
        held = target.objects()
        second = sorted(k for k in held if k.endswith(".segment"))[1]
        damaged = bytearray(held[second])
        damaged[len(damaged) // 2] ^= 0x40
        target.replace(second, bytes(damaged))
        bad = dlctl(env, "-o", "json", "log", "read", name, "--from-cold")
        flat = "".join(bad.stderr.split())
        assert bad.returncode == 1 and "internalerror" not in flat and "".join(second.split()) in flat and "SHA-256" in flat, bad.stderr
        assert [json.loads(line)["payload"].encode() for line in bad.stdout.splitlines() if line.strip()] == written[:30]
        target.replace(second, held[second])

        # Copies that stop short of the truncation point: nothing printed, the gap named.
        for key in [k for k in target.objects() if k.endswith(".manifest.json")][1:]:
            target.delete(key)
        short = dlctl(env, "-o", "json", "log", "read", name, "--from-cold")
        assert short.returncode != 0 and short.stdout == "" and "segment(s) 2..2" in short.stderr, short.stderr
    finally:
        session.close()


async def replicas_held(session, log_id: int) -> set[int]:
    """The segments of log id ``log_id`` any agent holds a replica of (each agent asked)."""
    pool = AgentPool(session.meta, session.credentials)
    try:
        nodes = await pool.refresh()
        held = set()
        for node in nodes:
            held |= {i.segment_seq for i in await (await pool.client(node)).list_segments() if i.log_id == log_id}
        return held
    finally:
        await pool.close()


def test_with_cold_storage_required_truncated_segments_leave_only_once_copied(sandbox, tmp_path):
    name = "offloaded"
    target, env, session = log_with_filesystem_store(sandbox, tmp_path, name)
    enabled = dlctl(env, "--yes", "cluster", "cold-storage", "enable")
    assert enabled.returncode == 0, enabled.stderr
    try:
        written = asyncio.run(three_segments(session, name, 30))
        assert dlctl(env, "--yes", "truncate", name, "--to", "3/0/0").returncode == 0

        # The store is out of reach (not mounted): the truncated segments stay, replicas too.
        away = tmp_path / "away"
        target.root.rename(away)
        stuck = run_json(env, "--yes", "gc")
        assert stuck["bytes_reclaimed"] == 0
        kept = {s.value.seq: s.value for s in session.meta.segments(name)}
        assert set(kept) == {1, 2, 3} and kept[1].cold is None and kept[2].cold is None

        away.rename(target.root)
        log_id = session.meta.get_log(name).value.log_id
        assert {1, 2} <= asyncio.run(replicas_held(session, log_id)), "replicas went before their copies were made"
        run_json(env, "--yes", "gc")
        assert {s.value.seq for s in session.meta.segments(name)} == {3}, "copied segments were not collected"
        # Reclaimed by this gc on every live agent (or already by the agents' own housekeeping).
        assert not {1, 2} & asyncio.run(replicas_held(session, log_id)), "their replicas were not reclaimed"
        copies = {k: v for k, v in target.objects().items() if "/0000000000000000003." not in k}
        assert records_of(copies) == written[:60], "the cold copies do not hold the truncated records"
        clocks = [json.loads(v)["clock"] for k, v in sorted(copies.items()) if k.endswith(".manifest.json")]
        here = session.meta.cluster
        assert [(c["before"], c["after"]) for c in clocks] == [({}, {here: 30}), ({here: 30}, {here: 60})], clocks
        both = dlctl(env, "-o", "json", "log", "read", name, "--from-cold")
        assert [json.loads(line)["payload"].encode() for line in both.stdout.splitlines()] == written
        # The log's own cold retention, kept by the sweep over the cluster's default.
        assert dlctl(env, "--yes", "log", "retention", name, "--cold-age", "30d").returncode == 0
        assert session.meta.get_log(name).value.config.cold_retention_seconds == 30 * 86400
    finally:
        assert dlctl(env, "--yes", "cluster", "cold-storage", "disable").returncode == 0
        session.close()
