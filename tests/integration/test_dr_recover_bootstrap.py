"""``dr recover`` when a peer has already deleted records (issue 11): real clusters, real agents
(wiped for real), the real ``dlctl truncate`` and ``dlctl gc`` at the peer, real Spark in local
mode for the bootstrap copy, the CLI run as an operator types it.

The recovered location must end with every record its peer retains, none twice; the records the
peer deleted (and the location lost) are reported as a gap naming the peer, the log and the
range, with exit 3 — unless the peer's cold store holds them (its gc copied the truncated
segments there first): then they come back from it, and nothing is missing; the peer's records
keep the counters they always had; the location's clock never goes back.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agents import harness_credentials
from harness.logcluster import eventually, run
from harness.twoclusters import Sites, not_done, read_all, run_cli, sites_for_test, streams_now

from dlctl.errors import ExitCode
from dlctl.log.dlsn import DLSN, INITIAL
from dlctl.log.pool import AgentPool
from dlctl.log.producer import LogProducer
from dlctl.meta.records import LogConfig, SegmentState
from dlctl.ops import replication as ops
from dlctl.plan import apply
from dlctl.replication import dr
from dlctl.replication.origin import Origin
from dlctl.replication.positions import log_end
from dlctl.replication.store import StreamStore

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.spark, pytest.mark.slow]

LOG = "profiles"


@pytest.fixture
def pair(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b"))


def dlctl(inv: Path, *argv: str) -> tuple[int, dict | list | str]:
    code, out, _ = run_cli(inv, *argv)
    return code, out


async def write_rounds(site, prefix: str, rounds: int, per_round: int) -> None:
    pool = AgentPool(site.meta(), harness_credentials())
    producer = LogProducer(site.meta(), pool, LOG)
    try:
        for r in range(rounds):
            await asyncio.gather(*(producer.submit(f"{prefix}-{r}-{i}".encode() + b"." * 100) for i in range(per_round)))
    finally:
        await producer.close()
        await pool.close()


def records(site) -> list:
    return run(read_all(site.meta(), LOG, idle=1.0), timeout=120)


def vts_by_identity(site) -> dict[tuple[str, DLSN], dict[str, int]]:
    """Identity -> vector timestamp of every replicated record ``site`` holds (as stored)."""
    out = {}
    for r in records(site):
        origin = Origin.from_headers(r.headers)
        if origin is not None:
            out[(origin.cluster, origin.dlsn)] = origin.vt
    return out


def identities(site) -> list[tuple[str, DLSN]]:
    return [dr.identity(r, site.name) for r in records(site)]


def interleaved_pair(a, b) -> int:
    """The log at a and b (many small segments: something to truncate and to copy), replicated
    both ways, and blocks of 100 records written in turn, each replicated before the next: both
    logs interleave a's and b's records all along (what b later retains holds records of both).
    Returns how many were written."""
    for site in (a, b):
        site.meta().create_log(LOG, LogConfig(roll_bytes=8 * 1024))
    apply(ops.init_plan(a.session(), b.session(), patterns=(LOG,), bidirectional=True).plan)
    total = 0
    for r in range(4):
        for site in (b, a):
            run(write_rounds(site, f"{site.name}-{r}", 1, 100), timeout=60)
            total += 100
            for other in (a, b):
                run(eventually(lambda other=other, n=total: _at_least(other, n), timeout=60, message=f"{total} records at {other.name}"))
    return total


def test_dr_recover_of_a_wiped_location_whose_peer_truncated_bootstraps_what_the_peer_retains_and_reports_the_gap(pair: Sites, tmp_path: Path):
    sites = pair
    a, b = sites["a"], sites["b"]
    total = interleaved_pair(a, b)
    for site in (a, b):
        assert len(run(read_all(site.meta(), LOG, until=total, timeout=90), timeout=120)) == total
    old_vts = vts_by_identity(a)  # b's records as a held them before the loss
    old_a_max = max(vt["a"] for (origin, _), vt in vts_by_identity(b).items() if origin == "a")

    # b -> a has applied all of b (its checkpoint is at b's end): b may truncate up to there.
    b_end = run(_end(b), timeout=30)

    def b_to_a_next() -> DLSN:
        return StreamStore(a.meta()).get_checkpoint("b-to-a", LOG).value.next

    run(eventually(lambda: b_to_a_next() >= b_end, timeout=60, message="b -> a checkpoint at b's end"))
    inv = sites.write_inventory(tmp_path / "inv.toml")
    cut = truncate_half(b, inv)
    retained = identities(b)
    deleted = total - len(retained)
    assert 0 < deleted < total

    a.wipe_disks()

    code, plan = dlctl(inv, "-o", "json", "dr", "recover", "--cluster", "a", "--dry-run")
    assert code == 0 and "bootstrap" in [s["action"] for s in plan["steps"]], plan
    assert any(n.startswith("GAP b/profiles") and f"before {cut}/0/0" in n for n in plan["notes"]), plan["notes"]
    started = time.monotonic()
    code, out = dlctl(inv, "-o", "json", "dr", "recover", "--cluster", "a")
    assert code == ExitCode.PARTIAL and isinstance(out, dict) and out["ok"], not_done(out)  # done, with a gap: exit 3
    print(f"dr recover with a bootstrap: {time.monotonic() - started:.1f}s")
    results = {s["action"]: s["result"] for s in out["steps"]}
    copy = results["bootstrap"][f"b-to-a/{LOG}"]
    assert copy["records"] > 0 and copy["segments"] > 0, copy
    (gap,) = results["finish"]["gaps"]
    assert (gap["peer"], gap["log"], gap["from"], gap["to"]) == ("b", LOG, str(INITIAL), f"{cut}/0/0")
    assert gap["records_estimate"] == deleted and gap["covered_by"] == []
    assert any(n.startswith("GAP b/profiles") for n in results["finish"]["notes"])

    # a holds exactly what b retains, once each.
    held = identities(a)
    assert len(held) == len(set(held)), "a holds duplicates"
    assert set(held) == set(retained) and len(held) == len(retained)
    # b's records kept the counters they always had (the copy and the stream start from b's
    # clock at its first retained record, not from zero).
    new_vts = vts_by_identity(a)
    b_records = [i for i in held if i[0] == "b"]
    assert b_records and all(new_vts[i]["b"] == old_vts[i]["b"] for i in b_records)
    # a's own records that b retained came back with the timestamps b holds them with.
    b_vts = vts_by_identity(b)
    assert all(new_vts[i] == b_vts[i] for i in held if i[0] == "a")

    # a's clock never goes back: new local records count above every counter it handed out.
    run(write_rounds(a, "a-after", 1, 30), timeout=60)
    run(eventually(lambda: _at_least(b, len(retained) + 30), timeout=60, message="a's new records reach b"), timeout=90)
    a_counters = sorted(vt["a"] for (origin, _), vt in vts_by_identity(b).items() if origin == "a")
    assert a_counters[-30:] == list(range(old_a_max + 1, old_a_max + 31))
    ids_b = identities(b)
    assert len(ids_b) == len(set(ids_b)), "b holds duplicates"


def truncate_half(site, inv: Path) -> int:
    """``dlctl truncate`` the site's log at the start of its middle completed segment, then
    ``dlctl gc``: the segment number cut at."""
    completed = [s.value for s in site.meta().segments(LOG) if s.value.state is SegmentState.COMPLETED]
    assert len(completed) >= 3, f"{site.name}'s log has only {len(completed)} completed segments"
    cut = completed[len(completed) // 2].seq
    code, out = dlctl(inv, "--cluster", site.name, "-o", "json", "truncate", LOG, "--to", f"{cut}/0/0")
    assert code == 0, out
    code, out = dlctl(inv, "--cluster", site.name, "-o", "json", "gc", "--nice", "0")
    assert code == 0, out
    return cut


async def _end(site) -> DLSN:
    pool = AgentPool(site.meta(), harness_credentials())
    try:
        return (await log_end(site.meta(), pool, LOG)).next
    finally:
        await pool.close()


async def _at_least(site, n: int) -> bool:
    return len(await read_all(site.meta(), LOG, idle=0.5)) >= n


def restart(site, *, restore: dict[str, Path] | None = None, backup: dict[str, Path] | None = None) -> None:
    """Kill every agent of the location; copy its data aside (``backup``) or put an old copy
    back (``restore``: disks replaced from an old backup); start the agents again."""
    for node in site.agents.values():
        node.proc.kill()
    for node_id, node in site.agents.items():
        if backup is not None:
            shutil.copytree(node.data_dir, backup[node_id])
        if restore is not None:
            shutil.rmtree(node.data_dir, ignore_errors=True)
            shutil.copytree(restore[node_id], node.data_dir)
    site.start_agents()


def test_dr_recover_of_a_location_restored_from_an_old_backup_whose_peer_truncated_streams_the_rest_without_duplicates(pair: Sites, tmp_path: Path):
    sites = pair
    a, b = sites["a"], sites["b"]
    for site in (a, b):
        site.meta().create_log(LOG, LogConfig(roll_bytes=8 * 1024))
    apply(ops.init_plan(a.session(), b.session(), patterns=(LOG,), bidirectional=True).plan)
    total = 0

    def block(site, label: str) -> None:
        nonlocal total
        run(write_rounds(site, label, 1, 100), timeout=60)
        total += 100
        for other in (a, b):
            try:
                run(eventually(lambda other=other, n=total: _at_least(other, n), timeout=60, message=f"{total} records at {other.name}"), timeout=90)
            except AssertionError as exc:  # (once seen in a stress run, not reproduced: say what the streams were doing)
                raise AssertionError(f"{exc}\n{streams_now(sites, other.name)}") from None

    block(b, "b-0")
    block(a, "a-0")
    backup = {n: tmp_path / f"backup-{n}" for n in a.agents}
    restart(a, backup=backup)  # the backup holds at most these 200 records
    for r in range(1, 4):
        block(b, f"b-{r}")
        block(a, f"a-{r}")
    old_vts = vts_by_identity(a)
    old_a_max = max(vt["a"] for (origin, _), vt in vts_by_identity(b).items() if origin == "a")

    b_end = run(_end(b), timeout=30)
    run(eventually(lambda: StreamStore(a.meta()).get_checkpoint("b-to-a", LOG).value.next >= b_end, timeout=60, message="b -> a checkpoint at b's end"), timeout=90)
    completed = [s.value for s in b.meta().segments(LOG) if s.value.state is SegmentState.COMPLETED]
    cut = completed[len(completed) // 2].seq
    everything = identities(b)
    inv = sites.write_inventory(tmp_path / "inv.toml")
    assert dlctl(inv, "--cluster", "b", "-o", "json", "truncate", LOG, "--to", f"{cut}/0/0")[0] == 0
    assert dlctl(inv, "--cluster", "b", "-o", "json", "gc", "--nice", "0")[0] == 0
    retained = identities(b)
    assert total - len(retained) > 200, "b deleted more than a's backup can hold: some records are gone for good"

    restart(a, restore=backup)  # a's disks come back from the old backup: it lost what came after
    code, out = dlctl(inv, "-o", "json", "dr", "recover", "--cluster", "a")
    assert code == ExitCode.PARTIAL and isinstance(out, dict) and out["ok"], not_done(out)
    results = {s["action"]: s["result"] for s in out["steps"]}
    kept = results["drop-lost"][LOG]
    assert kept.get("dropped_segments"), kept  # a lost its newer segments ...
    assert results["reset-incoming"][f"b-to-a/{LOG}"].startswith(f"from {cut}/0/0"), results["reset-incoming"]
    assert results["bootstrap"] == {}, "a holds part of the log: no copy (it would duplicate what a kept)"
    (gap,) = results["finish"]["gaps"]
    assert (gap["peer"], gap["log"], gap["to"]) == ("b", LOG, f"{cut}/0/0") and gap["x_kept_records"] > 0

    held = identities(a)
    assert len(held) == len(set(held)), "a holds duplicates"
    assert set(retained) <= set(held) <= set(everything), "a holds every record b retains (and nothing else than what was written)"
    assert len(held) < total, "what b deleted and a lost is not back (it is the gap)"
    new_vts = vts_by_identity(a)
    assert all(new_vts[i]["b"] == old_vts[i]["b"] for i in held if i[0] == "b")

    run(write_rounds(a, "a-after", 1, 30), timeout=60)
    run(eventually(lambda: _at_least(b, len(retained) + 30), timeout=60, message="a's new records reach b"), timeout=90)
    a_counters = sorted(vt["a"] for (origin, _), vt in vts_by_identity(b).items() if origin == "a")
    assert a_counters[-30:] == list(range(old_a_max + 1, old_a_max + 31))
    ids_b = identities(b)
    assert len(ids_b) == len(set(ids_b)), "b holds duplicates"


@pytest.fixture
def trio(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b", "c"), nodes=1)


def test_dr_recover_from_a_peer_that_truncated_waits_for_the_peer_that_still_holds_the_past_and_loses_nothing(trio: Sites, tmp_path: Path):
    """#314's event recovery: the wiped location a recovers from b only once it holds what b
    deleted, which c (a complete peer) brings back first. Copying b's retained records into a
    first would put them ahead of the deleted ones, which a's owner then takes for duplicates
    when c delivers them."""
    sites = trio
    a, b, c = sites["a"], sites["b"], sites["c"]
    one = LogConfig(ensemble_size=1, write_quorum=1, ack_quorum=1, roll_bytes=8 * 1024)
    for site in (a, b, c):
        site.meta().create_log(LOG, one)
    apply(ops.init_plan(a.session(), b.session(), patterns=(LOG,), bidirectional=True).plan)
    for source, sink in (("b", "c"), ("c", "a")):
        apply(ops.init_plan(sites[source].session(), sites[sink].session(), patterns=(LOG,), causal=True).plan)
    total = 0
    for r in range(3):
        for site in (b, a):
            run(write_rounds(site, f"{site.name}-{r}", 1, 100), timeout=60)
            total += 100
            for other in (a, b, c):
                run(eventually(lambda other=other, n=total: _at_least(other, n), timeout=60, message=f"{total} records at {other.name}"))
    everything = set(identities(c))
    assert len(everything) == total and set(identities(a)) == everything

    b_end = run(_end(b), timeout=30)
    for sink, stream in (("a", "b-to-a"), ("c", "b-to-c")):
        run(eventually(lambda sink=sink, stream=stream: StreamStore(sites[sink].meta()).get_checkpoint(stream, LOG).value.next >= b_end, timeout=60, message=f"{stream} at b's end"))
    inv = sites.write_inventory(tmp_path / "inv.toml")
    truncate_half(b, inv)
    assert 0 < len(identities(b)) < total

    a.wipe_disks()
    code, out = dlctl(inv, "-o", "json", "dr", "recover", "--cluster", "a")
    assert code in (ExitCode.OK, ExitCode.PARTIAL) and isinstance(out, dict) and out["ok"], not_done(out)
    gaps = [g for s in out["steps"] if s["action"] == "finish" for g in s["result"]["gaps"]]
    assert all(g["covered_by"] == ["c"] for g in gaps), gaps  # what b deleted, c held
    run(eventually(lambda: _at_least(a, total), timeout=90, message="a holds every record again"), timeout=120)
    held = identities(a)
    assert len(held) == len(set(held)), "a holds duplicates"
    assert set(held) == everything, f"a lacks {len(everything - set(held))} record(s)"


def test_dr_recover_of_a_wiped_location_gets_what_its_peer_deleted_back_from_the_peers_cold_store(pair: Sites, tmp_path: Path):
    """As the first test, but b's cluster requires cold copies: its gc copied the truncated
    segments to its cold store before deleting them. `dr recover` names that store as the
    source of what b deleted, replays it into a before b's stream goes on, and a ends with
    every record ever written, once each, with the timestamps it had: no gap, exit 0."""
    sites = pair
    a, b = sites["a"], sites["b"]
    total = interleaved_pair(a, b)
    everything = identities(a)
    assert len(everything) == len(set(everything)) == total
    old_vts = vts_by_identity(a)

    b_end = run(_end(b), timeout=30)
    run(eventually(lambda: StreamStore(a.meta()).get_checkpoint("b-to-a", LOG).value.next >= b_end, timeout=60, message="b -> a checkpoint at b's end"), timeout=90)
    inv = sites.write_inventory(tmp_path / "inv.toml")
    cold = tmp_path / "b-cold"
    cold.mkdir()
    inv.write_text(inv.read_text() + f'\n[clusters.b.cold_storage]\nkind = "filesystem"\npath = "{cold}"\n')
    assert dlctl(inv, "--cluster", "b", "--yes", "cluster", "cold-storage", "enable")[0] == 0
    cut = truncate_half(b, inv)
    assert min(s.value.seq for s in b.meta().segments(LOG)) == cut, "b's gc did not delete the truncated segments"
    assert len(list(cold.rglob("*.manifest.json"))) >= cut - 1
    retained = identities(b)
    assert 0 < len(retained) < total

    a.wipe_disks()
    code, plan = dlctl(inv, "-o", "json", "dr", "recover", "--cluster", "a", "--dry-run")
    assert code == 0 and "cold-restore" in [s["action"] for s in plan["steps"]], plan
    assert any(n.startswith(f"COLD b/{LOG}") and str(cold) in n for n in plan["notes"]), plan["notes"]
    assert not any(n.startswith("GAP") for n in plan["notes"]), plan["notes"]
    code, out = dlctl(inv, "-o", "json", "dr", "recover", "--cluster", "a")
    assert code == ExitCode.OK and isinstance(out, dict) and out["ok"], not_done(out)
    results = {s["action"]: s["result"] for s in out["steps"]}
    replayed = results["cold-restore"][f"b-to-a/{LOG}"]
    assert replayed["applied"] == total - len(retained) and replayed["held_already"] == 0, replayed
    assert results["bootstrap"] == {}, "a holds what the cold store gave back: the rest is streamed, not copied"
    (gap,) = results["finish"]["gaps"]
    assert gap["covered_by"] and str(cold) in gap["covered_by"][0], gap

    run(eventually(lambda: _at_least(a, total), timeout=90, message="a holds every record again"), timeout=120)
    held = identities(a)
    assert len(held) == len(set(held)), "a holds duplicates"
    assert set(held) == set(everything), f"a lacks {len(set(everything) - set(held))} record(s)"
    new_vts = vts_by_identity(a)
    assert all(new_vts[i] == old_vts[i] for i in held if i[0] == "b"), "b's records came back with other timestamps"
