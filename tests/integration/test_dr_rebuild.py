"""``dlctl dr recover`` of a location that lost its ZooKeeper metadata too (issue 11): rebuilt
empty with the same identity, or restored from an old backup. Real clusters of real agents,
real SIGKILLs, the operator's actions through the ``dlctl`` CLI with ``-o json``.

- Three locations active-active (a <-> b a bidirectional pair, b -> c -> a causal one-way
  streams). Location a loses everything: its agents are SIGKILLed, their data dirs deleted, and
  its own ZooKeeper server is emptied (every znode of its namespace deleted). ``dr recover``
  rebuilds a's logs and the streams into it from what b and c hold, then brings every record
  back: a ends with every record its peers have, once, its clock continues above every counter
  it handed out before, and writes at a resume and replicate.
- Two locations a <-> b; a is restored from a backup (ZooKeeper and data dirs) taken before more
  records were written and before a second log was added to the pair: ``dr recover`` completes
  the stream and log the backup lacks and brings the newer records back.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agents import harness_credentials
from harness.logcluster import eventually, run
from harness.twoclusters import Site, Sites, not_done, read_all, run_cli, sites_for_test
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError, NotEmptyError

from dlctl.log.pool import AgentPool
from dlctl.log.producer import LogProducer
from dlctl.meta.access import AccessMode, AccessStore
from dlctl.meta.records import LogConfig
from dlctl.ops.dr import rebuild as dr_rebuild
from dlctl.ops import replication as ops
from dlctl.plan import Plan, apply
from dlctl.replication import dr
from dlctl.replication.clock import ClockStore
from dlctl.replication.origin import Origin
from dlctl.replication.records import StreamState
from dlctl.replication.store import StreamStore

pytestmark = pytest.mark.zk

PROFILES, CARTS, ORDERS, LATE = "profiles", "carts", "orders", "late"


@pytest.fixture
def three(zk_server, zk_private_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    """a (with a ZooKeeper server of its own), b and c."""
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b", "c"), private_zk={"a": zk_private_server.server})


@pytest.fixture
def pair(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b"))


# -- helpers ------------------------------------------------------------------------------------------


def dlctl_full(inv: Path, *argv: str) -> tuple[int, dict | list | str, str]:
    return run_cli(inv, *argv)


def dlctl(inv: Path, *argv: str) -> tuple[int, dict | list | str]:
    code, out, _ = dlctl_full(inv, *argv)
    return code, out


async def write(site: Site, name: str, prefix: str, rounds: int, per_round: int) -> None:
    pool = AgentPool(site.meta(), harness_credentials())
    producer = LogProducer(site.meta(), pool, name)
    try:
        for r in range(rounds):
            await asyncio.gather(*(producer.submit(f"{prefix}-{r}-{i}".encode()) for i in range(per_round)))
            await asyncio.sleep(0.1)
    finally:
        await producer.close()
        await pool.close()


def writes(*jobs: tuple[Site, str, str, int, int]) -> None:
    async def go() -> None:
        await asyncio.gather(*(write(*job) for job in jobs))

    run(go(), timeout=180)


def identities(site: Site, name: str, **kw) -> list[tuple]:
    return [dr.identity(r, site.name) for r in run(read_all(site.meta(), name, **kw), timeout=120)]


async def _holds(site: Site, name: str, n: int) -> bool:
    return len(await read_all(site.meta(), name, idle=0.5)) >= n


def converged(sites: Sites, name: str, locations: str, total: int) -> None:
    for n in locations:
        run(eventually(lambda n=n: _holds(sites[n], name, total), timeout=90, message=f"{n}/{name} holds {total} records"), timeout=120)


def counters_of(site: Site, name: str, location: str) -> list[int]:
    """``location``'s own counters in the vector timestamps of its records as ``site`` holds them."""
    out = []
    for r in run(read_all(site.meta(), name, idle=1.0), timeout=120):
        origin = Origin.from_headers(r.headers)
        if origin is not None and origin.cluster == location:
            out.append(origin.vt.get(location, 0))
    return out


def kill_agents(site: Site) -> None:
    for node in site.agents.values():
        node.proc.kill()


def delete_children(client: KazooClient, path: str) -> None:
    for child in client.get_children(path):
        if path == "/" and child == "zookeeper":
            continue  # the server's own
        delete_tree(client, f"{path.rstrip('/')}/{child}")


def delete_tree(client: KazooClient, path: str, attempts: int = 20) -> None:
    """Delete ``path`` and everything under it. The peers keep writing into a location's
    namespace meanwhile (their workers report progress to its retention pins), so a child can
    appear while the tree is being deleted: then the delete goes again."""
    for _ in range(attempts):
        try:
            client.delete(path, recursive=True)
            return
        except NoNodeError:
            return
        except NotEmptyError:
            continue
    raise AssertionError(f"could not delete {path}: peers kept writing into it")


def dump_tree(client: KazooClient, path: str) -> list[tuple[str, bytes]]:
    """Every persistent znode under ``path`` (parents first) with its data: a ZooKeeper backup."""
    out = []
    try:
        data, stat = client.get(path)
    except NoNodeError:
        return out
    if stat.ephemeralOwner:
        return out
    out.append((path, data))
    for child in sorted(client.get_children(path)):
        out += dump_tree(client, f"{path}/{child}")
    return out


def restore_tree(client: KazooClient, nodes: list[tuple[str, bytes]]) -> None:
    for path, data in nodes:
        client.create(path, data, makepath=True)


def replace_tree(client: KazooClient, path: str, nodes: list[tuple[str, bytes]], attempts: int = 20) -> None:
    """Replace everything under ``path`` by a backup's ``nodes`` (see ``delete_tree``: a peer
    may create a node the backup holds too: then the restore starts over)."""
    for _ in range(attempts):
        delete_tree(client, path)
        try:
            restore_tree(client, nodes)
            return
        except NodeExistsError:
            continue
    raise AssertionError(f"could not restore {path}: peers kept writing into it")


def steps_of(out: dict, action: str) -> list[dict]:
    return [s for s in out["steps"] if s["action"] == action]


def assert_once_everywhere(sites: Sites, name: str, locations: str, total: int) -> None:
    held = {n: identities(sites[n], name) for n in locations}
    for n, ids in held.items():
        assert len(ids) == len(set(ids)) == total, f"{n}/{name}: {len(ids)} records, {len(set(ids))} distinct, expected {total}"
    first = set(held[locations[0]])
    assert all(set(ids) == first for ids in held.values()), f"{name}: the locations hold different records"


# -- rebuilt empty ---------------------------------------------------------------------------------------


def test_dr_recover_rebuilds_a_wiped_locations_metadata_from_its_peers_and_brings_every_record_back_once(three: Sites, tmp_path: Path):
    sites = three
    a, b, c = sites["a"], sites["b"], sites["c"]
    for n in "abc":
        sites[n].meta().create_log(PROFILES, LogConfig())
    for n in "ab":
        sites[n].meta().create_log(CARTS, LogConfig())
    apply(ops.init_plan(a.session(), b.session(), patterns=(PROFILES, CARTS), bidirectional=True).plan)
    apply(ops.init_plan(b.session(), c.session(), patterns=(PROFILES,), causal=True).plan)
    apply(ops.init_plan(c.session(), a.session(), patterns=(PROFILES,), causal=True).plan)

    writes(*[(sites[n], PROFILES, f"{n}-p", 3, 100) for n in "abc"], *[(sites[n], CARTS, f"{n}-c", 3, 50) for n in "ab"])
    profiles, carts = 900, 300
    converged(sites, PROFILES, "abc", profiles)
    converged(sites, CARTS, "ab", carts)
    old_max = {PROFILES: max(counters_of(b, PROFILES, "a") + counters_of(c, PROFILES, "a")), CARTS: max(counters_of(b, CARTS, "a"))}
    assert old_max == {PROFILES: 300, CARTS: 150}  # a's own counters, as its peers saw them

    # a is rebuilt empty with the same identity: agents SIGKILLed, disks and ZooKeeper emptied.
    kill_agents(a)
    for node in a.agents.values():
        shutil.rmtree(node.data_dir)
    delete_children(a.admin, "/")
    a.start_agents()
    assert a.meta().list_logs() == [] and StreamStore(a.meta()).list_streams() == []

    inv = sites.write_inventory(tmp_path / "inv.toml")
    # a's own metadata names no stream any more; the sources' pins still do.
    code, status = dlctl(inv, "dr", "status", "--cluster", "a", "-o", "json")
    assert code == 0 and [e["recoverable_from"] for e in status] == [["b", "c"]], status
    code, plan = dlctl(inv, "dr", "recover", "--cluster", "a", "--dry-run", "-o", "json")
    assert code == 0, plan
    actions = [s["action"] for s in plan["steps"]]
    assert actions[:6] == ["rebuild-layout", "rebuild-log", "rebuild-log", "rebuild-stream", "rebuild-stream", "begin"], actions
    streams = {s["params"]["stream"]: s["params"] for s in steps_of(plan, "rebuild-stream")}
    assert streams["b-to-a"]["logs"] == [CARTS, PROFILES] and streams["c-to-a"]["logs"] == [PROFILES]
    assert {p["mode"] for p in streams.values()} == {"active-active"}
    logs = {s["params"]["log"]: s["params"] for s in steps_of(plan, "rebuild-log")}
    assert {n: p["mode"] for n, p in logs.items()} == {CARTS: "read-write", PROFILES: "read-write"}
    assert logs[PROFILES]["clock_floor"] >= 1 and logs[PROFILES]["clock_floor"] <= old_max[PROFILES]
    assert a.meta().list_logs() == [], "a dry run changes nothing"

    # A first attempt stops after recreating the logs (as if the operator's machine died).
    rebuilt = dr_rebuild.plan_rebuild(a.session(), {"b": b.session(), "c": c.session()})
    apply(Plan.of("interrupted", [s for s in rebuilt.steps if s.action in ("rebuild-layout", "rebuild-log")]))
    for name in (PROFILES, CARTS):
        assert AccessStore(a.meta()).get(name).value.mode is AccessMode.READ_ONLY, "no application can write before the clock is raised"
        assert ClockStore(a.meta()).steps(name)[0][1]["a"] == logs[name]["clock_floor"]
        assert a.meta().get_log(name).value.max_segment_seq == logs[name]["first_segment"] - 1
    code, plan = dlctl(inv, "dr", "recover", "--cluster", "a", "--dry-run", "-o", "json")
    assert code == 0 and [s["action"] for s in plan["steps"]][:3] == ["rebuild-stream", "rebuild-stream", "begin"], plan

    code, out = dlctl(inv, "dr", "recover", "--cluster", "a", "-o", "json")
    assert code == 0 and out["ok"], not_done(out)
    raised = steps_of(out, "raise-clock")[0]["result"]
    assert raised[PROFILES]["counter"] >= old_max[PROFILES] and raised[CARTS]["counter"] >= old_max[CARTS]
    events = steps_of(out, "events")[0]["result"]
    print(f"begin: {steps_of(out, 'begin')[0]['result']}")
    print(f"dr recover of a rebuilt-empty location: {events['recovered_records']} records in {events['seconds']}s ({events['records_per_second']}/s)")

    assert_once_everywhere(sites, PROFILES, "abc", profiles)
    assert_once_everywhere(sites, CARTS, "ab", carts)
    # a is back to normal: its streams in run with the normal filter, its logs take writes, no op record.
    streams_at_a = StreamStore(a.meta())
    for sid in ("b-to-a", "c-to-a"):
        assert streams_at_a.get_state(sid).value.state is StreamState.RUNNING
        assert not streams_at_a.get_config(sid).value.unfiltered
    assert {n: AccessStore(a.meta()).get(n).value.mode for n in (PROFILES, CARTS)} == {PROFILES: AccessMode.READ_WRITE, CARTS: AccessMode.READ_WRITE}
    assert a.meta().list_ops() == []
    code, again = dlctl(inv, "dr", "recover", "--cluster", "a", "--dry-run", "-o", "json")
    assert code == 0 and not steps_of(again, "rebuild-log") and not steps_of(again, "rebuild-stream"), "nothing left to rebuild"

    # Writes resume at a and continue its clock; they reach b and c, and b's reach a.
    writes((a, PROFILES, "a-after", 1, 50), (a, CARTS, "a-after", 1, 20), (b, PROFILES, "b-after", 1, 30))
    converged(sites, PROFILES, "abc", profiles + 80)
    converged(sites, CARTS, "ab", carts + 20)
    new_profiles = sorted(counters_of(b, PROFILES, "a"))[-50:]
    assert new_profiles == list(range(old_max[PROFILES] + 1, old_max[PROFILES] + 51)), "a never reuses a counter"
    assert min(sorted(counters_of(b, CARTS, "a"))[-20:]) > old_max[CARTS]
    assert_once_everywhere(sites, PROFILES, "abc", profiles + 80)
    assert_once_everywhere(sites, CARTS, "ab", carts + 20)


def test_dr_recover_refuses_with_a_hint_when_no_peer_replicates_into_the_location(pair: Sites, tmp_path: Path):
    a, b = pair["a"], pair["b"]
    inv = pair.write_inventory(tmp_path / "inv.toml")
    # No stream anywhere: nothing knows a (e.g. the inventory lacks its real peers).
    code, _, err = dlctl_full(inv, "dr", "recover", "--cluster", "a", "--dry-run", "-o", "json")
    assert code == 4 and "no cluster of the inventory knows 'a'" in err and "hint:" in err, err
    # a is only the primary of a one-way stream: its standby holds its records but nothing
    # flows back; that is a failover, not a recovery.
    a.meta().create_log(ORDERS, LogConfig())
    apply(ops.init_plan(a.session(), b.session(), patterns=(ORDERS,)).plan)
    code, _, err = dlctl_full(inv, "dr", "recover", "--cluster", "a", "-o", "json")
    assert code == 4 and "only the source of stream(s) a-to-b" in err and "failover" in err, err
    assert a.meta().list_ops() == [] and StreamStore(a.meta()).list_streams() == [], "nothing was changed"


def test_dr_recover_rebuilds_a_wiped_one_way_standby_as_a_replica_of_its_stream(pair: Sites, tmp_path: Path):
    a, b = pair["a"], pair["b"]
    a.meta().create_log(ORDERS, LogConfig())
    apply(ops.init_plan(a.session(), b.session(), patterns=(ORDERS,)).plan)
    writes((a, ORDERS, "a-1", 2, 100))
    converged(pair, ORDERS, "b", 200)

    # The standby b is rebuilt empty (its metadata lives in the shared ZooKeeper: only b's is deleted).
    kill_agents(b)
    for node in b.agents.values():
        shutil.rmtree(node.data_dir)
    delete_tree(b.admin, "/dlctl/b")
    b.start_agents()

    inv = pair.write_inventory(tmp_path / "inv.toml")
    code, plan = dlctl(inv, "dr", "recover", "--cluster", "b", "--dry-run", "-o", "json")
    assert code == 0, plan
    (log,) = steps_of(plan, "rebuild-log")
    assert log["params"]["mode"] == "replica" and log["params"]["replica_of"] == "a-to-b"
    (stream,) = steps_of(plan, "rebuild-stream")
    assert stream["params"]["mode"] == "one-way" and stream["params"]["create"]
    code, out = dlctl(inv, "dr", "recover", "--cluster", "b", "-o", "json")
    assert code == 0 and out["ok"], not_done(out)

    assert_once_everywhere(pair, ORDERS, "ab", 200)
    access = AccessStore(b.meta()).get(ORDERS).value
    assert (access.mode, access.stream) == (AccessMode.REPLICA, "a-to-b"), "the standby refuses application writes again"
    assert StreamStore(b.meta()).get_state("a-to-b").value.state is StreamState.RUNNING
    writes((a, ORDERS, "a-2", 1, 50))
    converged(pair, ORDERS, "b", 250)
    assert_once_everywhere(pair, ORDERS, "ab", 250)


# -- restored from an old backup ---------------------------------------------------------------------------


def test_dr_recover_of_a_location_restored_from_an_old_backup_completes_its_metadata_and_brings_the_newer_records_back(pair: Sites, tmp_path: Path):
    sites = pair
    a, b = sites["a"], sites["b"]
    for n in "ab":
        sites[n].meta().create_log(ORDERS, LogConfig())
    apply(ops.init_plan(a.session(), b.session(), patterns=(ORDERS,), bidirectional=True).plan)
    writes((a, ORDERS, "a-1", 2, 100), (b, ORDERS, "b-1", 2, 100))
    converged(sites, ORDERS, "ab", 400)

    # The backup: a stopped, its data dirs copied and its ZooKeeper namespace dumped.
    kill_agents(a)
    backup = tmp_path / "backup"
    for node in a.agents.values():
        shutil.copytree(node.data_dir, backup / node.node_id)
    zk_backup = dump_tree(a.admin, "/dlctl/a")
    a.start_agents()

    # Later: more records at both, and a second log added to the pair.
    for n in "ab":
        sites[n].meta().create_log(LATE, LogConfig())
    apply(ops.init_plan(a.session(), b.session(), patterns=(LATE,), bidirectional=True).plan)
    writes((a, ORDERS, "a-2", 2, 100), (b, ORDERS, "b-2", 2, 100), (a, LATE, "a-l", 1, 50), (b, LATE, "b-l", 1, 50))
    converged(sites, ORDERS, "ab", 800)
    converged(sites, LATE, "ab", 100)
    old_max = max(counters_of(b, ORDERS, "a"))
    assert old_max == 400

    # a's disks and ZooKeeper are restored from the backup. The operator restores with the
    # streams into a paused, so no worker applies records at a before dr recover has run.
    kill_agents(a)
    for node in a.agents.values():
        shutil.rmtree(node.data_dir)
        shutil.copytree(backup / node.node_id, node.data_dir)
    replace_tree(a.admin, "/dlctl/a", zk_backup)
    assert a.meta().list_logs() == [ORDERS] and StreamStore(a.meta()).get_config("b-to-a").value.logs == (ORDERS,)
    inv = sites.write_inventory(tmp_path / "inv.toml")
    code, out = dlctl(inv, "replication", "pause", "b-to-a", "--sink", "a", "-o", "json")
    assert code == 0, out
    a.start_agents()

    code, plan = dlctl(inv, "dr", "recover", "--cluster", "a", "--dry-run", "-o", "json")
    assert code == 0, plan
    assert [s["params"]["log"] for s in steps_of(plan, "rebuild-log")] == [LATE]
    (stream,) = steps_of(plan, "rebuild-stream")
    assert stream["params"]["stream"] == "b-to-a" and stream["params"]["add_logs"] == [LATE] and not stream["params"]["create"]
    # b holds records of a's log from segments the backup does not know: a continues after them.
    (numbering,) = steps_of(plan, "rebuild-numbering")
    assert numbering["params"]["log"] == ORDERS and numbering["params"]["first_segment"] > a.meta().get_log(ORDERS).value.max_segment_seq + 1

    code, out = dlctl(inv, "dr", "recover", "--cluster", "a", "-o", "json")
    assert code == 0 and out["ok"], not_done(out)
    assert steps_of(out, "raise-clock")[0]["result"][ORDERS]["counter"] >= old_max
    # The stream into a was paused by the operator before the recovery: it stays paused until resumed.
    assert StreamStore(a.meta()).get_state("b-to-a").value.state is StreamState.PAUSED
    code, out = dlctl(inv, "replication", "resume", "b-to-a", "--sink", "a", "-o", "json")
    assert code == 0, out

    assert_once_everywhere(sites, ORDERS, "ab", 800)
    assert_once_everywhere(sites, LATE, "ab", 100)
    writes((a, ORDERS, "a-3", 1, 40), (b, LATE, "b-3", 1, 10))
    converged(sites, ORDERS, "ab", 840)
    converged(sites, LATE, "ab", 110)
    assert sorted(counters_of(b, ORDERS, "a"))[-40:] == list(range(old_max + 1, old_max + 41)), "a never reuses a counter"
    assert_once_everywhere(sites, ORDERS, "ab", 840)
    assert_once_everywhere(sites, LATE, "ab", 110)
