"""Stream metadata as immutable values and their JSON form (pure data; no ZooKeeper here).

In the sink cluster, under ``streams/<id>/``: ``config`` (what is replicated from where),
``state`` (setting-up, running, paused), ``checkpoints/<log>`` (how far each log is applied,
written only by the worker that holds ``workers/<log>``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from ..errors import CorruptMetadata
from ..log.dlsn import DLSN, INITIAL
from ..meta.records import load_object
from ..names import validate_name
from .filters import RecordFilter

DEFAULT_PIN_MAX_AGE = 7 * 24 * 3600.0


class StreamState(str, Enum):
    SETTING_UP = "setting-up"  # init-replication has not finished: no worker runs
    RUNNING = "running"
    PAUSED = "paused"
    # The source was given up (``dlctl failover``): no worker may ever run this stream again,
    # and ``replication resume`` refuses it; ``StreamStatus.details`` keeps what was at risk.
    FAILED_OVER = "failed-over"


# Where a stream may go from each state (``StreamStore.set_state`` holds every change to it):
# a failed-over stream stays failed over (only deleting it ends it), and nothing goes back to
# setting-up (a stream is created in it, by init-replication).
TRANSITIONS: dict[StreamState, frozenset[StreamState]] = {
    StreamState.SETTING_UP: frozenset({StreamState.RUNNING, StreamState.PAUSED, StreamState.FAILED_OVER}),
    StreamState.RUNNING: frozenset({StreamState.RUNNING, StreamState.PAUSED, StreamState.FAILED_OVER}),
    StreamState.PAUSED: frozenset({StreamState.RUNNING, StreamState.PAUSED, StreamState.FAILED_OVER}),
    StreamState.FAILED_OVER: frozenset({StreamState.FAILED_OVER}),
}


COMPRESSIONS = ("none", "zstd")


@dataclass(frozen=True)
class StreamConfig:
    stream_id: str
    source_cluster: str
    source_zookeeper: str  # connect string of the source's ZooKeeper (credentials: agent config)
    sink_cluster: str
    logs: tuple[str, ...]
    bidirectional: bool = False  # part of an active-active pair: the causality filter applies
    throttle_bytes_per_second: int = 0  # 0: unlimited
    pin_max_age_seconds: float = DEFAULT_PIN_MAX_AGE
    created: float = 0.0
    # ``dlctl dr recover``: the sink lost data; its causality filter then also counts the
    # sink's own component and admits records that originated at the sink (its own records
    # come back), skipping only what the sink log holds already. Off again once recovered.
    unfiltered: bool = False
    # Which records the stream carries (``dlctl.replication.filters``; "" all of them). Never
    # on a connection that is or ever was on a cycle of the network (issue 21).
    filter: str = ""
    # The log patterns init-replication was given (shell patterns; () from before patterns were
    # kept: ``logs`` only). Source logs created later that match join the stream by themselves.
    patterns: tuple[str, ...] = ()
    # How records cross the WAN: "zstd" (negotiated with the source agent; plain with one that
    # cannot) or "none" (issue 23).
    compression: str = "none"

    def __post_init__(self) -> None:
        validate_name("stream", self.stream_id)
        validate_name("cluster", self.source_cluster)
        validate_name("cluster", self.sink_cluster)
        for name in self.logs:
            validate_name("log", name)
        if self.source_cluster == self.sink_cluster:
            raise ValueError(f"stream {self.stream_id!r}: source and sink are the same cluster ({self.sink_cluster!r})")
        if self.throttle_bytes_per_second < 0 or self.pin_max_age_seconds <= 0:
            raise ValueError("throttle must be >= 0 and the pin maximum age > 0")
        if self.filter:
            RecordFilter.parse(self.filter)  # raises, naming the bad clause
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"stream {self.stream_id!r}: compression must be one of {', '.join(COMPRESSIONS)} (got {self.compression!r})")

    def to_json(self) -> bytes:
        return _dump(asdict(self))

    @classmethod
    def from_json(cls, data: bytes, where: str) -> StreamConfig:
        raw = load_object(data, where)
        try:
            return cls(**{**raw, "logs": tuple(raw["logs"]), "patterns": tuple(raw.get("patterns", ()))})
        except (TypeError, KeyError, ValueError) as exc:
            raise CorruptMetadata(f"{where}: malformed stream config: {exc}") from None


@dataclass(frozen=True)
class StreamStatus:
    state: StreamState
    updated: float = 0.0
    reason: str = ""  # who paused it, and why
    epoch: int = 0  # grows with every change of state (a failover fences the old flow by it)
    details: dict[str, Any] = field(default_factory=dict)  # failed-over: when, to whom, what was at risk

    def to_json(self) -> bytes:
        return _dump({"state": self.state.value, "updated": self.updated, "reason": self.reason, "epoch": self.epoch, "details": self.details})

    @classmethod
    def from_json(cls, data: bytes, where: str) -> StreamStatus:
        raw = load_object(data, where)
        try:
            details = raw.get("details") or {}
            if not isinstance(details, dict):
                raise ValueError("details must be an object")
            return cls(StreamState(raw["state"]), float(raw.get("updated", 0.0)), str(raw.get("reason", "")), int(raw.get("epoch", 0)), details)
        except (TypeError, KeyError, ValueError) as exc:
            raise CorruptMetadata(f"{where}: malformed stream state: {exc}") from None


@dataclass(frozen=True)
class Checkpoint:
    """How far log ``log`` of a stream is applied at the sink.

    ``next`` is the first source position not yet applied (everything before it is in the sink
    log, or was skipped by the causality filter). ``source_vv`` is the source log's version
    vector before ``next`` (to derive the timestamps of local records from there on);
    ``sink_vv`` the version vector of what this stream appended (the causality filter's memory);
    ``sink_dlsn`` the sink position of the last record appended as of this checkpoint (a
    restart looks for later ones from there)."""

    log: str
    next: DLSN = INITIAL
    source_vv: dict[str, int] = field(default_factory=dict)
    sink_vv: dict[str, int] = field(default_factory=dict)
    sink_dlsn: DLSN | None = None
    processed_records: int = 0  # source records handled (appended or filtered) by this stream
    applied_records: int = 0  # of those, appended to the sink
    applied_bytes: int = 0  # payload bytes appended
    left_at_source: int = 0  # of the others, those the source sent as stubs (the sink held them)
    # The source's answers to this stream's reads (issue 23): their bytes on the wire and decoded
    # (wire_payload_bytes / wire_bytes is the compression ratio), and the compression in effect
    # as the worker last found it ("zstd", "none", "none (source agent lacks zstd)"; "": never ran).
    wire_bytes: int = 0
    wire_payload_bytes: int = 0
    compression: str = ""
    updated: float = 0.0
    last_applied_at: float = 0.0  # when a record was last appended
    last_contact: float = 0.0  # when the source last answered (a record or a caught-up read)
    caught_up_at: float = 0.0  # when the worker last had read everything the source had
    worker: str = ""  # node id of the worker that wrote this
    last_error: str = ""
    last_error_at: float = 0.0
    needs_bootstrap: str = ""  # non-empty: why this log can only continue after a bootstrap
    # The source's end as the worker last measured it (every pin refresh): what a failover
    # reports at risk when the source is gone. ``source_end_records``: records from the
    # checkpoint's position of that moment to the end, when ``processed_records`` was
    # ``source_end_processed``.
    source_end: DLSN | None = None
    source_end_records: int = 0
    source_end_processed: int = 0
    source_end_at: float = 0.0
    # A causal stream over a new connection (``dlctl.replication.network``): it starts only once
    # the sink holds everything the source deleted; meanwhile the worker records here which
    # origins' events (first and last counter) the sink still lacks.
    gated: bool = False
    waiting_for: dict[str, list[int]] = field(default_factory=dict)
    # This log's safe time (``dlctl.replication.safetime``; Unix time, worker's clock, 0: none
    # yet): everything the source held then is at the sink. Kept here so it never goes back
    # when the worker moves to another agent.
    safe_time: float = 0.0

    def to_json(self) -> bytes:
        raw = asdict(self)
        raw["next"] = str(self.next)
        raw["sink_dlsn"] = str(self.sink_dlsn) if self.sink_dlsn else None
        raw["source_end"] = str(self.source_end) if self.source_end else None
        return _dump(raw)

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Checkpoint:
        raw = load_object(data, where)
        try:
            raw["next"] = DLSN.parse(raw["next"])
            raw["sink_dlsn"] = DLSN.parse(raw["sink_dlsn"]) if raw.get("sink_dlsn") else None
            raw["source_end"] = DLSN.parse(raw["source_end"]) if raw.get("source_end") else None
            return cls(**raw)
        except (TypeError, KeyError, ValueError) as exc:
            raise CorruptMetadata(f"{where}: malformed checkpoint: {exc}") from None

    def with_error(self, message: str) -> Checkpoint:
        return replace(self, last_error=message[:1000], last_error_at=time.time())

    def unapplied_estimate(self) -> int | None:
        """Source records after ``next`` as of the last measured source end (None: never measured)."""
        if self.source_end is None:
            return None
        if self.next >= self.source_end:
            return 0
        return max(0, self.source_end_records - (self.processed_records - self.source_end_processed))


def lag_seconds(lag_records: int | None, caught_up_at: float, since: float, now: float) -> float | None:
    """How far behind in time a stream's log is, given ``lag_records`` left at the source: 0 with
    none left, else the age of the newest moment the worker had read everything the source
    held (``Checkpoint.caught_up_at``), or of ``since`` (the stream's creation) if it never
    had; None when the records left are unknown."""
    if lag_records is None:
        return None
    if lag_records == 0:
        return 0.0
    return max(0.0, now - (caught_up_at or since))


def default_stream_id(source: str, sink: str) -> str:
    return validate_name("stream", f"{source}-to-{sink}")


def _dump(raw: dict[str, Any]) -> bytes:
    return json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()
