"""The clock base of a log: ``logs/<name>/clock`` in the log's cluster (issue 11).

A location derives the vector timestamps of its local records while reading its log (see
``dlctl.replication.causal``): the version vector before the record, own counter plus one.
A location that lost its log would start counting again from zero and reuse timestamps its
peers have already seen. The clock base is the minimum version vector the log starts from:
readers that start at the beginning of the log (or anywhere without a checkpointed vector)
start from it, so new local records get counters above every one handed out before.
``dlctl dr recover`` raises it — by compare-and-set, never lowering a component — to the
highest counter of the location that any directly connected peer has seen.

A base takes effect from a position (``from``): records before it keep the timestamps they were
always read with (a partly recovered log keeps its surviving records' identity); records at or
after it derive from at least the base. JSON ``{"steps": [{"from": "seq/entry/slot", "vv":
{...}}, ...], "updated": ...}`` (steps in position order); absent = no base.

**The truncation base** (``"truncation": {"at": "seq/entry/slot", "vv": {...}}``): a truncation
deletes the records before its point T, so a reader starting at T could no longer count them.
Before T moves, ``dlctl.replication.truncation_base`` writes the version vector a reader from
the beginning holds just before T as a step at T (and records it here as the truncation base):
from T on, every reader derives the timestamps a reader from the beginning derived. The step is
exactly that vector, so it changes nothing for a reader that still starts earlier (a truncation
cut short after writing it is harmless). It only ever moves forward. A point inside an entry
(slot > 0) also gets a step at the entry's start with the vector before it (``"entry_vv"``):
storage keeps the whole boundary entry, and what copies from the entry's start (``dr``) starts
from that vector. A point that is not at its segment's start also gets a step at the segment's
start (``"segment": {"vv": ..., "before_entry": n, "before_point": n}``: the vector before the
segment's first record, and how many data records of the segment lie before the point's entry
and before the point): storage deletes segments whole, and a bootstrap copies the boundary
segment from its first active entry (``dlctl.spark.clockbase``), so it needs the count of what
it leaves out to fold the segment's clock effect from metadata.

**Derived and raising steps.** Steps written for a truncation base are *derived*: exactly the
vector a reader from the beginning holds there, so they change no timestamp wherever they lie
(``"derived": true`` on the step). Steps ``dr recover`` writes *raise* the clock and always
start at a segment's first position. ``derived_steps`` tells them apart (a bootstrap may copy
across a derived step, never across a raising one).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kazoo.exceptions import NoNodeError

from ..errors import ConflictError, CorruptMetadata, NotFoundError
from ..log.dlsn import DLSN, INITIAL
from ..meta import cas, paths
from ..meta.records import Versioned
from ..meta.store import MetaStore
from ..names import validate_name
from .causal import merge

ClockBase = tuple[tuple[DLSN, dict[str, int]], ...]  # (from, vv) steps in position order


class _Keep(NamedTuple):
    """A change to the clock znode that finds nothing to write: the steps as they are."""

    steps: ClockBase


def parse_base(data: bytes, where: str) -> ClockBase:
    try:
        raw = json.loads(data)
        steps = []
        for step in raw["steps"]:
            vv = step["vv"]
            if not isinstance(vv, dict):
                raise ValueError("vv must be an object")
            out = {validate_name("location", k): int(v) for k, v in vv.items()}
            if any(v < 0 for v in out.values()):
                raise ValueError("negative counter")
            steps.append((DLSN.parse(step["from"]), out))
        return tuple(sorted(steps, key=lambda s: s[0]))
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as exc:
        raise CorruptMetadata(f"{where}: malformed clock base: {exc}") from None


TruncationBase = tuple[DLSN, dict[str, int]]  # (truncation point, the version vector before it)


def parse_truncation(data: bytes, where: str) -> TruncationBase | None:
    """The truncation base recorded in a clock znode (None: none)."""
    try:
        raw = json.loads(data).get("truncation")
        if raw is None:
            return None
        vv = {validate_name("location", k): int(v) for k, v in raw["vv"].items()}
        if any(v < 0 for v in vv.values()):
            raise ValueError("negative counter")
        return DLSN.parse(raw["at"]), vv
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as exc:
        raise CorruptMetadata(f"{where}: malformed truncation base: {exc}") from None


def parse_entry_vv(data: bytes, where: str) -> TruncationBase | None:
    """(the start of the truncation point's entry, the vector before it) when the point lies
    inside an entry (None otherwise)."""
    base = parse_truncation(data, where)
    if base is None or base[0].slot == 0:
        return None
    raw = json.loads(data)["truncation"].get("entry_vv")
    if raw is None:
        return None
    try:
        return DLSN(base[0].segment_seq, base[0].entry_id, 0), {validate_name("location", k): int(v) for k, v in raw.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise CorruptMetadata(f"{where}: malformed truncation base: {exc}") from None


def parse_derived(data: bytes, where: str) -> ClockBase:
    """The derived steps (written for truncation bases: exact, they change no timestamp): those
    flagged ``"derived"``, and for a base recorded before steps were flagged, the steps at the
    recorded positions with the recorded vectors."""
    steps = parse_base(data, where)
    raw = json.loads(data)
    flagged = [(DLSN.parse(s["from"]), s["vv"]) for s in raw["steps"] if s.get("derived")]
    base = parse_truncation(data, where)
    if base is not None:
        flagged.append(base)
        entry = parse_entry_vv(data, where)
        if entry is not None:
            flagged.append(entry)
        segment = parse_segment(data, where)
        if segment is not None:
            flagged.append((segment.start, segment.vv))
    return tuple(s for s in steps if any(s[0] == f and s[1] == {k: int(v) for k, v in vv.items() if int(v) > 0} for f, vv in flagged))


@dataclass(frozen=True)
class SegmentBase:
    """What the last truncation recorded about the start of its point's segment (the point not
    at the segment's start): the vector before the segment's first record, and the data
    records of the segment before the point's entry and before the point (None: unknown)."""

    start: DLSN  # the segment's first position
    vv: dict[str, int]
    before_entry: int | None
    before_point: int | None


def parse_segment(data: bytes, where: str) -> SegmentBase | None:
    base = parse_truncation(data, where)
    if base is None:
        return None
    raw = json.loads(data)["truncation"].get("segment")
    if raw is None:
        return None
    try:
        vv = {validate_name("location", k): int(v) for k, v in raw["vv"].items()}
        counts = [None if raw.get(k) is None else int(raw[k]) for k in ("before_entry", "before_point")]
        if any(v < 0 for v in vv.values()) or any(c is not None and c < 0 for c in counts):
            raise ValueError("negative count")
        return SegmentBase(DLSN(base[0].segment_seq, 0, 0), vv, counts[0], counts[1])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CorruptMetadata(f"{where}: malformed truncation base: {exc}") from None


def _same(a: tuple[DLSN, Mapping[str, int]], b: tuple[DLSN, Mapping[str, int]]) -> bool:
    return a[0] == b[0] and {k: v for k, v in a[1].items() if v > 0} == {k: v for k, v in b[1].items() if v > 0}


def _dump(steps: ClockBase, reason: str, truncation: dict | None = None, derived: Sequence[tuple[DLSN, Mapping[str, int]]] = ()) -> bytes:
    out = []
    for f, vv in steps:
        step: dict = {"from": str(f), "vv": vv}
        if any(_same((f, vv), d) for d in derived):
            step["derived"] = True
        out.append(step)
    raw: dict = {"steps": out, "reason": reason, "updated": time.time()}
    if truncation is not None:
        raw["truncation"] = truncation
    return json.dumps(raw, sort_keys=True).encode()


def _raw_truncation(data: bytes | None) -> dict | None:
    return json.loads(data).get("truncation") if data is not None else None


def floor_at(steps: ClockBase, position: DLSN) -> dict[str, int]:
    """The merged base of every step that starts at or before ``position``."""
    out: dict[str, int] = {}
    for start, vv in steps:
        if start <= position:
            out = merge(out, vv)
    return out


class ClockStore:
    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self.client = meta.client
        self.cluster = meta.cluster

    def get(self, name: str) -> Versioned[ClockBase]:
        """The log's clock base steps (empty, version -1, when it has none)."""
        path = paths.log_clock(self.cluster, name)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return Versioned((), -1)
        return Versioned(parse_base(data, path), stat.version)

    def steps(self, name: str) -> ClockBase:
        return self.get(name).value

    def _raw(self, name: str) -> tuple[bytes | None, int]:
        try:
            data, stat = self.client.get(paths.log_clock(self.cluster, name))
        except NoNodeError:
            return None, -1
        return data, stat.version

    def _update(self, name: str, change: Callable[[bytes | None], tuple[bytes, ClockBase] | _Keep]) -> ClockBase:
        """The clock znode's read/change/write loop (``cas.update``): ``change`` gets its bytes
        (None: no znode yet) and returns the new bytes with the steps they hold, or ``_Keep``
        (nothing to write) with the steps as they are; on a conflict it runs again on what is
        there now. Returns the steps in place after it."""
        path = paths.log_clock(self.cluster, name)
        missing = NotFoundError(f"log {name!r} does not exist in cluster {self.cluster!r}")
        kept: list[ClockBase] = []

        def read() -> Versioned[bytes | None]:
            return Versioned(*self._raw(name))

        def derive(data: bytes | None) -> tuple[bytes, ClockBase] | None:
            out = change(data)
            if isinstance(out, _Keep):
                kept.append(out.steps)
                return None
            return out

        def write(new: tuple[bytes, ClockBase], version: int) -> Versioned[tuple[bytes, ClockBase]]:
            return Versioned(new, cas.put(self.client, path, new[0], version, acl=self.meta.acl, missing=lambda: missing))

        result = cas.update(read, derive, write, what=path)
        return kept[-1] if kept else result.value[1]  # type: ignore[index]

    def truncation_base(self, name: str) -> TruncationBase | None:
        """(T, the version vector before T) recorded by the last truncation, or None."""
        data, _ = self._raw(name)
        return parse_truncation(data, paths.log_clock(self.cluster, name)) if data is not None else None

    def truncation_entry(self, name: str) -> TruncationBase | None:
        """For a truncation point inside an entry: (the entry's start, the vector before it)."""
        data, _ = self._raw(name)
        return parse_entry_vv(data, paths.log_clock(self.cluster, name)) if data is not None else None

    def derived_steps(self, name: str) -> ClockBase:
        """The log's derived steps (truncation bases: exact, they change no timestamp)."""
        data, _ = self._raw(name)
        return parse_derived(data, paths.log_clock(self.cluster, name)) if data is not None else ()

    def truncation_segment(self, name: str) -> SegmentBase | None:
        """For a truncation point not at its segment's start: what was recorded about that start."""
        data, _ = self._raw(name)
        return parse_segment(data, paths.log_clock(self.cluster, name)) if data is not None else None

    def skipped_records(self, name: str) -> dict[tuple[int, int], int]:
        """(segment, first active entry) -> the data records of that segment before that entry,
        as the last truncation recorded them (empty: none recorded)."""
        data, _ = self._raw(name)
        if data is None:
            return {}
        where = paths.log_clock(self.cluster, name)
        base, segment = parse_truncation(data, where), parse_segment(data, where)
        if base is None or segment is None or segment.before_entry is None:
            return {}
        return {(base[0].segment_seq, base[0].entry_id): segment.before_entry}

    def set_truncation_base(
        self,
        name: str,
        at: DLSN,
        vv: Mapping[str, int],
        reason: str = "truncation",
        entry_vv: Mapping[str, int] | None = None,
        segment: SegmentBase | None = None,
    ) -> ClockBase:
        """Record ``vv`` (what a reader from the beginning holds just before ``at``) as a step at
        ``at`` and as the truncation base; for ``at`` inside an entry, ``entry_vv`` (the vector
        before the entry) as a step at the entry's start too; for ``at`` after its segment's
        start, ``segment`` (the vector before the segment's first record, as a step there too,
        and the segment's record counts). Every such step is flagged derived. Idempotent (the
        same call again changes nothing) and never backwards: a base already at or past ``at``
        stays (returns the steps in place)."""
        path = paths.log_clock(self.cluster, name)
        wanted = {k: int(v) for k, v in vv.items() if v > 0}
        extra: list[tuple[DLSN, dict[str, int]]] = []
        record: dict = {"at": str(at), "vv": wanted}
        if at.slot > 0 and entry_vv is not None:
            entry = {k: int(v) for k, v in entry_vv.items() if v > 0}
            extra.append((DLSN(at.segment_seq, at.entry_id, 0), entry))
            record["entry_vv"] = entry
        if segment is not None and at > DLSN(at.segment_seq, 0, 0):
            seg_vv = {k: int(v) for k, v in segment.vv.items() if v > 0}
            extra.append((DLSN(at.segment_seq, 0, 0), seg_vv))
            record["segment"] = {"vv": seg_vv, "before_entry": segment.before_entry, "before_point": segment.before_point}

        def change(data: bytes | None) -> tuple[bytes, ClockBase] | _Keep:
            steps = parse_base(data, path) if data is not None else ()
            current = parse_truncation(data, path) if data is not None else None
            if current is not None and current[0] >= at:
                return _Keep(steps)
            # A step already at ``at`` (an earlier run cut short) is replaced: same value. A
            # raising step at the same position (``dr recover``) stays: it is not ours.
            mine = [(at, wanted), *extra]
            derived = parse_derived(data, path) if data is not None else ()
            ours = {m[0] for m in mine}
            kept = [s for s in steps if s[0] not in ours or not any(_same(s, d) for d in derived)]
            kept = [s for s in kept if not any(_same(s, m) for m in mine)]
            new_steps = tuple(sorted((*kept, *mine), key=lambda s: s[0]))
            old_reason = json.loads(data).get("reason", "") if data is not None else ""
            return _dump(new_steps, old_reason or reason, record, (*derived, *mine)), new_steps

        return self._update(name, change)

    def join_without_past(self, name: str, vv: Mapping[str, int], reason: str = "joined without its peers' deleted past") -> ClockBase:
        """A location joins its network without the past its peers deleted (Eventuate #314,
        ``init-replication --start-from now``): its deletion vector and current version vector
        become at least ``vv`` — recorded as the log's truncation base at its first position
        (and a derived step there: readers from the start count from it, so local records
        written from now on follow that past). For a log that holds no record yet; merges with
        an earlier join (another peer's deleted past), never lowers anything. Idempotent."""
        path = paths.log_clock(self.cluster, name)

        def change(data: bytes | None) -> tuple[bytes, ClockBase] | _Keep:
            steps = parse_base(data, path) if data is not None else ()
            current = parse_truncation(data, path) if data is not None else None
            if current is not None and current[0] > INITIAL:
                raise ConflictError(f"log {name!r} in cluster {self.cluster!r} truncated already (at {current[0]}): it cannot join without its peers' past")
            merged = {k: int(v) for k, v in merge(current[1] if current else {}, vv).items() if v > 0}
            if current is not None and current[1] == merged:
                return _Keep(steps)
            derived = [d for d in (parse_derived(data, path) if data is not None else ()) if d[0] != INITIAL]
            kept = tuple(s for s in steps if not (s[0] == INITIAL and current is not None and _same(s, current)))
            new_steps = tuple(sorted((*kept, (INITIAL, merged)), key=lambda s: s[0]))
            return _dump(new_steps, reason, {"at": str(INITIAL), "vv": merged, "joined": True}, (*derived, (INITIAL, merged))), new_steps

        return self._update(name, change)

    def raise_to(self, name: str, floor: Mapping[str, int], start: DLSN, reason: str = "") -> ClockBase:
        """Make local records at or after ``start`` count from at least ``floor`` (merged with
        every earlier step; never lowers anything). Idempotent."""
        path = paths.log_clock(self.cluster, name)
        wanted = {k: int(v) for k, v in floor.items() if v > 0}

        def change(data: bytes | None) -> tuple[bytes, ClockBase] | _Keep:
            # One read: the steps and the truncation base of one version (raised concurrently:
            # merged again with theirs).
            current = parse_base(data, path) if data is not None else ()
            truncation = _raw_truncation(data)  # kept as it is
            derived = parse_derived(data, path) if data is not None else ()  # stay flagged
            already = floor_at(current, DLSN(2**62, 0, 0))
            if all(already.get(k, 0) >= v for k, v in wanted.items()) and data is not None:
                return _Keep(current)
            steps = tuple(sorted((*current, (start, merge(already, wanted))), key=lambda s: s[0]))
            return _dump(steps, reason, truncation, derived), steps

        return self._update(name, change)

    def clear(self, name: str) -> None:
        try:
            self.client.delete(paths.log_clock(self.cluster, name))
        except NoNodeError:
            pass
