"""``dlctl log …``: create, list, show and delete logs."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
from typing import BinaryIO

import click

from ..log.dlsn import DLSN
from ..meta.records import LogConfig
from ..ops import backup, logio, logs, restore
from ..output import FlushWhenIdle, render_item
from .closed_output import watch_stdout_reader
from ..plan import Plan
from .complete import complete_log
from .context import AppContext, command_options, mutating, pass_app
from .truncate import DURATION, SIZE, TIME


@click.group("log")
def log_group() -> None:
    """Create, inspect and delete logs."""


@log_group.command("create")
@click.argument("name")
@click.option("-e", "--ensemble-size", type=click.IntRange(1), default=3, show_default=True, help="E: agents a segment is striped over.")
@click.option("-w", "--write-quorum", type=click.IntRange(1), default=3, show_default=True, help="W: agents each entry is written to.")
@click.option("-a", "--ack-quorum", type=click.IntRange(1), default=2, show_default=True, help="A: acknowledgements before an entry counts.")
@click.option("--roll-bytes", type=click.IntRange(1), default=256 * 1024 * 1024, show_default=True, help="Roll to a new segment after this many bytes.")
@click.option("--roll-seconds", type=click.FloatRange(min=0.001), default=3600.0, show_default=True, help="Roll to a new segment after this long.")
@click.option("--retention", "retention_seconds", type=DURATION, metavar="DURATION", help="Truncate completed segments this long after their completion (e.g. 7d; default: keep for ever).")
@click.option("--retention-bytes", type=SIZE, metavar="SIZE", help="Truncate the oldest completed segments while the log holds more than SIZE (e.g. 10GiB).")
@mutating(confirm=False)
def log_create(app: AppContext, name: str, ensemble_size: int, write_quorum: int, ack_quorum: int, roll_bytes: int, roll_seconds: float, retention_seconds: float | None, retention_bytes: int | None) -> Plan:
    """Create log NAME with its quorums (E >= W >= A), rolling and retention policy."""
    try:
        config = LogConfig(ensemble_size, write_quorum, ack_quorum, roll_bytes, roll_seconds, retention_seconds, retention_bytes)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return logs.create_log_plan(app.session(), name, config)


def _keep_or(convert):
    def parse(value: str | None):
        if value is None:
            return False  # not given: unchanged
        return None if value.strip().lower() in ("none", "forever", "off") else convert(value)

    return parse


@log_group.command("retention")
@click.argument("name", shell_complete=complete_log)
@click.option("--age", metavar="DURATION|none", help="Truncate completed segments this long after their completion (none: keep for ever).")
@click.option("--max-bytes", metavar="SIZE|none", help="Size cap: truncate the oldest completed segments beyond it (none: no cap).")
@click.option("--cold-age", metavar="DURATION|none", help="Keep this log's copies in the cold store this long after they were stored (none: the cluster's cold retention).")
@mutating(confirm=False)
def log_retention(app: AppContext, name: str, age: str | None, max_bytes: str | None, cold_age: str | None) -> Plan:
    """Set NAME's retention (by CAS on its record). The elected agent's housekeeping applies it;
    `dlctl gc` applies it at once. Retention never passes a live replication pin and never
    touches the in-progress segment. --cold-age: how long its cold copies stay (see
    `cluster cold-storage enable`)."""
    try:
        seconds = _keep_or(lambda v: DURATION.convert(v, None, None))(age)
        size = _keep_or(lambda v: SIZE.convert(v, None, None))(max_bytes)
        cold = _keep_or(lambda v: DURATION.convert(v, None, None))(cold_age)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message) from None
    if seconds is False and size is False and cold is False:
        raise click.UsageError("give --age, --max-bytes and/or --cold-age")
    return logs.retention_plan(app.session(), name, seconds=seconds, max_bytes=size, cold_seconds=cold)


@log_group.command("list")
@command_options
@pass_app
def log_list(app: AppContext) -> None:
    """List logs with their size and owner."""
    app.render(logs.list_logs(app.session()))


@log_group.command("show")
@click.argument("name", shell_complete=complete_log)
@command_options
@pass_app
def log_show(app: AppContext, name: str) -> None:
    """Show a log's configuration, owner and segments, with each completed segment's replica
    health ("ok", or the members short of what its record names and why) and the append times
    of its first and last records."""
    app.render(logs.show_log(app.session(), name))


@log_group.command("count")
@click.argument("name", shell_complete=complete_log)
@click.option("--from", "from_dlsn", metavar="SEG/ENTRY/SLOT", help="Count from this position (inclusive; default: the first live record).")
@click.option("--to", "to_dlsn", metavar="SEG/ENTRY/SLOT", help="Count up to this position (exclusive; default: the end, to a quorum-read LAC).")
@command_options
@pass_app
def log_count(app: AppContext, name: str, from_dlsn: str | None, to_dlsn: str | None) -> None:
    """Print how many records NAME holds between two positions (sequence ids: from the
    segments' totals and each entry's running totals; no record is read)."""
    try:
        start = DLSN.parse(from_dlsn) if from_dlsn else None
        stop = DLSN.parse(to_dlsn) if to_dlsn else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--from/--to") from None
    app.render(logs.count_records(app.session(), name, start, stop))


@log_group.command("delete")
@click.argument("name", shell_complete=complete_log)
@mutating(confirm=True)
def log_delete(app: AppContext, name: str) -> Plan:
    """Delete log NAME (refused while a writer owns it)."""
    return logs.delete_log_plan(app.session(), name)


def _start(from_dlsn: str | None, from_txid: int | None, since: float | None) -> dict:
    if sum(x is not None for x in (from_dlsn, from_txid, since)) > 1:
        raise click.UsageError("give one of --from-dlsn, --from-txid and --since")
    try:
        return {"start_dlsn": DLSN.parse(from_dlsn) if from_dlsn else None, "start_txid": from_txid, "start_time": since}
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--from-dlsn") from None


def _stream(app: AppContext, name: str, start: dict, limit: int | None, idle: float | None, region: str | None) -> int:
    session = app.session()  # here: the click context is this thread's, not the command loop's

    async def go() -> int:
        count = 0
        out = FlushWhenIdle(app.stdout.file)
        loop = asyncio.get_running_loop()
        stop_watching = watch_stdout_reader(lambda exc: loop.call_soon_threadsafe(out.fail, exc))
        try:
            async for record in logio.read_records(session, name, limit=limit, idle_timeout=idle, region=region, **start):
                render_item(logio.record_view(record), app.output, stream=out.stream, columns=("dlsn", "txid", "time", "payload"))
                out.wrote()
                count += 1
        except BaseException:
            out.raise_failure()  # the output failed, and so stopped the read: that is what to report
            with contextlib.suppress(OSError):
                out.close()  # what was read before Ctrl-C or a failure; the failure is what to report
            raise
        finally:
            stop_watching()
        out.close()
        return count

    return session.run(go())


_position = [
    click.option("--from-dlsn", metavar="SEG/ENTRY/SLOT", help="Start at this DLSN (default: the beginning)."),
    click.option("--from-txid", type=int, metavar="TXID", help="Start at the first record with txid >= TXID."),
    click.option("--since", type=TIME, metavar="TIME", help="Start at the first record appended at or after TIME: ISO 8601 (2026-11-26T10:00Z; no zone: UTC) or a duration ago (15m, 2h)."),
    click.option("--region", metavar="REGION", help="Where this reader runs: closer replicas are asked first."),
]


def _with_position(func):
    for option in reversed(_position):
        func = option(func)
    return func


@log_group.command("read")
@click.argument("name", shell_complete=complete_log)
@_with_position
@click.option("-n", "--limit", type=click.IntRange(1), help="Stop after this many records.")
@click.option("--idle-timeout", type=click.FloatRange(min=0.01), default=1.0, show_default=True, help="Stop once no record arrived for this long (caught up).")
@click.option("--from-cold", is_flag=True, help="Begin with the history before the truncation point, from the cluster's cold store (`log backup` copies), then go on in the log.")
@command_options
@pass_app
def log_read(
    app: AppContext, name: str, from_dlsn: str | None, from_txid: int | None, since: float | None, region: str | None, limit: int | None, idle_timeout: float, from_cold: bool
) -> None:
    """Print records of NAME (one per line: DLSN, txid, append time, payload; -o json: JSON lines).

    Only confirmed records are printed (never past LAC); control records are skipped. A
    record's time is when its owner appended it (UTC, never decreasing along the log).

    --from-cold reads what truncation removed from the cold store first (at the records'
    original positions), then the log from its truncation point: no record twice, none
    missing. If the copies do not reach the truncation point, nothing is printed and the
    command fails naming the missing segments.
    """
    start = _start(from_dlsn, from_txid, since)
    if from_cold:
        if any(v is not None for v in start.values()):
            raise click.UsageError("--from-cold starts at the oldest copy: it takes no --from-dlsn, --from-txid or --since")
        start = {"from_cold": True}
    count = _stream(app, name, start, limit, idle_timeout, region)
    logging.getLogger("dlctl.log").info("read %d record(s) from %s", count, name)


@log_group.command("tail")
@click.argument("name", shell_complete=complete_log)
@_with_position
@click.option("-n", "--limit", type=click.IntRange(1), help="Stop after this many records.")
@command_options
@pass_app
def log_tail(app: AppContext, name: str, from_dlsn: str | None, from_txid: int | None, since: float | None, region: str | None, limit: int | None) -> None:
    """Follow NAME: print records as they are confirmed, until interrupted (Ctrl-C) or --limit."""
    _stream(app, name, _start(from_dlsn, from_txid, since), limit, None, region)


@log_group.command("append")
@click.argument("name", shell_complete=complete_log)
@click.option("--length-delimited", is_flag=True, help="Records on stdin are u32 big-endian length + bytes (default: one per line).")
@click.option("--direct", is_flag=True, help="Write with the library writer (this process owns the log while it runs) instead of through the owning agent.")
@click.option("--region", metavar="REGION", help="Where this producer runs: agents of this region are preferred as proxies.")
@click.option("--no-idempotence", is_flag=True, help="At-least-once: a request whose acknowledgement is lost may be stored twice (for comparison).")
@mutating(confirm=False)
def log_append(app: AppContext, name: str, length_delimited: bool, direct: bool, region: str | None, no_idempotence: bool) -> Plan:
    """Append records read from standard input to NAME (for shell scripts).

    Each record is appended as it arrives: the input may stay open (`tail -f app.log | dlctl
    log append NAME`). Ctrl-C says how many records were acknowledged so far.

    Records go through the agent that owns the log (write proxy), which batches them with other
    producers' records; with --direct this process becomes the log's owner for the duration
    (fencing any other writer). Either way the command returns once every record is
    acknowledged by the ack quorum, and prints the first and last DLSN.

    Through the proxy, delivery is exactly once: requests carry this producer's id, epoch and
    sequence number, and the owner answers a resend (after a lost acknowledgement or an owner
    failover) with the positions its records got the first time. A resend the owner can no
    longer recognise (past [proxy] producer_id_ttl, or older than the tail a new owner read)
    fails, saying the records may or may not be in the log; it is never stored twice.

    --no-idempotence: at least once instead; a request whose acknowledgement was lost is resent
    blindly and may be stored twice (for comparison).

    A failure after some records were acknowledged exits 3 and says how many are in the log
    (appending the same input again would store them twice). A record too large for one
    request stops the input there: the records before it are appended, the message names its
    number (continue with `tail -n +N`); as the first record, it is a usage error (exit 2).
    """
    if no_idempotence and direct:
        raise click.UsageError("--no-idempotence applies to appends through the owning agent, not to --direct")
    session = app.session()
    framing = "u32-length-prefixed" if length_delimited else "newline-separated"
    via = "the library writer (taking ownership)" if direct else "the owning agent (write proxy)" + (", at least once" if no_idempotence else ", exactly once")

    def run() -> dict:
        stdin = _stdin_of_its_own()
        with app.progress() as bar:
            task = bar.add_task(f"append to {name}", total=None)
            return session.run(
                logio.append_records(
                    session, name, logio.iter_stdin_records(stdin, length_delimited),
                    direct=direct, region=region, idempotent=not no_idempotence, on_progress=lambda n: bar.update(task, completed=n),
                )
            )

    return logio.append_plan(session, name, framing=framing, via=via, run=run)


def _stdin_of_its_own() -> BinaryIO:
    """Standard input for the thread that reads the records (``ops.threaded_input``): a reader
    of its own on a copy of the descriptor. A daemon thread still blocked in ``sys.stdin``'s
    reader when the process exits (after a Ctrl-C) makes the interpreter abort at shutdown."""
    stream = click.get_binary_stream("stdin")
    try:
        return os.fdopen(os.dup(stream.fileno()), "rb")
    except (OSError, io.UnsupportedOperation, ValueError):  # not a descriptor (a test's input)
        return stream


@log_group.command("release")
@click.argument("name", shell_complete=complete_log)
@click.option("--force", is_flag=True, help="Remove the ownership even if the owner is not an agent or does not answer (it is fenced by the next owner).")
@mutating(confirm=False)
def log_release(app: AppContext, name: str, force: bool) -> Plan:
    """Make the agent that owns NAME let it go (to move the log to another agent).

    The owner flushes, completes the in-progress segment and drops its ownership; the next
    append claims the log again, on the agent its producers route to.
    """
    return logs.release_log_plan(app.session(), name, force=force)


@log_group.command("backup")
@click.argument("name", shell_complete=complete_log)
@click.option("--verify", is_flag=True, help="Also re-read the copies already held and check them entry by entry against their manifests.")
@mutating(confirm=False)
def log_backup(app: AppContext, name: str, verify: bool) -> Plan:
    """Copy NAME's completed segments to the cluster's cold store (incremental).

    The cold store is [clusters.<c>.cold_storage] in the inventory: a filesystem path or an
    S3-compatible bucket. Each segment becomes one object, read back and checked by SHA-256
    before its manifest is written; segments whose manifest is there already are skipped, so
    the command can be scheduled. An interrupted run is completed by the next one. The log is
    not changed.
    """
    return backup.backup_plan(app.session(), name, verify=verify)


@log_group.command("restore")
@click.argument("name", shell_complete=complete_log)
@click.option("--to-log", "to_log", required=True, metavar="NEW", help="The log to rebuild into: created, or an existing one that holds no records.")
@click.option("--log-id", type=click.IntRange(min=1), help="Which incarnation of NAME to restore (a log deleted and created again has a new id); default: the latest in the store.")
@click.option("--from-txid", type=int, metavar="TXID", help="Only records with a txid >= TXID.")
@click.option("--to-txid", type=int, metavar="TXID", help="Only records with a txid <= TXID.")
@mutating(confirm=False)
def log_restore(app: AppContext, name: str, to_log: str, log_id: int | None, from_txid: int | None, to_txid: int | None) -> Plan:
    """Rebuild NAME from its copies in the cluster's cold store, into log NEW.

    Every record keeps its txid, key and headers (replicated records keep their origin events),
    in the original order; it gets NEW's positions and the restore's append time. All copies
    are checked first (SHA-256 against their manifests, then entry by entry): a damaged or
    missing copy refuses the restore and nothing is written. NAME need not exist any more.
    --from-txid/--to-txid restore a range (only the copies holding it are read).
    """
    return restore.restore_plan(app.session(), name, to_log=to_log, log_id=log_id, from_txid=from_txid, to_txid=to_txid)
