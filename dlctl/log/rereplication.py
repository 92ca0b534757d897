"""Re-replication of segment replicas held by lost agents (DESIGN.md §6): the pure planning.

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

This module is the pure part, plain functions over segment records (tested in
tests/unit/test_rereplication_plan.py): which entries a member held, who can still serve them,
what is lost for good, the swapped ensembles, the choice of a target, and the digest a copy is
verified by. The copy engine and the commit that follows it, the I/O, are
``dlctl.log.rereplication_copy``.
"""

from __future__ import annotations

import hashlib
import random
import struct
import zlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import RefusedError
from ..meta.records import EnsembleChange, SegmentRecord
from ..placement import PlacementPolicy, replace_member
from . import quorum


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
    return quorum.stores(span_nodes, write_quorum, node, entry_id)


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
            ws = quorum.write_set_of(span.nodes, w, r)
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


__all__ = [
    "LostRange",
    "Span",
    "choose_target",
    "digest_of",
    "entries_on",
    "lost_ranges",
    "members",
    "sources",
    "spans",
    "with_replacements",
]
