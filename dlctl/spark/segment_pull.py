"""PULL_SEGMENT: a sink agent copies one bootstrap segment itself — one network leg, not two.

The relay copy (``dlctl.spark.task``) reads a source segment into an executor, re-encodes it and
adds every entry to the W sink agents: each byte crosses two connections (two TLS encryptions and
two decryptions) and three processes. A sink agent that can read the source cluster — a declared
source (``dlagent.replication_config``), as its replication workers read it — is asked instead to
read the source segment itself, re-encode it with the same ``SegmentRecoder`` and store the
entries of its own write sets: one connection, two processes, and no third process's CPU. Every
member of the sink ensemble pulls for itself (the source serves W reads, as a relay serves W
adds), and the re-encoding is deterministic, so the W members report the same content.

Here are the two halves the agent and the task share: ``PullRequest`` (the request's JSON body,
checked field by field: it comes from the network) and ``pull_segment``, the copy the agent runs
given a pool that reaches the source's agents and a function that stores a batch durably.

The task still decides where the segment goes (the sink ensemble), clears stale replicas first,
and verifies the result as it verifies a relayed copy: every member's DIGEST of what it stores
must equal the digest of what it says it stored, for the number of entries its write sets hold,
and the members' content digests must agree (``dlctl.spark.task``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..log.format import stored_crc, stored_entry_id
from ..log.quorum import write_set_of
from ..log.rereplication import digest_of
from ..meta.records import SegmentRecord, segment_from_json, to_json
from ..names import validate_name
from ..ratelimit import TokenBucket
from .recode import SegmentRecoder
from .segment_read import read_entries

MAX_WINDOW = 4096  # entries read ahead at most, whatever a request asks
BATCH_BYTES = 4 * 1024 * 1024  # entries stored per durable batch: one fdatasync each, the next read meanwhile


@dataclass(frozen=True)
class PullRequest:
    """What a sink agent needs to copy one source segment into one sink segment."""

    log: str
    source_cluster: str
    source_log_id: int
    source: SegmentRecord
    sink_log_id: int
    sink_seq: int
    ensemble: tuple[str, ...]  # the sink segment's ensemble (the agent stores its write sets' entries)
    write_quorum: int
    start_vv: dict[str, int] = field(default_factory=dict)
    settled: dict[str, int] = field(default_factory=dict)
    assume_local: bool = False
    window: int = 32  # source entries read ahead
    throttle: float | None = None  # bytes per second for this pull (None: unlimited)

    def to_json(self) -> bytes:
        raw = {
            "log": self.log, "source_cluster": self.source_cluster, "source_log_id": self.source_log_id,
            "source": json.loads(to_json(self.source)), "sink_log_id": self.sink_log_id, "sink_seq": self.sink_seq,
            "ensemble": list(self.ensemble), "write_quorum": self.write_quorum, "start_vv": self.start_vv,
            "settled": self.settled, "assume_local": self.assume_local, "window": self.window, "throttle": self.throttle,
        }
        return json.dumps(raw, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, body: bytes) -> PullRequest:
        """The request in ``body``; ValueError naming the field that is missing or wrong."""
        try:
            raw = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"PULL_SEGMENT body is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("PULL_SEGMENT body must be a JSON object")
        unknown = set(raw) - _FIELDS
        if unknown:
            raise ValueError(f"PULL_SEGMENT body has unknown fields {sorted(unknown)}")
        missing = _REQUIRED - set(raw)
        if missing:
            raise ValueError(f"PULL_SEGMENT body lacks {sorted(missing)}")
        log = _text(raw, "log")
        cluster = _text(raw, "source_cluster")
        validate_name("cluster", cluster)  # it names a directory under the agent's sources_dir
        source = segment_from_json(json.dumps(raw["source"]).encode(), "PULL_SEGMENT 'source'")
        ensemble = raw["ensemble"]
        if not isinstance(ensemble, list) or not ensemble or not all(isinstance(n, str) and n for n in ensemble) or len(set(ensemble)) != len(ensemble):
            raise ValueError(f"PULL_SEGMENT 'ensemble' must be a list of distinct node ids, got {ensemble!r}")
        w = _int(raw, "write_quorum", 1)
        if w > len(ensemble):
            raise ValueError(f"PULL_SEGMENT 'write_quorum' {w} is larger than its ensemble of {len(ensemble)}")
        throttle = raw.get("throttle")
        if throttle is not None and (not isinstance(throttle, (int, float)) or isinstance(throttle, bool) or throttle <= 0):
            raise ValueError(f"PULL_SEGMENT 'throttle' must be a positive number of bytes per second, got {throttle!r}")
        return cls(
            log=log, source_cluster=cluster, source_log_id=_int(raw, "source_log_id", 0), source=source,
            sink_log_id=_int(raw, "sink_log_id", 0), sink_seq=_int(raw, "sink_seq", 0), ensemble=tuple(ensemble), write_quorum=w,
            start_vv=_counters(raw, "start_vv"), settled=_counters(raw, "settled"), assume_local=bool(raw.get("assume_local", False)),
            window=_window(raw), throttle=float(throttle) if throttle is not None else None,
        )

    @property
    def first(self) -> int:
        return max(self.source.min_active_entry, 0)

    def entries_of(self, node: str) -> int:
        """How many of the segment's entries the write sets of ``node`` hold."""
        return sum(1 for e in range(self.first, self.source.last_entry_id + 1) if node in write_set_of(self.ensemble, self.write_quorum, e))


_REQUIRED = {"log", "source_cluster", "source_log_id", "source", "sink_log_id", "sink_seq", "ensemble", "write_quorum"}
_FIELDS = _REQUIRED | {"start_vv", "settled", "assume_local", "window", "throttle"}


def _text(raw: dict, name: str) -> str:
    value = raw[name]
    if not isinstance(value, str) or not value:
        raise ValueError(f"PULL_SEGMENT {name!r} must be a non-empty string, got {value!r}")
    return value


def _int(raw: dict, name: str, least: int) -> int:
    value = raw[name]
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value < 2**63:
        raise ValueError(f"PULL_SEGMENT {name!r} must be an integer >= {least}, got {value!r}")
    return value


def _window(raw: dict) -> int:
    if "window" not in raw:
        return 32
    window = _int(raw, "window", 1)
    if window > MAX_WINDOW:
        raise ValueError(f"PULL_SEGMENT 'window' {window} is above {MAX_WINDOW} entries (the agent's memory)")
    return window


def _counters(raw: dict, name: str) -> dict[str, int]:
    value = raw.get(name, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in value.items()):
        raise ValueError(f"PULL_SEGMENT {name!r} must map locations to counters, got {value!r}")
    return dict(value)


StoreBatch = Callable[[Sequence[bytearray]], Awaitable[Any]]


async def pull_segment(request: PullRequest, source_pool: Any, node_id: str, store: StoreBatch) -> dict[str, Any]:
    """Copy the request's segment from the source agents (``source_pool``) into this agent:
    every entry is read and re-encoded, and those of ``node_id``'s write sets are handed to
    ``store`` in batches of about ``BATCH_BYTES`` — one being stored while the next is read.
    Returns the content figures (``SegmentRecoder.result``) plus ``replica_entries`` and
    ``replica_digest``: what this agent now holds, for the task to check against its DIGEST.
    Raises ``CopyFailed`` (the source cannot serve), ``NeedsClock``, or what ``store`` raises."""
    if node_id not in request.ensemble:
        raise ValueError(f"PULL_SEGMENT to {node_id}: it is not in the sink ensemble {list(request.ensemble)}")
    recoder = SegmentRecoder(
        log=request.log, source_cluster=request.source_cluster, source_seq=request.source.seq, first_entry=request.first,
        sink_log_id=request.sink_log_id, sink_seq=request.sink_seq, start_vv=request.start_vv, settled=request.settled, assume_local=request.assume_local,
    )
    bucket = TokenBucket(request.throttle) if request.throttle else None
    ensemble, w = request.ensemble, request.write_quorum
    stored: list[tuple[int, int]] = []
    batch: list[bytearray] = []
    size = 0
    storing: asyncio.Future | None = None

    async def flush() -> None:
        nonlocal storing, batch, size
        if storing is not None:
            await storing  # at most one batch in the store at a time: memory stays bounded
        storing = asyncio.ensure_future(store(batch)) if batch else None
        batch, size = [], 0

    try:
        async for buf, start, end in read_entries(request, source_pool, request.window, {}):
            out = recoder.recode(buf, start, end)
            entry_id = stored_entry_id(out)
            if node_id not in write_set_of(ensemble, w, entry_id):
                continue
            if bucket is not None:
                await bucket.take(len(out))
            stored.append((entry_id, stored_crc(out)))
            batch.append(out)
            size += len(out)
            if size >= BATCH_BYTES:
                await flush()
        await flush()
        await flush()  # the last batch is durable
    finally:
        if storing is not None and not storing.done():
            storing.cancel()
            await asyncio.gather(storing, return_exceptions=True)
    return dict(recoder.result(), replica_entries=len(stored), replica_digest=digest_of(stored))


__all__ = ["BATCH_BYTES", "PullRequest", "pull_segment"]
