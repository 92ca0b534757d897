"""Streams keep in step with their source by themselves (issue 23, ``dlctl.replication.upkeep``):
a new source log that matches the stream's pattern joins and its records reach the sink; a
retention change at the source reaches the sink log; a log deleted at the source leaves the
stream, the sink keeps its copy and `replication status` reports it; a new log whose name the
sink already uses for data of its own is not joined, and says why. Two clusters of real agents,
driven by the real command line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agents import harness_credentials
from harness.logcluster import eventually, run
from harness.procs import wait_until
from harness.twoclusters import Sites, read_all, run_cli, sites_for_test
from harness.zk import scribbled

from dlctl.log.pool import AgentPool
from dlctl.log.producer import LogProducer
from dlctl.meta import paths
from dlctl.meta.access import AccessMode, AccessStore
from dlctl.meta.records import LogConfig
from dlctl.replication.store import StreamStore

pytestmark = [pytest.mark.zk, pytest.mark.agent]

ONE_COPY = LogConfig(ensemble_size=1, write_quorum=1, ack_quorum=1)


@pytest.fixture
def two(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b"), nodes=1, replication_options="upkeep_seconds = 0.5")


async def append(meta, log: str, payloads: list[bytes]) -> None:
    pool = AgentPool(meta, harness_credentials())
    producer = LogProducer(meta, pool, log)
    try:
        for payload in payloads:
            await producer.submit(payload)
    finally:
        await producer.close()
        await pool.close()


async def holding(site, log: str) -> list[bytes]:
    return [r.payload for r in await read_all(site.meta(), log, idle=0.5)] if log in site.meta().list_logs() else []


def payloads(site, log: str) -> list[bytes]:
    return run(holding(site, log))


def holds(site, log: str, expected: list[bytes]):
    """An awaitable predicate for ``eventually``: ``site``'s log holds exactly ``expected``."""
    async def check() -> bool:
        return await holding(site, log) == expected

    return check


def status(inventory: Path) -> dict:
    code, out, err = run_cli(inventory, "--cluster", "b", "-o", "json", "replication", "status", "a-to-b")
    assert code == 0, err
    return out


def stream_orders(two: Sites, tmp_path: Path) -> Path:
    """A's orders-1 with one record, and a stream a -> b of the logs matching orders-*; the inventory."""
    a = two["a"]
    inventory = two.write_inventory(tmp_path / "inventory.toml", default="a")
    a.meta().create_log("orders-1", ONE_COPY)
    run(append(a.meta(), "orders-1", [b"o1-1"]))
    code, _, err = run_cli(inventory, "init-replication", "--source", "a", "--sink", "b", "--logs", "orders-*")
    assert code == 0, err
    return inventory


def test_new_matching_logs_join_settings_propagate_and_a_deleted_source_log_leaves_the_stream(two: Sites, tmp_path: Path):
    a, b = two["a"], two["b"]
    inventory = stream_orders(two, tmp_path)
    assert status(inventory)["patterns"] == ["orders-*"]

    # A log created later that matches joins by itself; one that does not match stays out.
    a.meta().create_log("orders-2", ONE_COPY)
    a.meta().create_log("invoices", ONE_COPY)
    run(append(a.meta(), "orders-2", [b"o2-1", b"o2-2"]))
    run(eventually(holds(b, "orders-2", [b"o2-1", b"o2-2"]), timeout=30, message="orders-2 joined and its records reached B"))
    run(append(a.meta(), "orders-2", [b"o2-3"]))
    run(eventually(holds(b, "orders-2", [b"o2-1", b"o2-2", b"o2-3"]), timeout=30, message="orders-2 keeps streaming"))
    assert "invoices" not in b.meta().list_logs()
    assert sorted(StreamStore(b.meta()).get_config("a-to-b").value.logs) == ["orders-1", "orders-2"]
    # Like any sink log of a one-way stream, a joined log refuses application writes at B.
    assert AccessStore(b.meta()).get("orders-2").value.mode is AccessMode.REPLICA

    # A retention change at the source reaches the sink log.
    code, _, err = run_cli(inventory, "--cluster", "a", "log", "retention", "orders-1", "--age", "2h")
    assert code == 0, err
    wait_until(lambda: b.meta().get_log("orders-1").value.config.retention_seconds == 7200, 30, message="B's orders-1 took the source's retention")

    # A name the sink already uses for data of its own is not joined, and status says why.
    b.meta().create_log("orders-3", ONE_COPY)
    run(append(b.meta(), "orders-3", [b"b's own"]))
    a.meta().create_log("orders-3", ONE_COPY)

    def reported(log: str, kind: str) -> bool:
        return any(d["log"] == log and d["kind"] == kind for d in status(inventory)["drift"])

    wait_until(lambda: reported("orders-3", "not-joined"), 30, message="orders-3 reported as not joined")
    assert payloads(b, "orders-3") == [b"b's own"] and "orders-3" not in StreamStore(b.meta()).get_config("a-to-b").value.logs

    # A log deleted at the source leaves the stream; the sink keeps its copy; status reports it.
    code, _, err = run_cli(inventory, "--cluster", "a", "log", "release", "orders-1")  # its owner (A's write proxy) lets go
    assert code == 0, err
    code, _, err = run_cli(inventory, "--cluster", "a", "log", "delete", "orders-1")
    assert code == 0, err
    wait_until(lambda: reported("orders-1", "deleted-at-source"), 30, message="the deletion reported")
    assert "orders-1" not in StreamStore(b.meta()).get_config("a-to-b").value.logs
    assert payloads(b, "orders-1") == [b"o1-1"]
    code, verdict, err = run_cli(inventory, "--cluster", "b", "replication", "check", "a-to-b")
    assert code == 1 and "orders-1: deleted-at-source" in " ".join(str(verdict).split()) + err, (verdict, err)


def test_a_source_log_gone_without_a_deletion_stays_in_the_stream_and_is_reported(two: Sites, tmp_path: Path):
    """A source whose metadata was lost (its ZooKeeper wiped, or restored from an old backup)
    no longer lists the log, but never deleted it: the stream must keep the log, or ``dr
    recover`` of the source would find no stream to bring it back by (CI saw it happen while a
    wiped location waited for its recovery). The same removal by `dlctl log delete` — a recorded
    deletion — does take the log out: the test above."""
    a, b = two["a"], two["b"]
    inventory = stream_orders(two, tmp_path)
    run(eventually(holds(b, "orders-1", [b"o1-1"]), timeout=30, message="orders-1 reached B"))

    code, _, err = run_cli(inventory, "--cluster", "a", "log", "release", "orders-1")
    assert code == 0, err
    # The metadata is lost, not deleted: the znodes go, as a wiped ZooKeeper loses them (no tombstone).
    a.admin.delete(paths.log("a", "orders-1"), recursive=True)
    assert "orders-1" not in a.meta().list_logs() and not a.meta().was_deleted("orders-1")

    def drift() -> dict[str, str]:
        return {d["log"]: d["kind"] for d in status(inventory)["drift"]}

    wait_until(lambda: drift().get("orders-1") == "missing-at-source", 30, message="the missing log reported")
    # (The upkeep pass that reported it is the one that would have taken it out.)
    assert StreamStore(b.meta()).get_config("a-to-b").value.logs == ("orders-1",)
    assert payloads(b, "orders-1") == [b"o1-1"]


def test_a_source_log_whose_record_cannot_be_read_is_reported_and_the_other_logs_still_join(two: Sites, tmp_path: Path):
    """One source log record scribbled over (not by dlctl) made every upkeep round fail: no new
    log joined, no drift was written. Now that log is reported as ``unreadable`` drift, naming
    the record, and a new matching log still joins and streams."""
    a, b = two["a"], two["b"]
    inventory = stream_orders(two, tmp_path)
    run(eventually(holds(b, "orders-1", [b"o1-1"]), timeout=30, message="orders-1 reached B"))
    with scribbled(a.admin, paths.log("a", "orders-1")) as record:
        a.meta().create_log("orders-2", ONE_COPY)
        run(append(a.meta(), "orders-2", [b"o2-1"]))
        run(eventually(holds(b, "orders-2", [b"o2-1"]), timeout=30, message="orders-2 joined and its records reached B"))

        def drift() -> dict[str, dict]:
            return {d["log"]: d for d in status(inventory)["drift"]}

        wait_until(lambda: drift().get("orders-1", {}).get("kind") == "unreadable", 30, message="orders-1 reported as unreadable")
        assert record in drift()["orders-1"]["detail"]
