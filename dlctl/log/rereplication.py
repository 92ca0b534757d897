"""Re-replication of segment replicas held by lost agents (DESIGN.md §6).

For one segment and one lost member, the entries that member stored are copied from the
surviving replicas of each entry's write set to a replacement agent, the copy is verified, and
only then is the segment's metadata changed (by compare-and-set) so the replacement takes the
lost member's *position* in every ensemble — write sets keep their meaning, readers find each
entry where the striping says it is.

Safety rules, in the order they are enforced:

* nothing is read from a lost agent, and nothing is ever deleted from a replica the metadata
  names: the only delete is of an orphan copy on a target the metadata does not reference;
* the copy is verified before the metadata names the target: the target's digest of the copied
  range must equal the digest computed from the entries read from the sources (each of them
  CRC-checked end to end by the client);
* a write set with no surviving member is *data loss*: it is reported with its entry ids and the
  segment's metadata is left alone (the lost agents may come back; replacing them in the
  metadata would make those entries unreachable for good);
* every metadata change is a CAS; a lost race re-reads and re-decides.

The top of the module is pure planning (tested in tests/unit/test_rereplication_plan.py); the
copy engine below it does the I/O.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import struct
import time
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConflictError, DlctlError, NotFoundError, RefusedError
from ..meta.records import EnsembleChange, SegmentRecord, SegmentState, Versioned
from ..meta.store import MetaStore
from ..placement import PlacementPolicy, replace_member
from ..ratelimit import TokenBucket
from .errors import AgentError, AgentUnavailableError, NoSuchEntryError, NoSuchSegmentError
from .format import decode_header
from .readpolicy import order_replicas

log = logging.getLogger(__name__)

# -- pure planning ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """The entries ``first``..``last`` of a segment, written to ensemble ``nodes``."""

    first: int
    last: int
    nodes: tuple[str, ...]


def spans(segment: SegmentRecord) -> list[Span]:
    """The segment's ensemble changes as closed entry ranges (empty ranges left out).

    Entries before ``min_active_entry`` are truncated away and need no copy. An in-progress
    segment has no final last entry: its spans end at ``last_entry_id`` as recorded (callers
    recover in-progress segments before copying)."""
    out = []
    changes = segment.ensembles
    for i, change in enumerate(changes):
        last = changes[i + 1].first_entry_id - 1 if i + 1 < len(changes) else segment.last_entry_id
        last = min(last, segment.last_entry_id)
        first = max(change.first_entry_id, segment.min_active_entry)
        if last >= first:
            out.append(Span(first, last, change.nodes))
    return out


def members(segment: SegmentRecord) -> set[str]:
    """Every agent named in any of the segment's ensembles."""
    return {n for change in segment.ensembles for n in change.nodes}


def stores(span_nodes: tuple[str, ...], write_quorum: int, node: str, entry_id: int) -> bool:
    """Whether ``node`` is in ``entry_id``'s write set (W consecutive members from entry mod E)."""
    e = len(span_nodes)
    return any(span_nodes[(entry_id + i) % e] == node for i in range(write_quorum))


def entries_on(segment: SegmentRecord, node: str) -> list[int]:
    """The entry ids ``node`` holds as a member of the segment (ascending)."""
    out: list[int] = []
    w = segment.write_quorum
    for span in spans(segment):
        if node not in span.nodes:
            continue
        e = len(span.nodes)
        if w >= e:  # every member holds every entry of the span
            out.extend(range(span.first, span.last + 1))
            continue
        # Membership depends only on entry mod E: find the residues once, then step by E.
        residues = [r for r in range(e) if stores(span.nodes, w, node, r)]
        ids = [x for r in residues for x in range(span.first + (r - span.first) % e, span.last + 1, e)]
        out.extend(sorted(ids))
    return out


def sources(segment: SegmentRecord, entry_id: int, dead: Collection[str]) -> tuple[str, ...]:
    """The members of ``entry_id``'s write set that can still serve it (not lost, not down)."""
    return tuple(n for n in segment.write_set(entry_id) if n not in dead)


@dataclass(frozen=True)
class LostRange:
    """Entries of one span whose whole write set is lost: ids ``first``..``last`` with
    ``id % modulus == residue`` (modulus 1: every id), ``count`` of them."""

    first: int
    last: int
    residue: int
    modulus: int
    count: int
    write_set: tuple[str, ...]

    def describe(self) -> str:
        ids = f"{self.first}..{self.last}" if self.first != self.last else str(self.first)
        every = "" if self.modulus == 1 else f" with id mod {self.modulus} = {self.residue}"
        return f"entries {ids}{every} ({self.count}; write set {','.join(self.write_set)})"

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "last": self.last, "residue": self.residue, "modulus": self.modulus, "count": self.count, "write_set": list(self.write_set)}


def lost_ranges(segment: SegmentRecord, dead: Collection[str]) -> list[LostRange]:
    """Entries no surviving agent can serve: every member of their write set is in ``dead``."""
    dead = set(dead)
    out = []
    w = segment.write_quorum
    for span in spans(segment):
        e = len(span.nodes)
        if w >= e:
            if set(span.nodes) <= dead:
                out.append(LostRange(span.first, span.last, 0, 1, span.last - span.first + 1, span.nodes))
            continue
        for r in range(e):
            ws = tuple(span.nodes[(r + i) % e] for i in range(w))
            if not set(ws) <= dead:
                continue
            first = span.first + (r - span.first) % e
            if first > span.last:
                continue
            last = span.last - (span.last - r) % e
            out.append(LostRange(first, last, r, e, (last - first) // e + 1, ws))
    return out


def with_replacements(segment: SegmentRecord, mapping: Mapping[str, str]) -> SegmentRecord:
    """The segment with each lost member swapped for its target in every ensemble, in place
    (same position), so every entry's write set maps to the same positions as before."""
    changes = tuple(EnsembleChange(c.first_entry_id, tuple(mapping.get(n, n) for n in c.nodes)) for c in segment.ensembles)
    # A replaced member's shortfall goes with it: its replacement holds every entry (verified).
    return replace(segment, ensembles=changes, short={n: last for n, last in segment.short.items() if n not in mapping})


def choose_target(
    segment: SegmentRecord,
    lost: str,
    available: Mapping[str, Mapping[str, Any]],
    *,
    exclude: Collection[str] = (),
    lost_region: str | None = None,
    seed: Any = None,
    policy: PlacementPolicy | None = None,
    known: Mapping[str, Mapping[str, Any]] | None = None,
) -> str | None:
    """A replacement for ``lost`` in ``segment``, or None when no agent can take its place.

    The one place a target is chosen, so it can become a call to the region-aware policy
    (``placement.replace_member``) in one line once that keeps the region invariant. Until
    then: an available agent outside the segment's ensembles and ``exclude``, in the lost
    agent's region if one is left (the placement the writer chose is restored), else in the
    region holding fewest members of the ensemble (spreading is what the invariant needs),
    then the rack holding fewest; ties broken by a seeded random choice so that a dry run and
    the apply that follows pick the same target.
    """
    taken = members(segment) | set(exclude)
    spare = sorted(n for n in available if n not in taken)
    if not spare:
        return None
    if policy is not None:
        return _policy_target(segment, lost, available, taken, policy, seed)
    # The ensemble as it will be once ``lost`` is gone (region counts drive the choice).
    current = [n for n in segment.ensembles[-1].nodes if n != lost]
    region_of = {n: available.get(n, {}).get("region") for n in current}
    rack_of = {n: (available.get(n, {}).get("region"), available.get(n, {}).get("rack")) for n in current}

    def key(n: str) -> tuple[int, int, int]:
        info = available[n]
        same = 0 if lost_region is not None and info.get("region") == lost_region else 1
        in_region = sum(1 for r in region_of.values() if r == info.get("region"))
        in_rack = sum(1 for r in rack_of.values() if r == (info.get("region"), info.get("rack")))
        return (same, in_region, in_rack)

    best = min(key(n) for n in spare)
    tied = [n for n in spare if key(n) == best]
    return random.Random(repr(seed)).choice(tied)


def _policy_target(
    segment: SegmentRecord,
    lost: str,
    available: Mapping[str, Mapping[str, Any]],
    taken: Collection[str],
    policy: PlacementPolicy,
    seed: Any,
) -> str | None:
    """The region-aware choice: the segment's own E/W/A with the log's m, regions and drains,
    so every write set keeps the invariant after the swap; None when no agent can."""
    ensemble = segment.ensembles[-1].nodes
    effective = replace(policy, ensemble_size=len(ensemble), write_quorum=segment.write_quorum, ack_quorum=segment.ack_quorum)
    try:
        swapped = replace_member(
            ensemble,
            lost,
            {n: dict(i) for n, i in available.items()},
            exclude=taken,
            seed=zlib.crc32(repr(seed).encode()),
            policy=effective,
            known={n: dict(i) for n, i in available.items()},
        )
    except RefusedError:
        return None
    return swapped[list(ensemble).index(lost)]


# -- digests (the agent's algorithm, recomputed from what was read) --------------------------------

_DIGEST_ITEM = struct.Struct(">qI")


def digest_of(pairs: Iterable[tuple[int, int]]) -> str:
    """SHA-256 over ordered (entry id, CRC-32C) pairs, each packed big-endian i64 + u32: the
    same digest the agent's DIGEST request returns for the entries it holds in a range."""
    h = hashlib.sha256()
    for entry_id, crc in pairs:
        h.update(_DIGEST_ITEM.pack(entry_id, crc))
    return h.hexdigest()


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


async def copy_replica(
    pool: Any,
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
) -> CopyResult:
    """Copy every entry ``lost`` held in ``segment`` to ``target`` and verify it (see module doc).

    Entries are pipelined: up to ``window`` read→add chains are in flight, each read from the
    nearest surviving member of the entry's write set and falling over to the next one. Adds
    are *recovery* adds, which the agent accepts on a fenced replica and which are idempotent
    for identical bytes — an interrupted copy is simply redone. ``throttle`` paces the bytes
    copied (shared by concurrent copies, it bounds their sum). Raises ``StuckError`` naming
    the entry and every replica's answer when an entry cannot be read or stored.
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
    crcs: dict[int, int] = {}
    sem = asyncio.Semaphore(window)
    failure: list[BaseException] = []

    async def read_any(entry_id: int) -> bytes:
        order = order_replicas(
            sources(segment, entry_id, dead), pool.nodes, target_info.get("region"), target_info.get("rack"), lacking=segment.lacking(entry_id)
        )
        answers: dict[str, str] = {}
        for node in order:
            try:
                client = await pool.client(node)
                return await client.read(log_id, segment.seq, entry_id)
            except AgentError as exc:
                answers[node] = f"{type(exc).__name__}: {exc.message}"
        lost_to = ", ".join(f"{n}: {why}" for n, why in answers.items()) or "no surviving member of its write set"
        raise StuckError(
            f"{where}: entry {entry_id} could not be read from any surviving replica ({lost_to})",
            hint="bring a replica of it back; if none holds it, the entry is lost and is reported so",
            details={"segment": segment.seq, "entry": entry_id, "answers": answers},
        )

    async def add(entry_id: int, encoded: bytes) -> None:
        for attempt in range(attempts):
            try:
                # A new replica is read only once its copy is verified: keep it out of the target's page cache.
                await target_client.add(encoded, recovery=True, uncached=True)
                return
            except AgentUnavailableError as exc:
                if attempt + 1 == attempts:
                    raise StuckError(f"{where}: target {target} did not store entry {entry_id}: {exc.message}", hint="check the target agent, or re-run to pick another") from None
                await asyncio.sleep(0.2 * (attempt + 1))  # a reconnect, not a poll of a condition
            except AgentError as exc:
                raise StuckError(f"{where}: target {target} refused entry {entry_id}: {exc.message}", hint="check the target agent's log") from None

    async def one(entry_id: int) -> None:
        try:
            if failure:
                return
            encoded = await read_any(entry_id)
            if throttle is not None:
                await throttle.take(len(encoded))
            await add(entry_id, encoded)
            crcs[entry_id] = decode_header(encoded).crc
            result.entries += 1
            result.bytes += len(encoded)
            if progress is not None:
                progress.add(1, len(encoded))
        except BaseException as exc:  # noqa: BLE001 - the first failure stops the copy, below
            failure.append(exc)
        finally:
            sem.release()

    tasks = []
    for entry_id in ids:
        await sem.acquire()
        if failure:
            sem.release()
            break
        tasks.append(asyncio.ensure_future(one(entry_id)))
    await asyncio.gather(*tasks)
    if failure:
        raise failure[0]

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


async def drop_orphan(meta: MetaStore, pool: Any, name: str, log_id: int, seq: int, target: str) -> bool:
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
    "CopyProgress",
    "CopyResult",
    "LostRange",
    "Span",
    "StuckError",
    "choose_target",
    "commit_replacements",
    "copy_replica",
    "digest_of",
    "drop_orphan",
    "entries_on",
    "lost_ranges",
    "members",
    "sources",
    "spans",
    "with_replacements",
]
