"""``dlctl fence LOG`` and ``dlctl recover log LOG``: depose a writer, close its segment."""

from __future__ import annotations

from typing import Any

from ..errors import RefusedError
from ..log.recovery import fence_log, recover_log
from ..meta.records import SegmentState
from ..plan import Plan, Step
from .logs import owner_of
from ..session import ClusterSession


def _in_progress(session: ClusterSession, name: str) -> list[Any]:
    return [s.value for s in session.meta.segments(name) if s.value.state is SegmentState.INPROGRESS]


def _guard_owner(session: ClusterSession, name: str, force: bool, verb: str) -> list[str]:
    owner = owner_of(session, name)
    if owner and not force:
        raise RefusedError(
            f"log {name!r} has a live writer ({owner}); {verb} would fence it and fail its appends",
            hint="stop that writer, or pass --force to depose it",
        )
    return [f"the live writer {owner} is deposed: its next append fails with a fencing error"] if owner else []


def fence_plan(session: ClusterSession, name: str, *, force: bool, timeout: float) -> Plan:
    session.meta.get_log(name)  # NotFound (exit 1) before anything else
    notes = _guard_owner(session, name, force, "fencing")
    segments = _in_progress(session, name)
    if not segments:
        return Plan.of("fence", [], notes=[f"log {name!r} has no in-progress segment; nothing to fence"])
    seqs = ", ".join(str(s.seq) for s in segments)
    ensembles = "; ".join(",".join(s.ensembles[-1].nodes) for s in segments)

    def run() -> dict[str, Any]:
        outcome = session.with_pool(lambda pool: fence_log(session.meta, pool, name, timeout=timeout))
        return {str(seq): o.to_dict() for seq, o in outcome.items()}

    return Plan.of(
        "fence",
        [Step("fence", f"{session.cluster.name}/{name}", f"fence in-progress segment(s) {seqs} of {name} on {ensembles} (W-A+1 replicas per write set)", run=run)],
        notes=notes + ["the segment stays in progress until the next owner or `dlctl recover log` closes it"],
    )


def recover_plan(
    session: ClusterSession, name: str, *, force: bool, timeout: float, accept_data_loss: bool = False, confirm: str | None = None
) -> Plan:
    """``accept_data_loss``: unclean recovery (replicas that cannot answer are taken as gone for
    good; the segment closes at the last entry still readable and the report names what may be
    lost), only with ``confirm`` naming the log."""
    if accept_data_loss and confirm != name:
        raise RefusedError(
            f"recover log {name!r} --accept-data-loss closes the segment without the replicas that cannot answer, "
            "and acknowledged records they hold are lost: " + ("not confirmed" if confirm is None else f"--confirm {confirm!r} does not name the log"),
            hint=f"bring the agents back if they can come back; otherwise pass --confirm {name}",
        )
    session.meta.get_log(name)
    notes = _guard_owner(session, name, force, "recovery")
    segments = _in_progress(session, name)
    if not segments:
        return Plan.of("recover log", [], notes=[f"log {name!r} has no in-progress segment; nothing to recover"])
    seqs = ", ".join(str(s.seq) for s in segments)

    def run() -> list[dict[str, Any]]:
        return [r.to_dict() for r in session.with_pool(lambda pool: recover_log(session.meta, pool, name, timeout=timeout, accept_data_loss=accept_data_loss))]

    how = "close with a versioned update"
    if accept_data_loss:
        how = "UNCLEAN: take replicas that cannot answer as lost, close at the last entry still readable, report the entries at risk"
        notes = [*notes, "--accept-data-loss: acknowledged records on replicas that cannot answer may be lost; the result names the range"]
    return Plan.of(
        "recover log",
        [
            Step(
                "recover",
                f"{session.cluster.name}/{name}",
                f"fence segment(s) {seqs}, read forward from LAC with fencing reads, re-replicate what is found, {how}",
                run=run,
            )
        ],
        notes=notes,
    )
