"""Log metadata operations: create, list, show, delete."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from ..errors import ConflictError, CorruptMetadata, NotFoundError, RefusedError, UsageError
from ..log.dlsn import DLSN
from ..log.errors import AgentError
from ..log.ownership import owner_info
from ..log.speculative import ReplicaReader
from ..log.timeindex import iso
from ..meta.records import LogConfig, SegmentRecord, SegmentState
from ..names import validate_name
from ..plan import Plan, Step
from ..log.repair import AUDITED_STATES, Cause
from ..session import ClusterSession

logger = logging.getLogger(__name__)

LAC_TIMEOUT = 5.0  # seconds `log show` waits for a quorum of an in-progress segment's replicas


def create_log_plan(session: ClusterSession, name: str, config: LogConfig) -> Plan:
    validate_name("log", name)
    if name in session.meta.list_logs():
        raise ConflictError(f"log {name!r} already exists in cluster {session.cluster.name!r}")
    return Plan.of(
        "log create",
        [
            Step(
                "create-log",
                f"{session.cluster.name}/{name}",
                f"create log {name} (E={config.ensemble_size}, W={config.write_quorum}, A={config.ack_quorum})",
                params={"config": _config_dict(config)},
                run=lambda: {"log_id": session.meta.create_log(name, config).log_id},
            )
        ],
    )


def _config_dict(config: LogConfig) -> dict[str, Any]:
    return {
        "ensemble_size": config.ensemble_size,
        "write_quorum": config.write_quorum,
        "ack_quorum": config.ack_quorum,
        "roll_bytes": config.roll_bytes,
        "roll_seconds": config.roll_seconds,
        "retention_seconds": config.retention_seconds,
        "retention_bytes": config.retention_bytes,
        "cold_retention_seconds": config.cold_retention_seconds,
    }


def retention_plan(
    session: ClusterSession, name: str, *, seconds: float | None | bool = False, max_bytes: int | None | bool = False, cold_seconds: float | None | bool = False
) -> Plan:
    """Change a log's retention (``False``: leave as is; ``None``: keep for ever), by CAS on the
    log record at the version read now. A writer that races it re-reads the record and goes on
    (only its segment counter matters to it)."""
    from dataclasses import replace

    current = session.meta.get_log(name)
    config = current.value.config
    changes: dict[str, Any] = {}
    if seconds is not False:
        changes["retention_seconds"] = seconds
    if max_bytes is not False:
        changes["retention_bytes"] = max_bytes
    if cold_seconds is not False:
        changes["cold_retention_seconds"] = cold_seconds
    new = replace(config, **changes)
    if new == config:
        return Plan.of("log retention", [], notes=[f"log {name!r} already has this retention"])

    def describe(c: LogConfig) -> str:
        age = f"{c.retention_seconds:g}s" if c.retention_seconds is not None else "for ever"
        size = f"{c.retention_bytes} bytes" if c.retention_bytes is not None else "no size cap"
        cold = f"{c.cold_retention_seconds:g}s" if c.cold_retention_seconds is not None else "the cluster's"
        return f"age {age}, {size}, cold copies kept {cold}"

    return Plan.of(
        "log retention",
        [
            Step(
                "set-retention",
                f"{session.cluster.name}/{name}",
                f"set the retention of log {name} to {describe(new)} (was {describe(config)})",
                params={"retention_seconds": new.retention_seconds, "retention_bytes": new.retention_bytes, "cold_retention_seconds": new.cold_retention_seconds, "version": current.version},
                run=lambda: _config_dict(session.meta.update_log_config(name, new, current.version).value.config),
            )
        ],
        notes=["applied by the elected agent's housekeeping (every [housekeeping] check_seconds) or at once by `dlctl gc`"],
    )


def _iso(epoch: float | None) -> str | None:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds") if epoch else None


def owner_record(session: ClusterSession, name: str) -> dict[str, Any] | None:
    """The owner znode's record (``owner``, and ``address``/``node`` for an agent proxy), or None."""
    current = session.meta.owner_of(name)
    return owner_info(current[0]) if current is not None else None


def owner_of(session: ClusterSession, name: str) -> str | None:
    """Who writes the log, for people: the owner id, with the proxy address of an agent owner."""
    info = owner_record(session, name)
    if info is None:
        return None
    return f"{info['owner']} ({info['address']})" if info.get("address") else info["owner"]


def list_logs(session: ClusterSession) -> list[dict[str, Any]]:
    rows = []
    for name in session.meta.list_logs():
        try:
            log = session.meta.get_log(name).value
            segments = session.meta.segments(name)
        except NotFoundError:
            continue  # deleted while listing
        except CorruptMetadata as exc:  # listed, not hidden, and not a reason to hide the others
            logger.warning("log %r: %s", name, exc.message)
            rows.append({"name": name, "log_id": None, "segments": None, "records": None, "bytes": None, "last_state": "unreadable", "owner": None})
            continue
        rows.append(
            {
                "name": name,
                "log_id": log.log_id,
                "segments": len(segments),
                "records": sum(s.value.records for s in segments),
                "bytes": sum(s.value.bytes for s in segments),
                "last_state": segments[-1].value.state.value if segments else None,
                "owner": owner_of(session, name),
            }
        )
    return rows


def show_log(session: ClusterSession, name: str) -> dict[str, Any]:
    log = session.meta.get_log(name)
    segments = session.meta.segments(name)
    health = _replica_health(session, name)
    lacs = _in_progress_lacs(session, log.value.log_id, [s.value for s in segments if s.value.state is SegmentState.INPROGRESS])
    return {
        "name": name,
        "log_id": log.value.log_id,
        "created": _iso(log.value.created),
        "config": _config_dict(log.value.config),
        "owner": owner_of(session, name),
        "truncated_before": _truncation_point(session, name),
        "segments": [
            {
                "seq": s.value.seq,
                "state": s.value.state.value,
                "min_active_entry": s.value.min_active_entry,
                "ensemble": ",".join(s.value.ensembles[-1].nodes),
                "ensemble_changes": len(s.value.ensembles) - 1,
                "last_entry_id": s.value.last_entry_id,
                # An in-progress segment's end so far: its quorum-read LAC (every entry
                # acknowledged before this command ran is at or before it).
                "lac": lacs.get(s.value.seq, "-"),
                "first_txid": s.value.first_txid,
                "last_txid": s.value.last_txid,
                "records": s.value.records,
                "bytes": s.value.bytes,
                # When its first and last records were appended (recorded at completion).
                "first_time": iso(s.value.first_time),
                "last_time": iso(s.value.last_time),
                "completed": _iso(s.value.completed),
                "replicas": health.get(s.value.seq, "ok" if s.value.state in AUDITED_STATES else "-"),
            }
            for s in segments
        ],
    }


def count_records(session: ClusterSession, name: str, start: DLSN | None = None, stop: DLSN | None = None) -> dict[str, Any]:
    """``log count``: how many data records ``name`` holds from ``start`` (inclusive) to
    ``stop`` (exclusive); None: the first live record / the end (a quorum-read LAC)."""
    from ..replication.positions import records_between

    session.meta.get_log(name)  # NotFoundError naming the log, before any agent is asked
    if start is not None and stop is not None and stop < start:
        raise UsageError(f"--to {stop} is before --from {start}")
    count = session.with_pool(lambda pool: records_between(session.meta, pool, name, start, stop))
    return {"log": name, "from": str(start) if start else None, "to": str(stop) if stop else None, "records": count}


def _in_progress_lacs(session: ClusterSession, log_id: int, segments: list[SegmentRecord]) -> dict[int, int | str]:
    """seq -> quorum-read LAC of each in-progress segment ("unreachable: ..." when too few
    replicas answer: ``log show`` still shows the rest)."""
    if not segments:
        return {}

    async def read(pool: Any) -> dict[int, int | str]:
        await pool.refresh()
        replicas = ReplicaReader(pool)
        out: dict[int, int | str] = {}
        for seg in segments:
            try:
                out[seg.seq] = await replicas.read_lac(log_id, seg, quorum=True, timeout=LAC_TIMEOUT)
            except AgentError as exc:
                out[seg.seq] = f"unreachable: {exc.message}"
        return out

    return session.with_pool(read)


def _replica_health(session: ClusterSession, name: str) -> dict[int, str]:
    """Per completed segment with a member short of what its record names: who and why
    (dlctl.log.repair; `dlctl cluster check` lists the same for every log)."""
    from .health import survey

    found = survey(session, [name])
    out: dict[int, str] = {}
    for (_log, seq), problems in sorted(found.under_replicated().items()):
        out[seq] = "; ".join(
            f"{p.node}: {p.cause.value}" + (f" {p.held_entries}/{p.expected_entries}" if p.cause is Cause.SHORT else "") for p in problems
        )
    return out


def delete_log_plan(session: ClusterSession, name: str) -> Plan:
    log = session.meta.get_log(name)
    owner = owner_of(session, name)
    if owner:
        raise RefusedError(f"log {name!r} is owned by {owner}", hint="stop its writer (or release it) before deleting")
    segments = session.meta.segments(name)
    return Plan.of(
        "log delete",
        [
            Step(
                "delete-log",
                f"{session.cluster.name}/{name}",
                f"delete log {name} and its {len(segments)} segment record(s)",
                params={"version": log.version},
                run=lambda: session.meta.delete_log(name, log.version),
            )
        ],
        notes=[
            (
                f"{sum(s.value.records for s in segments)} record(s) become unreachable; their replica files become orphans "
                "(no metadata): `dlctl gc` lists them and `dlctl gc --force` deletes them"
            )
        ],
    )


def _truncation_point(session: ClusterSession, name: str) -> str | None:
    from ..meta.truncation import TruncationStore

    record = TruncationStore(session.meta).get(name)
    return str(record.value.point) if record is not None else None


def release_log_plan(session: ClusterSession, name: str, *, force: bool = False) -> Plan:
    """Move a log away from its owner: the owning agent flushes, completes the segment and lets
    go (the next append claims it on another agent, or the same one). ``force`` removes the
    owner znode instead — for an owner that is not an agent or does not answer; the owner then
    finds itself deposed and the next owner fences and recovers what it left."""
    session.meta.get_log(name)  # NotFoundError (exit 1) for a missing log
    info = owner_record(session, name)
    if info is None:
        return Plan.of("log release", [], notes=[f"log {name!r} has no owner: nothing to release"])
    who = f"{info['owner']} ({info['address']})" if info.get("address") else info["owner"]
    if not force and not info.get("address"):
        raise RefusedError(
            f"log {name!r} is owned by {who}, a library writer, not an agent",
            hint="close that writer, or remove its ownership with --force (it is then fenced by the next owner)",
        )
    if force:
        step = Step("depose-owner", f"{session.cluster.name}/{name}", f"remove the owner znode of {name} held by {who}", run=lambda: remove_owner_znode(session, name))
    else:
        step = Step("release-log", f"{session.cluster.name}/{name}", f"ask agent {who} to release {name}", run=lambda: ask_owner_to_release(session, name, info["address"]))
    return Plan.of("log release", [step])


def ask_owner_to_release(session: ClusterSession, name: str, address: str) -> dict[str, Any]:
    from ..log.client import AgentClient

    host, _, port = address.rpartition(":")

    async def go() -> bool:
        async with AgentClient(host, int(port), session.secret, tls=session.tls) as client:
            return await client.release(name)

    released = session.run(go())
    if not released:
        raise ConflictError(f"agent {address} no longer owned log {name!r}", hint="run `dlctl log show` to see the current owner")
    return {"released": True, "by": address}


def remove_owner_znode(session: ClusterSession, name: str) -> dict[str, Any]:
    """Take log ``name`` from the session that owns it now by deleting its owner znode. An owner
    that lets go meanwhile (a replication worker stopping as its stream is fenced) is what was
    wanted; another session taking the log meanwhile is a conflict."""
    current = session.meta.owner_of(name)
    if current is None:
        return {"released": False, "reason": "no owner any more"}
    holder = current[1]
    for _ in range(3):  # (the owner rewriting its znode's data moves its version on)
        if session.meta.release_owner(name, holder):
            return {"released": True, "forced": True}
        now = session.meta.owner_of(name)
        if now is None:
            return {"released": False, "reason": "its owner let go meanwhile"}
        if now[1] != holder:
            break
    raise ConflictError(f"the owner of log {name!r} changed meanwhile", hint="run the command again")
