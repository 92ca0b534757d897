"""``dlctl bench write|read`` with tiny sizes on a real sandbox: valid JSON, documented fields,
plausible values (not the performance targets: those are for a quiet machine, not CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]


def dlctl(env: dict[str, str], *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "dlctl.cli", *argv],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"dlctl {' '.join(argv)} exited {result.returncode}:\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    base = tmp_path_factory.mktemp("bench-sandbox")
    env = {"DLCTL_SANDBOX_DIR": str(base / "sbx"), "DLCTL_CONFIG": str(base / "sbx" / "config.toml")}
    try:
        dlctl(env, "--yes", "sandbox", "up", "--regions", "1", "--nodes-per-region", "3", "--dir", env["DLCTL_SANDBOX_DIR"])
        yield env
    finally:
        dlctl(env, "--yes", "sandbox", "down", "--purge", "--dir", env["DLCTL_SANDBOX_DIR"], check=False)


def _latency_ok(lat: dict, samples: int) -> None:
    assert lat["samples"] == samples
    assert 0 < lat["p50"] <= lat["p99"] <= lat["p999"] <= lat["max"]


def test_bench_write_then_read_report_what_they_wrote_and_read(sandbox):
    write = json.loads(
        dlctl(
            sandbox, "-q", "-o", "json", "bench", "write", "smoke", "--create", "--record-size", "64",
            "--records", "3000", "--runs", "2", "--warmup-records", "500", "--sync-latency-samples", "40",
        ).stdout
    )
    assert write["benchmark"] == "write" and write["log"] == "smoke" and write["created_log"] is True
    assert write["log_config"] == {"E": 3, "W": 3, "A": 2} and write["agents"] == 3
    # Warm-up + 2 runs + 40 timed (and up to 100 untimed) synchronous appends, all acknowledged.
    assert write["records_written"] == 500 + 2 * 3000 + 40 + 40
    assert write["log_records_after"] - write["log_records_before"] == write["records_written"]
    assert [r["records"] for r in write["runs"]] == [3000, 3000]
    assert all(r["records_per_second"] > 0 and r["mb_per_second"] > 0 and r["seconds"] > 0 for r in write["runs"])
    assert write["records_per_second"] > 0 and write["mb_per_second"] > 0
    _latency_ok(write["sync_append_latency_ms"], 40)
    _latency_ok(write["pipelined_ack_latency_ms"], 3000 // 64)
    assert {t["figure"] for t in write["targets"]} == {"records/s (100 B records)", "MB/s (1 KiB records)"}
    assert all(t["met"] is None for t in write["targets"])  # 64-byte records: no target applies

    read = json.loads(
        dlctl(
            sandbox, "-q", "-o", "json", "bench", "read", "smoke", "--runs", "2",
            "--rate", "500", "--tail-seconds", "1", "--tail-warmup", "0.2",
        ).stdout
    )
    assert read["benchmark"] == "read" and read["created_log"] is False
    assert read["log_records"] == write["log_records_after"]
    assert read["records_read"] == read["records_expected"] == read["log_records"]
    assert [r["records"] for r in read["runs"]] == [read["log_records"]] * 2
    assert read["catch_up_records_per_second"] > 0
    assert read["tail_records_received"] == read["tail_records_written"] > 0
    assert read["tail_records_out_of_sequence"] == 0
    assert read["tail_latency_ms"]["samples"] > 0 and 0 < read["tail_latency_ms"]["p50"] <= read["tail_latency_ms"]["p99"]
    assert read["targets"][0]["met"] is None  # 500 records/s: the 10,000 records/s target does not apply


def test_bench_deletes_only_the_log_it_created(sandbox):
    dry = json.loads(dlctl(sandbox, "-o", "json", "bench", "write", "scratch", "--create", "--delete-after", "--dry-run").stdout)
    assert [s["action"] for s in dry["steps"]] == ["create-log", "bench-write", "delete-log"]

    out = json.loads(
        dlctl(
            sandbox, "-q", "-o", "json", "bench", "read", "scratch", "--create", "--delete-after", "--prefill", "200",
            "--runs", "1", "--rate", "0",
        ).stdout
    )
    assert out["created_log"] is True and out["deleted_log"] is True and out["records_read"] == 200
    assert "scratch" not in [row["name"] for row in json.loads(dlctl(sandbox, "-o", "json", "log", "list").stdout)]

    dlctl(sandbox, "log", "create", "keepme")
    out = json.loads(dlctl(sandbox, "-q", "-o", "json", "bench", "read", "keepme", "--delete-after", "--prefill", "10", "--runs", "1", "--rate", "0").stdout)
    assert out["created_log"] is False and out["deleted_log"] is False
    assert "keepme" in [row["name"] for row in json.loads(dlctl(sandbox, "-o", "json", "log", "list").stdout)]

    missing = dlctl(sandbox, "bench", "write", "nosuchlog", check=False)
    assert missing.returncode == 1 and "--create" in missing.stderr
