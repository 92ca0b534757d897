# Over ~600 lines (about 630): the four steps of segment recovery (fence, read back, re-replicate,
# close) act on one segment's state in turn; unclean recovery is the same steps with fewer replicas.
"""Fencing and recovery of an in-progress segment (BookKeeper's ledger recovery, DESIGN.md §5).

A new owner (or ``dlctl recover``) makes an in-progress segment final in four steps:

1. **Fence** the segment's (last) ensemble until every write set has W − A + 1 fenced
   replicas. A fenced replica refuses normal adds, so at most A − 1 replicas of any write set
   still accept the old writer's adds: it can never reach ack quorum again. The fence
   responses carry each replica's LAC; their maximum is where reading starts (every entry up
   to it was acknowledged, and entries before the last ensemble change are too).
2. **Read forward** from LAC + 1 with fencing reads to every replica of the entry's write set.
   An entry is recovered as soon as one replica has it; recovery ends at the first entry that
   W − A + 1 replicas say they do not have (an acknowledged entry is on at least A of W
   replicas, so at most W − A can lack it). An unreachable or limbo replica is *unknown*,
   never absent: with too many unknowns recovery waits (retrying) and then fails, it never
   guesses.
3. **Re-write** each recovered entry, byte for byte, to its whole write set with recovery adds
   (accepted by fenced replicas), and wait for A of them, so what the segment now claims is
   on an ack quorum.
4. **Close** the segment with a compare-and-set on its metadata: last entry id, last txid,
   record and byte counts (from the totals record the writer puts at the end of every entry),
   completion time. Two recoveries racing each other may disagree about an entry that was
   never acknowledged; the CAS picks one and the loser adopts what the winner wrote.

The decision rules are plain functions at the top of this module, tested exhaustively.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from ..errors import ConflictError, DlctlError
from ..meta.records import NO_ENTRY, NO_TXID, SegmentRecord, SegmentState, Versioned
from ..meta.store import MetaStore
from .errors import AgentError, AgentUnavailableError, LimboError, NoSuchEntryError, NoSuchSegmentError
from .format import HEADER_SIZE, decode
from .quorum import can_still_ack, fence_covered, fence_possible, fence_quorum
from .records import TOTALS, TOTALS_UNTIMED, CorruptRecords, Record, decode_records, encode_records
from .pool import ReplicaPool

log = logging.getLogger(__name__)

class Verdict(Enum):
    FOUND = "found"  # some replica has it: recover it
    ABSENT = "absent"  # W − A + 1 replicas lack it: it was never acknowledged; recovery ends before it
    PENDING = "pending"  # replies outstanding may still decide
    UNKNOWN = "unknown"  # every reachable replica answered and neither holds: cannot decide now


def entry_verdict(write_quorum: int, ack_quorum: int, *, found: bool, absent: int, pending: int) -> Verdict:
    """The fate of one entry given its write set's answers so far. Failed replicas are neither
    ``absent`` nor ``pending``: unknown replicas never count towards absence."""
    if found:
        return Verdict.FOUND
    if absent >= fence_quorum(write_quorum, ack_quorum):
        return Verdict.ABSENT
    return Verdict.PENDING if pending > 0 else Verdict.UNKNOWN


def recovery_end(start: int, verdicts: Sequence[Verdict]) -> int | None:
    """Last entry id of the segment given verdicts for entries ``start, start+1, ...``, or None
    while undecided. Recovery ends just before the first ABSENT entry; a PENDING or UNKNOWN entry
    before it leaves the end undecided (entries after an unknown one cannot be judged yet)."""
    for offset, verdict in enumerate(verdicts):
        if verdict is Verdict.ABSENT:
            return start + offset - 1
        if verdict is not Verdict.FOUND:
            return None
    return None


# -- per-entry totals (written by the writer, read here) --------------------------------------
#
# The writer ends every entry with a control record whose payload is (data records, bytes) of
# the segment up to and including this entry, then the entry's append time; ``bytes`` counts
# whole encoded entries (header and payload). Closing a recovered segment then needs its last
# entry only, not a scan. The append time (milliseconds since the epoch, the owner's clock,
# never lower than the log's previous entry: ``LogWriter``) is every record's of the entry, and
# orders the log in time (``dlctl.log.timeindex``); 0 means unknown. Entries written before the
# time was added end with the 16-byte form, still read (their time unknown).



def totals_record(txid: int, records: int, nbytes: int, append_ms: int = 0) -> Record:
    return Record(txid=txid, payload=TOTALS.pack(records, nbytes, append_ms), control=True)


TOTALS_RECORD_SIZE = len(encode_records([totals_record(0, 0, 0)]))


def read_totals(record: Record) -> tuple[int, int, int | None] | None:
    """(records, bytes, append time in ms or None when unknown) of a totals record; None when
    ``record`` is not one."""
    if not record.control:
        return None
    if len(record.payload) == TOTALS.size:
        records, nbytes, append_ms = TOTALS.unpack(record.payload)
        return records, nbytes, append_ms or None
    if len(record.payload) == TOTALS_UNTIMED.size:
        records, nbytes = TOTALS_UNTIMED.unpack(record.payload)
        return records, nbytes, None
    return None


def append_time(records: Sequence[Record]) -> int | None:
    """The append time (ms) of the entry whose decoded records are ``records`` (None: unknown)."""
    totals = read_totals(records[-1]) if records else None
    return totals[2] if totals is not None else None


@dataclass(frozen=True)
class EntrySummary:
    """What the last entry of a segment says about the whole segment."""

    records: int
    bytes: int
    last_txid: int  # txid of the entry's last record (the totals record carries the last data txid)
    append_ms: int | None = None  # the entry's append time (None: unknown)


def entry_summary(encoded: bytes) -> EntrySummary | None:
    """The totals stored at the end of an encoded entry, or None when it has none (then the
    segment must be scanned)."""
    last: Record | None = None
    try:
        for last in decode_records(decode(encoded).payload):
            pass
    except (CorruptRecords, ValueError):
        return None
    totals = read_totals(last) if last is not None else None
    if last is None or totals is None:
        return None
    return EntrySummary(totals[0], totals[1], last.txid, totals[2])


# -- results and errors -----------------------------------------------------------------------


class RecoveryError(DlctlError):
    """Recovery could not decide the end of a segment or could not make it durable."""


@dataclass(frozen=True)
class RecoveryResult:
    """What recovery of one segment found and decided."""

    segment_seq: int
    lac: int  # the highest LAC the fenced replicas reported: everything up to it was acknowledged
    last_entry_id: int  # the end decided (by this recovery or by a concurrent one that won the CAS)
    recovered_entries: int  # entries past the LAC that this recovery found and re-wrote
    records: int
    bytes: int
    first_txid: int
    last_txid: int
    fenced: tuple[str, ...]  # replicas that answered the fence
    unreachable: tuple[str, ...]  # replicas that did not (down, slow, limbo)
    closed_by_us: bool  # False: another recovery (or the writer) closed it first; we adopted its end
    seconds: float
    segment: Versioned[SegmentRecord]
    at_risk: AtRisk | None = None  # unclean recovery only: what may have been acknowledged and is gone

    def to_dict(self) -> dict[str, Any]:
        return {
            "segment": self.segment_seq,
            "lac": self.lac,
            "last_entry_id": self.last_entry_id,
            "recovered_entries": self.recovered_entries,
            "records": self.records,
            "bytes": self.bytes,
            "first_txid": self.first_txid,
            "last_txid": self.last_txid,
            "fenced": list(self.fenced),
            "unreachable": list(self.unreachable),
            "closed_by_us": self.closed_by_us,
            "seconds": round(self.seconds, 3),
        } | ({"at_risk": self.at_risk.to_dict()} if self.at_risk is not None else {})


@dataclass(frozen=True)
class AtRisk:
    """What an unclean recovery (``accept_data_loss``) could not rule out: entries from
    ``first_entry`` on may have been acknowledged by the replicas that could not answer, and are
    not in the closed segment. Everything up to ``lac`` was acknowledged and is kept."""

    first_entry: int
    lac: int
    highest_entry_seen: int  # the highest entry id any answering replica reported holding
    unknown: dict[str, str]  # replica -> why it could not answer
    shortfalls: dict[int, int]  # recovered entry -> replicas it could be re-written to, when fewer than A

    def to_dict(self) -> dict[str, Any]:
        return {
            "first_entry": self.first_entry,
            "lac": self.lac,
            "highest_entry_seen": self.highest_entry_seen,
            "unknown_replicas": dict(sorted(self.unknown.items())),
            "under_ack_quorum": {str(k): v for k, v in sorted(self.shortfalls.items())},
            "meaning": f"entries {self.first_entry} and later may have been acknowledged by "
            f"{', '.join(sorted(self.unknown)) or 'the missing replicas'} and are lost; entries up to {self.first_entry - 1} are kept",
        }


@dataclass(frozen=True)
class FenceOutcome:
    lac: int
    fenced: tuple[str, ...]
    unreachable: dict[str, str]  # node -> why (so far)
    highest_entry_seen: int = NO_ENTRY  # the highest last entry the fenced replicas reported

    def to_dict(self) -> dict[str, Any]:
        return {"lac": self.lac, "fenced": list(self.fenced), "unreachable": dict(self.unreachable)}


# -- the procedure ----------------------------------------------------------------------------

_BACKOFF_FIRST, _BACKOFF_MAX = 0.1, 1.0
_background: set[asyncio.Task] = set()  # requests left running after a decision (slow replicas)


def _keep(task: asyncio.Task) -> None:
    _background.add(task)
    task.add_done_callback(_finish_background)


def _finish_background(task: asyncio.Task) -> None:
    _background.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: a slow replica failing later is expected, not an error


class _Final(Exception):
    """A replica's answer that retrying cannot change (limbo, I/O failure)."""


class SegmentRecovery:
    """Fence, recover and close one in-progress segment of log ``name`` (see the module doc)."""

    def __init__(
        self,
        meta: MetaStore,
        pool: ReplicaPool,
        name: str,
        log_id: int,
        segment: Versioned[SegmentRecord],
        *,
        timeout: float = 30.0,
        read_ahead: int = 16,
        accept_data_loss: bool = False,
    ) -> None:
        self.meta, self.pool, self.name, self.log_id = meta, pool, name, log_id
        self.segment = segment
        self.timeout = timeout
        self.read_ahead = max(1, read_ahead)
        # Unclean recovery (BookKeeper's recover -sku, Kafka's unclean election), only when the
        # operator asks: replicas that cannot answer are taken as gone for good, the segment is
        # closed at the last entry that can still be read, and what may be lost is reported.
        self.accept_data_loss = accept_data_loss
        self._deadline = 0.0
        self._last_encoded: tuple[int, bytes] | None = None  # the last entry recovery read, if any
        self._silent: set[str] = set()  # replicas that did not answer the fence: read from last
        self._undecided: dict[int, dict[str, str]] = {}  # unclean: entries no quorum could judge -> unknown replicas
        self._shortfalls: dict[int, int] = {}  # unclean: entries re-written to fewer than A replicas

    @property
    def _seg(self) -> SegmentRecord:
        return self.segment.value

    def _where(self) -> str:
        return f"segment {self._seg.seq} of log {self.name!r}"

    async def run(self) -> RecoveryResult:
        started = time.monotonic()
        for _attempt in range(5):
            if self._seg.state is not SegmentState.INPROGRESS:
                return self._adopted(self.segment, NO_ENTRY, (), {}, started)
            self._deadline = time.monotonic() + self.timeout
            self._last_encoded = None
            self._undecided, self._shortfalls = {}, {}
            fence = await self.fence()
            last, recovered = await self._read_forward(fence.lac)
            closed = await self._close(last, fence)
            if closed is not None:
                return RecoveryResult(
                    self._seg.seq, fence.lac, last, recovered, closed.value.records, closed.value.bytes,
                    closed.value.first_txid, closed.value.last_txid, fence.fenced, tuple(sorted(fence.unreachable)),
                    True, time.monotonic() - started, closed, self._at_risk(fence, last),
                )
            # Lost the CAS: whoever won decided; an in-progress segment whose metadata changed
            # (an ensemble change) is recovered again from its new version.
            self.segment = await self._zk(self.meta.get_segment, self.name, self._seg.seq)
            if self._seg.state is not SegmentState.INPROGRESS:
                return self._adopted(self.segment, fence.lac, fence.fenced, fence.unreachable, started)
        raise RecoveryError(f"{self._where()} kept changing while it was being recovered", hint="retry")

    def _at_risk(self, fence: FenceOutcome, last: int) -> AtRisk | None:
        """Unclean recovery only: what it could not rule out, when it had to stop undecided (or
        could not fence every write set, or re-wrote entries to fewer than A replicas)."""
        if not self.accept_data_loss:
            return None
        covered = fence_covered(self._seg.ensembles[-1].nodes, self._seg.write_quorum, self._seg.ack_quorum, fence.fenced)
        stopped_undecided = self._undecided.get(last + 1)  # reading ended at an entry no quorum could judge
        if stopped_undecided is None and covered and not self._shortfalls:
            return None
        unknown = dict(fence.unreachable) | (stopped_undecided or {})
        return AtRisk(last + 1, fence.lac, max(fence.highest_entry_seen, last), unknown, dict(self._shortfalls))

    def _adopted(self, seg: Versioned[SegmentRecord], lac: int, fenced: tuple[str, ...], unreachable: dict, started: float) -> RecoveryResult:
        v = seg.value
        return RecoveryResult(
            v.seq, lac, v.last_entry_id, 0, v.records, v.bytes, v.first_txid, v.last_txid, tuple(fenced),
            tuple(sorted(unreachable)), False, time.monotonic() - started, seg,
        )

    # -- step 1: fence --------------------------------------------------------------------------

    async def fence(self) -> FenceOutcome:
        """Fence until every write set of the last ensemble has W − A + 1 fenced replicas."""
        seg = self._seg
        if not self._deadline:
            self._deadline = time.monotonic() + self.timeout
        ensemble = seg.ensembles[-1].nodes
        w, a = seg.write_quorum, seg.ack_quorum
        tasks = {asyncio.ensure_future(self._with_retries(node, self._fence_one, node)): node for node in ensemble}
        fenced: dict[str, int] = {}
        highest = NO_ENTRY
        failed: dict[str, str] = {}
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    node = tasks[task]
                    try:
                        answer = task.result()
                        fenced[node] = answer.lac
                        highest = max(highest, answer.last_entry_id)
                    except (_Final, AgentError) as exc:
                        failed[node] = str(exc)
                if fence_covered(ensemble, w, a, fenced):
                    break
                if self.accept_data_loss:
                    if not pending and not fenced:
                        raise RecoveryError(
                            f"cannot recover {self._where()} even accepting data loss: no replica answered: "
                            + "; ".join(f"{n}: {why}" for n, why in sorted(failed.items())),
                            hint="bring at least one of its agents back",
                        )
                    continue  # wait for every replica to answer or fail, then go on with what answered
                if not fence_possible(ensemble, w, a, failed):
                    raise RecoveryError(
                        f"cannot fence {self._where()}: every write set needs {fence_quorum(w, a)} fenced replicas "
                        f"of {w} (E={len(ensemble)}, A={a}); fenced: {', '.join(sorted(fenced)) or 'none'}; "
                        "unreachable: " + "; ".join(f"{n}: {why}" for n, why in sorted(failed.items())),
                        hint="bring the unreachable agents back (or re-replicate them), then retry",
                        details={"fenced": sorted(fenced), "unreachable": failed},
                    )
        finally:
            for task in pending:
                _keep(task)  # slow replicas get fenced too, whenever they answer
        unreachable = {tasks[t]: "no answer yet" for t in pending} | failed
        lac = max([NO_ENTRY, *fenced.values()])
        # Entries before the last ensemble change were all acknowledged when it was made.
        lac = max(lac, seg.ensembles[-1].first_entry_id - 1)
        return FenceOutcome(lac, tuple(sorted(fenced)), unreachable, highest)

    async def _fence_one(self, node: str):
        client = await self.pool.client(node)
        return await client.fence(self.log_id, self._seg.seq)

    async def _with_retries(self, node: str, fn: Any, *args: Any) -> Any:
        """Call ``fn`` until it answers; an unreachable agent is retried with backoff until the
        deadline, a limbo or failed one is final."""
        delay = _BACKOFF_FIRST
        while True:
            try:
                return await fn(*args)
            except (LimboError, NoSuchEntryError, NoSuchSegmentError):
                raise
            except AgentUnavailableError as exc:
                if time.monotonic() + delay > self._deadline:
                    raise _Final(f"agent {node} unreachable: {exc}") from None
            except AgentError as exc:
                raise _Final(f"agent {node}: {exc}") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    # -- steps 2 and 3: read forward, re-write -----------------------------------------------

    async def _read_forward(self, lac: int) -> tuple[int, int]:
        """Recover entries from ``lac`` + 1 on; returns (last entry id, entries recovered)."""
        start = lac + 1
        probes: dict[int, asyncio.Task] = {}
        rewrites: list[asyncio.Task] = []
        entry_id, launched = start, start
        try:
            while True:
                while launched < entry_id + self.read_ahead:
                    probes[launched] = asyncio.ensure_future(self._probe(launched))
                    launched += 1
                encoded = await probes.pop(entry_id)
                if encoded is None:
                    break
                rewrites.append(asyncio.ensure_future(self._rewrite(entry_id, encoded)))
                self._last_encoded = (entry_id, encoded)
                entry_id += 1
            await asyncio.gather(*rewrites)
        finally:
            for task in (*probes.values(), *rewrites):
                task.cancel()
            await asyncio.gather(*probes.values(), *rewrites, return_exceptions=True)
        return entry_id - 1, entry_id - start

    async def _probe(self, entry_id: int) -> bytes | None:
        """The entry's bytes if any replica has it, None when W − A + 1 replicas lack it."""
        seg = self._seg
        w, a = seg.write_quorum, seg.ack_quorum
        ws = seg.write_set(entry_id)
        tasks = {asyncio.ensure_future(self._with_retries(n, self._read_one, n, entry_id)): n for n in ws}
        pending = set(tasks)
        absent, unknown = 0, {}
        try:
            while True:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                found: bytes | None = None
                for task in done:
                    try:
                        found = task.result()
                    except (NoSuchEntryError, NoSuchSegmentError):
                        absent += 1
                    except (_Final, AgentError) as exc:
                        unknown[tasks[task]] = str(exc)
                verdict = entry_verdict(w, a, found=found is not None, absent=absent, pending=len(pending))
                if verdict is Verdict.FOUND:
                    return found
                if verdict is Verdict.ABSENT:
                    return None
                if verdict is Verdict.UNKNOWN:
                    if self.accept_data_loss:
                        # Every replica that can answer lacks it, but too few can answer to prove it
                        # was never acknowledged: the operator accepted that it may be lost.
                        self._undecided[entry_id] = unknown
                        return None
                    raise RecoveryError(
                        f"cannot recover {self._where()}: entry {entry_id} is missing on {absent} replicas but "
                        f"{fence_quorum(w, a)} must say so to end the segment there, and the others are unknown: "
                        + "; ".join(f"{n}: {why}" for n, why in sorted(unknown.items())),
                        hint="bring those agents back (or re-replicate them), then retry recovery",
                        details={"entry_id": entry_id, "absent": absent, "unknown": unknown},
                    )
        finally:
            for task in pending:
                task.cancel()

    async def _read_one(self, node: str, entry_id: int) -> bytes:
        client = await self.pool.client(node)
        return await client.read(self.log_id, self._seg.seq, entry_id, fence=True)

    async def _rewrite(self, entry_id: int, encoded: bytes) -> None:
        """Recovery-add ``encoded`` to the entry's whole write set; return once A replicas have it."""
        seg = self._seg
        ws = seg.write_set(entry_id)
        tasks = {asyncio.ensure_future(self._with_retries(n, self._add_one, n, encoded)): n for n in ws}
        pending = set(tasks)
        acks, errors = 0, {}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    try:
                        task.result()
                        acks += 1
                    except (_Final, AgentError) as exc:
                        errors[tasks[task]] = str(exc)
                if acks >= seg.ack_quorum:
                    return
                if self.accept_data_loss and not pending and acks:
                    self._shortfalls[entry_id] = acks  # as many copies as can be made now
                    return
                if not pending or not can_still_ack(acks, len(pending), seg.ack_quorum) and not self.accept_data_loss:
                    raise RecoveryError(
                        f"cannot recover {self._where()}: entry {entry_id} was re-written to {acks} replicas, "
                        f"{seg.ack_quorum} needed: " + "; ".join(f"{n}: {why}" for n, why in sorted(errors.items())),
                        hint="bring those agents back, then retry recovery",
                    )
        finally:
            for task in pending:
                _keep(task)  # the rest of the write set gets it whenever it answers

    async def _add_one(self, node: str, encoded: bytes) -> None:
        client = await self.pool.client(node)
        await client.add(encoded, recovery=True)

    # -- step 4: close ------------------------------------------------------------------------

    async def _read_any(self, entry_id: int) -> bytes:
        """A (non-fencing) read of an entry from any replica of its write set: each is tried in
        turn — those that did not answer the fence last (a paused agent would hold the read for
        a whole request timeout) —, rounds repeat with backoff until the deadline (a dead first
        replica costs one try)."""
        delay = _BACKOFF_FIRST
        silent = self._silent
        while True:
            problems = []
            for node in sorted(self._seg.write_set(entry_id), key=lambda n: n in silent):
                try:
                    client = await self.pool.client(node)
                    return await client.read(self.log_id, self._seg.seq, entry_id)
                except AgentError as exc:
                    problems.append(f"{node}: {exc}")
            if time.monotonic() + delay > self._deadline:
                raise RecoveryError(
                    f"cannot read entry {entry_id} of {self._where()} from any replica: " + "; ".join(problems),
                    hint="bring its agents back, then retry",
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _BACKOFF_MAX)

    async def _summarize(self, last: int) -> tuple[int, int, int, int, tuple[int, int] | None]:
        """(records, bytes, first txid, last txid, (first, last) append times in ms or None
        when unknown) of entries 0..``last``."""
        seg = self._seg
        if last == NO_ENTRY:
            return 0, 0, seg.first_txid, NO_TXID, None
        have = self._last_encoded
        summary = entry_summary(have[1] if have is not None and have[0] == last else await self._read_any(last))
        first_txid = seg.first_txid
        if summary is not None:
            first = _records(await self._read_any(0)) if first_txid == NO_TXID or summary.append_ms is not None else []
            if first_txid == NO_TXID:
                first_txid = next((r.txid for r in first if not r.control), NO_TXID)
            times = None
            if summary.append_ms is not None and summary.records:
                first_ms = await self._data_time(range(0, last + 1), first)
                last_ms = await self._data_time(range(last, -1, -1), _records(have[1]) if have is not None and have[0] == last else None)
                times = (first_ms, last_ms) if first_ms is not None and last_ms is not None else None
            return summary.records, summary.bytes, first_txid, summary.last_txid, times
        # Written by something that leaves no totals: count the hard way.
        records, nbytes, last_txid = 0, 0, NO_TXID
        for entry_id in range(last + 1):
            encoded = await self._read_any(entry_id)
            nbytes += len(encoded)
            for record in _records(encoded):
                if not record.control:
                    records += 1
                    last_txid = record.txid
                    if first_txid == NO_TXID:
                        first_txid = record.txid
        return records, nbytes, first_txid, last_txid, None

    async def _data_time(self, entry_ids: range, known: list[Record] | None = None, most: int = 16) -> int | None:
        """The append time of the first entry of ``entry_ids`` that holds a data record (the
        first and last records' times: an idle writer's control entries come later), looking
        at ``most`` entries at most, then the first one's time (an outer bound). ``known``: the
        decoded records of ``entry_ids[0]``, when read already."""
        bound: int | None = None
        for n, entry_id in enumerate(entry_ids[:most]):
            records = known if n == 0 and known is not None else _records(await self._read_any(entry_id))
            when = append_time(records)
            if n == 0:
                bound = when
            if any(not r.control for r in records):
                return when
        return bound

    async def _close(self, last: int, fence: FenceOutcome) -> Versioned[SegmentRecord] | None:
        self._silent = set(fence.unreachable)
        records, nbytes, first_txid, last_txid, times = await self._summarize(last)
        # Members that did not answer the fence (down, slow, limbo) may lack entries: the record
        # says so, and the auditor checks and refills them (dlctl.log.repair).
        short = {n: NO_ENTRY for n in fence.unreachable}
        closed = replace(self._seg.completed_with(last, last_txid, records, nbytes, time.time(), short=short, times=times), first_txid=first_txid)
        try:
            result = await self._zk(self.meta.update_segment, self.name, self.segment, closed)
        except ConflictError:
            return None
        log.info(
            "recovered %s: LAC %d, last entry %d, %d records (fenced %s)",
            self._where(), fence.lac, last, records, ", ".join(fence.fenced),
        )
        return result

    async def _zk(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _records(encoded: bytes) -> list[Record]:
    return list(decode_records(memoryview(encoded)[HEADER_SIZE:]))


async def recover_segment(
    meta: MetaStore,
    pool: ReplicaPool,
    name: str,
    log_id: int,
    segment: Versioned[SegmentRecord],
    *,
    timeout: float = 30.0,
    read_ahead: int = 16,
    accept_data_loss: bool = False,
) -> RecoveryResult:
    """Fence, recover and close ``segment`` (see the module docstring). Safe to run concurrently
    with a live writer (which gets fenced) and with other recoveries (which agree).
    ``accept_data_loss``: unclean recovery (see ``SegmentRecovery``), only on an operator's word."""
    return await SegmentRecovery(meta, pool, name, log_id, segment, timeout=timeout, read_ahead=read_ahead, accept_data_loss=accept_data_loss).run()


async def recover_log(meta: MetaStore, pool: ReplicaPool, name: str, *, timeout: float = 30.0, accept_data_loss: bool = False) -> list[RecoveryResult]:
    """Recover every in-progress segment of log ``name`` (normally at most the last one), oldest first."""
    loop = asyncio.get_running_loop()
    log_record = await loop.run_in_executor(None, meta.get_log, name)
    segments = await loop.run_in_executor(None, meta.segments, name)
    results = []
    for seg in segments:
        if seg.value.state is SegmentState.INPROGRESS:
            results.append(await recover_segment(meta, pool, name, log_record.value.log_id, seg, timeout=timeout, accept_data_loss=accept_data_loss))
    return results


async def fence_log(meta: MetaStore, pool: ReplicaPool, name: str, *, timeout: float = 30.0) -> dict[int, FenceOutcome]:
    """Fence every in-progress segment of log ``name`` without closing it (``dlctl fence``): its
    writer can no longer commit anything; the next owner or ``recover_log`` closes the segment."""
    loop = asyncio.get_running_loop()
    log_record = await loop.run_in_executor(None, meta.get_log, name)
    segments = await loop.run_in_executor(None, meta.segments, name)
    return {
        seg.value.seq: await SegmentRecovery(meta, pool, name, log_record.value.log_id, seg, timeout=timeout).fence()
        for seg in segments
        if seg.value.state is SegmentState.INPROGRESS
    }
