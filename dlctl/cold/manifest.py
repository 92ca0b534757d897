"""What the cold store knows about one offloaded or backed-up segment: the manifest beside its
object. It is written *after* the object has been verified, so a manifest means a complete,
checked copy; an object without one is an interrupted upload (written again next time).

    {"version": 1, "cluster", "log", "log_id", "segment": <the segment record>,
     "object": key, "bytes", "sha256", "stored": <time>,
     "clock": {"location", "before": <vv>, "after": <vv>}}

The segment record carries its entry count, txid range, record count and append times, so the
manifest answers "what is in there" without reading the object. ``clock`` (``dlctl.cold.clock``)
is what a reader of the original log derived around the segment's records, so a restore keeps
their timestamps; absent when it was not known (or in copies made before it was recorded).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from ..meta.records import SegmentRecord, segment_from_json, to_json
from ..names import validate_name
from .clock import CopyClock
from .segobject import CorruptObject, digest

VERSION = 1


def log_prefix(log: str, log_id: int) -> str:
    """Keys of one log incarnation (a log deleted and created again gets another log id)."""
    return f"logs/{validate_name('log', log)}/{int(log_id)}"


def object_key(log: str, log_id: int, seq: int) -> str:
    return f"{log_prefix(log, log_id)}/{int(seq):019d}.segment"


def manifest_key(log: str, log_id: int, seq: int) -> str:
    return f"{log_prefix(log, log_id)}/{int(seq):019d}.manifest.json"


@dataclass(frozen=True)
class SegmentManifest:
    cluster: str
    log: str
    log_id: int
    segment: SegmentRecord
    object: str
    bytes: int
    sha256: str
    stored: float = 0.0
    clock: CopyClock | None = None

    @classmethod
    def of(cls, cluster: str, log: str, log_id: int, segment: SegmentRecord, data: bytes, clock: CopyClock | None = None) -> SegmentManifest:
        return cls(cluster, log, log_id, segment, object_key(log, log_id, segment.seq), len(data), digest(data), time.time(), clock)

    def verify(self, data: bytes) -> None:
        """Raise ``CorruptObject`` unless ``data`` is exactly the object this manifest describes."""
        if len(data) != self.bytes or digest(data) != self.sha256:
            raise CorruptObject(
                f"cold object {self.object}: {len(data)} bytes with SHA-256 {digest(data)[:16]}…, "
                f"the manifest says {self.bytes} bytes with {self.sha256[:16]}…"
            )

    def to_json(self) -> bytes:
        raw: dict[str, Any] = {
            "version": VERSION,
            "cluster": self.cluster,
            "log": self.log,
            "log_id": self.log_id,
            "segment": json.loads(to_json(self.segment)),
            "object": self.object,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "stored": self.stored,
        }
        if self.clock is not None:
            raw["clock"] = self.clock.to_dict()
        return json.dumps(raw, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> SegmentManifest:
        try:
            raw = json.loads(data)
            if raw.get("version") != VERSION:
                raise ValueError(f"unsupported manifest version {raw.get('version')!r}")
            segment = segment_from_json(json.dumps(raw["segment"]).encode(), where)
            manifest = cls(
                str(raw["cluster"]), validate_name("log", str(raw["log"])), int(raw["log_id"]), segment,
                str(raw["object"]), int(raw["bytes"]), str(raw["sha256"]), float(raw.get("stored", 0.0)),
                CopyClock.from_dict(raw["clock"]) if raw.get("clock") is not None else None,
            )
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as exc:
            raise CorruptObject(f"{where}: malformed manifest: {exc}") from None
        if manifest.object != object_key(manifest.log, manifest.log_id, segment.seq):
            raise CorruptObject(f"{where}: manifest names object {manifest.object!r}, not this segment's")
        if len(manifest.sha256) != 64 or manifest.bytes < 0:
            raise CorruptObject(f"{where}: malformed manifest: bad digest or size")
        return manifest
