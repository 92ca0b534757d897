"""A changing replication network stays correct (issue 21, DESIGN.md §7, Eventuate #314).

Four locations of real agents (one ZooKeeper server, a fault proxy on every link between two
locations), driven by the real ``dlctl`` command line as an operator would. The anomaly of issue
21: a location that joins a network by a *new* connection from a peer that truncated events it
has not yet passed on must not deliver the retained events ahead of the truncated ones, or a
third location drops the truncated ones for ever.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agents import harness_credentials
from harness.logcluster import eventually, run
from harness.procs import wait_until
from harness.twoclusters import Sites, origin_of, read_all, run_cli, sites_for_test

from dlctl.log.dlsn import DLSN
from dlctl.log.pool import AgentPool
from dlctl.log.producer import LogProducer
from dlctl.meta.pins import PinStore
from dlctl.meta.records import LogConfig
from dlctl.replication.origin import Origin
from dlctl.replication.store import StreamStore

pytestmark = [pytest.mark.zk, pytest.mark.agent]

LOG = "ledger"
ONE_COPY = LogConfig(ensemble_size=1, write_quorum=1, ack_quorum=1, roll_bytes=1)  # a segment per entry


@pytest.fixture
def four(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b", "c", "d"), nodes=1)


async def append_one(meta, payload: bytes, key: bytes = b"") -> DLSN:
    """One record appended on its own, through the log's owner as an application would (each in
    a segment of its own: the log rolls after every entry)."""
    pool = AgentPool(meta, harness_credentials())
    producer = LogProducer(meta, pool, LOG)
    try:
        return await producer.submit(payload, key=key)
    finally:
        await producer.close()
        await pool.close()


async def holding(site) -> list[tuple[str, DLSN]]:
    """The origin identity of every record ``site`` holds, in its log order."""
    return [origin_of(r) or (site.name, r.dlsn) for r in await read_all(site.meta(), LOG, idle=1.0)]


def held(site) -> list[tuple[str, DLSN]]:
    return run(holding(site))


def log_row(site, stream: str, inventory: Path) -> dict:
    code, out, err = run_cli(inventory, "--cluster", site.name, "-o", "json", "replication", "status", stream)
    assert code == 0, err
    status = out[0] if isinstance(out, list) else out
    return next(row for row in status["logs"] if row["log"] == LOG)


def a_b_c(four: Sites, tmp_path: Path) -> Path:
    """The log at A, with A <-> B and B <-> C; the inventory."""
    inventory = four.write_inventory(tmp_path / "inventory.toml", default="a")
    four["a"].meta().create_log(LOG, ONE_COPY)
    for source, sink in (("a", "b"), ("b", "c")):
        code, _, err = run_cli(inventory, "init-replication", "--source", source, "--sink", sink, "--bidirectional", "--logs", LOG)
        assert code == 0, err
    return inventory


def test_a_location_joining_from_a_peer_that_truncated_waits_for_the_causal_past_and_no_location_loses_a_record(four: Sites, tmp_path: Path):
    a, b, c, d = (four[n] for n in "abcd")
    inventory = a_b_c(four, tmp_path)
    four.network.partition("b", "c")  # B -> C lags: C sees nothing of what follows
    events = [run(append_one(a.meta(), f"e{i}".encode())) for i in (1, 2, 3)]
    ids = [("a", p) for p in events]
    run(eventually(lambda: PinStore(a.meta()).get("a-to-b", LOG).value.position > events[2], timeout=30, message="A -> B checkpointed past e3"))
    assert held(b) == ids
    code, _, err = run_cli(inventory, "--cluster", "a", "truncate", LOG, "--to", str(events[2]))
    assert code == 0, err

    # D joins from A (which deleted e1 and e2) and from C (which has not received them yet).
    code, _, err = run_cli(inventory, "init-replication", "--source", "a", "--sink", "d", "--bidirectional", "--logs", LOG)
    assert code == 0, err
    code, _, err = run_cli(inventory, "init-replication", "--source", "c", "--sink", "d", "--bidirectional", "--logs", LOG)
    assert code == 0, err

    # A -> D cannot start: A deleted events D has not received. It says so, and names them.
    async def waiting() -> bool:  # (the CLI runs its own event loop: in a thread)
        row = await asyncio.to_thread(log_row, d, "a-to-d", inventory)
        return row["state"] == "waiting-for-causal-past" and "a 1..2" in (row["waiting_for"] or "")

    run(eventually(waiting, timeout=30, message="A -> D shown waiting for A's events 1..2"))
    assert held(d) == [] and held(c) == []

    four.network.heal()
    async def started() -> bool:
        return (await asyncio.to_thread(log_row, d, "a-to-d", inventory))["state"] == "running"

    run(eventually(started, timeout=60, message="A -> D started once D had A's past"))
    for site in (c, d):
        run(eventually(lambda site=site: _at_least(site, 3), timeout=60, message=f"{site.name} holds three records"))
    # Every location holds e1, e2 and e3, each once, in A's order (nothing more arrives).
    for site in (b, c, d):
        assert held(site) == ids, f"{site.name}: {held(site)}"


async def _at_least(site, count: int) -> bool:
    return len(await holding(site)) >= count


def test_a_location_joining_without_the_past_gets_what_its_peer_retains_and_its_peers_wait_for_its_deleted_past(four: Sites, tmp_path: Path):
    """``--start-from now`` (#314's join with new events only) and ``--causal`` edges: D joins A
    without the events A deleted; C, new too, is fed by D first (it must wait: D's deleted past
    is A's e1, e2, which C lacks) and then by B (which has them): C ends with everything, in order."""
    a, b, c, d = (four[n] for n in "abcd")
    inventory = four.write_inventory(tmp_path / "inventory.toml", default="a")
    a.meta().create_log(LOG, ONE_COPY)
    code, _, err = run_cli(inventory, "init-replication", "--source", "a", "--sink", "b", "--bidirectional", "--logs", LOG)
    assert code == 0, err
    events = [run(append_one(a.meta(), f"e{i}".encode())) for i in (1, 2, 3)]
    run(eventually(lambda: PinStore(a.meta()).get("a-to-b", LOG).value.position > events[2], timeout=30, message="A -> B checkpointed past e3"))
    code, _, err = run_cli(inventory, "--cluster", "a", "truncate", LOG, "--to", str(events[2]))
    assert code == 0, err

    code, out, err = run_cli(inventory, "-o", "json", "init-replication", "--source", "a", "--sink", "d", "--bidirectional", "--logs", LOG, "--start-from", "now")
    assert code == 0, err
    run(eventually(lambda: _at_least(d, 1), timeout=30, message="D got A's retained e3"))
    d_event = run(append_one(d.meta(), b"d1"))
    run(eventually(lambda: _at_least(b, 4), timeout=30, message="D's record reached B through A"))
    assert held(d) == [("a", events[2]), ("d", d_event)]  # A's deleted e1, e2: never asked for, never waited for

    # C joins by two directed edges: first from D, then from B.
    code, _, err = run_cli(inventory, "init-replication", "--source", "d", "--sink", "c", "--causal", "--logs", LOG)
    assert code == 0, err

    async def d_to_c_waits() -> bool:
        row = await asyncio.to_thread(log_row, c, "d-to-c", inventory)
        return row["state"] == "waiting-for-causal-past" and row["waiting_for"] == "a 1..2"

    run(eventually(d_to_c_waits, timeout=30, message="D -> C waits for A's events 1..2, which D joined without"))
    code, _, err = run_cli(inventory, "init-replication", "--source", "b", "--sink", "c", "--causal", "--logs", LOG)
    assert code == 0, err
    run(eventually(lambda: _at_least(c, 4), timeout=60, message="C holds four records"))
    assert held(c) == [("a", e) for e in events] + [("d", d_event)]
    run(eventually(lambda: asyncio.to_thread(lambda: log_row(c, "d-to-c", inventory)["state"] == "running"), timeout=30, message="D -> C started"))
    e4 = run(append_one(a.meta(), b"e4"))
    for site in (b, c, d):
        run(eventually(lambda site=site: _at_least(site, 5 if site is not d else 3), timeout=60, message=f"{site.name} got e4"))
    assert held(c) == [("a", e) for e in events] + [("d", d_event), ("a", e4)]
    assert held(d) == [("a", events[2]), ("d", d_event), ("a", e4)]


def test_a_one_way_stream_starts_where_the_operator_says(four: Sites, tmp_path: Path):
    import datetime
    import time

    a, b, c, d = (four[n] for n in "abcd")
    inventory = four.write_inventory(tmp_path / "inventory.toml", default="a")
    a.meta().create_log(LOG, ONE_COPY)
    first = [run(append_one(a.meta(), f"r{i}".encode())) for i in range(3)]
    cut = time.time()
    run(eventually(lambda: time.time() > cut + 0.05, timeout=1, message="time passes"))  # completions strictly after the cut
    later = [run(append_one(a.meta(), f"r{i}".encode())) for i in range(3, 5)]
    code, out, err = run_cli(inventory, "-o", "json", "init-replication", "--source", "a", "--sink", "b", "--logs", LOG, "--start-from", str(first[1]))
    assert code == 0, err
    when = datetime.datetime.fromtimestamp(cut, datetime.timezone.utc).isoformat()
    code, out, err = run_cli(inventory, "-o", "json", "init-replication", "--source", "a", "--sink", "c", "--logs", LOG, "--start-from", when)
    assert code == 0, err
    run(eventually(lambda: _at_least(b, 4), timeout=30, message="B streams from r1"))
    assert held(b) == [("a", p) for p in first[1:] + later]
    # Records carry their append time: C starts at the first record appended after the cut
    # (the test's clock read between the appends, the oracle).
    run(eventually(lambda: _at_least(c, len(later)), timeout=30, message="C streams from the first record appended after the cut"))
    assert held(c) == [("a", p) for p in later]
    # A causal stream given a position: refused (exit 2), nothing changed.
    code, _, err = run_cli(inventory, "init-replication", "--source", "a", "--sink", "d", "--causal", "--logs", LOG, "--start-from", str(first[1]))
    assert code == 2 and "only 'now'" in " ".join(err.split())
    assert "a-to-d" not in StreamStore(d.meta()).list_streams()
    # From now: only what is written after.
    code, out, err = run_cli(inventory, "-o", "json", "init-replication", "--source", "a", "--sink", "d", "--logs", LOG, "--start-from", "now")
    assert code == 0, err
    newest = run(append_one(a.meta(), b"r5"))
    try:
        run(eventually(lambda: _at_least(d, 1), timeout=30, message="D streams from now"))
    except AssertionError as exc:  # seen once in CI, never since: keep what the stream said
        code, status, err = run_cli(inventory, "--cluster", "d", "-o", "json", "replication", "status", "a-to-d")
        raise AssertionError(f"{exc}; r5 is at {newest}; the stream's status (exit {code}): {status or err}") from None
    assert held(d) == [("a", newest)]


def test_filters_sit_only_where_no_record_can_be_lost_and_the_topology_shows_the_network_and_its_history(four: Sites, tmp_path: Path):
    from dlctl.replication.history import HistoryStore

    a, b, c, d = (four[n] for n in "abcd")
    inventory = four.write_inventory(tmp_path / "inventory.toml", default="a")
    a.meta().create_log(LOG, ONE_COPY)
    for argv in (("--source", "a", "--sink", "b", "--bidirectional"), ("--source", "b", "--sink", "c", "--causal"), ("--source", "c", "--sink", "d", "--causal", "--filter", "key=eu-*")):
        code, _, err = run_cli(inventory, "init-replication", *argv, "--logs", LOG)
        assert code == 0, err
    # Refused, with the reason, changing nothing: a filter that would sit on a cycle, a connection
    # out of the filtered connection's sink (it is terminal), a second feed of that sink.
    refusals = [
        (("--source", "c", "--sink", "a", "--causal", "--filter", "key=x"), "on a cycle"),
        (("--source", "d", "--sink", "a", "--causal"), "a location a filter feeds is terminal"),
        (("--source", "a", "--sink", "d", "--causal"), "fed by a filtered connection from c"),
        (("--source", "a", "--sink", "b", "--filter", "key=x"), "is or was on a cycle"),
    ]
    for argv, why in refusals:
        code, _, err = run_cli(inventory, "init-replication", *argv, "--logs", LOG)
        assert code in (1, 4) and why in " ".join(err.split()), (argv, err)
    assert sorted(StreamStore(d.meta()).list_streams()) == ["c-to-d"] and "c-to-a" not in StreamStore(a.meta()).list_streams()

    keys = [b"eu-1", b"us-1", b"eu-2"]
    ids = [("a", run(append_one(a.meta(), k, key=k))) for k in keys]
    run(eventually(lambda: _at_least(c, 3), timeout=60, message="C holds every record"))
    run(eventually(lambda: _at_least(d, 2), timeout=60, message="D holds the records its filter admits"))
    assert held(c) == ids
    assert held(d) == [ids[0], ids[2]]  # us-1 filtered out
    assert len(held(d)) == 2  # and nothing else came

    code, view, err = run_cli(inventory, "-o", "json", "replication", "topology")
    assert code == 0, err
    edges = {(e["source"], e["sink"]): e for e in view["edges"]}
    assert set(edges) == {("a", "b"), ("b", "a"), ("b", "c"), ("c", "d")}
    assert edges["a", "b"]["on_cycle"] and edges["a", "b"]["edge"] == "a <-> b"
    assert not edges["b", "c"]["on_cycle"] and edges["c", "d"]["filter"] == "key=eu-*"
    assert [(e["kind"], e["source"], e["sink"]) for e in view["history"]] == [
        ("connect", "a", "b"), ("connect", "b", "a"), ("connect", "b", "c"), ("connect", "c", "d"),
    ]
    # The history travels along the streams: D, which only C feeds, learns of A <-> B.
    def d_knows() -> bool:
        return {(e.source, e.sink) for e in HistoryStore(d.meta()).events()} >= {("a", "b"), ("b", "a"), ("b", "c"), ("c", "d")}

    run(eventually(d_knows, timeout=30, message="the network history reached D"))
    # A broken cycle stays in the history: a -> b is no longer on a cycle, but was.
    code, _, err = run_cli(inventory, "--cluster", "a", "replication", "delete", "b-to-a")
    assert code == 0, err
    code, view, err = run_cli(inventory, "-o", "json", "replication", "topology")
    edges = {(e["source"], e["sink"]): e for e in view["edges"]}
    assert not edges["a", "b"]["on_cycle"] and edges["a", "b"]["ever_on_cycle"]
    assert view["history"][-1]["kind"] == "disconnect" and (view["history"][-1]["source"], view["history"][-1]["sink"]) == ("b", "a")
    code, text, err = run_cli(inventory, "replication", "topology")
    assert code == 0 and "a ===> b   [was on a cycle, causal]" in text and "c ===> d   [causal, filter c->d: key=eu-*]" in text, text

    # #314's redundant filtered connection and fail-over: a second feed of D carrying the same
    # filter joins while C -> D runs; then C -> D goes (C lost) and B -> D carries on alone. A
    # feed with another filter, or none (also C -> D re-declared without its filter), is refused.
    for argv, why in (
        (("--source", "b", "--sink", "d", "--filter", "key=*-2"), "filter key=eu-*"),
        (("--source", "b", "--sink", "d"), "never bring the records that filter held back"),
        (("--source", "c", "--sink", "d", "--causal"), "never bring the records that filter held back"),
        (("--source", "b", "--sink", "d", "--filter", "key=eu-*"), "must be causal"),
    ):
        code, _, err = run_cli(inventory, "init-replication", *argv, "--logs", LOG)
        assert code == 4 and why in " ".join(err.split()), (argv, err)
    assert StreamStore(d.meta()).get_config("c-to-d").value.filter == "key=eu-*"
    code, _, err = run_cli(inventory, "init-replication", "--source", "b", "--sink", "d", "--causal", "--filter", "key=eu-*", "--logs", LOG)
    assert code == 0, err
    ids += [("a", run(append_one(a.meta(), k, key=k))) for k in (b"eu-3", b"us-2")]
    run(eventually(lambda: _at_least(d, 3), timeout=60, message="D holds eu-3"))
    code, _, err = run_cli(inventory, "--cluster", "d", "replication", "delete", "c-to-d")
    assert code == 0, err
    ids += [("a", run(append_one(a.meta(), b"eu-4", key=b"eu-4")))]
    run(eventually(lambda: _at_least(d, 4), timeout=60, message="D holds eu-4 through B"))
    assert held(d) == [ids[0], ids[2], ids[3], ids[5]]  # each eu- record once, in A's order


def test_a_retired_location_leaves_the_network_for_good(four: Sites, tmp_path: Path):
    a, b, c = four["a"], four["b"], four["c"]
    inventory = a_b_c(four, tmp_path)
    first = run(append_one(a.meta(), b"before"))
    run(eventually(lambda: _at_least(c, 1), timeout=30, message="C got the first record"))

    code, plan, err = run_cli(inventory, "-o", "json", "replication", "retire", "c", "--dry-run")
    assert code == 0, err
    assert sorted(StreamStore(c.meta()).list_streams()) == ["b-to-c"] and "c-to-b" in StreamStore(b.meta()).list_streams()  # dry run: nothing changed
    code, _, err = run_cli(inventory, "replication", "retire", "c")
    assert code == 0, err
    assert StreamStore(c.meta()).list_streams() == [] and "c-to-b" not in StreamStore(b.meta()).list_streams()
    assert "a-to-b" in StreamStore(b.meta()).list_streams()  # the rest of the network stays

    code, view, err = run_cli(inventory, "-o", "json", "replication", "topology")
    assert code == 0 and view["retired"] == ["c"] and "c" not in view["locations"], view
    assert {(e["source"], e["sink"]) for e in view["edges"]} == {("a", "b"), ("b", "a")}
    code, _, err = run_cli(inventory, "init-replication", "--source", "b", "--sink", "c", "--bidirectional", "--logs", LOG)
    assert code == 4 and "retired" in err
    after = run(append_one(a.meta(), b"after"))
    run(eventually(lambda: _at_least(b, 2), timeout=30, message="B still gets A's records"))
    assert held(c) == [("a", first)] and held(b) == [("a", first), ("a", after)]


def stamps(site) -> dict[tuple[str, DLSN], dict[str, int]]:
    """Origin identity -> the vector timestamp ``site`` stored with the record (``dl.vt``)."""
    return {origin_of(r): Origin.from_headers(r.headers).vt for r in run(read_all(site.meta(), LOG, idle=1.0)) if origin_of(r)}


def test_a_retired_location_settles_once_every_location_holds_its_events_and_leaves_new_timestamps(four: Sites, tmp_path: Path):
    """Issue 21 item 7: C writes two records and retires. Once A and B both hold them (their
    checkpoints say so), ``retire`` run again settles C at 2 in the log: records A writes from
    then on reach B without C in their timestamps; those written before keep C exactly."""
    a, b, c = four["a"], four["b"], four["c"]
    inventory = a_b_c(four, tmp_path)
    from_c = [("c", run(append_one(c.meta(), f"c{i}".encode()))) for i in (1, 2)]
    run(eventually(lambda: _at_least(a, 2), timeout=60, message="A holds C's two records (through B)"))
    before = ("a", run(append_one(a.meta(), b"before")))
    run(eventually(lambda: _at_least(b, 3), timeout=30, message="B holds A's record"))
    assert stamps(b)[before] == {"a": 1, "c": 2}  # C's events are in its past

    code, out, err = run_cli(inventory, "-o", "json", "replication", "retire", "c")
    assert code == 0, err

    def settled() -> bool:
        code, view, err = run_cli(inventory, "-o", "json", "replication", "topology")
        assert code == 0, err
        if view["settled"].get("c") == {LOG: 2}:
            return True
        code, _, err = run_cli(inventory, "replication", "retire", "c")  # run again: settles once A and B agree
        assert code == 0, err
        return False

    wait_until(settled, timeout=60, interval=0.5, message="C settled at 2 in the log")

    def written_without_c() -> bool:
        # A's stream to B picks the settle up at its next refresh: write until a record comes without C.
        mine = ("a", run(append_one(a.meta(), b"after")))
        run(eventually(lambda: _holds(b, mine), timeout=30, message="B holds A's new record"))
        return "c" not in stamps(b)[mine]

    wait_until(written_without_c, timeout=60, message="A's new records reach B without C in their timestamps")
    more = [("a", run(append_one(a.meta(), f"more{i}".encode()))) for i in range(3)]
    run(eventually(lambda: _holds(b, more[-1]), timeout=30, message="B holds A's last record"))
    at_b = stamps(b)
    assert all("c" not in at_b[m] for m in more), {m: at_b[m] for m in more}
    assert at_b[before] == {"a": 1, "c": 2} and [at_b[i]["c"] for i in from_c] == [1, 2]  # what was stamped stays
    assert sorted(at_b) == sorted({*from_c, before, *at_b}) and len(at_b) == len(set(at_b))


async def _holds(site, ident: tuple[str, DLSN]) -> bool:
    return ident in await holding(site)


def test_records_the_sink_holds_stay_at_the_source(four: Sites, tmp_path: Path):
    """Source-side filtering: a new connection B -> C into a C that holds A's records already
    (from A directly) carries them as stubs — their payloads never cross B -> C — while the same
    records cross B -> D whole into a D that lacks them (the byte counts can tell)."""
    a, b, c, d = (four[n] for n in "abcd")
    inventory = four.write_inventory(tmp_path / "inventory.toml", default="a")
    a.meta().create_log(LOG, LogConfig(ensemble_size=1, write_quorum=1, ack_quorum=1))
    for source, sink in (("a", "b"), ("a", "c")):
        code, _, err = run_cli(inventory, "init-replication", "--source", source, "--sink", sink, "--causal", "--logs", LOG)
        assert code == 0, err
    count, size = 200, 4000
    # Incompressible payloads: the byte counts measure what crosses, whatever the stream's compression.
    ids = [("a", p) for p in run(append_many(a.meta(), [os.urandom(size) for _ in range(count)]))]
    for site in (b, c):
        run(eventually(lambda site=site: _at_least(site, count), timeout=60, message=f"{site.name} holds A's records"))
    run(eventually(lambda: StreamStore(c.meta()).get_checkpoint("a-to-c", LOG).value.next > ids[-1][1], timeout=30, message="A -> C checkpointed past the last record"))

    def edge_bytes(source: str, sink: str) -> int:
        return sum(p.bytes_forwarded["down"] for p in four.network.proxies if p.name.startswith(source) and p.name.endswith(f"-for-{sink}") and not p.name.startswith("zk-"))

    before = {sink: edge_bytes("b", sink) for sink in "cd"}
    for sink in "cd":
        code, _, err = run_cli(inventory, "init-replication", "--source", "b", "--sink", sink, "--causal", "--logs", LOG)
        assert code == 0, err
    run(eventually(lambda: _at_least(d, count), timeout=60, message="D holds A's records (through B)"))
    run(eventually(lambda: StreamStore(c.meta()).get_checkpoint("b-to-c", LOG).value.processed_records >= count, timeout=60, message="B -> C read B's log"))
    cp = StreamStore(c.meta()).get_checkpoint("b-to-c", LOG).value
    assert (cp.applied_records, cp.left_at_source) == (0, count)
    assert held(c) == ids and held(d) == ids  # each once, in order
    crossed = {sink: edge_bytes("b", sink) - before[sink] for sink in "cd"}
    print(f"B -> C {crossed['c']} bytes, B -> D {crossed['d']} bytes")
    assert crossed["d"] > count * size  # the payloads crossed to D ...
    # ... and stayed at B for C: the two streams read the same log the same way but for that.
    assert crossed["d"] - crossed["c"] > 0.9 * count * size, crossed


async def append_many(meta, payloads: list[bytes]) -> list[DLSN]:
    """One after the other (an entry each: the streams' status probes, which read an entry now
    and then, stay small next to the payloads)."""
    pool = AgentPool(meta, harness_credentials())
    producer = LogProducer(meta, pool, LOG)
    try:
        return [await producer.submit(p) for p in payloads]
    finally:
        await producer.close()
        await pool.close()


def test_a_location_a_filter_feeds_is_terminal_and_dr_recover_brings_back_what_the_filter_admits(four: Sites, tmp_path: Path):
    """#314: recovery over filtered connections only for terminal locations — and a location a
    filter feeds is terminal by construction (a connection out of it is refused): dr recover of
    it gets back exactly what the filter admits."""
    a, b = four["a"], four["b"]
    inventory = four.write_inventory(tmp_path / "inventory.toml", default="a")
    a.meta().create_log(LOG, LogConfig(ensemble_size=1, write_quorum=1, ack_quorum=1))
    code, _, err = run_cli(inventory, "init-replication", "--source", "a", "--sink", "b", "--causal", "--filter", "key=keep-*", "--logs", LOG)
    assert code == 0, err
    keys = [b"keep-1", b"drop-1", b"keep-2"]
    ids = [("a", run(append_one(a.meta(), k, key=k))) for k in keys]
    run(eventually(lambda: _at_least(b, 2), timeout=30, message="B holds what its filter admits"))
    assert held(b) == [ids[0], ids[2]]

    code, _, err = run_cli(inventory, "init-replication", "--source", "b", "--sink", "c", "--causal", "--logs", LOG)
    assert code == 4 and "a location a filter feeds is terminal" in " ".join(err.split()), err
    b.wipe_disks()
    code, out, err = run_cli(inventory, "-o", "json", "dr", "recover", "--cluster", "b")
    assert code == 0, err
    run(eventually(lambda: _at_least(b, 2), timeout=60, message="B got the admitted records back"))
    assert held(b) == [ids[0], ids[2]]
