"""Cluster metadata operations on ZooKeeper with versioned compare-and-set.

Every change to shared metadata either names the znode version it read (``version=``) or runs
in a transaction with ``check``; a lost race raises ``ConflictError`` naming the znode and
nothing is overwritten. Every create passes the cluster's ACL (ZooKeeper does not inherit ACLs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError, RolledBackError

from ..errors import ConflictError, NotFoundError, RefusedError
from ..names import validate_name
from . import cas, paths
from .records import (
    LogConfig,
    LogRecord,
    SegmentRecord,
    SegmentState,
    Versioned,
    load_object,
    log_from_json,
    segment_from_json,
    to_json,
)
from .zk import ZkAuth, acl_for

T = TypeVar("T")


class MetaStore:
    """The metadata of one cluster (``/dlctl/<cluster>``) seen through one kazoo client."""

    def __init__(self, client: KazooClient, cluster: str, auth: ZkAuth | None = None) -> None:
        self.client = client
        self.cluster = validate_name("cluster", cluster)
        # Without credentials of its own, the client's default ACL (dlctl.meta.zk.connect sets
        # the cluster's), and only then an open one.
        self.acl = acl_for(auth) if auth is not None or not client.default_acl else list(client.default_acl)

    # -- helpers ---------------------------------------------------------------------------

    def _ensure(self, path: str) -> None:
        self.client.ensure_path(path, acl=self.acl)

    def _read(self, path: str, decode: Callable[[bytes, str], T], missing: str) -> Versioned[T]:
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            raise NotFoundError(missing) from None
        return Versioned(decode(data, path), stat.version)

    def _allocate_log_id(self) -> int:
        """Next log id by CAS on a counter znode: ids are never reused, even after deletes."""
        path = paths.log_id_counter(self.cluster)
        self._ensure(paths.counters(self.cluster))
        try:
            self.client.create(path, b"0", acl=self.acl)
        except NodeExistsError:
            pass

        def read() -> Versioned[int]:
            data, stat = self.client.get(path)
            return Versioned(int(data), stat.version)

        def write(next_id: int, version: int) -> Versioned[int]:
            return Versioned(next_id, cas.put(self.client, path, str(next_id).encode(), version))

        # Another creator taking the id means reading again; only a stream of them could make it
        # give up, far beyond any real contention.
        return cas.update(read, lambda last: last + 1, write, what=path, attempts=1000).value

    # -- logs -------------------------------------------------------------------------------

    def create_log(self, name: str, config: LogConfig) -> LogRecord:
        path = paths.log(self.cluster, name)
        self._ensure(paths.logs(self.cluster))
        if self.client.exists(path):
            raise ConflictError(f"log {name!r} already exists in cluster {self.cluster!r}")
        record = LogRecord(name=name, log_id=self._allocate_log_id(), created=time.time(), config=config)
        tx = self.client.transaction()
        tx.create(path, to_json(record), acl=self.acl)
        tx.create(paths.log_segments(self.cluster, name), b"", acl=self.acl)
        self._clear_tombstone(tx, name)
        self._commit(tx, f"create log {name!r}")
        return record

    def list_logs(self) -> list[str]:
        try:
            return sorted(self.client.get_children(paths.logs(self.cluster)))
        except NoNodeError:
            return []

    def get_log(self, name: str) -> Versioned[LogRecord]:
        return self._read(paths.log(self.cluster, name), log_from_json, f"log {name!r} does not exist in cluster {self.cluster!r}")

    def update_log_config(self, name: str, config: LogConfig, version: int) -> Versioned[LogRecord]:
        current = self.get_log(name)
        if current.version != version:
            raise self._conflict(paths.log(self.cluster, name), version)
        updated = replace(current.value, config=config)
        path = paths.log(self.cluster, name)
        return Versioned(updated, cas.put(self.client, path, to_json(updated), version, conflict=lambda: self._conflict(path, version)))

    def delete_log(self, name: str, version: int | None = None) -> None:
        """Delete a log's metadata. Refused while it has an owner (a live writer)."""
        path = paths.log(self.cluster, name)
        current = self.get_log(name)
        if version is not None and current.version != version:
            raise self._conflict(path, version)
        if self.client.exists(paths.log_owner(self.cluster, name)):
            raise RefusedError(f"log {name!r} has a live owner", hint="stop or release its writer first")
        tx = self.client.transaction()
        for child in self.client.get_children(paths.log_segments(self.cluster, name)):
            tx.delete(f"{paths.log_segments(self.cluster, name)}/{child}")
        tx.delete(paths.log_segments(self.cluster, name))
        # Per-log records next to segments (truncation point, access mode, clock base, writer
        # bounds) go with it.
        for extra in (
            paths.log_truncation(self.cluster, name),
            paths.log_access(self.cluster, name),
            paths.log_clock(self.cluster, name),
            paths.log_bounds(self.cluster, name),
        ):
            if self.client.exists(extra):
                tx.delete(extra)
        tx.delete(path, version=current.version)
        # The deletion leaves a tombstone (in the same transaction): a log that is merely gone
        # (metadata lost) must not be taken for deleted by those replicating it.
        tombstone = json.dumps({"log_id": current.value.log_id, "deleted": time.time()}).encode()
        self._ensure(paths.deleted_logs(self.cluster))
        if self.client.exists(paths.deleted_log(self.cluster, name)):
            tx.set_data(paths.deleted_log(self.cluster, name), tombstone)
        else:
            tx.create(paths.deleted_log(self.cluster, name), tombstone, acl=self.acl)
        self._commit(tx, f"delete log {name!r}")

    def was_deleted(self, name: str) -> bool:
        """Whether log ``name`` is absent because it was deleted (its tombstone is there), as
        opposed to never created or lost with the metadata."""
        return self.client.exists(paths.deleted_log(self.cluster, name)) is not None

    def _clear_tombstone(self, tx: Any, name: str) -> None:
        if self.client.exists(paths.deleted_log(self.cluster, name)):
            tx.delete(paths.deleted_log(self.cluster, name))

    # -- segments ---------------------------------------------------------------------------

    def segments(self, name: str) -> list[Versioned[SegmentRecord]]:
        """The log's segments in sequence order, each with its znode version."""
        parent = paths.log_segments(self.cluster, name)
        try:
            children = sorted(self.client.get_children(parent))
        except NoNodeError:
            raise NotFoundError(f"log {name!r} does not exist in cluster {self.cluster!r}") from None
        out = []
        for child in children:
            try:
                data, stat = self.client.get(f"{parent}/{child}")
            except NoNodeError:
                continue  # deleted (truncated and collected) between the listing and the read
            out.append(Versioned(segment_from_json(data, f"{parent}/{child}"), stat.version))
        return out

    def create_segment(self, name: str, log: Versioned[LogRecord], segment: SegmentRecord) -> tuple[Versioned[LogRecord], Versioned[SegmentRecord]]:
        """Allocate ``segment.seq`` (must be the log's next sequence number) and create it, atomically:
        the log record's version is checked, so two writers can never create the same segment."""
        if segment.seq != log.value.max_segment_seq + 1:
            raise ValueError(f"segment seq {segment.seq} is not the next one ({log.value.max_segment_seq + 1})")
        updated = replace(log.value, max_segment_seq=segment.seq)
        log_path = paths.log(self.cluster, name)
        tx = self.client.transaction()
        tx.set_data(log_path, to_json(updated), version=log.version)
        tx.create(paths.segment(self.cluster, name, segment.seq), to_json(segment), acl=self.acl)
        self._commit(tx, f"create segment {segment.seq} of log {name!r}", conflict_path=log_path, version=log.version)
        return Versioned(updated, log.version + 1), Versioned(segment, 0)

    def get_segment(self, name: str, seq: int) -> Versioned[SegmentRecord]:
        return self._read(
            paths.segment(self.cluster, name, seq),
            segment_from_json,
            f"segment {seq} of log {name!r} does not exist in cluster {self.cluster!r}",
        )

    def update_segment(self, name: str, current: Versioned[SegmentRecord], new: SegmentRecord) -> Versioned[SegmentRecord]:
        path = paths.segment(self.cluster, name, current.value.seq)
        version = cas.put(
            self.client, path, to_json(new), current.version, conflict=lambda: self._conflict(path, current.version),
            missing=lambda: NotFoundError(f"segment {current.value.seq} of log {name!r} no longer exists"),
        )
        return Versioned(new, version)

    def delete_segment(self, name: str, current: Versioned[SegmentRecord]) -> None:
        if current.value.state is SegmentState.INPROGRESS:
            raise RefusedError(f"segment {current.value.seq} of log {name!r} is in progress; it is never deleted")
        cas.delete(self.client, paths.segment(self.cluster, name, current.value.seq), current.version)

    # -- ownership --------------------------------------------------------------------------

    def claim_owner(self, name: str, data: bytes) -> int:
        """Create the log's ephemeral owner znode holding ``data``; returns the session id that owns it.

        Raises ``ConflictError`` when another session owns the log, ``NotFoundError`` when the log
        does not exist."""
        path = paths.log_owner(self.cluster, name)
        try:
            self.client.create(path, data, acl=self.acl, ephemeral=True)
        except NodeExistsError:
            raise ConflictError(f"log {name!r} already has an owner ({path} exists)") from None
        except NoNodeError:
            raise NotFoundError(f"log {name!r} does not exist in cluster {self.cluster!r}") from None
        return self.client.client_id[0]

    def owner_of(self, name: str) -> tuple[bytes, int] | None:
        """The owner znode's data and owning session id, or None when the log has no owner."""
        try:
            data, stat = self.client.get(paths.log_owner(self.cluster, name))
        except NoNodeError:
            return None
        return data, stat.ephemeralOwner

    def release_owner(self, name: str, session_id: int) -> bool:
        """Delete the owner znode if session ``session_id`` still owns it; True if deleted."""
        path = paths.log_owner(self.cluster, name)
        try:
            _, stat = self.client.get(path)
            if stat.ephemeralOwner != session_id:
                return False
            self.client.delete(path, version=stat.version)
        except (NoNodeError, BadVersionError):
            return False
        return True

    # -- agents -----------------------------------------------------------------------------

    def cluster_config(self) -> dict:
        """The cluster's config znode (what ``cluster init`` recorded: id, marker, tls, ...);
        empty when the cluster was never initialised with ``cluster init``."""
        try:
            data, _ = self.client.get(paths.config(self.cluster))
        except NoNodeError:
            return {}
        try:
            value = json.loads(data or b"{}")
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def publish_metrics_endpoint(self, node_id: str, address: str) -> None:
        """Record where ``node_id`` serves its metrics now (the agent, at start)."""
        path = paths.metrics_endpoint(self.cluster, node_id)
        body = json.dumps({"address": address, "since": time.time()}).encode()
        try:
            self.client.set(path, body)
        except NoNodeError:
            try:
                self.client.create(path, body, acl=self.acl, makepath=True)
            except NodeExistsError:
                self.client.set(path, body)

    def metrics_endpoints(self) -> dict[str, str]:
        """node id -> the address it last served its metrics at (dead agents included)."""
        out = {}
        for node_id, data in self._children_data(paths.metrics_endpoints(self.cluster)):
            try:
                address = json.loads(data).get("address")
            except (ValueError, AttributeError):
                continue  # not ours to read: the live record still counts
            if isinstance(address, str) and address:
                out[node_id] = address
        return out

    def available_nodes(self) -> dict[str, dict]:
        """Live agents (ephemeral ``available/<id>`` records): node id -> region, rack, address, ..."""
        parent = paths.available(self.cluster)
        return {node_id: _decode_node(data, f"{parent}/{node_id}") for node_id, data in self._children_data(parent)}

    def _children_data(self, parent: str) -> list[tuple[str, bytes]]:
        """(name, data) of each child of ``parent`` in name order; children that went away
        between the listing and the read are left out."""
        try:
            children = self.client.get_children(parent)
        except NoNodeError:
            return []
        # All reads in flight at once: one round trip, not one per child (a writer's roll waits
        # for the agents' records; with the client's process busy, each trip is slow).
        pending = [(name, self.client.get_async(f"{parent}/{name}")) for name in sorted(children)]
        out = []
        for name, result in pending:
            try:
                data, _ = result.get()
            except NoNodeError:
                continue
            out.append((name, data))
        return out

    # -- operations (resumable admin work, e.g. re-replication) -----------------------------

    def claim_repair(self, name: str, seq: int, node: str, holder: str) -> bool:
        """Claim refilling ``node``'s replica of segment ``seq`` of log ``name`` for this session
        (an ephemeral znode: a dead claimant's claim goes with its session). False when another
        session holds the claim."""
        try:
            self.client.create(paths.repair_claim(self.cluster, name, seq, node), holder.encode(), acl=self.acl, ephemeral=True, makepath=True)
            return True
        except NodeExistsError:
            return False

    def release_repair(self, name: str, seq: int, node: str) -> None:
        try:
            self.client.delete(paths.repair_claim(self.cluster, name, seq, node))
        except NoNodeError:
            pass

    def _ops_parent(self) -> str:
        return f"{paths.cluster_root(self.cluster)}/ops"

    def _op_path(self, op_id: str) -> str:
        return f"{self._ops_parent()}/{validate_name('operation', op_id)}"

    def list_ops(self) -> list[str]:
        try:
            return sorted(self.client.get_children(self._ops_parent()))
        except NoNodeError:
            return []

    def get_op(self, op_id: str) -> Versioned[dict]:
        return self._read(self._op_path(op_id), _decode_op, f"operation {op_id!r} does not exist in cluster {self.cluster!r}")

    def create_op(self, op_id: str, record: dict) -> Versioned[dict]:
        """Record a new operation at ``ops/<op_id>`` (JSON). ``makepath`` because a cluster
        initialised before ``ops`` existed lacks the parent; the ACL is passed explicitly
        (ZooKeeper does not inherit it)."""
        import json

        try:
            self.client.create(self._op_path(op_id), json.dumps(record, sort_keys=True).encode(), acl=self.acl, makepath=True)
        except NodeExistsError:
            raise ConflictError(f"aborted: operation {op_id!r} was created concurrently", hint="nothing was overwritten") from None
        return Versioned(record, 0)

    def update_op(self, op_id: str, current: Versioned[dict], record: dict) -> Versioned[dict]:
        """CAS the operation record; ``ConflictError`` when someone else updated it first."""
        import json

        path = self._op_path(op_id)
        version = cas.put(
            self.client, path, json.dumps(record, sort_keys=True).encode(), current.version, conflict=lambda: self._conflict(path, current.version),
            missing=lambda: NotFoundError(f"operation {op_id!r} no longer exists"),
        )
        return Versioned(record, version)

    def delete_op(self, op_id: str, current: Versioned[dict]) -> None:
        cas.delete(self.client, self._op_path(op_id), current.version)

    # -- bulk copies (bootstrap, DESIGN.md §8): numbers reserved up front, segments committed at once --

    def reserve_segment_seqs(self, name: str, log: Versioned[LogRecord], count: int) -> Versioned[LogRecord]:
        """Reserve the next ``count`` segment sequence numbers of log ``name`` by CAS on its record.

        Reserved numbers are never handed to a writer, so replicas a copy leaves behind (an
        interrupted job) can never be mistaken for a later segment's. ``ConflictError`` when the
        log record changed since it was read."""
        if count < 1:
            raise ValueError("reserve at least one segment number")
        path = paths.log(self.cluster, name)
        updated = replace(log.value, max_segment_seq=log.value.max_segment_seq + count)
        version = cas.put(
            self.client, path, to_json(updated), log.version, conflict=lambda: self._conflict(path, log.version),
            missing=lambda: NotFoundError(f"log {name!r} does not exist in cluster {self.cluster!r}"),
        )
        return Versioned(updated, version)

    def commit_segments(self, name: str, log: Versioned[LogRecord], segments: list[SegmentRecord]) -> Versioned[LogRecord]:
        """Make copied segments visible, in order, in one ZooKeeper transaction, or change nothing.

        The transaction checks the log record is still at ``log.version`` (re-setting it, so the
        version moves on: no writer created a segment since the numbers were reserved), that the
        log has no owner (an ephemeral owner znode is created and deleted again inside the
        transaction: it fails if one exists), and creates every segment znode. ``RefusedError``
        says which of those stood in the way."""
        if not segments:
            return log
        seqs = [s.seq for s in segments]
        if seqs != sorted(seqs) or len(set(seqs)) != len(seqs) or seqs[-1] > log.value.max_segment_seq:
            raise ValueError(f"segments {seqs[0]}..{seqs[-1]} are not in order within the reserved numbers (max {log.value.max_segment_seq})")
        log_path = paths.log(self.cluster, name)
        owner_path = paths.log_owner(self.cluster, name)
        tx = self.client.transaction()
        tx.set_data(log_path, to_json(log.value), version=log.version)
        tx.create(owner_path, b"bootstrap-commit", acl=self.acl, ephemeral=True)
        tx.delete(owner_path)
        for seg in segments:
            tx.create(paths.segment(self.cluster, name, seg.seq), to_json(seg), acl=self.acl)
        results = tx.commit()
        failures = [(i, r) for i, r in enumerate(results) if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if not failures:
            return Versioned(log.value, log.version + 1)
        index, failure = failures[0]
        if index == 0 and isinstance(failure, BadVersionError):
            raise RefusedError(
                f"log {name!r} in cluster {self.cluster!r} changed since the copy reserved segments {seqs[0]}..{seqs[-1]} "
                "(a writer created a segment or its configuration changed): the copied segments cannot go before it",
                hint="nothing was committed; stop writers of the sink log and re-run (the copy is redone under new numbers)",
            )
        if index == 0 and isinstance(failure, NoNodeError):
            raise NotFoundError(f"log {name!r} was deleted from cluster {self.cluster!r} during the copy")
        if index == 1 and isinstance(failure, NodeExistsError):
            raise RefusedError(
                f"log {name!r} in cluster {self.cluster!r} has an owner (a writer or replication worker holds it): the copied "
                "segments would have to go before what it is writing",
                hint="nothing was committed; stop that writer (pause the stream) and re-run: verified copies are kept",
            )
        if isinstance(failure, NodeExistsError):
            raise RefusedError(f"log {name!r}: a segment {seqs[0]}..{seqs[-1]} already exists in cluster {self.cluster!r}", hint="nothing was committed")
        raise ConflictError(f"aborted: committing segments {seqs[0]}..{seqs[-1]} of log {name!r}: {failure!r}", hint="nothing was committed; retry")

    # -- recreating a log with its per-log records (dr recover of a location rebuilt empty) --

    def create_log_with(self, name: str, config: LogConfig, records: dict[str, bytes], *, max_segment_seq: int = 0) -> LogRecord:
        """Create log ``name`` and per-log records next to its segments (e.g. ``{"access":
        ...}``) in one transaction: nobody can open the log before those records exist (a log
        recreated read-only is never writable for a moment). ``max_segment_seq``: sequence
        numbers taken already (a recreated log must not hand out positions its earlier
        incarnation used). ``ConflictError`` when it exists."""
        path = paths.log(self.cluster, name)
        self._ensure(paths.logs(self.cluster))
        if self.client.exists(path):
            raise ConflictError(f"log {name!r} already exists in cluster {self.cluster!r}")
        if max_segment_seq < 0:
            raise ValueError("max_segment_seq must be >= 0")
        record = LogRecord(name=name, log_id=self._allocate_log_id(), created=time.time(), config=config, max_segment_seq=max_segment_seq)
        tx = self.client.transaction()
        tx.create(path, to_json(record), acl=self.acl)
        tx.create(paths.log_segments(self.cluster, name), b"", acl=self.acl)
        for child, data in sorted(records.items()):
            tx.create(f"{path}/{validate_name('log record', child)}", data, acl=self.acl)
        self._clear_tombstone(tx, name)
        self._commit(tx, f"create log {name!r}")
        return record

    # -- errors -----------------------------------------------------------------------------

    def _conflict(self, path: str, version: int) -> ConflictError:
        return cas.changed_concurrently(path, version)

    def _commit(self, tx, what: str, conflict_path: str | None = None, version: int | None = None) -> None:
        results = tx.commit()
        failures = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if not failures:
            return
        failure = failures[0]
        if isinstance(failure, BadVersionError) and conflict_path is not None:
            raise self._conflict(conflict_path, version if version is not None else -1)
        if isinstance(failure, NodeExistsError):
            raise ConflictError(f"aborted: {what}: it was created concurrently", hint="nothing was overwritten")
        if isinstance(failure, NoNodeError):
            raise NotFoundError(f"{what}: a znode it needs no longer exists")
        if isinstance(failure, (BadVersionError, NotEmptyError)):
            raise ConflictError(f"aborted: {what}: metadata changed concurrently", hint="nothing was changed; retry")
        raise failure


def _decode_node(data: bytes, where: str) -> dict:
    info = load_object(data, f"{where}: availability record")
    if not isinstance(info.get("address"), str):
        raise ValueError(f"{where}: availability record has no address")
    return info


def _decode_op(data: bytes, where: str) -> dict:
    return load_object(data, f"{where}: operation record")

