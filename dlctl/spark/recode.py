"""One source segment re-encoded as one sink segment, entry by entry, with what the copy reports.

The two copies of a bootstrap segment — relayed by an executor (``dlctl.spark.task``) or pulled
by a sink agent (``dlctl.spark.segment_pull``) — do the same thing to each entry: take it into
the source content digest, re-encode it (``transform.EntryCopier``), take the result into the
sink content digest, and stop when a task that assumed local records only meets a replicated
one. ``SegmentRecoder`` is that, once; ``result()`` is the part of a task's result dict that
describes the content (counts, txids, clock, the two digests).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .transform import Clock, ContentDigest, EntryCopier


class NeedsClock(Exception):
    """The task assumed a log of local records only and met a replicated one: its clock needs
    the pre-pass (``scan_clock``)."""


class SegmentRecoder:
    @classmethod
    def of(cls, copy: Any) -> SegmentRecoder:
        """For ``copy``: a ``SegmentTask`` or a ``PullRequest`` (the same names for the same things)."""
        return cls(
            log=copy.log, source_cluster=copy.source_cluster, source_seq=copy.source.seq, first_entry=max(copy.source.min_active_entry, 0),
            sink_log_id=copy.sink_log_id, sink_seq=copy.sink_seq, start_vv=copy.start_vv, settled=copy.settled, assume_local=copy.assume_local,
        )

    def __init__(
        self, *, log: str, source_cluster: str, source_seq: int, first_entry: int, sink_log_id: int, sink_seq: int,
        start_vv: Mapping[str, int], settled: Mapping[str, int], assume_local: bool,
    ) -> None:
        self.where = f"segment {source_seq} of log {log!r}"
        self.first_entry = first_entry
        self.assume_local = assume_local
        self.copier = EntryCopier(
            source_cluster=source_cluster, source_seq=source_seq, sink_log_id=sink_log_id, sink_seq=sink_seq,
            clock=Clock(source_cluster, dict(start_vv), settled=dict(settled)),
        )
        self.source_digest = ContentDigest()
        self.sink_digest = ContentDigest()
        self.source_bytes = 0

    def recode(self, buf: bytes | bytearray, start: int, end: int) -> bytearray:
        """The sink entry for the source entry at ``buf[start:end]``."""
        stats = self.copier.stats
        self.source_bytes += end - start
        self.source_digest.add_entry(buf, start)
        replicated = stats.records - stats.local_records
        out = self.copier.copy(buf, start)
        if self.assume_local and stats.records - stats.local_records > replicated:
            raise NeedsClock(f"{self.where} holds records replicated from another location; its clock needs a pre-pass")
        self.sink_digest.add_entry(out)
        return out

    def result(self) -> dict[str, Any]:
        stats = self.copier.stats
        out: dict[str, Any] = {
            "entries": stats.entries,
            "records": stats.records,
            "source_records": self.source_digest.records,
            "local_records": stats.local_records,
            "source_bytes": self.source_bytes,
            "sink_bytes": stats.sink_bytes,
            "first_txid": stats.first_txid,
            "last_txid": stats.last_txid,
            "last_data_slot": list(stats.last_data_slot) if stats.last_data_slot else None,
            "end_vv": dict(self.copier.clock.vv),
            "source_digest": self.source_digest.hexdigest(),
            "sink_digest": self.sink_digest.hexdigest(),
        }
        differs = self.source_digest.first_difference(self.sink_digest)
        if differs is not None:
            out["content_differs_at_entry"] = self.first_entry + differs
        return out


__all__ = ["NeedsClock", "SegmentRecoder"]
