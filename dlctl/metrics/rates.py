"""Two scrapes of the agents' metrics -> what an operator watches (``dlctl top``): per agent
throughput, request and fsync latency, disk; per replication stream and log the lag; per log
the write proxy's queue. Pure functions over ``Snapshot`` pairs.

Rates are counter growth over the time between the two scrapes (a counter that went down — the
agent restarted — counts from zero). Latency quantiles come from the histogram buckets' growth
and are interpolated within a bucket, as Prometheus' ``histogram_quantile`` does: an estimate
no finer than the buckets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .scrape import Labels, Snapshot

WRITE_OPS = ("add", "add_batch", "append")
READ_OPS = ("read", "read_range")


def growth(before: Snapshot | None, after: Snapshot, name: str, match: Mapping[str, Iterable[str]] | None = None) -> float:
    """How much the counter samples called ``name`` (whose labels match) grew."""
    def pick(snapshot: Snapshot) -> dict[Labels, float]:
        return {labels: v for labels, v in snapshot.series(name).items() if _matches(labels, match)}

    now = pick(after)
    then = pick(before) if before is not None else {}
    total = 0.0
    for labels, value in now.items():
        old = then.get(labels, 0.0)
        total += value - old if value >= old else value
    return total


def _matches(labels: Labels, match: Mapping[str, Iterable[str]] | None) -> bool:
    if not match:
        return True
    have = dict(labels)
    return all(have.get(k) in set(v) for k, v in match.items())


def bucket_growth(before: Snapshot | None, after: Snapshot, histogram: str, match: Mapping[str, Iterable[str]] | None = None) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of a histogram's growth, summed over matching series."""
    then = before.series(f"{histogram}_bucket") if before is not None else {}
    sums: dict[float, float] = {}
    for labels, value in after.series(f"{histogram}_bucket").items():
        if not _matches(tuple((k, v) for k, v in labels if k != "le"), match):
            continue
        old = then.get(labels, 0.0)
        le = float(dict(labels)["le"])
        sums[le] = sums.get(le, 0.0) + (value - old if value >= old else value)
    return sorted(sums.items())


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative buckets (None: no observations)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(le):
                return lower  # above the highest finite bucket: its bound is all we know
            if cumulative == below:
                return le
            return lower + (le - lower) * (rank - below) / (cumulative - below)
        lower, below = le, cumulative
    return lower


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def agent_row(node: str, before: Snapshot | None, after: Snapshot) -> dict[str, Any]:
    """One agent's row. ``before`` None: totals only (no rates)."""
    dt = (after.at - before.at) if before is not None else 0.0

    def rate(name: str, match: Mapping[str, Iterable[str]] | None = None) -> float | None:
        return round(growth(before, after, name, match) / dt, 2) if dt > 0 else None

    writes = bucket_growth(before, after, "dlagent_request_duration_seconds", {"op": WRITE_OPS})
    reads = bucket_growth(before, after, "dlagent_request_duration_seconds", {"op": READ_OPS})
    fsyncs = bucket_growth(before, after, "dlagent_fsync_duration_seconds")
    roles = sorted(dict(labels)["role"] for labels, v in after.series("dlagent_role").items() if v >= 1)
    return {
        "node": node,
        "write_entries_per_s": rate("dlagent_written_entries_total"),
        "write_bytes_per_s": rate("dlagent_written_bytes_total"),
        "read_entries_per_s": rate("dlagent_read_entries_total"),
        "read_bytes_per_s": rate("dlagent_read_bytes_total"),
        "requests_per_s": rate("dlagent_request_duration_seconds_count"),
        "add_p50_ms": _ms(quantile(0.5, writes)),
        "add_p99_ms": _ms(quantile(0.99, writes)),
        "read_p99_ms": _ms(quantile(0.99, reads)),
        "fsync_p99_ms": _ms(quantile(0.99, fsyncs)),
        "written_entries": int(after.total("dlagent_written_entries_total")),
        "segments": _int(after.value("dlagent_segments")),
        "data_bytes": _int(after.value("dlagent_segment_bytes")),
        "disk_free_bytes": _int(after.value("dlagent_disk_free_bytes")),
        "under_replicated": _int(after.value("dlagent_under_replicated_segments")),
        "roles": ",".join(roles),
    }


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def stream_rows(befores: Mapping[str, Snapshot | None], afters: Mapping[str, Snapshot], wall_now: float | None = None) -> list[dict[str, Any]]:
    """One row per (stream, log) some agent's worker reports: lag, apply rate, last apply age."""
    wall_now = time.time() if wall_now is None else wall_now
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for node, after in afters.items():
        before = befores.get(node)
        dt = (after.at - before.at) if before is not None else 0.0
        for labels, lag in after.series("dlagent_replication_lag_records").items():
            where = dict(labels)
            key = (where.get("stream", ""), where.get("log", ""))
            match = {"stream": [key[0]], "log": [key[1]]}
            applied = growth(before, after, "dlagent_replication_applied_records_total", match)
            last = after.value("dlagent_replication_last_apply_timestamp_seconds", **where)
            safe = after.value("dlagent_replication_safe_timestamp_seconds", **where)
            wire = after.value("dlagent_replication_wire_bytes_total", **where)
            payload = after.value("dlagent_replication_payload_bytes_total", **where)
            rows[key] = {
                "stream": key[0],
                "log": key[1],
                "worker": node,
                "lag_records": int(lag),
                "lag_bytes": _int(after.value("dlagent_replication_lag_bytes", **where)),
                "lag_seconds": after.value("dlagent_replication_lag_seconds", **where),
                "applied_per_s": round(applied / dt, 2) if dt > 0 else None,
                "last_apply_ago_s": round(wall_now - last, 1) if last else None,
                # The sink holds everything the source held this long ago (dlctl.replication.safetime).
                "safe_time_ago_s": round(wall_now - safe, 1) if safe else None,
                "compression_ratio": round(payload / wire, 2) if wire and payload else None,
            }
    return [rows[k] for k in sorted(rows)]


def log_rows(afters: Mapping[str, Snapshot]) -> list[dict[str, Any]]:
    """One row per log some agent's write proxy owns: queued bytes and producers."""
    rows = []
    for node, after in afters.items():
        for labels, queued in after.series("dlagent_proxy_queue_bytes").items():
            log = dict(labels).get("log", "")
            rows.append({"log": log, "owner": node, "queue_bytes": int(queued), "producers": _int(after.value("dlagent_proxy_producers", log=log))})
    return sorted(rows, key=lambda r: (r["log"], r["owner"]))
