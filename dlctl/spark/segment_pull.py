"""PULL_SEGMENT: a sink agent copies one bootstrap segment itself — one network leg, not two.

The relay copy (``dlctl.spark.task``) reads a source segment into an executor, re-encodes it and
adds every entry to the W sink agents: each byte crosses two connections (two TLS encryptions and
two decryptions) and three processes. A sink agent that can read the source cluster — a declared
source (``dlagent.replication_config``), as its replication workers read it — is asked instead to
read the source segment itself, re-encode it with the same ``SegmentRecoder``, store the entries
of its own write sets and hand the other members theirs (ADD_BATCH, as re-replication does): the
source is read once and each entry re-encoded once, whatever W, and no third process spends CPU
on the copy. Members take turns at pulling, segment by segment, so the work spreads.

Here are the two halves the agent and the task share: ``PullRequest`` (the request's JSON body,
checked field by field: it comes from the network) and ``pull_segment``, the copy the agent runs
given a pool that reaches the source's agents and a function that stores a batch durably.

The task still decides where the segment goes (the sink ensemble), clears stale replicas first,
and verifies the result as it verifies a relayed copy: every member's DIGEST of what it stores
must equal the digest of the entries the puller says it handed that member, for exactly the
number of entries the member's write sets hold (``dlctl.spark.task``); the job then compares the
source and sink content digests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..log import protocol as p
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
    forward: bool = False  # also hand the other members their write sets' entries (ADD_BATCH)

    def to_json(self) -> bytes:
        raw = {
            "log": self.log, "source_cluster": self.source_cluster, "source_log_id": self.source_log_id,
            "source": json.loads(to_json(self.source)), "sink_log_id": self.sink_log_id, "sink_seq": self.sink_seq,
            "ensemble": list(self.ensemble), "write_quorum": self.write_quorum, "start_vv": self.start_vv,
            "settled": self.settled, "assume_local": self.assume_local, "window": self.window, "throttle": self.throttle,
            "forward": self.forward,
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
            start_vv=_counters(raw, "start_vv"), settled=_counters(raw, "settled"), assume_local=_flag(raw, "assume_local"),
            window=_window(raw), throttle=float(throttle) if throttle is not None else None, forward=_flag(raw, "forward"),
        )

    @property
    def first(self) -> int:
        return max(self.source.min_active_entry, 0)

    def entries_of(self, node: str) -> int:
        """How many of the segment's entries the write sets of ``node`` hold."""
        return sum(1 for e in range(self.first, self.source.last_entry_id + 1) if node in write_set_of(self.ensemble, self.write_quorum, e))


_REQUIRED = {"log", "source_cluster", "source_log_id", "source", "sink_log_id", "sink_seq", "ensemble", "write_quorum"}
_FIELDS = _REQUIRED | {"start_vv", "settled", "assume_local", "window", "throttle", "forward"}


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


def _flag(raw: dict, name: str) -> bool:
    value = raw.get(name, False)
    if not isinstance(value, bool):
        raise ValueError(f"PULL_SEGMENT {name!r} must be true or false, got {value!r}")
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


StoreBatch = Callable[[Sequence[bytearray]], Awaitable[Any]]  # entries -> durable here
PeerBatch = Callable[[str, Sequence[bytearray]], Awaitable[Any]]  # (member, entries) -> durable there


class _Outlet:
    """The entries bound for one member, in batches of about ``BATCH_BYTES``: one batch on its
    way (being stored, or sent and stored there) while the next fills, so memory stays bounded."""

    def __init__(self, send: StoreBatch) -> None:
        self.send = send
        self.pairs: list[tuple[int, int]] = []  # (entry id, CRC) of every entry handed over
        self.batch: list[bytearray] = []
        self.size = 0
        self.sending: asyncio.Future | None = None

    async def put(self, entry_id: int, out: bytearray) -> None:
        if self.batch and self.size + len(out) > p.MAX_BATCH_BYTES:
            await self.flush()
        self.pairs.append((entry_id, stored_crc(out)))
        self.batch.append(out)
        self.size += len(out)
        if self.size >= BATCH_BYTES:
            await self.flush()

    async def flush(self) -> None:
        if self.sending is not None:
            await self.sending
        self.sending = asyncio.ensure_future(self.send(self.batch)) if self.batch else None
        self.batch, self.size = [], 0

    async def drain(self) -> None:
        """Everything handed over is durable at its member."""
        await self.flush()
        if self.sending is not None:
            await self.sending
            self.sending = None

    async def abandon(self) -> None:
        if self.sending is not None and not self.sending.done():
            self.sending.cancel()
            await asyncio.gather(self.sending, return_exceptions=True)


async def pull_segment(request: PullRequest, source_pool: Any, node_id: str, store: StoreBatch, peers: PeerBatch | None = None) -> dict[str, Any]:
    """Copy the request's segment from the source agents (``source_pool``) into the sink
    ensemble: every entry is read and re-encoded once; those of ``node_id``'s write sets go to
    ``store``, and with ``request.forward`` those of the other members' write sets go to them
    through ``peers`` (ADD_BATCH) — in batches of about ``BATCH_BYTES``, one per member on its
    way while the next is read. Returns the content figures (``SegmentRecoder.result``) plus
    ``replicas``: per member, how many entries it was handed and their digest, for the task to
    check against the member's own DIGEST. Raises ``CopyFailed`` (the source cannot serve),
    ``NeedsClock``, or what ``store`` and ``peers`` raise (nothing is then acknowledged)."""
    if node_id not in request.ensemble:
        raise ValueError(f"PULL_SEGMENT to {node_id}: it is not in the sink ensemble {list(request.ensemble)}")
    if request.forward and peers is None:
        raise ValueError(f"PULL_SEGMENT to {node_id}: it cannot forward to the other members (it is not connected to its own cluster yet)")
    recoder = SegmentRecoder.of(request)
    bucket = TokenBucket(request.throttle) if request.throttle else None
    ensemble, w = request.ensemble, request.write_quorum
    outlets = {node_id: _Outlet(store)}
    if request.forward:
        assert peers is not None
        for node in ensemble:
            if node != node_id:
                outlets[node] = _Outlet(lambda batch, node=node: peers(node, batch))
    try:
        async for buf, start, end in read_entries(request, source_pool, request.window, {}):
            out = recoder.recode(buf, start, end)
            entry_id = stored_entry_id(out)
            members = [n for n in write_set_of(ensemble, w, entry_id) if n in outlets]
            if members and bucket is not None:
                await bucket.take(len(out))
            for node in members:
                await outlets[node].put(entry_id, out)
        await asyncio.gather(*(o.drain() for o in outlets.values()))
    finally:
        await asyncio.gather(*(o.abandon() for o in outlets.values()))
    replicas = {node: {"entries": len(o.pairs), "digest": digest_of(o.pairs)} for node, o in outlets.items()}
    return dict(recoder.result(), replicas=replicas)


__all__ = ["BATCH_BYTES", "PullRequest", "pull_segment"]
