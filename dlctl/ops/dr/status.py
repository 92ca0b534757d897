"""``dr status``: per location, its streams in and out, its logs' access modes, and where it
could be recovered from. Read-only; an unreachable cluster is reported, not fatal."""

from __future__ import annotations

from typing import Any

from ...meta.access import AccessStore
from ...meta.pins import PinStore
from ...meta.zk import UNREADABLE, why_unreadable
from ...replication.records import StreamConfig, StreamState
from ...session import ClusterSession
from .. import streams as stream_ops
from .facts import read_streams


def dr_status(sessions: dict[str, ClusterSession], only: str | None = None) -> list[dict[str, Any]]:
    """Per location: its streams in and out (state, per-log lag and the last point applied),
    its logs' access modes, and which locations hold its records (it could be recovered from:
    the sources of its incoming streams)."""
    streams: list[tuple[str, StreamConfig, StreamState]] = []
    unreadable: dict[str, dict[str, str]] = {name: {} for name in sessions}  # location -> stream id -> why
    for name, session in sessions.items():
        try:
            streams += [(name, s.config, s.state) for s in read_streams(session, unreadable[name])]
        except Exception:  # noqa: BLE001 - an unreachable cluster: reported below
            continue

    def describe(sink: str, c: StreamConfig, st: StreamState) -> dict[str, Any]:
        row: dict[str, Any] = {"stream": c.stream_id, "source": c.source_cluster, "sink": c.sink_cluster, "state": st.value, "mode": "active-active" if c.bidirectional else "one-way"}
        source = sessions.get(c.source_cluster)
        try:
            status = stream_ops.stream_status(sessions[sink], source if source is not None and st is not StreamState.FAILED_OVER else None, c.stream_id)
            row["logs"] = {r["log"]: {"lag_records": r["lag_records"], "lag_seconds": r["lag_seconds"], "last_applied": r["last_applied"], "state": r["state"]} for r in status["logs"]}
        except Exception as exc:  # noqa: BLE001 - status shows what it could not measure
            row["logs"] = f"unknown ({getattr(exc, 'message', None) or exc!r})"
        return row

    out = []
    for name, session in sessions.items():
        if only is not None and name != only:
            continue
        entry: dict[str, Any] = {"location": name}
        try:
            entry["logs"] = _access_modes(session)
            entry["reachable"] = True
        except Exception as exc:  # noqa: BLE001
            entry.update(reachable=False, error=getattr(exc, "message", None) or repr(exc))
        entry["unreadable_streams"] = unreadable[name]  # their records are damaged: not shown in or out
        entry["in"] = [describe(sink, c, st) for sink, c, st in streams if c.sink_cluster == name]
        entry["out"] = [describe(sink, c, st) for sink, c, st in streams if c.source_cluster == name]
        entry["recoverable_from"] = sorted(
            {c.source_cluster for _, c, st in streams if c.sink_cluster == name and st is not StreamState.FAILED_OVER}
            | _pinning_for(sessions, name)
        )
        out.append(entry)
    return out


def _access_modes(session: ClusterSession) -> dict[str, str]:
    """Each log's access mode; a damaged access record is shown as such, not as the location
    being out of reach."""
    access = AccessStore(session.meta)
    out = {}
    for name in session.meta.list_logs():
        try:
            out[name] = access.get(name).value.describe()
        except UNREADABLE as exc:
            out[name] = f"unreadable ({why_unreadable(exc)})"
    return out


def _pinning_for(sessions: dict[str, ClusterSession], sink: str) -> set[str]:
    """The locations that keep records for streams into ``sink`` by their retention pins: they
    still name it when ``sink`` lost its own metadata (a location rebuilt empty), and
    ``dr recover`` rebuilds its streams from them."""
    out = set()
    for name, session in sessions.items():
        if name == sink:
            continue
        try:
            pins = PinStore(session.meta)
            logs = session.meta.list_logs()
            if any(p.value.sink_cluster == sink and not p.value.holder.startswith("bootstrap-") for log in logs for p in pins.pins_of_log(log)):
                out.add(name)
        except Exception:  # noqa: BLE001 - an unreachable cluster: reported on its own row
            continue
    return out


__all__ = ["dr_status"]
