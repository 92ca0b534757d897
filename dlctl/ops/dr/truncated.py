"""``dr recover`` when a peer no longer holds the beginning of a log (issue 11; DESIGN.md §7, §8).

Event recovery restarts every stream P -> X from P's beginning with the unfiltered causality
filter. When P truncated log L (its first retained position is T), P cannot give X what lay
before T: those records come back only if X kept them (or another stream into X brings them),
and the rest is **reported as a gap** (peer, log, range, an estimate of the record count) —
never silently dropped. From T on, P still has everything, and X must get it exactly once.

Two things make that hard, and this module decides them per (stream, log), over facts read
before (``dlctl.ops.dr.recover_facts.read_source_start``): no I/O here.

* **The clock at T.** A stream stamps P's local records by counting from P's version vector
  before where it starts reading. From T, that vector is not {} (P counted the records it
  deleted): starting from {} would hand P's records *lower* counters than they always had, and
  other locations' causality filters would then skip records they never saw. P's own counter at
  T is derived backwards from a checkpoint of a stream from P at or after T (X's own one from
  before the loss, saved when ``dr recover`` began — P's retention pin kept T at or before it —
  or any other sink's) and the records read between (``dlctl.replication.dr.clock_at``), then
  checked forward with P's clock steps. No usable checkpoint: refused, nothing changed. When P
  recorded its clock base at its truncation point (``dlctl.replication.truncation_base``: every
  truncation does, before it deletes anything), that base is used instead: exact, no estimate.

* **Duplicates.** The Spark bootstrap (``dlctl.ops.bootstrap``) copies whole segments
  without the causality filter. X may still hold part of its log (records that are also in P's
  retained segments: X's own records that reached P, records X had received), so a copy into a
  log that holds anything would duplicate them. Hence:

  - X's log holds **nothing** (wiped, or everything dropped as lost): **bootstrap** P's
    retained completed segments into it (``start_vv`` = the clock at T, so copied records get
    their true counters), then the stream continues from the snapshot point, unfiltered. At
    most one stream per log copies; every stream carrying that log stays paused and the log
    frozen until the copy is committed, and their filters then start from what X holds.
  - X's log holds **something**: no copy; the stream reads P from T (with the clock at T)
    through the unfiltered causality filter, which skips every record X already holds.
  - Another stream into X comes from a peer that holds the whole log (it can bring back what P
    deleted): no copy either; P's stream waits until X holds everything P deleted (the
    location-addition rule, re-checked as X's other streams deliver: #314's recovery in rounds),
    then reads P from T like the case above.

Resumable: the decisions are kept in ``dr recover``'s operation record; a log whose copy
finished has its stream checkpoint's ``needs_bootstrap`` cleared (by ``stream_hook`` together
with the commit), so a re-run never copies it twice; an interrupted copy resumes (same holder).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import RefusedError
from ...log.dlsn import DLSN, INITIAL
from ...replication.records import StreamConfig

PENDING = "dr recover: a bootstrap copy from {first} is pending"


@dataclass(frozen=True)
class SourceStart:
    """Where a source's log starts now, and the source's clock there."""

    first: DLSN | None  # the first position it still holds; None: it holds everything it ever had
    vv: Mapping[str, int] = field(default_factory=dict)  # its version vector before ``first``
    anchor: DLSN | None = None  # the checkpoint position the clock was derived from (None: none read)
    between: int = 0  # records of the source's log between ``first`` and ``anchor``
    unknown: str = ""  # why the clock at ``first`` cannot be established ("": it is known)


@dataclass
class Incoming:
    """What ``dr recover`` does with one (stream, log) into X."""

    stream: str
    log: str
    mode: str  # "start" (the source holds everything), "stream" (from T, filtered), "bootstrap" (copy, then stream), "cold" (``dlctl.ops.dr.cold``: replay, then stream)
    first: DLSN  # where the source's log starts now (INITIAL: nothing deleted)
    vv: dict[str, int]  # the source's version vector before ``first``
    gap: dict[str, Any] | None = None
    # Another stream into X may bring back what the source deleted: this one starts only once X
    # holds it (the location-addition rule, ``dlctl.replication.network``; #314's recovery in
    # rounds), else the source's retained records would arrive ahead of the deleted ones and
    # X's owner would take those for duplicates.
    gated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.stream, "log": self.log, "mode": self.mode, "first": str(self.first), "vv": dict(self.vv), "gap": self.gap, "gated": self.gated}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Incoming:
        return cls(raw["stream"], raw["log"], raw["mode"], DLSN.parse(raw["first"]), {str(k): int(v) for k, v in raw["vv"].items()}, raw.get("gap"), bool(raw.get("gated")))


def saved_anchor(saved: Mapping[str, Any] | None) -> tuple[DLSN, dict[str, int]] | None:
    """X's own checkpoint of the stream from before the loss (``dr recover`` keeps it when it
    begins): a position of the source's log and the source's clock before it."""
    if not saved or not saved.get("next"):
        return None
    return DLSN.parse(saved["next"]), {str(k): int(v) for k, v in (saved.get("source_vv") or {}).items()}


def decide(
    x: str,
    config: StreamConfig,
    name: str,
    start: SourceStart,
    *,
    saved: Mapping[str, Any] | None,
    x_holds: int,
    copying: set[str],
    complete_sources: Sequence[str],
) -> Incoming:
    """Decide for stream ``config`` (source P -> X) and log ``name`` (see the module doc).
    ``start``: where P's log starts and its clock there; ``saved``: X's checkpoint from before the
    loss; ``x_holds``: records X's log holds now; ``copying``: logs another stream copies already
    (this one then streams); ``complete_sources``: other streams' sources into X that hold all of
    ``name`` (they may bring back what P deleted). Raises ``RefusedError`` when P's clock at its
    first retained position is unknown."""
    p, first = config.source_cluster, start.first
    if first is None:
        return Incoming(config.stream_id, name, "start", INITIAL, {})
    if start.unknown:
        raise RefusedError(
            f"{p} no longer holds the beginning of {name} (it starts at {first}) and its clock there cannot be established: {start.unknown}",
            hint=f"nothing of this step was changed; {p}'s records from {first} on can only be copied with their true counters once a stream from {p} has a checkpoint at or after {first}",
        )
    estimate = None
    anchor = saved_anchor(saved)
    processed = int(saved.get("processed") or 0) if saved else 0
    if anchor is not None and start.anchor == anchor[0] and processed >= start.between:
        # The stream read every record of P before its checkpoint: those before T are gone at P.
        estimate = processed - start.between
    gap = {
        "peer": p,
        "log": name,
        "stream": config.stream_id,
        "from": str(INITIAL),
        "to": str(first),
        "records_estimate": estimate,
        "peer_own_records_before": start.vv.get(p, 0),
        "x_kept_records": x_holds,
        "covered_by": list(complete_sources),
        "note": (
            f"{p} deleted {name} before {first}: what of it {x} did not keep"
            + (f" may come back from {', '.join(complete_sources)}" if complete_sources else f" is lost for {x} (no other stream into {x} holds it)")
        ),
    }
    if complete_sources:
        # What P deleted comes back from those sources: P's stream waits until X holds it, then
        # reads P from T skipping what X holds (no copy: a copy would land ahead of it).
        return Incoming(config.stream_id, name, "stream", first, dict(start.vv), gap, gated=True)
    mode = "bootstrap" if x_holds == 0 and name not in copying else "stream"
    return Incoming(config.stream_id, name, mode, first, dict(start.vv), gap)


def gap_note(gap: Mapping[str, Any]) -> str:
    count = f"about {gap['records_estimate']} record(s)" if gap.get("records_estimate") is not None else "an unknown number of records"
    return f"GAP {gap['peer']}/{gap['log']}: {gap['peer']} no longer holds {gap['from']}..{gap['to']} ({count}); {gap['note']}"


__all__ = ["PENDING", "Incoming", "SourceStart", "decide", "gap_note", "saved_anchor"]
