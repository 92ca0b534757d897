"""Disaster recovery between real clusters (issue 11): failover when a whole location dies
(its agents and its own ZooKeeper, SIGKILLed under load), failback with divergence, switchover
under load, and ``dr recover`` of a wiped location in an active-active cycle.

Cluster ``a`` has a ZooKeeper server of its own, so killing "every process of a" is real;
the other clusters share the session's server. Sink agents reach sources through the fault
proxy. Operators' actions go through the ``dlctl`` CLI (``main``), as an operator would type them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agents import harness_credentials
from harness.logcluster import eventually, run
from harness.procs import wait_until
from harness.twoclusters import Sites, not_done, read_all, run_cli, sites_for_test
from harness.zk import acl_refused, scribbled, zk_retry

from dlctl.log.dlsn import DLSN
from dlctl.log.errors import ReadOnlyLogError
from dlctl.log.ownership import owner_info
from dlctl.log.pool import AgentPool
from dlctl.log.producer import LogProducer, ProducerOptions
from dlctl.log.recovery import recover_log
from dlctl.log.writer import LogWriter
from dlctl.meta.access import AccessMode, AccessStore, LogReadOnlyError
from dlctl.meta import paths
from dlctl.meta.records import LogConfig
from dlctl.ops import replication as ops
from dlctl.plan import apply
from dlctl.replication import dr
from dlctl.replication.records import StreamState
from dlctl.replication.store import StreamStore

pytestmark = pytest.mark.zk

LOG = "orders"


@pytest.fixture
def sites(zk_server, zk_private_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, private_zk={"a": zk_private_server.server})


def inventory(sites: Sites, path: Path) -> Path:
    return sites.write_inventory(path)


def dlctl(inv: Path, *argv: str) -> tuple[int, dict | list | str]:
    code, out, _ = run_cli(inv, *argv)
    return code, out


async def dlctl_async(inv: Path, *argv: str) -> tuple[int, dict | list | str]:
    return await asyncio.get_running_loop().run_in_executor(None, lambda: dlctl(inv, *argv))


class Load:
    """Producers appending numbered records through the owning agents, moving to the next
    cluster of ``clusters`` when a log refuses them as read-only (what an application does
    after a switchover). ``acked[cluster]``: (payload, DLSN) of every acknowledged record."""

    def __init__(self, sites: Sites, clusters: list[str], name: str = LOG, batch: int = 20, pause: float = 0.01) -> None:
        self.sites, self.clusters, self.name, self.batch, self.pause = sites, list(clusters), name, batch, pause
        self.acked: dict[str, list[tuple[bytes, DLSN]]] = {c: [] for c in clusters}
        self.refused: dict[str, int] = {c: 0 for c in clusters}
        self.moved_at: float | None = None
        self.errors: list[str] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.n = 0

    def start(self) -> Load:
        self._task = asyncio.ensure_future(self._run())
        return self

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())

    async def _run(self) -> None:
        for cluster in self.clusters:
            meta = self.sites[cluster].meta()
            pool = AgentPool(meta, harness_credentials())
            producer = LogProducer(meta, pool, self.name, options=ProducerOptions(retry_timeout=120))
            try:
                while not self._stop.is_set():
                    payloads = [f"{cluster}-{self.n + k}".encode() for k in range(self.batch)]
                    self.n += self.batch
                    futures = [producer.submit(p) for p in payloads]
                    results = await asyncio.gather(*futures, return_exceptions=True)
                    refused = False
                    for p, r in zip(payloads, results):
                        if isinstance(r, DLSN):
                            self.acked[cluster].append((p, r))
                        elif isinstance(r, ReadOnlyLogError):
                            refused = True
                            self.refused[cluster] += 1
                        else:
                            self.errors.append(f"{cluster}: {r!r}")
                    if refused and cluster != self.clusters[-1]:
                        self.moved_at = time.monotonic()
                        break
                    await asyncio.sleep(0.1 if refused else self.pause)  # (the next one may not be promoted yet)
                if self._stop.is_set():
                    return
            finally:
                try:
                    await asyncio.wait_for(producer.close(), 5)
                except Exception:  # noqa: BLE001 - a dead cluster's producer cannot flush
                    pass
                await pool.close()

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 10)
        except TimeoutError:  # stuck on a dead cluster: what was acknowledged is recorded
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def checkpoint(sites: Sites, stream: str = "a-to-b", sink: str = "b"):
    return zk_retry(lambda: StreamStore(sites[sink].meta()).get_checkpoint(stream, LOG).value)


def identities(site, name: str = LOG, **kw) -> list[tuple[str, DLSN]]:
    return [dr.identity(r, site.name) for r in run(read_all(site.meta(), name, **kw), timeout=120)]


async def count_identities(site, name: str = LOG) -> int:
    return len(await read_all(site.meta(), name, idle=0.5))


async def _at_least(site, n: int, name: str = LOG) -> bool:
    return await count_identities(site, name) >= n


def kill_location(site) -> None:
    """SIGKILL every process of the location: its agents and its ZooKeeper server."""
    for node in site.agents.values():
        node.proc.kill()
    site.ns.server.kill()


def revive_location(site) -> None:
    site.ns.server.start()
    for node in site.agents.values():
        node.start(wait=False)
    for node in site.agents.values():
        node.wait_ready(site.admin)


def one_way(sites: Sites) -> None:
    sites["a"].meta().create_log(LOG, LogConfig())
    built = ops.init_plan(sites["a"].session(), sites["b"].session(), patterns=(LOG,))
    assert [s.action for s in built.plan.steps][-2:] == ["mark-replica", "activate"]
    apply(built.plan)


def test_dr_status_names_damaged_stream_and_access_records_and_the_location_stays_reachable(sites: Sites, tmp_path: Path):
    """A stream record and a log's access record that hold bytes dlctl did not write: before,
    the location was shown as out of reach and the stream vanished without a word; a damaged
    checkpoint failed the stream's whole status."""
    one_way(sites)
    b = sites["b"].meta()
    inv = inventory(sites, tmp_path / "inv.toml")
    code, status = dlctl(inv, "dr", "status", "-o", "json")
    assert code == 0, status
    (stream,) = [s["stream"] for s in {e["location"]: e for e in status}["b"]["in"]]
    with scribbled(b.client, paths.stream_config(b.cluster, stream)) as config, scribbled(b.client, paths.log_access(b.cluster, LOG)):
        code, status = dlctl(inv, "dr", "status", "-o", "json")
        assert code == 0, status
        by = {e["location"]: e for e in status}
        assert by["b"]["reachable"] and by["b"]["logs"][LOG].startswith("unreadable (") and paths.log_access(b.cluster, LOG) in by["b"]["logs"][LOG]
        assert list(by["b"]["unreadable_streams"]) == [stream] and config in by["b"]["unreadable_streams"][stream]
        assert by["b"]["in"] == [] and by["a"]["out"] == [] and by["a"]["unreadable_streams"] == {}
        code, table = dlctl(inv, "dr", "status")
        assert code == 0 and f"streamrecordsthatcannotberead(notshown):{stream}(" in "".join(str(table).split()), table
    # The same records refused by their ACL (made by hand, say): named the same way, not taken
    # for the location being out of reach, nor the stream left out without a word.
    connect = sites["b"].ns.connect_string
    with acl_refused(connect, paths.stream_config(b.cluster, stream)) as config, acl_refused(connect, paths.log_access(b.cluster, LOG)) as access:
        code, status = dlctl(inv, "dr", "status", "-o", "json")
        assert code == 0, status
        by = {e["location"]: e for e in status}
        assert by["b"]["reachable"] and by["b"]["logs"][LOG] == f"unreadable (ZooKeeper refused access to znode {access}: its ACL does not admit this configuration's ZooKeeper credentials)"
        assert list(by["b"]["unreadable_streams"]) == [stream] and f"znode {config}" in by["b"]["unreadable_streams"][stream]
        assert by["b"]["in"] == [] and by["a"]["out"] == []
    # A damaged checkpoint: the stream's status shows that log's row as such, not an error for all,
    # and a monitoring check calls it critical (whether the log moves is unknown).
    with scribbled(b.client, paths.stream_checkpoint(b.cluster, stream, LOG)) as checkpoint:
        code, status = dlctl(inv, "--cluster", "b", "replication", "status", stream, "-o", "json")
        assert code == 0, status
        (row,) = status["logs"]
        assert row["state"] == "unreadable" and checkpoint in row["last_error"], row
        code, checked = dlctl(inv, "--cluster", "b", "replication", "check", stream, "-o", "json")
        assert code == 2 and checked["status"] == "CRITICAL" and any(checkpoint in p for p in checked["problems"]), checked


def test_a_standby_refuses_application_writes_at_once_until_promoted(sites: Sites, tmp_path: Path):
    one_way(sites)
    b = sites["b"]
    assert AccessStore(b.meta()).get(LOG).value.mode is AccessMode.REPLICA
    # The stream's worker owns the standby's log: an application's append must not be sent after
    # that owner (which never takes it) until the retry timeout, but refused at once.
    def owner() -> str:
        current = b.meta().owner_of(LOG)
        return owner_info(current[0]).get("owner", "") if current else ""

    wait_until(lambda: owner().startswith("replication:a-to-b:"), 30, message="the stream's worker to own b's log")

    async def try_writes() -> tuple[BaseException | None, BaseException | None, float]:
        pool = AgentPool(b.meta(), harness_credentials())
        try:
            try:
                writer = await LogWriter.open(b.meta(), pool, LOG)
                await writer.close()
                direct = None
            except LogReadOnlyError as exc:
                direct = exc
            producer = LogProducer(b.meta(), pool, LOG)
            started = time.monotonic()
            try:
                await producer.submit(b"x")
                proxied = None
            except ReadOnlyLogError as exc:
                proxied = exc
            took = time.monotonic() - started
            await producer.close() if proxied is None else None
            return direct, proxied, took
        finally:
            await pool.close()

    direct, proxied, took = run(try_writes())
    assert isinstance(direct, LogReadOnlyError) and "replica of stream a-to-b" in str(direct)
    assert isinstance(proxied, ReadOnlyLogError) and took < 10  # failed, not retried for a minute
    inv = inventory(sites, tmp_path / "inv.toml")
    code, out = dlctl(inv, "dr", "promote", "--cluster", "b", "-o", "json")
    assert code == 4  # the cluster's name was not typed
    code, out = dlctl(inv, "dr", "promote", "--cluster", "b", "--confirm", "b", "-o", "json")
    assert code == 0 and out["ok"], not_done(out)
    assert AccessStore(b.meta()).get(LOG).value.mode is AccessMode.READ_WRITE


def _failover_under_load(sites: Sites, inv: Path) -> tuple[Load, dict]:
    """Writes at a, the stream lags behind a partition, then every process of a is killed;
    failover to b. Returns the load and the failover's at-risk report."""
    one_way(sites)
    a = sites["a"]

    async def scenario() -> tuple[Load, dict]:
        load = Load(sites, ["a"]).start()
        await eventually(lambda: checkpoint(sites).applied_records > 300, timeout=60, message="stream under way")
        await eventually(lambda: checkpoint(sites).source_end is not None, timeout=30, message="the worker measured the source end")
        sites.network.partition("a", "b")  # b falls behind: a keeps acknowledging
        acked_at_cut = load.count
        await eventually(lambda: load.count > acked_at_cut + 200, timeout=30, message="a acknowledges while b is cut off")
        kill_location(a)
        await load.stop()
        code, out = await dlctl_async(inv, "failover", "--to", "b", "-o", "json")
        assert code == 4, out  # promote needs the name typed
        code, out = await dlctl_async(inv, "failover", "--to", "b", "--confirm", "b", "-o", "json")
        assert code == 0 and out["ok"], not_done(out)
        return load, out

    load, out = run(scenario(), timeout=240)
    settle = next(s for s in out["steps"] if s["action"] == "settle")["result"]["at_risk"][LOG]
    promote = next(s for s in out["steps"] if s["action"] == "promote")["result"]
    assert promote["promoted_after_seconds"] < 60
    sites.network.heal()
    return load, settle


def _writes_at(site, payloads: list[bytes]) -> list[DLSN]:
    async def go() -> list[DLSN]:
        pool = AgentPool(site.meta(), harness_credentials())
        producer = LogProducer(site.meta(), pool, LOG)
        try:
            return list(await asyncio.gather(*(producer.submit(p) for p in payloads)))
        finally:
            await producer.close()
            await pool.close()

    return run(go())


def test_failover_after_killing_every_process_of_a_reports_exactly_the_missing_records_and_failback_discard_converges(sites: Sites, tmp_path: Path):
    a, b = sites["a"], sites["b"]
    inv = inventory(sites, tmp_path / "inv.toml")
    load, risk = _failover_under_load(sites, inv)
    at_risk_from = DLSN.parse(risk["from"])
    assert isinstance(risk["records_estimate"], int)
    # Writes continue at b, and the old flow is fenced for good.
    _writes_at(b, [f"b-{i}".encode() for i in range(100)])
    assert StreamStore(b.meta()).get_state("a-to-b").value.state is StreamState.FAILED_OVER
    code, _ = dlctl(inv, "replication", "resume", "a-to-b")
    assert code == 4

    revive_location(a)
    run(eventually(lambda: StreamStore(b.meta()).claims("a-to-b") == {}, timeout=5, message="no worker runs the failed-over stream"))

    async def recover() -> None:  # read a's log to its true end (its owner died mid-segment)
        pool = AgentPool(a.meta(), harness_credentials())
        try:
            await recover_log(a.meta(), pool, LOG)
        finally:
            await pool.close()

    run(recover())
    a_records = run(read_all(a.meta(), LOG), timeout=120)
    at_b = set(identities(b))
    acked = {d for _, d in load.acked["a"]}
    missing_at_b = {d for d in acked if ("a", d) not in at_b}
    assert missing_at_b == {d for d in acked if d >= at_risk_from}, "at risk = exactly a's acknowledged records missing at b"
    assert missing_at_b, "the partition left acknowledged records only at a"
    assert not any(c == "a" and d >= at_risk_from for c, d in at_b)
    divergent = [r for r in a_records if r.dlsn >= at_risk_from]
    print(f"at risk: reported estimate {risk['records_estimate']}, actual {len(divergent)} (acked {len(missing_at_b)})")

    # Failback without a choice refuses and changes nothing; discard needs a's name typed.
    code, out = dlctl(inv, "failback", "--to", "a", "-o", "json")
    assert code == 4 and sum(d["records"] for d in out) == len(divergent), out
    assert AccessStore(a.meta()).get(LOG).value.mode is AccessMode.READ_WRITE
    code, out = dlctl(inv, "failback", "--to", "a", "--discard-divergent", "-o", "json")
    assert code == 4
    code, out = dlctl(inv, "failback", "--to", "a", "--discard-divergent", "--confirm", "a", "-o", "json")
    assert code == 0 and out["ok"], not_done(out)
    assert not StreamStore(b.meta()).exists("a-to-b")
    _writes_at(b, [f"b-late-{i}".encode() for i in range(50)])
    expected = identities(b)
    run(eventually(lambda: _at_least(a, len(expected)), timeout=60, message="b -> a refills a"))
    assert identities(a) == expected  # identical: same records, same order
    assert not any(c == "a" and d >= at_risk_from for c, d in expected)  # the discarded ones are gone
    assert AccessStore(a.meta()).get(LOG).value.mode is AccessMode.REPLICA


def test_failback_reconcile_re_appends_the_divergent_records_at_b_and_both_end_identical(sites: Sites, tmp_path: Path):
    a, b = sites["a"], sites["b"]
    inv = inventory(sites, tmp_path / "inv.toml")
    load, risk = _failover_under_load(sites, inv)
    _writes_at(b, [f"b-{i}".encode() for i in range(100)])
    revive_location(a)
    code, plan = dlctl(inv, "failback", "--to", "a", "--reconcile", "--dry-run", "-o", "json")
    assert code == 0 and any(n.startswith("DIVERGED a/orders") for n in plan["notes"]), plan
    code, out = dlctl(inv, "failback", "--to", "a", "--reconcile", "-o", "json")
    assert code == 0 and out["ok"], not_done(out)
    at_b = identities(b)
    assert len(at_b) == len(set(at_b))
    for _, d in load.acked["a"]:
        assert ("a", d) in set(at_b), f"acknowledged a@{d} lost"
    run(eventually(lambda: _at_least(a, len(at_b)), timeout=60, message="b -> a refills a"))
    assert identities(a) == at_b
    # Re-running is harmless: nothing diverges any more, the reverse stream exists.
    code, out = dlctl(inv, "failback", "--to", "a", "--reconcile", "-o", "json")
    assert code != 0  # there is no failed-over stream any more


def test_switchover_under_load_loses_nothing_duplicates_nothing_and_reverses_the_stream(sites: Sites, tmp_path: Path):
    a, b = sites["a"], sites["b"]
    inv = inventory(sites, tmp_path / "inv.toml")
    one_way(sites)

    async def scenario() -> tuple[Load, dict, float]:
        load = Load(sites, ["a", "b"]).start()
        await eventually(lambda: checkpoint(sites).applied_records > 500, timeout=60, message="stream under way")
        started = time.monotonic()
        code, out = await dlctl_async(inv, "switchover", "--to", "b", "--confirm", "b", "-o", "json")
        assert code == 0 and out["ok"], not_done(out)
        assert load.moved_at is not None and load.refused["a"] > 0, "producers at a were refused and moved to b"
        await eventually(lambda: len(load.acked["b"]) > 200, timeout=60, message=f"writes continue at b ({load.errors[-3:]})")
        await load.stop()
        return load, out, time.monotonic() - started

    load, out, _ = run(scenario(), timeout=240)
    steps = {s["action"]: s["result"] for s in out["steps"]}
    assert steps["verify"]["lost"] == 0 and steps["verify"]["duplicates"] == 0
    print(f"switchover: b accepted writes {steps['promote']['promoted_after_seconds']}s after the command")
    at_b = identities(b)
    assert len(at_b) == len(set(at_b)), "no duplicate at b"
    expected = [("a", d) for _, d in load.acked["a"]] + [("b", d) for _, d in load.acked["b"]]
    assert set(expected) <= set(at_b), "every acknowledged record is at b"
    assert [i for i in at_b if i[0] == "a"] == [("a", d) for _, d in load.acked["a"]][: len([i for i in at_b if i[0] == "a"])]
    # The stream is reversed without a copy: b -> a runs, a is its replica, b's writes reach a.
    assert not StreamStore(b.meta()).exists("a-to-b")
    assert StreamStore(a.meta()).get_state("b-to-a").value.state is StreamState.RUNNING
    assert AccessStore(a.meta()).get(LOG).value.mode is AccessMode.REPLICA
    assert StreamStore(a.meta()).get_checkpoint("b-to-a", LOG).value.processed_records <= len(load.acked["b"])
    run(eventually(lambda: _at_least(a, len(at_b)), timeout=60, message="b's writes reach a"))
    assert identities(a) == at_b


# -- dr recover ------------------------------------------------------------------------------------


@pytest.fixture
def cycle(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b", "c"))


async def write_rounds(site, name: str, prefix: str, rounds: int, per_round: int) -> None:
    pool = AgentPool(site.meta(), harness_credentials())
    producer = LogProducer(site.meta(), pool, name)
    try:
        for r in range(rounds):
            await asyncio.gather(*(producer.submit(f"{prefix}-{r}-{i}".encode()) for i in range(per_round)))
            await asyncio.sleep(0.2)
    finally:
        await producer.close()
        await pool.close()


def a_counters_at(site, name: str) -> list[int]:
    """The a-components of the vector timestamps of a's records as another location holds them."""
    from dlctl.replication.origin import Origin

    out = []
    for r in run(read_all(site.meta(), name, idle=1.0), timeout=120):
        origin = Origin.from_headers(r.headers)
        if origin is not None and origin.cluster == "a":
            out.append(origin.vt.get("a", 0))
    return out


def test_dr_recover_of_a_wiped_location_in_an_active_active_cycle_brings_back_every_record_once_and_never_reuses_its_clock(cycle: Sites, tmp_path: Path):

    sites = cycle
    name = "profiles"
    for n in "abc":
        sites[n].meta().create_log(name, LogConfig())
    for source, sink in (("a", "b"), ("b", "c"), ("c", "a")):
        apply(ops.init_plan(sites[source].session(), sites[sink].session(), patterns=(name,), causal=True).plan)

    async def writers() -> None:
        await asyncio.gather(*(write_rounds(sites[n], name, f"{n}-before", 4, 150) for n in "abc"))

    run(writers(), timeout=180)
    total = 3 * 4 * 150
    for n in "abc":
        assert len(run(read_all(sites[n].meta(), name, until=total, timeout=90), timeout=120)) == total
    old_max = max(a_counters_at(sites["b"], name))
    assert old_max == 4 * 150  # a's own counter, as its peers saw it

    # Disks replaced: every agent of a loses its data; a's ZooKeeper metadata survives.
    a = sites["a"]
    a.wipe_disks()

    inv = inventory(sites, tmp_path / "inv.toml")
    code, plan = dlctl(inv, "dr", "recover", "--cluster", "a", "--dry-run", "-o", "json")
    assert code == 0 and [s["action"] for s in plan["steps"]][0] == "begin", plan
    code, out = dlctl(inv, "dr", "recover", "--cluster", "a", "-o", "json")
    assert code == 0 and out["ok"], not_done(out)
    results = {s["action"]: s["result"] for s in out["steps"]}
    assert results["raise-clock"][name]["counter"] >= old_max
    print(f"dr recover: {results['events']['recovered_records']} records in {results['events']['seconds']}s")

    held = {n: identities(sites[n], name) for n in "abc"}
    for n, ids in held.items():
        assert len(ids) == len(set(ids)), f"{n} holds duplicates"
    assert set(held["a"]) == set(held["b"]) == set(held["c"]) and len(held["a"]) == total, "a holds every record the others have"
    code, status = dlctl(inv, "dr", "status", "-o", "json")
    assert code == 0 and {e["location"]: e["recoverable_from"] for e in status}["a"] == ["c"]

    # New writes at a count above every counter a handed out before: its clock never went back.
    run(write_rounds(a, name, "a-after", 1, 50), timeout=60)
    for n in "bc":
        run(eventually(lambda n=n: _at_least(sites[n], total + 50, name), timeout=60, message=f"a's new records reach {n}"))
    counters = a_counters_at(sites["b"], name)
    assert sorted(counters)[-50:] == list(range(old_max + 1, old_max + 51)), "a's new records continue its clock"
    for n in "abc":
        ids = identities(sites[n], name)
        assert len(ids) == len(set(ids)) == total + 50
