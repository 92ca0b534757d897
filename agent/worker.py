"""The replication worker runtime of a sink agent (DESIGN.md §7).

Every agent of a sink cluster looks at the cluster's streams every ``poll_seconds``: the running
streams' logs are the work; claims are ephemeral znodes ``streams/<id>/workers/<log>`` held
through the agent's ZooKeeper session. Each agent claims and releases by the balancing rule of
``dlctl.replication.assignment`` and runs a ``StreamWorker`` for each claim it holds. When an
agent dies its session expires, its claims vanish and other agents claim them in their next
round; the new worker resumes exactly where the sink log says (see ``dlctl.replication.worker``).

A worker that fails is restarted with a growing delay (up to 30 s) while its claim is held; its
error goes into the checkpoint, where ``dlctl replication status`` shows it. A paused, deleted or
bootstrap-needing stream's workers stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from kazoo.client import KazooClient

from dlctl.errors import ConfigError, NotFoundError
from dlctl.log.auth import Credentials
from dlctl.log.pool import AgentPool
from dlctl.meta.store import MetaStore
from dlctl.meta.zk import ZkAuth, ZkTls
from dlctl.replication import history
from dlctl.replication.assignment import WorkItem, plan_claims
from dlctl.replication.records import StreamConfig, StreamState
from dlctl.replication.source import SourceLink
from dlctl.replication.store import StreamStore
from dlctl.replication.upkeep import upkeep
from dlctl.replication.worker import (
    NeedsBootstrap,
    StreamGone,
    StreamWorker,
    WorkerOptions,
    record_error,
)

from .metrics import AgentMetrics
from .replication_config import ReplicationSettings, declared_source

log = logging.getLogger("dlagent.replication")

MAX_RESTART_DELAY = 30.0
HISTORY_SECONDS = 5.0  # how often the sources' network history is copied here


def _changed(new: StreamConfig, old: StreamConfig) -> bool:
    """A change a running worker must restart for (``dr recover`` switching a stream's filter,
    a new throttle): the list of logs growing or shrinking leaves the other logs' workers be."""
    return replace(new, logs=()) != replace(old, logs=())


@dataclass
class _Running:
    config: StreamConfig
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    worker: StreamWorker | None = None


class ReplicationService:
    def __init__(
        self,
        zk: KazooClient,
        cluster: str,
        node_id: str,
        region: str,
        secret: Credentials | bytes,  # this cluster's secret and TLS files
        zk_auth: ZkAuth | None,
        settings: ReplicationSettings,
        *,
        secret_file: Path,
        zk_auth_file: Path | None,
        zookeeper_tls: ZkTls | None = None,
        session_timeout: float = 10.0,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.node_id = node_id
        self.metrics = metrics if metrics is not None else AgentMetrics()  # workers' lag and progress
        self.region = region
        self.settings = settings
        self.sink_meta = MetaStore(zk, cluster, zk_auth)
        self.sink_pool = AgentPool(self.sink_meta, secret)
        self.streams = StreamStore(self.sink_meta)
        self._secret_file = secret_file
        self._tls = Credentials.of(secret).tls  # the default for sources (clusters sharing a CA)
        self._zk_auth_file = zk_auth_file
        self._zookeeper_tls = zookeeper_tls  # the default for sources' ZooKeeper (one ensemble CA)
        self._session_timeout = session_timeout
        self._sources: dict[str, SourceLink] = {}
        self._running: dict[WorkItem, _Running] = {}
        # Workers told to stop, until they have (their claim is released then): a round never
        # waits for them, so one slow to stop (a sink writer closing against a stalled agent,
        # a worker waiting for a sink log's ownership) does not hold up every other stream.
        self._stopping: dict[WorkItem, asyncio.Task] = {}
        self._unclaimed_since: dict[WorkItem, float] = {}
        self._history_synced = 0.0  # monotonic time of the last copy of the sources' network history
        self._upkeep_at = 0.0  # monotonic time of the last upkeep of the streams (dlctl.replication.upkeep)
        self._upkeep_task: asyncio.Task | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> ReplicationService:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.ensure_future(self._main())
        return self

    async def stop(self) -> None:
        """Stop every worker (each writes a final checkpoint) and release their claims."""
        for task in (self._task, self._upkeep_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for item in list(self._running):
            self._stop_in_background(item)
        await asyncio.gather(*self._stopping.values(), return_exceptions=True)
        for link in self._sources.values():
            await link.close()
        await self.sink_pool.close()

    @property
    def running(self) -> list[WorkItem]:
        return sorted(self._running)

    async def _zk(self, fn, *args):
        assert self._loop is not None
        return await self._loop.run_in_executor(None, fn, *args)

    async def _main(self) -> None:
        while True:
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - ZooKeeper trouble: try again next round
                log.warning("replication: round failed: %r", exc)
            await asyncio.sleep(self.settings.poll_seconds)

    async def _round(self) -> None:
        work: dict[WorkItem, StreamConfig] = {}
        claims: dict[WorkItem, str] = {}
        for stream_id in await self._zk(self.streams.list_streams):
            try:
                config = (await self._zk(self.streams.get_config, stream_id)).value
                state = (await self._zk(self.streams.get_state, stream_id)).value
                stream_claims = await self._zk(self.streams.claims, stream_id)
            except (NotFoundError, ValueError) as exc:
                log.debug("stream %s skipped: %s", stream_id, exc)
                continue
            for log_name, claim in stream_claims.items():
                claims[(stream_id, log_name)] = str(claim.get("node", ""))
            if state.state is not StreamState.RUNNING:
                continue
            checkpoints = set(await self._zk(self.streams.checkpoints, stream_id))
            for log_name in config.logs:
                if log_name in checkpoints:
                    work[(stream_id, log_name)] = config
        # Workers whose stream stopped, or whose claim this session no longer holds, stop.
        for item in list(self._running):
            running = self._running[item]
            ended = running.task is not None and running.task.done()
            if item not in work or _changed(work[item], running.config) or ended or claims.get(item) != self.node_id or not await self._zk(self.streams.holds, *item):
                # (A changed config — `dr recover` switching a stream's filter — or a worker that
                # ended because its checkpoint was reset under it: start afresh next round.)
                self._stop_in_background(item)
        now = time.monotonic()
        for item in work:
            if item in claims:
                self._unclaimed_since.pop(item, None)
            else:
                self._unclaimed_since.setdefault(item, now)
        agents = list((await self._zk(self.sink_meta.available_nodes)).keys())
        plan = plan_claims(
            work, claims, self.node_id, agents,
            {i: now - t for i, t in self._unclaimed_since.items()}, self.settings.claim_grace_seconds,
        )
        for item in plan.release:
            log.info("replication: handing %s/%s to a less loaded agent", *item)
            self._stop_in_background(item)
        for item in plan.claim:
            if await self._zk(self.streams.claim, item[0], item[1], self.node_id):
                log.info("replication: claimed stream %s, log %s", *item)
                claims[item] = self.node_id
                self._unclaimed_since.pop(item, None)
        for item, config in work.items():
            if claims.get(item) == self.node_id and item not in self._running and item not in self._stopping:
                self._start_worker(item, config)
        await self._sync_histories()
        self._maybe_upkeep(work, agents)

    def _maybe_upkeep(self, work: dict[WorkItem, StreamConfig], agents: list[str]) -> None:
        """Every ``upkeep_seconds`` the sink agent with the lowest node id keeps the running
        streams in step with their sources (``dlctl.replication.upkeep``: logs that match a
        stream's patterns join, settings propagate, deletions are handled). Its steps are
        idempotent, so two agents running it at once (membership changing) do no harm. It runs
        beside the rounds, never in them: a source whose ZooKeeper is out of reach must not hold
        up claiming, starting and stopping workers."""
        now = time.monotonic()
        if now - self._upkeep_at < self.settings.upkeep_seconds or not agents or min(agents) != self.node_id:
            return
        if self._upkeep_task is not None and not self._upkeep_task.done():
            return  # the previous one still waits on a source
        self._upkeep_at = now
        self._upkeep_task = asyncio.ensure_future(self._upkeep(list({c.stream_id: c for c in work.values()}.values())))

    async def _upkeep(self, configs: list[StreamConfig]) -> None:
        for config in configs:
            try:
                link = await self._source(config)
                report = await self._zk(upkeep, config.stream_id, self.sink_meta, link.meta)
                if report.joined or report.left or report.propagated:
                    log.info("replication: stream %s: joined %s, left %s, settings propagated %s", config.stream_id, report.joined or "-", report.left or "-", report.propagated or "-")
            except Exception as exc:  # noqa: BLE001 - a source out of reach: next time
                log.warning("replication: upkeep of stream %s: %r", config.stream_id, exc)

    async def _sync_histories(self) -> None:
        """Every ``HISTORY_SECONDS``, copy the network history of the sources of the streams
        this agent runs into the sink's (``dlctl.replication.history``): so it reaches every
        location the network connects. Best effort: a source out of reach is tried next time."""
        now = time.monotonic()
        if now - self._history_synced < HISTORY_SECONDS:
            return
        self._history_synced = now
        for config in {r.config.source_cluster: r.config for r in self._running.values()}.values():
            try:
                link = await self._source(config)
                copied = await self._zk(history.sync, link.meta, self.sink_meta)
                if copied:
                    log.info("replication: %d network event(s) of %s recorded here", copied, config.source_cluster)
            except Exception as exc:  # noqa: BLE001 - a source out of reach: next time
                log.debug("replication: network history of %s: %r", config.source_cluster, exc)

    def _start_worker(self, item: WorkItem, config: StreamConfig) -> None:
        running = _Running(config)
        running.task = asyncio.ensure_future(self._supervise(item, running))
        self._running[item] = running

    def _stop_in_background(self, item: WorkItem) -> None:
        """Tell the worker of ``item`` to stop; its final checkpoint and the release of its claim
        follow in a task of their own (``_stopping`` until then: not started again before)."""
        running = self._running.pop(item, None)
        if running is not None:
            running.stop.set()
        if item in self._stopping:
            return
        task = asyncio.ensure_future(self._stop_worker(item, running))
        self._stopping[item] = task
        task.add_done_callback(lambda _: self._stopping.pop(item, None))

    async def _stop_worker(self, item: WorkItem, running: _Running | None) -> None:
        if running is not None and running.task is not None:
            # A worker still starting (waiting for its sink log's ownership) ends at once; one
            # that runs finishes what it submitted and writes its last checkpoint first.
            starting = running.worker is not None and not running.worker.started
            try:
                await asyncio.wait_for(asyncio.shield(running.task), 0.0 if starting else 30.0)
            except TimeoutError:
                running.task.cancel()
                await asyncio.gather(running.task, return_exceptions=True)
        self.metrics.worker_stopped(*item)  # after its final checkpoint's report
        try:
            await self._zk(self.streams.release, *item)
        except Exception:  # noqa: BLE001 - the session's end releases it anyway
            pass

    async def _supervise(self, item: WorkItem, running: _Running) -> None:
        stream_id, log_name = item
        delay = 0.5
        while not running.stop.is_set():
            started = time.monotonic()
            try:
                link = await self._source(running.config)
                if running.stop.is_set():
                    return
                settings = link.settings
                worker = StreamWorker(
                    running.config, log_name, self.node_id,
                    sink_meta=self.sink_meta, sink_pool=self.sink_pool,
                    source_meta=link.meta, source_pool=link.pool, stop=running.stop,
                    options=WorkerOptions(
                        checkpoint_interval=self.settings.checkpoint_seconds,
                        pin_interval=self.settings.pin_seconds,
                        region=settings.region or self.region,
                        source_filtering=self.settings.source_filtering,
                        poll_depth=self.settings.poll_depth,
                    ),
                    observer=self.metrics.worker_observer(),
                )
                running.worker = worker
                await worker.run()
                return
            except asyncio.CancelledError:
                raise
            except StreamGone as exc:
                log.info("replication: %s", exc.message)
                return
            except NeedsBootstrap as exc:
                log.error("replication: %s", exc.message)
                await record_error(self.streams, stream_id, log_name, exc.message)
                delay = MAX_RESTART_DELAY  # nothing changes until a bootstrap; look again rarely
            except Exception as exc:  # noqa: BLE001 - any failure: record it, back off, retry
                message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                log.warning("replication: worker of stream %s, log %s failed: %s", stream_id, log_name, message)
                await record_error(self.streams, stream_id, log_name, f"worker on {self.node_id}: {message}")
                if time.monotonic() - started > 60:
                    delay = 0.5  # it ran fine for a while: this is a new problem
            try:
                await asyncio.wait_for(running.stop.wait(), delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, MAX_RESTART_DELAY)

    async def _source(self, config: StreamConfig) -> SourceLink:
        return await self.source_link(config.source_cluster, config.source_zookeeper, config.sink_cluster)

    async def source_link(self, cluster: str, connect_string: str | None = None, sink_cluster: str | None = None) -> SourceLink:
        """The open link to source ``cluster``, declared on this agent (``ConfigError`` if it is
        not, even when a link opened while it was is still open). ``connect_string``: its
        ZooKeeper as a stream's record names it, used when the declaration names none; None (a
        bootstrap's pull, which has no stream) needs one declared."""
        settings = declared_source(self.settings, cluster)  # read anew: credentials removed since are not used again
        if settings is None:
            # (A stream's record alone is never enough: whoever can write the sink's metadata
            # could otherwise point its workers, and their credentials, anywhere.)
            raise ConfigError(
                f"source cluster {cluster!r} is not declared on agent {self.node_id}: install its credentials with "
                f"`dlctl init-replication --source {cluster} --sink {sink_cluster or self.sink_meta.cluster}` (its inventory listing this agent), "
                f"or declare [replication.sources.{cluster}] in agent.toml"
            )
        link = self._sources.get(cluster)
        if link is None:
            zookeeper = settings.zookeeper or connect_string
            if not zookeeper:
                raise ConfigError(f"source cluster {cluster!r} is declared on agent {self.node_id} without a zookeeper connect string")
            link = await self._zk(
                lambda: SourceLink.open(
                    settings, zookeeper,
                    default_secret_file=self._secret_file, default_zk_auth_file=self._zk_auth_file, default_tls=self._tls,
                    default_zookeeper_tls=self._zookeeper_tls,
                    session_timeout=self._session_timeout,
                )
            )
            self._sources[cluster] = link
        return link
