"""Stream metadata in the sink cluster's ZooKeeper: config, state, checkpoints, worker claims.

Every change is a compare-and-set (or a create that fails when the znode exists); a lost race
is a ``ConflictError`` naming the znode. Worker claims are ephemeral: they vanish with the
claiming agent's session, which is how a dead worker's logs are handed to another agent.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)

from ..errors import ConflictError, NotFoundError, RefusedError
from ..meta import cas, paths
from ..meta.records import Versioned
from ..meta.store import MetaStore
from .records import TRANSITIONS, Checkpoint, StreamConfig, StreamState, StreamStatus


class StreamStore:
    def __init__(self, meta: MetaStore) -> None:
        self.meta = meta
        self.client = meta.client
        self.cluster = meta.cluster

    # -- streams ----------------------------------------------------------------------------

    def list_streams(self) -> list[str]:
        return self._children(paths.streams(self.cluster))

    def exists(self, stream_id: str) -> bool:
        return self.client.exists(paths.stream_config(self.cluster, stream_id)) is not None

    def get_config(self, stream_id: str) -> Versioned[StreamConfig]:
        path = paths.stream_config(self.cluster, stream_id)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            raise NotFoundError(f"stream {stream_id!r} does not exist in cluster {self.cluster!r}", hint="list streams with `dlctl replication list`") from None
        return Versioned(StreamConfig.from_json(data, path), stat.version)

    def create(self, config: StreamConfig) -> Versioned[StreamConfig]:
        """Create the stream (config and ``setting-up`` state) in one transaction; when it
        already exists, return it as it is (the caller compares)."""
        base = paths.stream(self.cluster, config.stream_id)
        self.client.ensure_path(paths.streams(self.cluster), acl=self.meta.acl)
        tx = self.client.transaction()
        tx.create(base, b"", acl=self.meta.acl)
        tx.create(paths.stream_config(self.cluster, config.stream_id), config.to_json(), acl=self.meta.acl)
        tx.create(paths.stream_state(self.cluster, config.stream_id), StreamStatus(StreamState.SETTING_UP, time.time()).to_json(), acl=self.meta.acl)
        tx.create(paths.stream_checkpoints(self.cluster, config.stream_id), b"", acl=self.meta.acl)
        tx.create(paths.stream_workers(self.cluster, config.stream_id), b"", acl=self.meta.acl)
        results = tx.commit()
        if any(isinstance(r, NodeExistsError) for r in results):
            return self.get_config(config.stream_id)
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            raise ConflictError(f"aborted: creating stream {config.stream_id!r}: {failures[0]!r}", hint="nothing was created; retry")
        return Versioned(config, 0)

    def update_config(self, current: Versioned[StreamConfig], new: StreamConfig) -> Versioned[StreamConfig]:
        path = paths.stream_config(self.cluster, new.stream_id)
        return Versioned(new, cas.put(self.client, path, new.to_json(), current.version, conflict=lambda: self._conflict(path)))

    def get_state(self, stream_id: str) -> Versioned[StreamStatus]:
        path = paths.stream_state(self.cluster, stream_id)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            raise NotFoundError(f"stream {stream_id!r} has no state in cluster {self.cluster!r}") from None
        return Versioned(StreamStatus.from_json(data, path), stat.version)

    def set_state(self, stream_id: str, current: Versioned[StreamStatus], state: StreamState, reason: str = "", details: dict | None = None) -> Versioned[StreamStatus]:
        """Change the state by CAS; the epoch grows by one. Only the moves of ``TRANSITIONS``: a
        failed-over stream stays failed over (only deleting it ends it)."""
        path = paths.stream_state(self.cluster, stream_id)
        if state not in TRANSITIONS[current.value.state]:
            if current.value.state is StreamState.FAILED_OVER:
                raise RefusedError(
                    f"stream {stream_id!r} was failed over ({current.value.reason}); it can never run again",
                    hint="set up the reverse direction with `dlctl failback`, or delete the stream",
                )
            raise RefusedError(f"stream {stream_id!r} cannot go from {current.value.state.value} to {state.value}")
        new = StreamStatus(state, time.time(), reason, current.value.epoch + 1, dict(details if details is not None else current.value.details))
        return Versioned(new, cas.put(self.client, path, new.to_json(), current.version, conflict=lambda: self._conflict(path)))

    def delete(self, stream_id: str) -> bool:
        """Remove the stream and everything under it (idempotent). Live worker claims vanish
        too; their workers notice (their checkpoint writes fail) and stop."""
        base = paths.stream(self.cluster, stream_id)
        for _ in range(8):
            try:
                self.client.delete(base, recursive=True)
                return True
            except NoNodeError:
                return False
            except NotEmptyError:
                continue  # a claim raced in: delete again
        raise ConflictError(f"aborted: {base} kept getting new children", hint="pause the stream first, then delete")

    # -- checkpoints ------------------------------------------------------------------------

    def get_drift(self, stream_id: str) -> dict[str, dict]:
        """log -> {"kind", "detail", "since"}: what the stream's upkeep last found ({} none)."""
        try:
            data, _ = self.meta.client.get(paths.stream_drift(self.cluster, stream_id))
            found = json.loads(data)
        except (NoNodeError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def set_drift(self, stream_id: str, drift: dict[str, dict]) -> None:
        body = json.dumps(drift, sort_keys=True).encode()
        path = paths.stream_drift(self.cluster, stream_id)
        try:
            self.meta.client.set(path, body)
        except NoNodeError:
            try:
                self.meta.client.create(path, body, acl=self.meta.acl)
            except NodeExistsError:
                self.meta.client.set(path, body)

    def checkpoints(self, stream_id: str) -> list[str]:
        return self._children(paths.stream_checkpoints(self.cluster, stream_id))

    def get_checkpoint(self, stream_id: str, log: str) -> Versioned[Checkpoint]:
        path = paths.stream_checkpoint(self.cluster, stream_id, log)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            raise NotFoundError(f"stream {stream_id!r} has no checkpoint for log {log!r} in cluster {self.cluster!r}") from None
        return Versioned(Checkpoint.from_json(data, path), stat.version)

    def create_checkpoint(self, stream_id: str, checkpoint: Checkpoint) -> Versioned[Checkpoint]:
        """Create it unless it exists (then the existing one is returned untouched)."""
        path = paths.stream_checkpoint(self.cluster, stream_id, checkpoint.log)
        try:
            self.client.create(path, replace(checkpoint, updated=time.time()).to_json(), acl=self.meta.acl)
        except NodeExistsError:
            return self.get_checkpoint(stream_id, checkpoint.log)
        except NoNodeError:
            raise NotFoundError(f"stream {stream_id!r} does not exist in cluster {self.cluster!r}") from None
        return Versioned(checkpoint, 0)

    def update_checkpoint(self, stream_id: str, current: Versioned[Checkpoint], new: Checkpoint) -> Versioned[Checkpoint]:
        path = paths.stream_checkpoint(self.cluster, stream_id, new.log)
        new = replace(new, updated=time.time())
        version = cas.put(
            self.client, path, new.to_json(), current.version, conflict=lambda: self._conflict(path),
            missing=lambda: NotFoundError(f"checkpoint {path} was deleted (the stream was deleted)"),
        )
        return Versioned(new, version)

    def delete_checkpoint(self, stream_id: str, log: str) -> None:
        try:
            self.client.delete(paths.stream_checkpoint(self.cluster, stream_id, log))
        except NoNodeError:
            pass

    # -- worker claims ----------------------------------------------------------------------

    def claims(self, stream_id: str) -> dict[str, dict]:
        """log -> the claim's record (node, since, session) for every claimed log of the stream."""
        parent = paths.stream_workers(self.cluster, stream_id)
        out = {}
        for log in self._children(parent):
            try:
                data, stat = self.client.get(f"{parent}/{log}")
            except NoNodeError:
                continue
            try:
                record = json.loads(data)
            except ValueError:
                record = {"node": data.decode(errors="replace")}
            record["session"] = stat.ephemeralOwner
            out[log] = record
        return out

    def claim(self, stream_id: str, log: str, node: str) -> bool:
        """Claim ``log`` of the stream for this session's worker; False when someone holds it."""
        path = paths.stream_worker(self.cluster, stream_id, log)
        data = json.dumps({"node": node, "since": time.time()}).encode()
        try:
            self.client.create(path, data, acl=self.meta.acl, ephemeral=True)
            return True
        except NodeExistsError:
            return False
        except NoNodeError:
            return False  # the stream was deleted meanwhile

    def holds(self, stream_id: str, log: str) -> bool:
        """Does this session still hold the claim?"""
        try:
            _, stat = self.client.get(paths.stream_worker(self.cluster, stream_id, log))
        except NoNodeError:
            return False
        client_id = self.client.client_id
        return client_id is not None and stat.ephemeralOwner == client_id[0]

    def release(self, stream_id: str, log: str) -> None:
        path = paths.stream_worker(self.cluster, stream_id, log)
        try:
            _, stat = self.client.get(path)
            client_id = self.client.client_id
            if client_id is not None and stat.ephemeralOwner == client_id[0]:
                self.client.delete(path, version=stat.version)
        except (NoNodeError, BadVersionError):
            pass

    # -- helpers ----------------------------------------------------------------------------

    def configs(self) -> list[StreamConfig]:
        """Every stream's configuration that can be read now (a stream being deleted, or one
        whose record does not parse, carries nothing and is left out)."""
        out = []
        for stream_id in self.list_streams():
            try:
                out.append(self.get_config(stream_id).value)
            except (NotFoundError, ValueError):
                continue
        return out

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self.client.get_children(path))
        except NoNodeError:
            return []

    def wait_released(self, stream_id: str, timeout: float) -> bool:
        """Wait until no worker holds a log of the stream (after a pause or a stop: each writes
        a last checkpoint and pin, then lets its claim go); False when some still do after
        ``timeout`` seconds. A watch on the claims says when to look again."""
        parent = paths.stream_workers(self.cluster, stream_id)
        deadline = time.monotonic() + timeout
        changed = threading.Event()
        while True:
            changed.clear()
            try:
                held = self.client.get_children(parent, watch=lambda _event: changed.set())
            except NoNodeError:
                return True  # no claim was ever made (or the stream is gone)
            if not held:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            changed.wait(min(left, 1.0))  # (and look again now and then: a watch lost to a reconnect)

    def _conflict(self, path: str) -> ConflictError:
        return ConflictError(f"aborted: {path} changed concurrently", hint="nothing was overwritten; read it again and retry")
