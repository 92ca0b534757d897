"""Metadata records as immutable values, and their JSON encoding in znodes.

Pure data: no ZooKeeper here. Every record round-trips through ``to_json``/``from_json`` and
``from_json`` rejects malformed input with a message that names the record.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any, Generic, TypeVar

from ..errors import CorruptMetadata
from ..log.quorum import write_set_of

T = TypeVar("T")

NO_ENTRY = -1
NO_TXID = -1


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A record together with the znode version it was read at (for compare-and-set)."""

    value: T
    version: int


@dataclass(frozen=True)
class LogConfig:
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    roll_bytes: int = 256 * 1024 * 1024
    roll_seconds: float = 3600.0
    # Retention (DESIGN.md §9), applied by the agents' elected housekeeper and `dlctl gc`:
    # completed segments whose last record is older than ``retention_seconds`` (its append
    # time; the completion time for segments without one) are truncated,
    # and the oldest completed ones while the log holds more than ``retention_bytes``.
    # None keeps data for ever. Both default to None so records written before they existed
    # read back unchanged.
    retention_seconds: float | None = None
    retention_bytes: int | None = None
    # How long this log's cold copies stay in the cluster's cold store (dlctl.retention.offload);
    # None: the cluster's default (`cluster cold-storage enable --retention`).
    cold_retention_seconds: float | None = None

    def __post_init__(self) -> None:
        e, w, a = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not (isinstance(e, int) and isinstance(w, int) and isinstance(a, int)):
            raise ValueError("ensemble_size, write_quorum and ack_quorum must be integers")
        if not e >= w >= a >= 1:
            raise ValueError(f"quorums must satisfy E >= W >= A >= 1 (got E={e}, W={w}, A={a})")
        if self.roll_bytes <= 0 or self.roll_seconds <= 0:
            raise ValueError("roll_bytes and roll_seconds must be positive")
        ttl, cap = self.retention_seconds, self.retention_bytes
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0):
            raise ValueError(f"retention_seconds must be a positive number of seconds or None (got {ttl!r})")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or not cap > 0):
            raise ValueError(f"retention_bytes must be a positive integer or None (got {cap!r})")
        cold = self.cold_retention_seconds
        if cold is not None and (isinstance(cold, bool) or not isinstance(cold, (int, float)) or not cold > 0):
            raise ValueError(f"cold_retention_seconds must be a positive number of seconds or None (got {cold!r})")


@dataclass(frozen=True)
class LogRecord:
    name: str
    log_id: int
    created: float
    config: LogConfig
    # The highest segment sequence number ever allocated: bumped by CAS together with the
    # segment's creation, so a sequence number is never reused even after deletions.
    max_segment_seq: int = 0


class SegmentState(str, Enum):
    INPROGRESS = "inprogress"
    COMPLETED = "completed"
    PARTIALLY_TRUNCATED = "partially-truncated"
    TRUNCATED = "truncated"


@dataclass(frozen=True)
class EnsembleChange:
    """From ``first_entry_id`` on, entries go to ``nodes`` (BookKeeper's ensemble map)."""

    first_entry_id: int
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class SegmentRecord:
    seq: int
    state: SegmentState
    ensembles: tuple[EnsembleChange, ...]
    write_quorum: int
    ack_quorum: int
    created: float
    writer: str = ""  # who created it (owner id), for operators
    last_entry_id: int = NO_ENTRY
    first_txid: int = NO_TXID
    last_txid: int = NO_TXID
    records: int = 0
    bytes: int = 0
    completed: float | None = None
    min_active_entry: int = 0  # partially truncated: entries before it are gone
    # Members known to lack entries of their write sets (written when the segment is closed by
    # a writer that dropped them, or by a recovery they could not answer): node -> the last
    # entry it is known to hold (-1: none known). Empty: every member holds its entries. Such a
    # segment is under-replicated until the auditor refills the member and clears it here.
    short: dict[str, int] = field(default_factory=dict)
    # The append times (ms since the epoch) of its first and last entries, recorded when it is
    # completed (None: unknown — in progress, empty, or written before entries carried them).
    first_time: int | None = None
    last_time: int | None = None
    # The key of its verified copy in the cluster's cold store (dlctl.retention.offload): with a cold
    # store required, a truncated segment leaves the cluster only once it has one.
    cold: str | None = None

    def __hash__(self) -> int:  # frozen, but ``short`` is a dict: hash what identifies it
        return hash((self.seq, self.state, self.ensembles, self.last_entry_id))

    @property
    def last_append_ms(self) -> float | None:
        """When its last record was appended at the latest (ms since the epoch): the recorded
        time, else its completion time (an upper bound); None while in progress."""
        if self.last_time is not None:
            return self.last_time
        return self.completed * 1000 if self.completed is not None else None

    def lacking(self, entry_id: int) -> frozenset[str]:
        """Members the record says do not hold ``entry_id`` (readers try them last)."""
        return frozenset(n for n, last in self.short.items() if last < entry_id)

    @property
    def ensemble_size(self) -> int:
        return len(self.ensembles[0].nodes)

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        current = self.ensembles[0].nodes
        for change in self.ensembles:
            if change.first_entry_id <= entry_id:
                current = change.nodes
        return current

    def write_set(self, entry_id: int) -> tuple[str, ...]:
        """The W agents that store ``entry_id``: round-robin striping from ``entry_id mod E``."""
        return write_set_of(self.ensemble_for(entry_id), self.write_quorum, entry_id)

    def completed_with(
        self, last_entry_id: int, last_txid: int, records: int, size: int, when: float, short: dict[str, int] | None = None,
        times: tuple[int, int] | None = None,
    ) -> SegmentRecord:
        """Closed at ``last_entry_id``; ``short``: members known to hold less (only those short
        of the end are kept); ``times``: the append times of its first and last entries."""
        return replace(
            self,
            state=SegmentState.COMPLETED,
            last_entry_id=last_entry_id,
            last_txid=last_txid,
            records=records,
            bytes=size,
            completed=when,
            short={n: min(last, last_entry_id) for n, last in (short or {}).items() if last < last_entry_id},
            first_time=times[0] if times else None,
            last_time=times[1] if times else None,
        )


def _encode(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def to_json(record: Any) -> bytes:
    raw = _encode(asdict(record))
    if isinstance(record, LogRecord) and raw["config"]["cold_retention_seconds"] is None:
        del raw["config"]["cold_retention_seconds"]  # (as below: unchanged for older readers)
    if isinstance(record, SegmentRecord):
        # Fields at their defaults stay out: the common case reads back unchanged by agents
        # that predate them.
        for name, default in (("short", {}), ("first_time", None), ("last_time", None), ("cold", None)):
            if raw[name] == default:
                del raw[name]
    return json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()


def log_from_json(data: bytes, where: str) -> LogRecord:
    raw = load_object(data, where)
    try:
        return LogRecord(**{**raw, "config": LogConfig(**raw["config"])})
    except (TypeError, KeyError, ValueError) as exc:
        raise CorruptMetadata(f"{where}: malformed log record: {exc}") from None


def segment_from_json(data: bytes, where: str) -> SegmentRecord:
    raw = load_object(data, where)
    try:
        ensembles = tuple(EnsembleChange(int(c["first_entry_id"]), tuple(c["nodes"])) for c in raw.pop("ensembles"))
        if not ensembles or any(not c.nodes for c in ensembles):
            raise ValueError("empty ensemble")
        short = raw.pop("short", {})
        if not isinstance(short, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in short.items()):
            raise ValueError(f"'short' must map node ids to entry ids, got {short!r}")
        for name in ("first_time", "last_time"):
            value = raw.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name!r} must be milliseconds since the epoch, got {value!r}")
        if raw.get("cold") is not None and not isinstance(raw["cold"], str):
            raise ValueError(f"'cold' must be a cold store key, got {raw['cold']!r}")
        return SegmentRecord(**{**raw, "state": SegmentState(raw["state"]), "ensembles": ensembles, "short": short})
    except (TypeError, KeyError, ValueError) as exc:
        raise CorruptMetadata(f"{where}: malformed segment record: {exc}") from None


def load_object(data: bytes, where: str) -> dict[str, Any]:
    """A znode's bytes as the JSON object every record is stored as (ValueError naming ``where``)."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptMetadata(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise CorruptMetadata(f"{where}: expected a JSON object")
    return raw


__all__ = [
    "EnsembleChange",
    "LogConfig",
    "LogRecord",
    "SegmentRecord",
    "SegmentState",
    "Versioned",
    "log_from_json",
    "segment_from_json",
    "to_json",
]
