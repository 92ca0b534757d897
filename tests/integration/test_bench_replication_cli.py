"""``dlctl bench replication`` on two real clusters (real ZooKeeper, three real agents each, the
sink's workers reaching the source through the fault proxy), run as an operator types it.

The figures are checked against what the test knows independently: the delay it put on the
link (the sink's lag cannot be shorter, the source's baseline does not cross it), the records
it reads itself from both logs (every record written reached the sink, once, as written), and
the clusters' metadata before and after (a dry run changes nothing; a run, even a failed one,
leaves no log, stream or pin behind unless --keep)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.twoclusters import Sites, read_all, run_cli, sites_for_test

from dlctl.meta.pins import PinStore
from dlctl.ops.bench import STAMP
from dlctl.replication.store import StreamStore

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]

DELAY = 0.25  # one-way, each direction, on every connection of the sink's agents to the source
RATE, SECONDS, WARMUP = 200, 2.0, 0.5
STEPS = ["create-log", "init-replication", "bench-replication", "delete-stream", "delete-sink-log", "delete-source-log"]


@pytest.fixture
def sites(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request)


def bench(inventory: Path, *argv: str) -> tuple[int, dict | list | str, str]:
    return run_cli(inventory, "-o", "json", "bench", "replication", "--source", "a", "--sink", "b", *argv)


def run_argv(log: str) -> tuple[str, ...]:
    return ("--log", log, "--rate", str(RATE), "--seconds", str(SECONDS), "--warmup", str(WARMUP), "--deliver-timeout", "30")


def leftovers(sites: Sites, log: str) -> dict[str, list[str]]:
    """What of a run's log and stream is in either cluster's metadata."""
    return {
        "logs": [f"{c}/{log}" for c in ("a", "b") if log in sites[c].meta().list_logs()],
        "streams": StreamStore(sites["b"].meta()).list_streams(),
        "pins": [f"{p.value.holder}/{p.value.log}" for p in PinStore(sites["a"].meta()).pins_of_log(log)],
    }


def check_consistent(out: dict) -> None:
    """Figures that must agree with each other whatever the machine's speed."""
    written = out["records_written"]
    assert written >= 0.8 * RATE * (SECONDS + WARMUP)  # the paced writer kept (roughly) its rate
    assert out["records_acknowledged"] == out["records_seen_at_sink"] == out["records_seen_at_source"] == written
    assert out["records_missing_at_sink"] == 0 and out["records_repeated_at_sink"] == 0 and out["other_records_at_sink"] == 0
    measured = written - int(RATE * WARMUP)
    for figure in ("lag_ms", "baseline_ms"):
        lat = out[figure]
        assert lat["samples"] == measured
        assert 0 <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"], lat
    assert out["lag_minus_baseline_ms"] == {k: round(out["lag_ms"][k] - out["baseline_ms"][k], 3) for k in ("p50", "p90", "p99", "max")}
    assert out["conditions"]["cpus"] >= 1


def test_lag_over_a_delayed_link_then_nothing_left(sites: Sites, tmp_path: Path) -> None:
    inventory = sites.write_inventory(tmp_path / "inv.toml")
    before = leftovers(sites, "lagged")

    code, plan, err = bench(inventory, *run_argv("lagged"), "--create", "--dry-run")
    assert code == 0, err
    assert [s["action"] for s in plan["steps"]] == STEPS
    assert leftovers(sites, "lagged") == before == {"logs": [], "streams": [], "pins": []}

    sites.network.set_link_delay("a", "b", DELAY)
    code, out, err = bench(inventory, *run_argv("lagged"), "--create")
    assert code == 0, err
    assert out["benchmark"] == "replication" and (out["source"], out["sink"], out["log"], out["stream"]) == ("a", "b", "lagged", "a-to-b")
    check_consistent(out)
    # Every record crossed the delayed link once (the worker's long poll is answered through
    # it); the reader at the source never does.
    assert out["lag_ms"]["p50"] >= DELAY * 1000, out["lag_ms"]
    assert out["baseline_ms"]["p50"] < DELAY * 1000, out["baseline_ms"]
    assert out["lag_minus_baseline_ms"]["p50"] > 0
    assert out["first_delivery_seconds"] >= DELAY
    assert out["created"] is True and sorted(out["removed"]) == ["log a/lagged", "log b/lagged", "stream b/a-to-b"]
    assert leftovers(sites, "lagged") == before


def test_records_match_what_the_logs_hold_and_existing_streams_are_respected(sites: Sites, tmp_path: Path) -> None:
    inventory = sites.write_inventory(tmp_path / "inv.toml")

    code, out, err = bench(inventory, *run_argv("kept"), "--create", "--keep")
    assert code == 0, err
    check_consistent(out)
    assert out["removed"] == []
    # The oracle: both logs read back here. The source holds the prime record and the run's,
    # each with its sequence number; the sink holds the very same payloads in the same order.
    source = asyncio.run(read_all(sites["a"].meta(), "kept", idle=2.0))
    sink = asyncio.run(read_all(sites["b"].meta(), "kept", until=len(source), timeout=30.0))
    assert [r.payload for r in sink] == [r.payload for r in source]
    sequence = [STAMP.unpack_from(r.payload)[1] for r in source]
    assert sequence == [2**32 - 1, *range(out["records_written"])]

    # A log the stream already carries is measured as it is: nothing created, nothing removed.
    code, again, err = bench(inventory, *run_argv("kept"))
    assert code == 0, err
    check_consistent(again)
    assert again["created"] is False and again["removed"] == [] and again["other_records_at_sink"] == 0
    assert "kept" in sites["b"].meta().list_logs() and StreamStore(sites["b"].meta()).list_streams() == ["a-to-b"]

    # A new log would join the operator's stream a-to-b: refused, and nothing is made.
    code, _, err = bench(inventory, *run_argv("other"), "--create")
    assert code == 4 and "a-to-b" in err, err
    assert "other" not in sites["a"].meta().list_logs()

    code, _, err = run_cli(inventory, "bench", "replication", "--source", "a", "--sink", "nosuch", "--create")
    assert code == 2 and "nosuch" in err, err
    code, _, err = bench(inventory, "--log", "missing")
    assert code == 1 and "--create" in err, err


def test_a_stream_that_delivers_nothing_fails_naming_it_and_leaves_nothing(sites: Sites, tmp_path: Path) -> None:
    inventory = sites.write_inventory(tmp_path / "inv.toml")
    sites.network.partition("a", "b")  # the sink's agents cannot reach the source at all
    code, _, err = bench(inventory, *run_argv("cut"), "--create", "--deliver-timeout", "3")
    assert code == 1, err
    assert "delivered nothing" in err and "a-to-b" in err, err
    assert "removed what this run created" in err, err
    assert leftovers(sites, "cut") == {"logs": [], "streams": [], "pins": []}
