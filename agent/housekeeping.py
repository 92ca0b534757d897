"""Housekeeping (DESIGN.md §1, §9): retention, collection of truncated segments, and reclaiming
this agent's disk space.

Two roles, both in every agent:

- **Deciding** — one agent per cluster, elected in ZooKeeper at
  ``/dlctl/<cluster>/housekeeping-election`` (``[housekeeping] enabled = true`` agents stand):
  every ``check_seconds`` it applies each log's retention (age by completion time, size cap),
  finishes marking what a cut-short truncation left, marks pins that were passed, copies truncated
  segments to the cold store when the cluster requires one (``dlctl.retention.offload``; collection
  waits for the copy), sweeps expired cold copies, and deletes truncated segments' records
  (``dlctl.retention.collect.apply_log``). Metadata only: it never touches
  another agent's files. ZooKeeper sessions are the failure detector; the role moves when the
  agent dies, and it acts only while connected.
- **Reclaiming** — every agent, at start and then every ``check_seconds``: it lists its own
  replicas, reads the metadata after the listing, and deletes the **stale** ones (their segment
  was truncated and its record collected; see ``dlctl.retention.collect``). An agent that was down while
  a collection ran deletes its stale replicas this way when it comes back. Orphans (nothing in
  the metadata explains them) are reported in the log, never deleted here: ``dlctl gc --force``.

Disk-space override: with ``disk_override_free_bytes`` > 0, the elected agent asks every agent
for its free disk; when one has less, retention no longer stops at replication pins (the pins
it passes are marked as needing a bootstrap, with the reason), so a dead stream cannot fill the
disks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from kazoo.client import KazooClient, KazooState

from dlctl.log.auth import Credentials
from dlctl.log.pool import AgentPool
from dlctl.meta import coldpolicy, roles
from dlctl.meta.store import MetaStore
from dlctl.meta.zk import ZkAuth
from dlctl.retention import collect as gc
from dlctl.retention import offload

from .config import HousekeepingSettings
from .election import ElectedRole
from .metrics import AgentMetrics

log = logging.getLogger("dlagent.housekeeping")


def election_path(cluster: str) -> str:
    return roles.election_path(cluster, "housekeeping")


class Housekeeping(ElectedRole):
    """Runs in the agent's event loop (reclaiming needs the store); the election runs on a
    thread of its own because kazoo's election blocks."""

    role = "housekeeping"
    metrics_role = "housekeeper"

    def __init__(
        self,
        client: KazooClient,
        cluster: str,
        node_id: str,
        store: Any,
        secret: Credentials | bytes,  # the cluster secret and TLS files, for its agent pool
        settings: HousekeepingSettings,
        auth: ZkAuth | None = None,
        *,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.client, self.cluster, self.node_id, self.store, self.secret, self.auth = client, cluster, node_id, store, secret, auth
        self.metrics = metrics  # the role, while held (what it reclaims the store counts itself)
        self.settings = settings
        self.meta = MetaStore(client, cluster, auth)
        self.rounds = 0  # decisions taken while elected (for tests and stats)
        self._cold_manifests: dict[str, Any] = {}  # cold copies' manifests read by earlier sweeps (offload.sweep_expired)
        self.reclaimed_replicas = 0
        self._stop = threading.Event()
        self._leading = threading.Event()
        self._leader_exit = threading.Event()
        self._connected = threading.Event()
        if client.state == KazooState.CONNECTED:
            self._connected.set()
        self._guard = threading.Lock()
        self._election: Any = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._reported: set[tuple[int, int]] = set()  # orphans already logged
        self._reported_damaged: set[str] = set()  # logs whose unreadable metadata was logged (until repaired)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Housekeeping:
        """Start (from inside the agent's event loop)."""
        self.client.add_listener(self._on_state)
        if self.settings.enabled:
            self._thread = threading.Thread(target=self._election_loop, name="housekeeping-election", daemon=True)
            self._thread.start()
        else:
            log.info("housekeeping: this agent does not stand for election ([housekeeping] enabled = false); it still reclaims its own stale replicas")
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())
        log.info("housekeeping started: every %gs", self.settings.check_seconds)
        return self

    async def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._leader_exit.set()
        with self._guard:
            if self._election is not None:
                self._election.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, timeout)
        self.client.remove_listener(self._on_state)
        log.info("housekeeping stopped")

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._connected.set()
            return
        self._connected.clear()
        if state == KazooState.LOST:
            self._leading.clear()
            self._leader_exit.set()

    # -- the election ------------------------------------------------------------------------

    def _election_path(self) -> str:
        return election_path(self.cluster)

    def _lead(self) -> None:
        if self._leader_exit.is_set() or self._stop.is_set():
            return
        log.info("elected housekeeper of cluster %s", self.cluster)
        self._leading.set()
        try:
            self._leader_exit.wait()
        finally:
            self._leading.clear()
            log.info("no longer the housekeeper")

    # -- the rounds ------------------------------------------------------------------------

    async def _run(self) -> None:
        delay = 0.5
        # Reclaim at once on start: an agent that was down during a collection catches up now.
        while not self._stop.is_set():
            try:
                await self.reclaim()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - ZooKeeper not ready yet and the like
                log.warning("housekeeping: reclaiming on start failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.check_seconds)
        while not self._stop.is_set():
            await asyncio.sleep(self.settings.check_seconds)
            try:
                if self._leading.is_set() and self._connected.is_set():
                    await self.decide()
                await self.reclaim()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("housekeeping round failed; retrying in %gs", self.settings.check_seconds)

    async def decide(self) -> list[dict[str, Any]]:
        """The elected agent's round: retention and collection for every log (metadata only)."""
        loop = asyncio.get_running_loop()
        override = await self._disk_override()
        names = await loop.run_in_executor(None, self.meta.list_logs)
        # Read once per round, not once per log: is a cold copy required, and the store to make it.
        cold_required = await loop.run_in_executor(None, lambda: coldpolicy.load(self.meta) is not None)
        cold = await loop.run_in_executor(None, self._cold_store) if cold_required else None
        results = []
        for name in names:
            if not (self._leading.is_set() and self._connected.is_set()) or self._stop.is_set():
                break  # lost the role or the connection: the next housekeeper takes over
            try:
                result = await loop.run_in_executor(None, lambda name=name: self._apply_log(name, override, cold[0] if cold else None, cold_required))
            except Exception as exc:  # noqa: BLE001 - one log's trouble must not stop the others
                log.warning("housekeeping: log %r: %s: %s", name, type(exc).__name__, exc)
                continue
            results.append(result)
            if result.get("retention"):
                log.info("housekeeping: log %r truncated to %s (%s)", name, result.get("truncation_point"), result["retention"])
            if result.get("pins_marked_for_bootstrap"):
                log.warning("housekeeping: log %r: pin(s) of %s passed: marked as needing a bootstrap", name, ", ".join(result["pins_marked_for_bootstrap"]))
            if result.get("offloaded"):
                log.info("housekeeping: log %r: segment(s) %s copied to the cold store", name, result["offloaded"])
            if result.get("offload_waiting"):
                log.warning("housekeeping: log %r: truncated segment(s) kept until copied to the cold store: %s", name, result["offload_waiting"])
            if result.get("segments_collected"):
                log.info("housekeeping: log %r: %d truncated segment record(s) collected (%d bytes)", name, len(result["segments_collected"]), result.get("bytes_collected", 0))
        if cold is not None and self._leading.is_set():
            try:
                per_log = await loop.run_in_executor(None, offload.cold_retentions, self.meta)
                swept = await loop.run_in_executor(None, lambda: offload.sweep_expired(cold[0], cold[1], per_log=per_log, seen=self._cold_manifests))
                if swept["deleted"]:
                    log.info("housekeeping: %d cold cop(ies) past their retention deleted", swept["deleted"])
            except Exception as exc:  # noqa: BLE001 - the store may be down: next round
                log.warning("housekeeping: sweeping expired cold copies: %s", exc)
        self.rounds += 1
        return results

    def _apply_log(self, name: str, override: str | None, cold_store: Any = None, cold_required: bool | None = None) -> dict[str, Any]:
        """Retention and collection for one log (a worker thread). With the secret, retention
        records a replicated log's clock base at the new point first, while the records before
        it are still readable (``dlctl.replication.truncation_base``)."""
        return gc.apply_log(
            self.meta, name, by=f"housekeeping {self.node_id}", override=override, secret=self.secret, cold_store=cold_store, cold_required=cold_required,
            cold_rate=self.settings.offload_bytes_per_second,
        )

    def _cold_store(self) -> Any:
        """(store, retention) of the cold store the cluster requires, reached with this agent's
        credentials; None when none is required or it cannot be opened here (truncated segments
        then wait: gc collects only those with a copy)."""
        try:
            return offload.required_store(self.meta, self.settings.cold_credentials_file)
        except Exception as exc:  # noqa: BLE001 - a bad record or no boto3: collection waits, says why
            log.warning("housekeeping: the cluster's cold store cannot be opened here: %s", exc)
            return None

    async def _disk_override(self) -> str | None:
        threshold = self.settings.disk_override_free_bytes
        if threshold <= 0:
            return None
        pool = AgentPool(self.meta, self.secret, request_timeout=5.0)
        try:
            nodes = await pool.refresh()

            async def free(node: str) -> tuple[str, int | None]:
                try:
                    stat = await (await pool.client(node)).stat()
                    return node, int(stat.get("disk_free_bytes", -1))
                except Exception:  # noqa: BLE001 - an agent that does not answer tells nothing
                    return node, None

            answers = await asyncio.gather(*(free(n) for n in sorted(nodes)))
        finally:
            await pool.close()
        short = [(n, f) for n, f in answers if f is not None and 0 <= f < threshold]
        if not short:
            return None
        node, left = min(short, key=lambda x: x[1])
        reason = f"disk-space override: agent {node} has {left} bytes free (< {threshold})"
        log.warning("housekeeping: %s; retention no longer stops at replication pins", reason)
        return reason

    async def reclaim(self) -> dict[str, Any]:
        """Delete this agent's stale replicas (metadata read after the listing); report orphans."""
        loop = asyncio.get_running_loop()
        infos = self.store.list_segments()
        if not infos:
            return {"deleted": 0, "bytes": 0, "orphans": 0}
        ids = {i.log_id for i in infos}
        views = await loop.run_in_executor(None, lambda: gc.load_views(self.meta, ids, full=False))
        stale, orphans = gc.classify(self.node_id, infos, views)
        damaged = views.damaged()
        self._reported_damaged &= set(damaged)
        for name, why in sorted(damaged.items()):
            if name not in self._reported_damaged:  # once, not every round
                self._reported_damaged.add(name)
                log.warning("housekeeping: log %r: its metadata cannot be read (%s): none of its replicas here is judged or deleted until it is repaired", name, why)
        deleted = nbytes = 0
        gate = asyncio.Semaphore(self.settings.delete_concurrency)
        pace = gc.Pace(self.settings.delete_rate)

        async def one(replica: gc.Replica) -> None:
            nonlocal deleted, nbytes
            async with gate:
                await pace.wait()
                if self._stop.is_set():
                    return
                if await self.store.delete(replica.log_id, replica.seq):
                    deleted += 1
                    nbytes += replica.bytes

        await asyncio.gather(*(one(r) for r in stale))
        if deleted:
            self.reclaimed_replicas += deleted
            log.info("housekeeping: deleted %d stale replica(s) of truncated segments (%d bytes)", deleted, nbytes)
        for orphan in orphans:
            key = (orphan.log_id, orphan.seq)
            if key not in self._reported:
                self._reported.add(key)
                log.warning("housekeeping: orphan replica log id %d segment %d (%d bytes): %s; `dlctl gc --force` deletes it", orphan.log_id, orphan.seq, orphan.bytes, orphan.why)
        return {"deleted": deleted, "bytes": nbytes, "orphans": len(orphans)}


__all__ = ["Housekeeping", "election_path"]
