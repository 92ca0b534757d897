"""Retention pins (DESIGN.md §7, §9): what a source cluster must keep for its consumers.

A pin lives in the *source* cluster at ``pins/<holder>/<log>``. ``holder`` is a replication
stream id, or ``bootstrap-<stream>`` for the extra pin a bootstrap copy holds while it runs.
``position`` is the first DLSN the holder still needs: segments whose sequence number is at or
after ``position.segment_seq`` must not be deleted, whatever truncation or TTL say. Every update
is a compare-and-set, and a pin never moves backwards (a late report cannot un-protect data).

A pin that has not been refreshed for ``max_age_seconds`` no longer protects anything (a dead
stream must not fill the disks); neither does any pin once an agent's free disk falls below its
threshold. Whoever deletes pinned data then marks the pin ``needs_bootstrap`` with the reason,
and the stream's status shows it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from kazoo.exceptions import NodeExistsError, NoNodeError

from ..errors import ConflictError, CorruptMetadata, NotFoundError
from ..log.dlsn import DLSN
from ..names import validate_name
from . import cas, paths
from .records import Versioned
from .store import MetaStore

DEFAULT_MAX_AGE = 7 * 24 * 3600.0


@dataclass(frozen=True)
class PinRecord:
    holder: str  # stream id, or bootstrap-<stream>
    log: str
    position: DLSN  # first position still needed; everything before it may go
    sink_cluster: str = ""
    created: float = 0.0
    updated: float = 0.0  # last refresh by the holder; the age is measured from here
    max_age_seconds: float = DEFAULT_MAX_AGE
    needs_bootstrap: bool = False
    reason: str = ""  # why needs_bootstrap was set

    def expired(self, now: float | None = None) -> bool:
        return ((now if now is not None else time.time()) - self.updated) > self.max_age_seconds

    def protects(self, segment_seq: int, now: float | None = None) -> bool:
        """Does this (live) pin keep segment ``segment_seq``?"""
        return not self.needs_bootstrap and not self.expired(now) and segment_seq >= self.position.segment_seq

    def to_json(self) -> bytes:
        raw = asdict(self)
        raw["position"] = str(self.position)
        return json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> PinRecord:
        try:
            raw: Any = json.loads(data)
            if not isinstance(raw, dict):
                raise ValueError("expected a JSON object")
            return cls(**{**raw, "position": DLSN.parse(raw["position"])})
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
            raise CorruptMetadata(f"{where}: malformed pin record: {exc}") from None


def pins_root(cluster: str) -> str:
    return f"{paths.cluster_root(cluster)}/pins"


def holder_path(cluster: str, holder: str) -> str:
    return f"{pins_root(cluster)}/{validate_name('pin holder', holder)}"


def pin_path(cluster: str, holder: str, log: str) -> str:
    return f"{holder_path(cluster, holder)}/{validate_name('log', log)}"


class PinStore:
    """Pins of one (source) cluster."""

    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self.client = meta.client
        self.cluster = meta.cluster

    def get(self, holder: str, log: str) -> Versioned[PinRecord]:
        path = pin_path(self.cluster, holder, log)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            raise NotFoundError(f"no pin of {holder!r} on log {log!r} in cluster {self.cluster!r}") from None
        return Versioned(PinRecord.from_json(data, path), stat.version)

    def set(self, pin: PinRecord) -> Versioned[PinRecord]:
        """Create the pin, or move it forward (never backwards) and refresh its age, by CAS.

        Re-setting a pin that needs bootstrap keeps that mark: only ``reset`` clears it (after a
        bootstrap put the sink back on retained data)."""
        path = pin_path(self.cluster, pin.holder, pin.log)
        now = time.time()

        def read() -> Versioned[PinRecord | None]:
            try:
                return self.get(pin.holder, pin.log)
            except NotFoundError:
                return Versioned(None, cas.ABSENT)

        def change(old: PinRecord | None) -> PinRecord:
            if old is None:
                return replace(pin, created=pin.created or now, updated=now)
            return replace(
                old,
                position=max(old.position, pin.position),
                updated=now,
                max_age_seconds=pin.max_age_seconds,
                sink_cluster=pin.sink_cluster or old.sink_cluster,
            )

        def write(new: PinRecord, version: int) -> Versioned[PinRecord]:
            # (Deleted meanwhile: a conflict too, so the next round creates it again.)
            return Versioned(new, cas.put(self.client, path, new.to_json(), version, acl=self.meta.acl, makepath=True))

        # Idempotent: derived again from its own result (same ``now``), it changes nothing.
        return cas.update(read, change, write, what=f"pin {path}", attempts=16, idempotent=True)

    def reset(self, pin: PinRecord) -> Versioned[PinRecord]:
        """Replace the pin outright (position may move, needs_bootstrap cleared): for bootstrap."""
        path = pin_path(self.cluster, pin.holder, pin.log)
        fresh = replace(pin, updated=time.time(), created=pin.created or time.time(), needs_bootstrap=False, reason="")
        try:
            current = self.get(pin.holder, pin.log)
        except NotFoundError:
            try:
                self.client.create(path, fresh.to_json(), acl=self.meta.acl, makepath=True)
                return Versioned(fresh, 0)
            except NodeExistsError:
                raise ConflictError(f"aborted: pin {path} was created concurrently", hint="retry") from None
        version = cas.put(self.client, path, fresh.to_json(), current.version, conflict=lambda: ConflictError(f"aborted: pin {path} changed concurrently", hint="retry"))
        return Versioned(fresh, version)

    def mark_needs_bootstrap(self, current: Versioned[PinRecord], reason: str) -> Versioned[PinRecord]:
        """Record that data this pin wanted was deleted anyway (age or disk override), by CAS."""
        path = pin_path(self.cluster, current.value.holder, current.value.log)
        new = replace(current.value, needs_bootstrap=True, reason=reason)
        version = cas.put(
            self.client, path, new.to_json(), current.version,
            conflict=lambda: ConflictError(f"aborted: pin {path} changed concurrently", hint="read it again and retry"),
            missing=lambda: NotFoundError(f"pin {path} was deleted concurrently"),
        )
        return Versioned(new, version)

    def delete(self, holder: str, log: str | None = None) -> int:
        """Delete one pin, or every pin of ``holder``; returns how many went. Idempotent."""
        logs = [log] if log is not None else self._children(holder_path(self.cluster, holder))
        deleted = 0
        for name in logs:
            try:
                self.client.delete(pin_path(self.cluster, holder, name))
                deleted += 1
            except NoNodeError:
                pass
        if log is None:
            try:
                self.client.delete(holder_path(self.cluster, holder))
            except (NoNodeError, Exception):  # noqa: BLE001 - not empty (a pin raced in) or gone: fine
                pass
        return deleted

    def holders(self) -> list[str]:
        return self._children(pins_root(self.cluster))

    def pins_of_log(self, log: str) -> list[Versioned[PinRecord]]:
        """Every pin on ``log`` (from every holder), expired ones included."""
        out = []
        for holder in self.holders():
            try:
                out.append(self.get(holder, log))
            except NotFoundError:
                continue
        return out

    def protecting(self, log: str, segment_seqs: Iterable[int], now: float | None = None) -> dict[int, list[str]]:
        """For each segment sequence number, the holders of live pins that keep it."""
        pins = [p.value for p in self.pins_of_log(log)]
        return {seq: [p.holder for p in pins if p.protects(seq, now)] for seq in segment_seqs}

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self.client.get_children(path))
        except NoNodeError:
            return []


def pin_overrun_reason(pin: PinRecord, point: DLSN, now: float, forced: str | None) -> str:
    if pin.expired(now):
        return (
            f"pin expired (not refreshed for {now - pin.updated:.0f}s, max age {pin.max_age_seconds:g}s) and log "
            f"{pin.log!r} was truncated to {point}, past its position {pin.position}"
        )
    if forced:
        return f"{forced}: log {pin.log!r} truncated to {point}, past its position {pin.position}"
    return f"log {pin.log!r} was already truncated to {point} when the pin was set at {pin.position}"


def mark_pins(pins: PinStore, overrun: list[Versioned[PinRecord]], point: DLSN, now: float, forced: str | None) -> list[str]:
    """Mark the holders whose pins ``point`` passes as needing a bootstrap (CAS; a pin that
    changed meanwhile is looked at again)."""
    marked = []
    for versioned in overrun:
        current = versioned
        for _ in range(8):
            if current.value.needs_bootstrap or not point > current.value.position:
                break  # the holder moved on, or someone marked it already
            try:
                pins.mark_needs_bootstrap(current, pin_overrun_reason(current.value, point, now, forced))
                marked.append(current.value.holder)
                break
            except ConflictError:
                try:
                    current = pins.get(current.value.holder, current.value.log)
                except NotFoundError:
                    break
            except NotFoundError:
                break
    return marked
