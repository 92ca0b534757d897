"""``failover``: the primary A is gone; B, the sink of its one-way stream, takes over.

Fence the stream A -> B for good (state ``failed-over``: no worker ever runs it again, so a
returning A cannot write into B), settle what is at risk (A's records after the last one B
applied, as far as B knows: exact once no worker runs) and promote B's logs to read-write.
Never contacts A.
"""

from __future__ import annotations

import time
from typing import Any

from ...plan import Plan, PlanResult, Step
from ...replication.records import StreamConfig, StreamState
from ...replication.store import StreamStore
from ...session import ClusterSession
from .decide import STANDBY_STATES, at_risk, risk_note, settled_checkpoint, stream_into
from .facts import read_progress, read_streams
from .fencing import promote_logs


def failover_plan(sink: ClusterSession, *, source: str | None = None, wait_workers: float = 30.0) -> Plan:
    unreadable: dict[str, str] = {}  # stream records that cannot be read: named if no stream is found
    config = stream_into(sink.cluster.name, read_streams(sink, unreadable), source, STANDBY_STATES, unreadable).config
    stream_id, src, snk = config.stream_id, config.source_cluster, sink.cluster.name
    risks = _risks(sink, config)
    started = time.monotonic()
    steps = [
        Step("fence-stream", f"{snk}/{stream_id}", f"mark stream {stream_id} failed-over: its workers stop and it never runs again (a returning {src} cannot write into {snk})", run=lambda: _fence(sink, config, wait_workers)),
        Step("settle", f"{snk}/{stream_id}", f"find, per log, the last record {snk} holds from {src}; record what is at risk", run=lambda: _settle(sink, config)),
        Step("promote", f"{snk}/{','.join(config.logs)}", f"promote {snk}'s logs {', '.join(config.logs)} to read-write: applications write at {snk}", run=lambda: _promote(sink, config, started)),
    ]
    notes = [risk_note(src, snk, r) for r in risks.values()]
    notes.append(f"after {src} returns: `dlctl failback --to {src}` shows the records it holds that {snk} never received and sets up {snk} -> {src}")
    return Plan.of(f"failover {src} -> {snk}", steps, notes)


def at_risk_of(plan_result: PlanResult) -> dict[str, Any]:
    """The settled at-risk record of an applied failover plan."""
    for outcome in plan_result.outcomes:
        if outcome.step.action == "settle":
            return outcome.result["at_risk"]
    return {}


def _risks(sink: ClusterSession, config: StreamConfig) -> dict[str, dict[str, Any]]:
    return {name: at_risk(read_progress(sink, config, name), time.time()) for name in config.logs}


def _fence(sink: ClusterSession, config: StreamConfig, wait_workers: float) -> dict[str, Any]:
    streams = StreamStore(sink.meta)
    current = streams.get_state(config.stream_id)
    if current.value.state is not StreamState.FAILED_OVER:
        snk, src = sink.cluster.name, config.source_cluster
        current = streams.set_state(config.stream_id, current, StreamState.FAILED_OVER, reason=f"failover to {snk} at {time.strftime('%Y-%m-%dT%H:%M:%S')}", details={"to": snk, "from": src, "at": time.time()})
    stopped = streams.wait_released(config.stream_id, wait_workers)
    return {"state": "failed-over", "epoch": current.value.epoch, "workers_stopped": stopped}


def _settle(sink: ClusterSession, config: StreamConfig) -> dict[str, Any]:
    # Now that no worker runs, the sink log's tail is final: the exact at-risk positions, kept in
    # the checkpoints and the stream's state for the failback to read back.
    settled = _risks(sink, config)
    streams = StreamStore(sink.meta)
    for name, risk in settled.items():
        current = streams.get_checkpoint(config.stream_id, name)
        moved = settled_checkpoint(current.value, risk)
        if moved is not None:
            streams.update_checkpoint(config.stream_id, current, moved)
    current = streams.get_state(config.stream_id)
    streams.set_state(config.stream_id, current, StreamState.FAILED_OVER, reason=current.value.reason, details={**current.value.details, "at_risk": settled})
    return {"at_risk": settled}


def _promote(sink: ClusterSession, config: StreamConfig, started: float) -> dict[str, Any]:
    out = promote_logs(sink, config.logs, reason=f"failover from {config.source_cluster}")
    return {"promoted": out, "promoted_after_seconds": round(time.monotonic() - started, 3)}


__all__ = ["at_risk_of", "failover_plan"]
