"""Re-replication's I/O (DESIGN.md §6): copy a lost member's entries to a target, verify the
copy, then name the target in the segment's metadata by compare-and-set.

The decisions it acts on (which entries, from whom, which target, the digest to verify) are the
pure planning in ``dlctl.log.rereplication``, whose docstring states the safety rules; this
module keeps them: it reads only from surviving members, commits only a verified copy, and
deletes only a copy the metadata does not name.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConflictError, DlctlError, NotFoundError
from ..meta.records import SegmentRecord, SegmentState, Versioned
from ..meta.store import MetaStore
from ..ratelimit import TokenBucket
from . import protocol as p
from .errors import AgentError, AgentUnavailableError, BadRequestError, NoSuchEntryError, NoSuchSegmentError
from .format import stored_crc
from .pool import ReplicaPool
from .readpolicy import order_replicas
from .rereplication import digest_of, entries_on, members, sources, with_replacements

log = logging.getLogger(__name__)


# -- the copy engine -------------------------------------------------------------------------------


class StuckError(DlctlError):
    """A replica could not be re-replicated now; the message names the segment and why."""


@dataclass
class CopyResult:
    node: str
    target: str
    entries: int = 0
    bytes: int = 0
    seconds: float = 0.0
    digest: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"lost": self.node, "target": self.target, "entries": self.entries, "bytes": self.bytes, "seconds": round(self.seconds, 3), "digest": self.digest}


@dataclass
class CopyProgress:
    """Counters shared by concurrent copies (the CLI's progress bar reads them)."""

    entries: int = 0
    bytes: int = 0
    on_change: Callable[[CopyProgress], None] | None = field(default=None, repr=False)

    def add(self, entries: int, nbytes: int) -> None:
        self.entries += entries
        self.bytes += nbytes
        if self.on_change is not None:
            self.on_change(self)


# The bytes of one chunk of a copy: at most one READ_RANGE answer's worth of consecutive entries
# (or as many single reads of a striped replica's entries) and one ADD_BATCH to the target.
# Measured with tests/benchmarks/bench_rereplication.py (64 KiB entries).
COPY_BATCH_BYTES = 2 * 1024 * 1024
# A pull is a read and a durable write of about COPY_BATCH_BYTES by the target: allow for a busy
# disk (a lost answer is only a redo: recovery adds of identical bytes are idempotent).
PULL_TIMEOUT = 60.0
_MAX_CHUNK_ENTRIES = 4096
# An entry's size until the segment's record or the first reads tell: on the small side, so the
# first chunks are too big rather than single entries (the window bounds them in entries).
_GUESS_ENTRY_BYTES = 16 * 1024


@dataclass
class _Piece:
    """Consecutive entries read in one answer: ``buf[start:end]`` holds entries ``first``,
    ``first + 1``, ... back to back, ``sizes`` their encoded lengths."""

    first: int
    buf: bytes
    start: int
    end: int
    sizes: list[int]

    @property
    def last(self) -> int:
        return self.first + len(self.sizes) - 1

    def view(self) -> memoryview:
        return memoryview(self.buf)[self.start : self.end]


def _batches(pieces: list[_Piece], cap: int) -> list[list[_Piece]]:
    """A chunk's pieces (ids increasing) as ADD_BATCH bodies of at most ``cap`` bytes: pieces
    split at entry boundaries where they must be, pieces that lie back to back in one answer
    merged (sent as one buffer). An entry larger than ``cap`` is a batch of its own."""
    out: list[list[_Piece]] = []
    current: list[_Piece] = []
    size = 0

    def put(piece: _Piece) -> None:
        last = current[-1] if current else None
        if last is not None and last.buf is piece.buf and last.end == piece.start and last.last + 1 == piece.first:
            current[-1] = _Piece(last.first, last.buf, last.start, piece.end, last.sizes + piece.sizes)
        else:
            current.append(piece)

    for piece in pieces:
        if size + piece.end - piece.start <= cap:
            put(piece)
            size += piece.end - piece.start
            continue
        pos = piece.start
        for i, n in enumerate(piece.sizes):
            if size + n > cap and current:
                out.append(current)
                current, size = [], 0
            put(_Piece(piece.first + i, piece.buf, pos, pos + n, [n]))
            size += n
            pos += n
    if current:
        out.append(current)
    return out


def _runs(ids: list[int], order_of: Callable[[int], tuple[str, ...]], key_of: Callable[[int], Any] | None = None) -> list[tuple[int, int, tuple[str, ...]]]:
    """``ids`` (increasing) as runs ``(first, last, sources)`` of consecutive ids with the same
    ``key_of`` (default: the same ``order_of``): the same surviving replicas hold each of them,
    so a run can be read as a range from any of them, in the order of preference of its first
    id (write sets rotate with the id, so equally close replicas take turns by run). E = W
    spans are one run; a striped replica's entries (E > W) are mostly runs of one."""
    key_of = key_of or order_of
    out: list[tuple[int, int, tuple[str, ...]]] = []
    last_key = None
    for entry_id in ids:
        key = key_of(entry_id)
        if out and out[-1][1] + 1 == entry_id and key == last_key:
            out[-1] = (out[-1][0], entry_id, out[-1][2])
        else:
            out.append((entry_id, entry_id, order_of(entry_id)))
            last_key = key
    return out


class _Budget:
    """Entries in one stage of a copy: ``take(n)`` waits until ``n`` more fit under ``limit``
    (or nothing is taken: a chunk larger than the limit still goes, alone), all ``n`` at once
    (taking them one by one, two chunks could each hold part of the budget and wait forever)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._changed = asyncio.Condition()

    async def take(self, n: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n

    async def give(self, n: int) -> None:
        async with self._changed:
            self.used -= n
            self._changed.notify_all()


def _stages(window: int) -> tuple[int, int, int]:
    """How ``window`` entries in flight are shared: at most this many entries per chunk, being
    read (or read and waiting for room among the adds), and being added (sent to the target
    and not yet durable there). Each stage holds two chunks or more, so reads run ahead while
    the target syncs and the target always has the next batch when a sync ends."""
    adding = max(1, window // 2)
    return max(1, min(_MAX_CHUNK_ENTRIES, window // 4)), max(1, window - adding), adding


def _unknown_op(exc: AgentError) -> bool:
    """An agent that predates the op (READ_RANGE, ADD_BATCH) answers BAD_REQUEST naming it."""
    return isinstance(exc, BadRequestError) and "unknown opcode" in exc.message


async def copy_replica(
    pool: ReplicaPool,
    log_id: int,
    segment: SegmentRecord,
    lost: str,
    target: str,
    dead: Collection[str],
    *,
    window: int = 128,
    progress: CopyProgress | None = None,
    attempts: int = 3,
    throttle: TokenBucket | None = None,
    batch_bytes: int = COPY_BATCH_BYTES,
    pull: bool = True,
) -> CopyResult:
    """Copy every entry ``lost`` held in ``segment`` to ``target`` and verify it (see module doc).

    Entries travel in chunks of consecutive entries (``lost``'s, in id order) of about
    ``batch_bytes``, pipelined so that up to ``window`` entries are in flight: half of them
    being read (reads run ahead), half being added. A chunk is read as runs: consecutive ids
    held by the same surviving replicas (an E = W span is one run) are read with READ_RANGE
    from the nearest of them, continuing where an answer stopped (its byte cap, a gap) and
    falling over to the next replica for the rest of the run; a striped replica's entries
    (E > W) mostly form runs of one, read with READ_ENTRY. With ``pull`` (the default) the
    target reads each run itself (PULL_RANGE: one network leg instead of two, and no third
    process handling the bytes), falling over between replicas as above, and only what it could
    not pull is read here. Otherwise the chunk goes to the target as
    one ADD_BATCH of *recovery* adds (all or nothing; an agent that predates ADD_BATCH gets
    single adds), which the agent accepts on a fenced replica and which are idempotent for
    identical bytes — an interrupted copy is simply redone. The entries are forwarded as the
    sources answered them (each CRC-checked by the client), never re-encoded.
    ``throttle`` paces the bytes copied (shared by concurrent copies, it bounds their sum).
    Raises ``StuckError`` naming the entry and every replica's answer when an entry cannot be
    read, or the entries when the target does not store them.
    """
    where = f"segment {segment.seq} of log id {log_id}"
    ids = entries_on(segment, lost)
    result = CopyResult(lost, target)
    started = time.monotonic()
    if not ids:
        return result
    dead = set(dead) | {lost}
    target_client = await pool.client(target)
    target_info = pool.nodes.get(target, {})
    region, rack = target_info.get("region"), target_info.get("rack")
    crcs: dict[int, int] = {}
    failure: list[BaseException] = []
    no_range: set[str] = set()  # sources that predate READ_RANGE
    single_adds = False  # the target predates ADD_BATCH
    pulling = pull  # the target pulls from the sources itself (until it turns out to predate PULL_RANGE)
    # A chunk is cut to about ``batch_bytes`` from the entry size seen so far; what it holds
    # travels in requests of up to MAX_BATCH_BYTES, so a chunk of entries larger than the
    # guess is still one READ_RANGE and one ADD_BATCH.
    batch_cap = p.MAX_BATCH_BYTES
    orders: dict[tuple[tuple[str, ...], frozenset[str]], tuple[str, ...]] = {}

    def order_of(entry_id: int) -> tuple[str, ...]:
        key = (sources(segment, entry_id, dead), segment.lacking(entry_id))
        order = orders.get(key)
        if order is None:
            order = orders[key] = order_replicas(key[0], pool.nodes, region, rack, lacking=key[1])
        return order

    def holders(entry_id: int) -> tuple[frozenset[str], frozenset[str]]:
        """Who can serve the entry, and which of them the record says lack it: equal for two
        ids, their orders differ at most within a tier (the write set's rotation)."""
        able = frozenset(sources(segment, entry_id, dead))
        return able, segment.lacking(entry_id) & able

    async def read_run(first: int, last: int, order: tuple[str, ...]) -> list[_Piece]:
        """Entries ``first``..``last`` from the first replica of ``order`` that serves them,
        falling over to the next for the rest of the run."""
        pieces: list[_Piece] = []
        answers: dict[str, str] = {}
        nodes = list(order)
        pos = first
        while pos <= last:
            if not nodes:
                lost_to = ", ".join(f"{n}: {why}" for n, why in answers.items()) or "no surviving member of its write set"
                raise StuckError(
                    f"{where}: entry {pos} could not be read from any surviving replica ({lost_to})",
                    hint="bring a replica of it back; if none holds it, the entry is lost and is reported so",
                    details={"segment": segment.seq, "entry": pos, "answers": answers},
                )
            node = nodes[0]
            try:
                client = await pool.client(node)
                if pos == last or node in no_range:
                    data = await client.read(log_id, segment.seq, pos)
                    pieces.append(_Piece(pos, data, 0, len(data), [len(data)]))
                    pos += 1
                    continue
                try:
                    data, spans_ = await client.read_range(log_id, segment.seq, pos, last, batch_cap, in_place=True)
                except AgentError as exc:
                    if not _unknown_op(exc):
                        raise
                    no_range.add(node)
                    continue
            except AgentError as exc:
                answers[node] = f"{type(exc).__name__}: {exc.message}" + (f" (at entry {pos})" if pos != first else "")
                nodes.pop(0)  # the next replica serves the rest of the run
                continue
            pieces.append(_Piece(pos, data, spans_[0][0], spans_[-1][1], [b - a for a, b in spans_]))
            pos += len(spans_)
        return pieces

    async def store(batch: list[_Piece]) -> None:
        nonlocal single_adds
        first, last = batch[0].first, batch[-1].last
        what = f"entry {first}" if first == last else f"entries {first}..{last}"
        for attempt in range(attempts):
            try:
                # A new replica is read only once its copy is verified: keep it out of the target's page cache.
                if single_adds or sum(piece.end - piece.start for piece in batch) > p.MAX_BATCH_BYTES:  # an entry too big for a batch
                    await _add_singly(batch)
                else:
                    try:
                        stored = await target_client.add_batch([piece.view() for piece in batch], recovery=True, uncached=True)
                    except AgentError as exc:
                        if not _unknown_op(exc):
                            raise
                        single_adds = True
                        await _add_singly(batch)
                        return
                    count = sum(len(piece.sizes) for piece in batch)
                    if stored != count:
                        raise StuckError(f"{where}: target {target} stored {stored} of the {count} {what}", hint="check the target agent's log")
                return
            except AgentUnavailableError as exc:
                if attempt + 1 == attempts:
                    raise StuckError(f"{where}: target {target} did not store {what}: {exc.message}", hint="check the target agent, or re-run to pick another") from None
                await asyncio.sleep(0.2 * (attempt + 1))  # a reconnect, not a poll of a condition
            except AgentError as exc:
                raise StuckError(f"{where}: target {target} refused {what}: {exc.message}", hint="check the target agent's log") from None

    async def _add_singly(batch: list[_Piece]) -> None:
        adds = []
        for piece in batch:
            view, pos = piece.view(), 0
            for n in piece.sizes:
                adds.append(target_client.add(view[pos : pos + n], recovery=True, uncached=True))
                pos += n
        outcomes = await asyncio.gather(*adds, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    def record(first: int, chunk_crcs: Iterable[int], nbytes: int) -> None:
        entries = 0
        for k, crc in enumerate(chunk_crcs):
            crcs[first + k] = crc
            entries += 1
        result.entries += entries
        result.bytes += nbytes
        if progress is not None:
            progress.add(entries, nbytes)

    async def store_pieces(pieces: list[_Piece]) -> None:
        for batch in _batches(pieces, batch_cap):
            nbytes = sum(piece.end - piece.start for piece in batch)
            if throttle is not None:
                await throttle.take(nbytes)
            await store(batch)
            for piece in batch:
                offsets = itertools.accumulate(piece.sizes[:-1], initial=piece.start)
                record(piece.first, (stored_crc(piece.buf, pos) for pos in offsets), piece.end - piece.start)

    async def pull_run(first: int, last: int, order: tuple[str, ...]) -> int:
        """Have the target pull ``first``..``last`` from the first replica of ``order`` that
        serves them (PULL_RANGE: one network leg), falling over to the next for the rest; what
        no pull stored is read and added as above (a target that predates PULL_RANGE, or that
        could not pull: the single path names the failure precisely). Returns the bytes."""
        nonlocal pulling
        pos, nbytes = first, 0
        nodes = list(order)
        answers: dict[str, str] = {}
        while pulling and nodes and pos <= last:
            try:
                got = await target_client.pull_range(log_id, segment.seq, pos, last, nodes[0], batch_bytes, timeout=PULL_TIMEOUT)
            except AgentError as exc:
                # The target itself failed the request (it predates PULL_RANGE, is not connected
                # to its cluster, its disk failed...): the rest of the copy goes through this
                # process, whose single adds name a storage failure precisely. A source's
                # failure is not an error here: the answer's reason carries it.
                if pulling and not _unknown_op(exc):
                    log.info("%s: %s could not pull entries %d..%d from %s (%s); copying through this process instead", where, target, pos, last, nodes[0], exc.message)
                pulling = False
                reads.limit = reading  # from now on half the window reads here, half adds
                break
            if throttle is not None:
                await throttle.take(got.bytes)
            record(pos, got.crcs, got.bytes)
            pos += got.entries
            nbytes += got.bytes
            if got.reason:
                answers[nodes.pop(0)] = got.reason
        if pos <= last:
            if not nodes:
                raise StuckError(
                    f"{where}: entry {pos} could not be read from any surviving replica ("
                    + (", ".join(f"{n}: {why}" for n, why in answers.items()) or "no surviving member of its write set")
                    + ")",
                    hint="bring a replica of it back; if none holds it, the entry is lost and is reported so",
                    details={"segment": segment.seq, "entry": pos, "answers": answers},
                )
            pieces = await read_run(pos, last, tuple(nodes))
            await store_pieces(pieces)
            nbytes += sum(piece.end - piece.start for piece in pieces)
        return nbytes

    async def one(chunk: list[int]) -> None:
        n = len(chunk)
        adding = False
        try:
            if failure:
                return
            runs = _runs(chunk, order_of, holders)
            if pulling:
                pulled = await asyncio.gather(*(pull_run(a, b, order) for a, b, order in runs))
                seen[0] += n
                seen[1] += sum(pulled)
                return
            read = await asyncio.gather(*(read_run(a, b, order) for a, b, order in runs))
            seen[0] += n
            seen[1] += sum(piece.end - piece.start for pieces in read for piece in pieces)
            # Read, the chunk waits for room among the adds in flight, and its place among the
            # reads goes to the next chunk: reads run ahead while the target syncs.
            await adds.take(n)
            adding = True
            await reads.give(n)
            await store_pieces([piece for pieces in read for piece in pieces])
        except BaseException as exc:  # noqa: BLE001 - the first failure stops the copy, below
            failure.append(exc)
        finally:
            await (adds if adding else reads).give(n)

    # Chunks are cut as they are started, from the entry size seen so far (the segment's record
    # gives a first guess): about ``batch_bytes`` each, at most a quarter of the window; half
    # the window is for chunks being read, half for chunks being added (``_stages``).
    span_entries = segment.last_entry_id - max(segment.min_active_entry, 0) + 1
    guess = segment.bytes // span_entries if segment.bytes > 0 and span_entries > 0 else _GUESS_ENTRY_BYTES
    seen = [0, 0]  # entries and bytes read so far (the running average entry size)
    per_chunk_max, reading, adding = _stages(window)
    # A pulled chunk is read and stored by the target in one request: the whole window pulls.
    reads, adds = _Budget(window if pull else reading), _Budget(adding)
    tasks = []
    i = 0
    while i < len(ids) and not failure:
        if len(tasks) == 1 and pull:
            # The first chunk tells whether the target pulls (and the entry size): the next
            # chunks are cut, and their budget chosen, knowing it.
            await asyncio.wait(tasks)
        average = seen[1] // seen[0] if seen[0] else guess
        per = max(1, min(per_chunk_max, batch_bytes // max(1, average)))
        chunk = ids[i : i + per]
        i += len(chunk)
        await reads.take(len(chunk))
        if failure:
            await reads.give(len(chunk))
            break
        tasks.append(asyncio.ensure_future(one(chunk)))
    await asyncio.gather(*tasks)
    if failure:
        # Chunks are started in order, so the lowest entry no replica could serve is among the
        # failures whichever failed first: name it (else the first failure).
        unreadable = [f for f in failure if isinstance(f, StuckError) and isinstance(f.details, dict) and "entry" in f.details]
        raise min(unreadable, key=lambda f: f.details["entry"]) if unreadable else failure[0]

    # Verify before anyone relies on the copy: the target's own digest of the range must be the
    # digest of exactly the entries read from the sources (ids and CRCs).
    expected = digest_of((i, crcs[i]) for i in ids)
    try:
        got = await target_client.digest(log_id, segment.seq, ids[0], ids[-1])
    except AgentError as exc:
        raise StuckError(f"{where}: cannot verify the copy on {target}: {exc.message}") from None
    if got.digest != expected or got.entries != len(ids):
        raise StuckError(
            f"{where}: the copy on {target} does not verify: it holds {got.entries} entries in "
            f"{ids[0]}..{ids[-1]} (expected {len(ids)}) and its digest differs from the sources'",
            hint="the target may hold a stale replica of this segment; re-run to redo the copy or pick another target",
            details={"expected": expected, "got": got.digest, "entries": got.entries},
        )
    result.digest = expected
    result.seconds = time.monotonic() - started
    return result


async def commit_replacements(
    meta: MetaStore,
    name: str,
    seq: int,
    mapping: Mapping[str, str],
    copied_last_entry: int,
    *,
    retries: int = 10,
) -> tuple[Versioned[SegmentRecord], dict[str, str]]:
    """CAS the segment's metadata so each target replaces its lost member, after the copy.

    Re-reads on a lost race. A lost member already gone from the metadata is left alone (another
    recovery replaced it; its outcome is returned as "replaced by X elsewhere"). Refuses — rather
    than guess — when the segment changed in a way the copy did not cover (its last entry moved:
    it was still being written or recovered).
    Returns the final record and, per lost member, "committed" or the reason it was not needed.
    """
    loop = asyncio.get_running_loop()
    for _ in range(retries):
        current = await loop.run_in_executor(None, meta.get_segment, name, seq)
        seg = current.value
        if seg.state is SegmentState.INPROGRESS or seg.last_entry_id != copied_last_entry:
            raise StuckError(
                f"segment {seq} of log {name!r} changed while it was copied (state {seg.state.value}, last entry {seg.last_entry_id}, copied up to {copied_last_entry})",
                hint="re-run: the next run copies what the segment holds now",
            )
        outcome: dict[str, str] = {}
        todo: dict[str, str] = {}
        present = members(seg)
        for lost, target in mapping.items():
            if lost not in present:
                outcome[lost] = "already replaced" + (f" by {target}" if target in present else " by another recovery")
            elif target in present:
                raise StuckError(f"segment {seq} of log {name!r}: target {target} became a member meanwhile", hint="re-run to pick another target")
            else:
                todo[lost] = target
        if not todo:
            return current, outcome
        new = with_replacements(seg, todo)
        try:
            updated = await loop.run_in_executor(None, meta.update_segment, name, current, new)
        except ConflictError:
            continue  # someone else changed it: read again and decide again
        outcome.update({lost: "committed" for lost in todo})
        return updated, outcome
    raise StuckError(f"segment {seq} of log {name!r}: its metadata kept changing ({retries} CAS attempts lost)", hint="re-run")


async def drop_orphan(meta: MetaStore, pool: ReplicaPool, name: str, log_id: int, seq: int, target: str) -> bool:
    """Delete a copy on ``target`` that the metadata does not reference (a target abandoned
    after an interrupted run). Never touches a replica the segment names."""
    loop = asyncio.get_running_loop()
    try:
        current = await loop.run_in_executor(None, meta.get_segment, name, seq)
    except NotFoundError:
        return False
    if target in members(current.value):
        return False
    try:
        client = await pool.client(target)
        return await client.delete_segment(log_id, seq)
    except (AgentError, NoSuchSegmentError, NoSuchEntryError):
        return False


__all__ = [
    "COPY_BATCH_BYTES",
    "CopyProgress",
    "CopyResult",
    "PULL_TIMEOUT",
    "StuckError",
    "commit_replacements",
    "copy_replica",
    "drop_orphan",
]
