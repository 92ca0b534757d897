"""The decisions of failover, switchover and failback, as pure functions over the snapshots of
``dlctl.ops.dr.facts``: no I/O here, so each is tested on plain values
(``tests/unit/test_dr_decisions.py``).

A record's position after a failover is told in the source's numbering (``from``: the first
source position the sink never applied) and the sink's (``sink_last``: where the last record
it did apply sits in the sink's log); failback reads both back from the failed-over stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ...errors import NotFoundError, RefusedError, UsageError
from ...log.dlsn import DLSN, INITIAL
from ...meta.access import AccessMode
from ...replication import dr
from ...replication.origin import ORIGIN_CLUSTER, ORIGIN_DLSN, SOURCE_POSITION, VECTOR_TIME, encode_vt
from ...replication.records import Checkpoint, StreamState, StreamStatus
from .facts import SinkProgress, StreamFacts

STANDBY_STATES = (StreamState.RUNNING, StreamState.PAUSED)  # a stream a failover or switchover may take over
CHOICES = (None, "reconcile", "discard")  # failback: refuse when anything diverged, re-append, drop

# -- which stream ----------------------------------------------------------------------------------


def stream_into(sink: str, streams: Iterable[StreamFacts], source: str | None, states: tuple[StreamState, ...], unreadable: Mapping[str, str] | None = None) -> StreamFacts:
    """The one-way stream into ``sink`` (from ``source`` when given) in one of ``states``.
    Active-active streams are refused (every location takes writes already: nothing to fail
    over); several candidates need the operator to name the source, and so does one beside a
    stream whose record cannot be read. ``unreadable``: those records (id -> why)."""
    found = [s for s in streams if (source is None or s.config.source_cluster == source) and s.state in states]
    one_way = [s for s in found if not s.config.bidirectional]
    if not one_way:
        kinds = "/".join(s.value for s in states)
        if found:
            raise RefusedError(
                f"the streams into {sink!r} ({', '.join(s.config.stream_id for s in found)}) are active-active: every location already takes writes",
                hint="failover and switchover are for a primary with a one-way standby",
            )
        damaged = "".join(f"; the record of stream {k} cannot be read: {v}" for k, v in sorted((unreadable or {}).items()))
        raise NotFoundError(f"no one-way stream {('from ' + repr(source) + ' ') if source else ''}into {sink!r} is {kinds}{damaged}", hint="see `dlctl dr status`")
    if len(one_way) > 1:
        raise UsageError(f"several streams flow into {sink!r} ({', '.join(s.config.stream_id for s in one_way)}); name the source with --from")
    if source is None and unreadable:
        # The stream found may not be the one meant: the unreadable one may come from the
        # location that was lost, and taking over the other would make two primaries.
        raise UsageError(
            f"stream {one_way[0].config.stream_id} flows into {sink!r}, and so may "
            + ", ".join(f"stream {k}, whose record cannot be read ({v})" for k, v in sorted(unreadable.items()))
            + "; name the source with --from",
            hint="see `dlctl dr status`",
        )
    return one_way[0]


def only_one_way_source(sink: str, streams: Iterable[StreamFacts]) -> str:
    """The source of the one running or paused one-way stream into ``sink`` (a switchover needs
    exactly one)."""
    sources = [s.config.source_cluster for s in streams if not s.config.bidirectional and s.state in STANDBY_STATES]
    if len(sources) != 1:
        raise UsageError(f"cluster {sink!r} has {len(sources)} one-way stream(s) into it; switchover needs exactly one")
    return sources[0]


def has_failed_over_from(streams: Iterable[StreamFacts], returning: str) -> bool:
    """Do these streams hold a failed-over one from ``returning`` (is their cluster the primary
    a failback returns to)?"""
    return any(s.config.source_cluster == returning and s.state is StreamState.FAILED_OVER for s in streams)


def reverse_exists(status: StreamStatus | None) -> bool:
    """A reverse stream that got past setting-up was registered by an earlier run: keep it (one
    still setting up is registered again, which completes it)."""
    return status is not None and status.state is not StreamState.SETTING_UP


# -- fencing and promoting ---------------------------------------------------------------------------


def to_promote(modes: Mapping[str, AccessMode]) -> list[str]:
    """The logs ``dr promote`` changes: those not read-write already, in the order given."""
    return [name for name, mode in modes.items() if mode is not AccessMode.READ_WRITE]


def owner_action(owner: Mapping[str, Any] | None, only_prefix: str | None) -> str:
    """What taking a log from its writer does to ``owner`` (its owner record): ``none`` (no
    owner), ``leave`` (not one ``only_prefix`` names), ``release`` (an agent: it flushes and
    completes its segment itself) or ``depose`` (anyone else: fenced by removing its claim)."""
    if owner is None:
        return "none"
    if only_prefix is not None and not str(owner["owner"]).startswith(only_prefix):
        return "leave"
    return "release" if owner.get("address") else "depose"


# -- failover ----------------------------------------------------------------------------------------


def at_risk(progress: SinkProgress, now: float) -> dict[str, Any]:
    """What of the source's log the sink never applied, as far as the sink knows: everything from
    the position after the last record its log holds from the source (the checkpoint, moved on by
    the log's tail when a worker applied more before it could record it), with the source end
    the worker last measured and how old that measure is."""
    cp = progress.checkpoint
    start, sink_last = cp.next, cp.sink_dlsn
    if progress.applied is not None and dr.after(progress.applied.source) > start:
        start, sink_last = dr.after(progress.applied.source), progress.applied.sink
    estimate = cp.unapplied_estimate()
    if estimate is not None and cp.source_end is not None and start >= cp.source_end:
        estimate = 0  # the tail reached the end the worker last saw
    return {
        "log": progress.log,
        "from": str(start),
        "source_end": str(cp.source_end) if cp.source_end else None,
        "records_estimate": estimate,
        "source_end_age_seconds": round(now - cp.source_end_at, 1) if cp.source_end_at else None,
        "sink_last": str(sink_last) if sink_last else None,
        "checkpoint": str(cp.next),
    }


def risk_note(source: str, sink: str, risk: Mapping[str, Any]) -> str:
    log = risk["log"]
    if risk["records_estimate"] == 0:
        return f"{source}/{log}: nothing at risk (the sink had applied up to {risk['from']}, the source end it last saw)"
    count = "an unknown number of records" if risk["records_estimate"] is None else f"about {risk['records_estimate']} record(s)"
    seen = f", source end {risk['source_end']} seen {risk['source_end_age_seconds']}s ago" if risk["source_end"] else ""
    return f"AT RISK {source}/{log}: {source}'s records from {risk['from']} on — {count}{seen} — never reached {sink}"


def settled_checkpoint(cp: Checkpoint, risk: Mapping[str, Any]) -> Checkpoint | None:
    """The checkpoint moved to the settled at-risk position (what a failback reads back), or None
    when it is there already."""
    position = DLSN.parse(risk["from"])
    if cp.next == position:
        return None
    return replace(cp, next=position, sink_dlsn=DLSN.parse(risk["sink_last"]) if risk["sink_last"] else None)


# -- switchover ------------------------------------------------------------------------------------


def still_behind(checkpoints: Mapping[str, Checkpoint], ends: Mapping[str, DLSN | None]) -> dict[str, str]:
    """The logs whose stream has not applied up to the source's final end (the drain target was
    read while the workers ran: only the ends read after they stopped count)."""
    return {name: f"{cp.next} < {ends[name]}" for name, cp in checkpoints.items() if ends[name] is not None and cp.next < ends[name]}


def switchover_start(progress: SinkProgress) -> tuple[DLSN, dict[str, int]]:
    """Where the reverse stream B -> A starts after a switchover: B's log holds exactly A's
    records (drained, no local writes while a replica), so it continues after the last one B
    applied, with B's clock there — the same as A's at its end."""
    position = dr.after(progress.applied.sink) if progress.applied is not None else INITIAL
    return position, dict(progress.checkpoint.source_vv)


def copy_report(source: str, sink: str, identities: Mapping[str, tuple[Sequence[dr.Identity], Sequence[dr.Identity]]]) -> dict[str, Any]:
    """Per log (the source's identities, the sink's): every source record is held once at the
    sink, or ``RefusedError`` with the count of records lost and duplicated."""
    out: dict[str, Any] = {"lost": 0, "duplicates": 0, "logs": {}}
    for name, (expected, held) in identities.items():
        lost, duplicates = dr.missing(list(expected), list(held))
        out["logs"][name] = {"source_records": len(expected), "sink_records": len(held), "lost": len(lost), "duplicates": duplicates, "first_lost": [f"{c}@{d}" for c, d in lost[:5]]}
        out["lost"] += len(lost)
        out["duplicates"] += duplicates
    if out["lost"] or out["duplicates"]:
        raise RefusedError(
            f"verification failed: {out['lost']} record(s) of {source} missing at {sink}, {out['duplicates']} duplicate(s)",
            hint=f"{source}'s logs stay read-only: nothing is lost there; inspect with `dlctl dr status`",
            details=out,
        )
    return out


# -- failback --------------------------------------------------------------------------------------


def check_choice(choice: str | None) -> None:
    if choice not in CHOICES:
        raise UsageError("choose --reconcile or --discard-divergent")


def recorded_start(risk: Mapping[str, Any] | None) -> DLSN | None:
    """Where the primary's copy of a log stopped, as the failover settled it (None: it recorded
    nothing for the log; the stream's checkpoint says it then)."""
    return DLSN.parse(risk["from"]) if risk and risk.get("from") else None


def divergence_notes(divergences: Mapping[str, dr.Divergence], returning: str, primary: str) -> list[str]:
    out = []
    for name, d in sorted(divergences.items()):
        if d.count:
            out.append(f"DIVERGED {returning}/{name}: {d.count} record(s) from {d.records[0].dlsn} to {d.records[-1].dlsn} that {primary} never received")
        else:
            out.append(f"{returning}/{name}: nothing diverged (as far as {returning} can be read before it is frozen)")
    return out


def refuse_undecided(divergences: Mapping[str, dr.Divergence], choice: str | None, returning: str, primary: str) -> None:
    """Before anything changes: records diverged and the operator chose nothing."""
    diverged = {n: d for n, d in divergences.items() if d.count}
    if diverged and choice is None:
        total = sum(d.count for d in diverged.values())
        raise RefusedError(
            f"{returning} holds {total} record(s) that {primary} never received ({', '.join(f'{n}: {d.count}' for n, d in diverged.items())}); nothing was changed",
            hint=f"choose: --reconcile (re-append them at {primary}) or --discard-divergent (drop them; asks you to type {returning!r})",
            details=[d.to_dict() for d in diverged.values()],
        )


def refuse_unchosen_loss(divergences: Mapping[str, dr.Divergence], choice: str | None, returning: str, primary: str) -> dict[str, int]:
    """Rebuilding the returning logs drops what they hold beyond the primary's: only with
    ``discard`` when anything (still) diverges — a dead owner's last entries show only once the
    freeze recovered its segment, after the operator chose. Returns the counts per log."""
    lost = {n: d.count for n, d in divergences.items() if d.count}
    if lost and choice != "discard":
        raise RefusedError(
            f"{returning} holds record(s) {primary} never received: {lost} (found after freezing {returning}); nothing was dropped",
            hint="re-run failback and choose --reconcile or --discard-divergent",
            details=[d.to_dict() for d in divergences.values() if d.count],
        )
    return lost


def needs_rebuild(tail_records: int | None) -> bool:
    """A returning log is rebuilt from the primary unless it is a prefix of the primary's: it
    exists (``tail_records`` not None) and holds nothing from the at-risk position on."""
    return tail_records is None or tail_records > 0


def rebuilt_report(recreated: Mapping[str, Any], name: str, tail_records: int | None, lost: Mapping[str, int], choice: str | None, primary: str) -> dict[str, Any]:
    if tail_records is None:  # the returning cluster had no such log
        return dict(recreated)
    fate = "dropped" if choice == "discard" else "re-appended at " + primary
    return {**recreated, fate: lost.get(name, 0), "tail_records": tail_records}


def failback_start(risk: Mapping[str, Any] | None, emptied: bool, primary_truncated: bool) -> DLSN | None:
    """Where the primary -> returning stream starts reading the primary's log: from the start
    into an empty (rebuilt) copy — None when the primary no longer holds its start (only a
    bootstrap copy can fill it) — else after the last record the primary applied from the
    returning cluster (the returning log is a prefix of the primary's up to there)."""
    if emptied:
        return None if primary_truncated else INITIAL
    sink_last = DLSN.parse(risk["sink_last"]) if risk and risk.get("sink_last") else None
    return dr.after(sink_last) if sink_last else INITIAL


def refuse_copy_needed(needs_copy: Sequence[str], returning: str, primary: str) -> None:
    if needs_copy:
        raise RefusedError(
            f"{primary} no longer holds the beginning of {', '.join(needs_copy)}: {returning}'s copy can only be rebuilt by a bootstrap copy",
            hint=f"run `dlctl init-replication --source {primary} --sink {returning} --logs ...` (it bootstraps), then re-run failback",
        )


def reappended_headers(headers: Mapping[str, bytes], location: str, dlsn: DLSN, vt: Mapping[str, int]) -> dict[str, bytes]:
    """The headers of a divergent record re-appended at the primary: its identity (the origin it
    had, or the returning location and its position there) and its vector time. A relayed
    record's old hop (``dl.src``) means nothing at the primary: dropped."""
    out = dict(headers)
    out.pop(SOURCE_POSITION, None)
    if ORIGIN_CLUSTER not in out:
        out[ORIGIN_CLUSTER] = location.encode()
        out[ORIGIN_DLSN] = str(dlsn).encode()
    out[VECTOR_TIME] = encode_vt(dict(vt))
    return out


__all__ = [
    "CHOICES", "STANDBY_STATES", "at_risk", "check_choice", "copy_report", "divergence_notes", "failback_start", "has_failed_over_from", "needs_rebuild",
    "only_one_way_source", "owner_action", "reappended_headers", "rebuilt_report", "recorded_start", "refuse_copy_needed", "refuse_undecided",
    "refuse_unchosen_loss", "reverse_exists", "risk_note", "settled_checkpoint", "still_behind", "stream_into", "switchover_start", "to_promote",
]
