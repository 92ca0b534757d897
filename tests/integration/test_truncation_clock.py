"""A truncated log keeps its clock (DESIGN.md §7, §9; ``dlctl.replication.truncation_base``).

Real clusters ``a``, ``b`` and ``c`` (real ZooKeeper, real agents running the replication
workers and the housekeeper), the real ``dlctl truncate``, retention applied by the elected
housekeeper, and real Spark in local mode for the bootstrap copy.

The property: a record written at ``a`` has ONE vector timestamp everywhere. ``b`` streams ``a``
from the beginning; after ``a`` truncated, whoever derives timestamps from ``a``'s retained start
(a bootstrap of ``c``, a reader of ``a``) must get exactly the timestamps ``b`` got — which
differ from counting from zero at the truncation point (the tests check that too, so they could
fail).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from harness.agents import DEFAULT_SECRET, harness_credentials
from harness.faultproxy import FaultNetwork
from harness.logcluster import eventually, log_writer, run
from harness.procs import ProcessRegistry
from harness.twoclusters import Sites, origin_of, read_all, replication_sites, sink_now

from dlctl.errors import ExitCode, RefusedError
from dlctl.log.client import AgentClient
from dlctl.log.dlsn import DLSN
from dlctl.log.pool import AgentPool
from dlctl.meta.pins import PinRecord, PinStore
from dlctl.meta.records import LogConfig
from dlctl.meta.truncation import TruncationStore
from dlctl.ops import replication as ops
from dlctl.ops import streams as stream_ops
from dlctl.plan import apply
from dlctl.replication import dr
from dlctl.replication.causal import SourceClock
from dlctl.replication.clock import ClockStore
from dlctl.replication.network import deletion_vector
from dlctl.replication.origin import Origin
from dlctl.replication.store import StreamStore
from dlctl.replication.truncation_base import prepare

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.spark, pytest.mark.slow]

HOUSEKEEPING = "[housekeeping]\nenabled = true\ncheck_seconds = 0.5\n"


@pytest.fixture(scope="module")
def sites(zk_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sites]:
    zk_server.ensure_running()
    base = tmp_path_factory.mktemp("truncation-clock")
    procs = ProcessRegistry(base / "procs")
    with FaultNetwork() as network:
        yield from replication_sites(zk_server, base, procs, network, "truncation-clock", clusters=("a", "b", "c"), proxied=False, agent_options=HOUSEKEEPING)


@pytest.fixture(scope="module")
def inventory(sites: Sites, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sites.write_inventory(tmp_path_factory.mktemp("inv") / "inventory.toml", default="a")


def dlctl(inv: Path, *argv: str) -> tuple[int, dict]:
    from dlctl.cli.main import main

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["--config", str(inv), "--yes", "-o", "json", *argv])
    text = out.getvalue()
    return code, (json.loads(text) if text.strip() else {})


async def segment(meta, name: str, payloads: list[bytes]) -> list[DLSN]:
    """One completed segment holding ``payloads`` (a writer per call: closing it completes it)."""
    async with log_writer(meta, name) as writer:
        futures = [writer.submit(p) for p in payloads]
        await writer.flush()
        return [f.result() for f in futures]


async def grouped(meta, name: str, groups: list[list[bytes]]) -> list[DLSN]:
    """One completed segment holding ``groups``, each flushed on its own."""
    async with log_writer(meta, name) as writer:
        out: list[DLSN] = []
        for group in groups:
            futures = [writer.submit(p) for p in group]
            await writer.flush()
            out += [f.result() for f in futures]
        return out


def write_segments(site, name: str, count: int, per: int, tag: str) -> list[DLSN]:
    out: list[DLSN] = []
    for s in range(count):
        out += run(segment(site.meta(), name, [f"{tag}-{s}-{i}".encode() for i in range(per)]))
    return out


def stream(sites: Sites, source: str, sink: str, name: str) -> ops.InitPlan:
    built = ops.init_plan(sites[source].session(), sites[sink].session(), patterns=(name,))
    ops.refuse_unavailable_bootstrap(built)
    apply(built.plan)
    return built


def stamps_at(site, name: str, count: int) -> dict[tuple[str, DLSN], dict[str, int]]:
    """Identity -> vector timestamp of every replicated record ``site`` holds (``dl.vt``)."""
    records = run(read_all(site.meta(), name, until=count, timeout=90), timeout=120)
    # (once in a stress run: fewer records within the 60 s run() allowed then)
    assert len(records) == count, f"{site.name} holds {len(records)} of {count} records\n{sink_now(site)}"
    out = {}
    for r in records:
        origin = Origin.from_headers(r.headers)
        assert origin is not None
        assert (origin.cluster, origin.dlsn) not in out, f"{site.name}: {origin_of(r)} twice"
        out[(origin.cluster, origin.dlsn)] = origin.vt
    return out


def pin_past(site, holder: str, name: str, position: DLSN) -> None:
    run(eventually(lambda: PinStore(site.meta()).get(holder, name).value.position >= position, timeout=30, message=f"the pin of {holder} past {position}"))


def test_a_sink_bootstrapped_after_truncate_gets_the_timestamps_a_sink_streaming_from_the_start_got(sites: Sites, inventory: Path):
    a, b, c = sites["a"], sites["b"], sites["c"]
    name = "events"
    a.meta().create_log(name, LogConfig())
    written = write_segments(a, name, 2, 60, "early")
    assert [d.decision.value for d in stream(sites, "a", "b", name).decisions] == ["start"]
    written += write_segments(a, name, 2, 60, "late")
    at_b = stamps_at(b, name, len(written))
    point = written[120]  # the start of the third segment: 120 local records lie before it
    assert point == DLSN(point.segment_seq, 0, 0)
    before = 120
    pin_past(a, "a-to-b", name, point)

    # The plan says what it reads first.
    code, out = dlctl(inventory, "truncate", name, "--to", str(point), "--dry-run")
    assert code == 0 and any(n.startswith(f"the clock base at {point} is recorded first") and "a-to-b" in n for n in out["notes"]), out
    # A truncation cut short after it recorded the base (point not moved) changes no timestamp.
    prepare(a.meta(), name, point, secret=harness_credentials())
    assert TruncationStore(a.meta()).get(name) is None
    early, _ = run(_stamped(a, name))
    assert {(("a", r.dlsn)): vt for r, vt in early} == at_b

    code, out = dlctl(inventory, "truncate", name, "--to", str(point))
    assert code == 0, out
    assert TruncationStore(a.meta()).get(name).value.point == point
    base = ClockStore(a.meta()).truncation_base(name)
    # The base is exactly the vector b's stream held before the point: the last earlier record's stamp.
    assert base == (point, at_b[("a", max(d for d in written if d < point))]) == (point, {"a": before})
    # Re-running is idempotent and records the same base.
    code, _ = dlctl(inventory, "truncate", name, "--to", str(point))
    assert code == 0 and ClockStore(a.meta()).truncation_base(name) == base

    # A reader of a from its retained start stamps as b's stream did.
    retained, _ = run(_stamped(a, name))
    assert [r.dlsn for r, _ in retained] == [d for d in written if d >= point]
    assert {("a", r.dlsn): vt for r, vt in retained} == {k: v for k, v in at_b.items() if k[1] >= point}

    # c bootstraps from a (Spark copy of a's retained segments), then streams on.
    built = stream(sites, "a", "c", name)
    assert [d.decision.value for d in built.decisions] == ["bootstrap"]
    more = write_segments(a, name, 1, 30, "after")
    at_b = stamps_at(b, name, len(written) + len(more))
    at_c = stamps_at(c, name, len(written) + len(more) - before)
    assert at_c == {k: v for k, v in at_b.items() if k[1] >= point}
    # Without the recorded base, counting from zero at the point gives other timestamps.
    first = min(k for k in at_c)
    assert at_c[first] == {"a": before + 1} != SourceClock("a").stamp(None)


async def _stamped(site, name: str):
    pool = AgentPool(site.meta(), harness_credentials())
    try:
        return await dr.stamped(site.meta(), pool, name, site.name)
    finally:
        await pool.close()


def test_retention_by_the_housekeeper_records_the_base_before_it_truncates(sites: Sites, inventory: Path):
    a, b = sites["a"], sites["b"]
    name = "metrics"
    a.meta().create_log(name, LogConfig())
    written = write_segments(a, name, 4, 40, "m")
    stream(sites, "a", "b", name)
    at_b = stamps_at(b, name, len(written))
    pin_past(a, "a-to-b", name, dr.after(written[-1]))
    segments = {v.value.seq: v.value for v in a.meta().segments(name)}
    keep = segments[written[-1].segment_seq].bytes + segments[written[-41].segment_seq].bytes  # the last two segments
    code, out = dlctl(inventory, "log", "retention", name, "--max-bytes", str(keep))
    assert code == 0, out

    def truncated():
        t = TruncationStore(a.meta()).get(name)
        return t is not None and t.value.point >= DLSN(written[-41].segment_seq, 0, 0) and t

    t = run(eventually(truncated, timeout=30, message="the housekeeper applying retention"))
    point = t.value.point
    before = sum(1 for d in written if d < point)
    assert before >= 80
    assert ClockStore(a.meta()).truncation_base(name) == (point, {"a": before})
    retained, _ = run(_stamped(a, name))
    assert {("a", r.dlsn): vt for r, vt in retained} == {k: v for k, v in at_b.items() if k[1] >= point}
    assert retained[0][1] == {"a": before + 1} != SourceClock("a").stamp(None)


def test_unreadable_segments_refuse_the_truncation_and_change_nothing(sites: Sites, inventory: Path):
    a = sites["a"]
    name = "fragile"
    a.meta().create_log(name, LogConfig())
    written = write_segments(a, name, 3, 20, "f")
    second = written[20].segment_seq
    end = DLSN(written[-1].segment_seq + 1, 0, 0)
    # A stream reads it (its pin is past everything): the log's clock matters.
    PinStore(a.meta()).set(PinRecord(holder="a-to-z", log=name, position=end, sink_cluster="z"))
    log_id = a.meta().get_log(name).value.log_id

    async def wipe() -> None:
        for node in a.agents.values():
            client = AgentClient(node.host, node.port, DEFAULT_SECRET, tls=node.client_tls)
            try:
                await client.delete_segment(log_id, second)
            finally:
                await client.close()

    run(wipe())
    for extra in ((), ("--force",)):  # --force passes pins, never this
        code, out = dlctl(inventory, "truncate", name, "--to", str(end), *extra)
        assert code == ExitCode.REFUSED, out
        assert f"segment {second}" in json.dumps(out), out
        assert TruncationStore(a.meta()).get(name) is None
        assert ClockStore(a.meta()).truncation_base(name) is None
        assert not PinStore(a.meta()).get("a-to-z", name).value.needs_bootstrap
    # Up to the unreadable segment it goes (what lies before it is read).
    code, out = dlctl(inventory, "truncate", name, "--to", f"{second}/0/0")
    assert code == 0, out
    assert ClockStore(a.meta()).truncation_base(name) == (DLSN(second, 0, 0), {"a": 20})


def test_a_log_nobody_replicates_is_truncated_without_reading_or_a_clock_base(sites: Sites, inventory: Path):
    a = sites["a"]
    name = "local-only"
    a.meta().create_log(name, LogConfig())
    written = write_segments(a, name, 2, 10, "l")
    code, out = dlctl(inventory, "truncate", name, "--to", f"{written[-1].segment_seq}/0/0")
    assert code == 0, out
    assert ClockStore(a.meta()).get(name).version == -1  # nothing written


def test_a_log_a_deleted_stream_wrote_into_records_its_base_when_truncated(sites: Sites, inventory: Path):
    """No stream carries it any more, but another location's records are in it: what the
    truncation deletes of them is this location's deletion vector, which must be known (a new
    connection out of here is gated on it)."""
    b, c = sites["b"], sites["c"]
    name = "fed-once"
    c.meta().create_log(name, LogConfig())
    from_c = write_segments(c, name, 2, 20, "c")
    stream(sites, "c", "b", name)
    stamps_at(b, name, len(from_c))
    code, out = dlctl(inventory, "--cluster", "b", "replication", "delete", "c-to-b")
    assert code == 0, out
    assert "c-to-b" not in StreamStore(b.meta()).list_streams()
    code, out = dlctl(inventory, "dr", "promote", "--cluster", "b", "--logs", name, "--confirm", "b")
    assert code == 0, out
    local = write_segments(b, name, 1, 10, "b")
    code, out = dlctl(inventory, "--cluster", "b", "truncate", name, "--to", str(local[0]))
    assert code == 0, out
    # The oracle: c's 40 records lie before the point, b wrote none there.
    assert ClockStore(b.meta()).truncation_base(name) == (local[0], {"c": len(from_c)})
    assert deletion_vector(b.meta(), name) == {"c": len(from_c)}


def test_a_point_inside_an_entry_keeps_the_stamps_of_the_records_after_it(sites: Sites, inventory: Path):
    a, b = sites["a"], sites["b"]
    name = "orders"
    a.meta().create_log(name, LogConfig())
    written = write_segments(a, name, 2, 50, "o")
    stream(sites, "a", "b", name)
    at_b = stamps_at(b, name, len(written))
    pin_past(a, "a-to-b", name, dr.after(written[-1]))
    inside = [i for i, d in enumerate(written) if d.slot > 0 and i > 50]
    assert inside, "the writer put every record in an entry of its own: no point inside an entry"
    k = inside[0]
    point = written[k]
    code, out = dlctl(inventory, "truncate", name, "--to", str(point))
    assert code == 0, out
    assert ClockStore(a.meta()).truncation_base(name) == (point, {"a": k})
    entry = DLSN(point.segment_seq, point.entry_id, 0)
    assert ClockStore(a.meta()).truncation_entry(name) == (entry, {"a": sum(1 for d in written if d < entry)})
    retained, _ = run(_stamped(a, name))
    assert retained[0][0].dlsn == point
    assert {("a", r.dlsn): vt for r, vt in retained} == {key: v for key, v in at_b.items() if key[1] >= point}


def test_the_point_of_a_replicated_log_never_moves_past_its_recorded_base(sites: Sites):
    """What moves a truncation point without recording the base first (``dlctl gc`` applying
    retention) is refused for a replicated log, and allowed once the base is there."""
    a = sites["a"]
    name = "guarded"
    a.meta().create_log(name, LogConfig())
    written = write_segments(a, name, 2, 10, "g")
    end = DLSN(written[-1].segment_seq + 1, 0, 0)
    store = TruncationStore(a.meta())
    PinStore(a.meta()).set(PinRecord(holder="a-to-z", log=name, position=end, sink_cluster="z"))
    with pytest.raises(RefusedError, match="clock base"):
        store.advance(name, end, reason="retention", by="test")
    assert store.get(name) is None
    prepare(a.meta(), name, end, secret=harness_credentials())
    _, moved = store.advance(name, end, reason="retention", by="test")
    assert moved and ClockStore(a.meta()).truncation_base(name) == (end, {"a": 20})


def test_a_bootstrap_after_truncating_inside_a_segment_is_not_refused_and_stamps_as_the_stream_from_the_start(sites: Sites, inventory: Path):
    """``dlctl truncate`` to a point in the middle of a segment (inside an entry): the truncation's
    clock steps lie inside the segment a bootstrap copies (from the point's entry on). The copy
    must not be refused, and every record — in that segment and in the segments after it, whose
    vectors are folded from the copied part's record count — gets the timestamp ``b`` got."""
    a, b, c = sites["a"], sites["b"], sites["c"]
    name = "mid"
    a.meta().create_log(name, LogConfig())
    written: list[DLSN] = []
    for s in range(3):  # entries of several records: flushing a group closes its entry
        written += run(grouped(a.meta(), name, [[f"m-{s}-{g}-{i}".encode() for i in range(10)] for g in range(6)]))
    assert [d.decision.value for d in stream(sites, "a", "b", name).decisions if d.log == name] == ["start"]
    at_b = stamps_at(b, name, len(written))
    pin_past(a, "a-to-b", name, dr.after(written[-1]))
    middle = written[60].segment_seq
    inside = [i for i, d in enumerate(written) if d.segment_seq == middle and d.slot > 0 and d.entry_id > 0 and i < 110]
    assert inside, "no record of the middle segment lies inside an entry after its first one"
    k1 = inside[0]
    later = [i for i in inside if written[i].entry_id > written[k1].entry_id]
    assert later
    k = later[len(later) // 2]
    point1, point = written[k1], written[k]
    entry1, entry = DLSN(middle, point1.entry_id, 0), DLSN(middle, point.entry_id, 0)
    skipped1 = sum(1 for d in written if DLSN(middle, 0, 0) <= d < entry1)
    skipped = sum(1 for d in written if DLSN(middle, 0, 0) <= d < entry)
    assert 0 < skipped1 < skipped

    # Truncated twice inside the segment: the second scan starts at the first point (inside the
    # segment) and continues the counts the first one recorded there.
    store = ClockStore(a.meta())
    code, out = dlctl(inventory, "truncate", name, "--to", str(point1))
    assert code == 0, out
    assert store.truncation_base(name) == (point1, {"a": k1})
    assert store.skipped_records(name) == {(middle, point1.entry_id): skipped1}
    code, out = dlctl(inventory, "truncate", name, "--to", str(point))
    assert code == 0, out
    assert f'"counted {k - k1} record(s) from {point1}"' in json.dumps(out), out  # read once: only what lies between
    assert store.truncation_base(name) == (point, {"a": k})
    # The segment's start is recorded too (exact, like the point's), with its records before the entry.
    assert store.truncation_segment(name).vv == {"a": 60} and store.truncation_segment(name).before_entry == skipped
    assert store.skipped_records(name) == {(middle, point.entry_id): skipped}
    steps = [(DLSN(middle, 0, 0), {"a": 60}), (entry1, {"a": 60 + skipped1}), (point1, {"a": k1}), (entry, {"a": 60 + skipped}), (point, {"a": k})]
    assert list(store.derived_steps(name)) == list(store.steps(name)) == steps
    seg = {v.value.seq: v.value for v in a.meta().segments(name)}[middle]
    assert seg.min_active_entry == point.entry_id

    # The plan is not refused, and c bootstraps (Spark) then streams on. (A stream a -> c that
    # an earlier test made runs: the copy commits into c only while it is paused.)
    running = "a-to-c" in StreamStore(c.meta()).list_streams()
    if running:
        apply(stream_ops.pause_plan(c.session(), "a-to-c"))
    built = stream(sites, "a", "c", name)
    assert [d.decision.value for d in built.decisions if d.log == name] == ["bootstrap"]
    if running:
        apply(stream_ops.resume_plan(c.session(), "a-to-c"))
    more = write_segments(a, name, 1, 30, "after")
    total = len(written) + len(more)
    at_b = stamps_at(b, name, total)
    held = [d for d in written + more if d >= entry]  # the copy starts at the point's entry
    at_c = stamps_at(c, name, len(held))
    assert at_c == {key: v for key, v in at_b.items() if key[1] >= entry}
    # The stamps after the copied part of the segment could only be right with the skipped count.
    first_after = min(key for key in at_c if key[1].segment_seq > middle)
    assert at_c[first_after] == {"a": 121}
