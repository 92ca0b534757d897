"""The decisions of ``dr recover``, as pure functions over the snapshots of
``dlctl.ops.dr.recover_facts``: which logs and streams the recovery covers, which segments it
drops, how far it raises X's clock, where the peers' and X's streams restart, which streams
it pauses and resumes, which access modes it restores. No I/O here
(``tests/unit/test_dr_recover_decisions.py``).

Streams are named ``stream@cluster`` where their state lives (the sink's ZooKeeper), as in the
operation record's ``running``: the streams to resume at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ...errors import RefusedError
from ...log.dlsn import DLSN, INITIAL
from ...meta.access import AccessMode
from ...replication.records import Checkpoint, StreamConfig, StreamState
from .cold import covered_note
from .recover_facts import ClockEvidence, IncomingFacts, Outgoing, Truncation
from .truncated import Incoming, SourceStart, decide

StreamIn = tuple[StreamConfig, StreamState]  # a stream into X and its state before the loss


def refuse_nothing_to_recover(x: str, incoming: Sequence[StreamIn]) -> None:
    if not incoming:
        raise RefusedError(
            f"no stream flows into {x!r} from a cluster of the inventory: there is nothing to recover {x}'s records from",
            hint="set up streams into it (dlctl init-replication) or add its peers to the inventory",
        )


def recovered_logs(incoming: Iterable[StreamIn], outgoing: Iterable[Outgoing]) -> list[str]:
    """Every log a stream into or out of X carries."""
    return sorted({n for c, _ in incoming for n in c.logs} | {n for o in outgoing for n in o.config.logs})


def running_before(x: str, incoming: Iterable[StreamIn], outgoing: Iterable[Outgoing]) -> list[str]:
    """The streams running before the recovery (it pauses every one): resumed at the end."""
    return [f"{c.stream_id}@{x}" for c, st in incoming if st is StreamState.RUNNING] + [f"{o.config.stream_id}@{o.peer}" for o in outgoing if o.state is StreamState.RUNNING]


def modes_before(current: Mapping[str, str], rebuilt: Mapping[str, str]) -> dict[str, str]:
    """The access modes X's logs return to at the end: what they have now, except the logs a
    metadata rebuild recreated read-only, which return to the mode they had before the loss."""
    return {**current, **rebuilt}


def segments_to_drop(segments: Sequence[Any], first_unserved: int | None) -> list[Any]:
    """A log has no holes: everything from the first segment no replica serves on is forgotten.
    Newest first, so that a run cut short leaves a log that still ends where its data does."""
    return [] if first_unserved is None else list(reversed(segments[first_unserved:]))


def raised_clock(x: str, evidence: ClockEvidence) -> tuple[int, DLSN]:
    """X's counter on the log must rise above every one of X's counters anyone has seen (else X
    would hand out a timestamp again): the floor, and the first position it applies from — the
    next segment, where X's new records start."""
    seen = max((vv.get(x, 0) for vv in evidence.seen), default=0)
    return max(seen, evidence.held.get(x, 0)), DLSN(evidence.max_segment_seq + 1, 0, 0)


def outgoing_start(end: DLSN | None, first: DLSN | None) -> DLSN:
    """Where the peers' streams from X restart reading X's log: at its end (what X still has is
    what they have). An emptied log starts after the segments it had — what comes back lands
    there: a stream from INITIAL would find its source "truncated" and stop for a bootstrap."""
    return end or first or INITIAL


def reset_outgoing(cp: Checkpoint, position: DLSN, vv: Mapping[str, int]) -> Checkpoint:
    return replace(cp, next=position, source_vv=dict(vv), needs_bootstrap="", last_error="")


def mode_restores(logs: Iterable[str], saved: Mapping[str, str], current: Mapping[str, AccessMode], incoming: Iterable[StreamIn], skip: Iterable[str] = ()) -> list[tuple[str, AccessMode, str]]:
    """(log, mode, replica of which stream) for every log whose access mode differs from the one
    it had before the recovery (read-write when none was recorded). A log a bootstrap copy goes
    into (``skip``) stays frozen until the copy is committed."""
    incoming, skip = list(incoming), set(skip)
    out = []
    for name in logs:
        if name in skip:
            continue
        mode = AccessMode(saved.get(name, AccessMode.READ_WRITE.value))
        if current[name] is not mode:
            stream = next((c.stream_id for c, _ in incoming if name in c.logs and not c.bidirectional), "") if mode is AccessMode.REPLICA else ""
            out.append((name, mode, stream))
    return out


def decide_incoming(x: str, incoming: Sequence[StreamIn], facts: IncomingFacts) -> list[tuple[StreamConfig, Incoming]]:
    """What happens to every (stream, log) into X (``dlctl.ops.dr.truncated``), in order: at most
    one bootstrap copy or cold replay per log, what a source deleted covered from its cold store
    when it can be, or else reported as a gap (with why the cold store could not help)."""
    copying: set[str] = set()
    replaying: set[str] = set()  # logs whose gap comes back from the peer's cold store first
    complete = {n: [c.source_cluster for c, _ in incoming if n in c.logs and (c.source_cluster, n) not in facts.truncations] for c, _ in incoming for n in c.logs}
    out = []
    for c, _ in incoming:
        for name in c.logs:
            item = decide(
                x, c, name, facts.starts.get((c.stream_id, name), SourceStart(None)), saved=facts.saved.get(f"{c.stream_id}/{name}"),
                x_holds=facts.holds.get(name, 0), copying=copying | replaying, complete_sources=[s for s in complete[name] if s != c.source_cluster],
            )
            if item.gap is not None and not item.gated and name not in replaying:
                item = _with_cold(x, c.source_cluster, item, facts.truncations[(c.source_cluster, name)])
            if item.mode == "bootstrap":
                copying.add(name)
            if item.mode == "cold":
                replaying.add(name)
            out.append((c, item))
    return out


def _with_cold(x: str, source: str, item: Incoming, truncation: Truncation) -> Incoming:
    if truncation.cover is not None:
        gap = {**item.gap, "covered_by": [f"cold store of {source}: {truncation.cover.describe()}"], "note": covered_note(source, item.log, item.first, x, truncation.cover)}
        return replace(item, mode="cold", gap=gap)
    if truncation.cold_store:  # configured, but it cannot help: say why
        return replace(item, gap={**item.gap, "cold_store": truncation.why})
    return item


def logs_copied(decided: Iterable[tuple[StreamConfig, Incoming]], mode: str) -> set[str]:
    return {item.log for _, item in decided if item.mode == mode}


def held_back(incoming: Iterable[StreamIn], logs: Iterable[str]) -> set[str]:
    """The streams into X that wait for a copy or a replay into one of their logs."""
    logs = set(logs)
    return {c.stream_id for c, _ in incoming if logs & set(c.logs)}


def restarted(cp: Checkpoint, item: Incoming, held: Mapping[str, int], pending: str) -> Checkpoint:
    """A stream into X restarts at the source's first position with the source's clock there,
    its filter from what X holds; ``pending``: why it waits for a bootstrap copy ("" none)."""
    return replace(
        cp, next=item.first, source_vv=dict(item.vv), sink_vv=dict(held), sink_dlsn=None, needs_bootstrap=pending, last_error="", gated=item.gated, waiting_for={},
        safe_time=0.0,  # X lost what it held: no time is safe until the stream brings it back (the one reset)
    )


def incoming_description(x: str, source: str, item: Incoming) -> str:
    return {
        "start": "from the start, unfiltered",
        "stream": f"from {item.first} ({source} deleted what lay before), unfiltered"
        + (f", once {x} holds what {source} deleted again (from {', '.join(item.gap['covered_by'])})" if item.gated and item.gap else ""),
        "bootstrap": f"bootstrap copy from {item.first} ({source} deleted what lay before), then streaming, unfiltered",
        "cold": f"what {source} deleted before {item.first} replayed from its cold store, then streaming from there, unfiltered",
    }[item.mode]


def streams_carrying(incoming: Iterable[StreamIn], logs: Iterable[str]) -> list[tuple[str, str]]:
    """(stream, log) of every stream into X carrying one of ``logs``: after a copy or a replay
    into them, their filters start from what X holds."""
    logs = set(logs)
    return [(c.stream_id, name) for c, _ in incoming for name in sorted(set(c.logs) & logs)]


def refuse_gaps(x: str, gaps: Mapping[str, str]) -> None:
    """Streams that could not bring X's records back (a peer deleted what X needs)."""
    if gaps:
        raise RefusedError(
            f"event recovery of {x} is incomplete: {dict(gaps)}",
            hint=f"bootstrap the missing range (dlctl bootstrap --stream ...) or accept the gap; re-running `dlctl dr recover --cluster {x}` continues",
            details={"gaps": dict(gaps)},
        )


def recovered_records(kept: Mapping[str, Any], now: Mapping[str, int]) -> int:
    """Records that came back: what X's logs hold now beyond what they kept after the loss."""
    return sum(now.values()) - sum(int(v) for v in kept.values())


def end_states(x: str, incoming: Iterable[StreamIn], outgoing: Iterable[Outgoing], running: Iterable[str]) -> tuple[list[str], list[Outgoing]]:
    """The streams into X to pause again and those out of X to resume: each back to the state it
    had before the recovery."""
    running = set(running)
    pause = [c.stream_id for c, _ in incoming if f"{c.stream_id}@{x}" not in running]
    resume = [o for o in outgoing if f"{o.config.stream_id}@{o.peer}" in running]
    return pause, resume


def truncated_notes(x: str, incoming: Iterable[StreamIn], truncations: Mapping[tuple[str, str], Truncation]) -> list[str]:
    """What the plan can say before it runs: the peers that deleted the beginning of a log, and
    whether their cold stores give it back."""
    out = []
    for c, _ in incoming:
        for name in c.logs:
            t = truncations.get((c.source_cluster, name))
            if t is None:
                continue
            if t.cover is not None:
                out.append(covered_note(c.source_cluster, name, t.first, x, t.cover) + f"; then streaming from {t.first}")
                continue
            cold = f" (its cold store cannot help: {t.why})" if t.cold_store else ""
            out.append(f"GAP {c.source_cluster}/{name}: {c.source_cluster} no longer holds {name} before {t.first}{cold}; what of it {x} did not keep is reported as lost (exit 3); the rest comes back by a bootstrap copy (when {x} holds nothing of {name}) or by streaming from {t.first}")
    return out


__all__ = [
    "decide_incoming", "end_states", "held_back", "incoming_description", "logs_copied", "mode_restores", "modes_before", "outgoing_start", "raised_clock",
    "recovered_logs", "recovered_records", "refuse_gaps", "refuse_nothing_to_recover", "reset_outgoing", "restarted", "running_before", "segments_to_drop",
    "streams_carrying", "truncated_notes",
]
