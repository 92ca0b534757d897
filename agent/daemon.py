"""``dlagent serve``: wires configuration, identity, storage, the protocol server and the
ZooKeeper registration together, and shuts them down in the safe order.

Order matters: the metrics endpoint binds first (an address it cannot have fails the start
before anything began); storage is recovered before the server listens; the agent is announced
in ZooKeeper, with its metrics address, only once it can serve; on shutdown it disappears from
ZooKeeper first, so no client is sent to an agent that is closing. A failed fsync stops the
agent (exit 1): it must never acknowledge what may be lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time

from dlctl import __version__
from dlctl.errors import ConfigError
from dlctl.log.auth import Credentials
from dlctl.log.pool import AgentPool
from dlctl.meta.store import MetaStore
from dlctl.meta.zk import ZkAuth, check_credentials, connect, loopback_only
from dlctl.secrets import read_secret_file

from .auditor import Auditor
from .config import AgentConfig
from .housekeeping import Housekeeping
from .metrics import AgentMetrics
from .metrics_http import MetricsEndpoint
from .disk import prepare_data_dir
from .fdlimit import check_headroom, raise_nofile_limit
from .pull import RangePuller
from .segment_pull import SegmentPuller
from .proxy import ProxyOptions, WriteProxy
from .registry import Registration
from .server import AgentServer
from .storage import SegmentStore, SyncPolicy

log = logging.getLogger("dlagent")

EXIT_OK = 0
EXIT_STORAGE_FAILED = 1

STORE_OPEN_FILES = 512  # SegmentStore's default max_open_files
DESCRIPTOR_RESERVE = 64  # ZooKeeper, the log, locks, directories being fsynced, scrubbing, threads


def _start_proxy(config: AgentConfig, zk, zk_auth: ZkAuth | None, credentials: Credentials, server: AgentServer) -> WriteProxy | None:
    """The write proxy shares the agent's ZooKeeper session: if the session ends, so does every
    ownership it holds, and with it every writer (they fail, fenced, rather than write on)."""
    if not config.proxy.enabled:
        log.info("write proxy disabled by configuration ([proxy] enabled = false)")
        return None
    meta = MetaStore(zk, config.cluster, zk_auth)
    options = ProxyOptions(
        max_log_bytes=config.proxy.max_log_bytes,
        batch_delay=config.proxy.batch_delay_ms / 1000.0,
        idle_release=config.proxy.idle_release_seconds,
        producer_id_ttl=config.proxy.producer_id_ttl,
    )
    proxy = WriteProxy(meta, AgentPool(meta, credentials), config.node_id, config.advertise, options).start()
    server.proxy = proxy
    return proxy


def _start_replication(config: AgentConfig, zk, zk_auth: ZkAuth | None, credentials: Credentials, metrics: AgentMetrics):
    """Replication workers for the streams whose sink is this cluster (dlagent.worker)."""
    if not config.replication.enabled:
        log.info("replication workers disabled by configuration ([replication] enabled = false)")
        return None
    from .worker import ReplicationService

    return ReplicationService(
        zk, config.cluster, config.node_id, config.region, credentials, zk_auth, config.replication,
        secret_file=config.secret_file, zk_auth_file=config.zk_auth_file, zookeeper_tls=config.zookeeper_tls,
        session_timeout=max(config.session_timeout, 4.0), metrics=metrics,
    ).start()


def _check_tls_mode(config: AgentConfig, cluster_config: dict) -> None:
    """Serve the way the cluster's clients will talk: ``cluster init`` recorded TLS or not."""
    recorded = cluster_config.get("tls")
    if recorded is True and config.tls is None:
        raise ConfigError(
            f"{config.path}: cluster {config.cluster!r} runs TLS (cluster init), but this agent has no [tls] table",
            hint="`dlctl agent install` delivers the certificate and writes [tls]; or add ca_file, cert_file, key_file",
        )
    if recorded is False and config.tls is not None:
        raise ConfigError(
            f"{config.path}: [tls] is set, but cluster {config.cluster!r} was initialised with --no-tls: its clients speak plaintext",
            hint="remove [tls] from agent.toml, or re-initialise the cluster with TLS",
        )


def _start_metrics(config: AgentConfig, metrics: AgentMetrics) -> MetricsEndpoint | None:
    if config.metrics.listen is None:
        log.info("metrics endpoint off ([metrics] listen = \"off\")")
        return None
    host, port = config.metrics.listen
    # Bound to every interface, it is published under the host clients use for the agent.
    advertise_host = config.advertise.rpartition(":")[0].strip("[]")
    return MetricsEndpoint.start(metrics.registry, host, port, advertise_host=advertise_host, config_path=config.path)


def _remember_metrics_endpoint(zk, config: AgentConfig, zk_auth: ZkAuth | None, address: str) -> None:
    """A persistent record of where the metrics are (``dlctl cluster metrics-targets``): unlike the
    availability record it outlives the agent, so Prometheus keeps scraping a dead agent and
    reports it down instead of forgetting it. Not fatal: the live record has the address too."""
    try:
        MetaStore(zk, config.cluster, zk_auth).publish_metrics_endpoint(config.node_id, address)
    except Exception as exc:  # noqa: BLE001 - logged; serving does not depend on it
        log.warning("could not record the metrics endpoint %s in ZooKeeper: %s", address, exc)


async def serve(config: AgentConfig) -> int:
    metrics = AgentMetrics.for_agent(config)
    endpoint = _start_metrics(config, metrics)
    try:
        return await _serve(config, metrics, endpoint.address if endpoint is not None else None)
    finally:
        if endpoint is not None:
            await asyncio.get_running_loop().run_in_executor(None, endpoint.close)


async def _serve(config: AgentConfig, metrics: AgentMetrics, metrics_address: str | None) -> int:
    # Every connection and open replica file is a descriptor: use all the operator allows, and
    # say so when even that is short of what the limits may need (reads would fail with EMFILE).
    raise_nofile_limit()
    check_headroom(config.server.descriptors() + STORE_OPEN_FILES + DESCRIPTOR_RESERVE)
    secret = read_secret_file(config.secret_file)
    zk_auth = ZkAuth.from_file(config.zk_auth_file) if config.zk_auth_file else None
    loop = asyncio.get_running_loop()
    if zk_auth is not None and config.zookeeper_tls is None and not loopback_only(config.zookeeper):
        log.warning("no [zookeeper_tls] in %s: the ZooKeeper password of %s crosses the network in plain text", config.path, config.zk_auth_file)
    zk = await loop.run_in_executor(None, lambda: connect(config.zookeeper, zk_auth, session_timeout=config.session_timeout, tls=config.zookeeper_tls))
    await loop.run_in_executor(None, check_credentials, zk, config.cluster, zk_auth, config.zk_auth_file)
    _check_tls_mode(config, MetaStore(zk, config.cluster, zk_auth).cluster_config())
    # Before the store opens: a new or wiped data directory marks what the node held as limbo,
    # so it never answers "no such entry" for what its previous disk acknowledged (agent/disk.py).
    disk = await loop.run_in_executor(None, prepare_data_dir, zk, config.cluster, config.node_id, config.data_dir, zk_auth)
    if disk.fresh:
        log.info("fresh data directory %s (disk %s): %d replica(s) to be re-copied", config.data_dir, disk.identity.disk_id, len(disk.forgotten))

    store = SegmentStore(
        config.data_dir,
        SyncPolicy(
            mode=config.storage.sync,
            window_ms=config.storage.group_commit_ms,
            window_bytes=config.storage.group_commit_bytes,
            inline_bytes=config.storage.inline_sync_bytes,
            prealloc_bytes=config.storage.preallocate_bytes,
        ),
        metrics=metrics,
    )
    report = await store.open()
    metrics.watch(store)
    log.info("storage recovered: %s", report.to_dict() if hasattr(report, "to_dict") else report)
    if config.storage.sync == "never":
        log.warning("sync = never: acknowledged entries may be lost if this node loses power; only replication protects them")

    stopping = asyncio.Event()
    storage_failed = asyncio.Event()

    def on_storage_failure(exc: BaseException) -> None:
        log.critical("storage failed (%s): stopping; nothing more will be acknowledged", exc)
        loop.call_soon_threadsafe(storage_failed.set)

    store.on_failure = on_storage_failure
    # Handle SIGTERM/SIGINT from here on: a stop asked for while the agent is still starting is
    # carried out (cleanly, exit 0) as soon as it is up, instead of killing it half-registered.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    if config.tls is None:
        log.warning("no [tls] in %s: agent traffic is not encrypted, and a relay could inject requests into authenticated connections", config.path)
    credentials = Credentials(secret, config.tls)
    server = AgentServer(store, secret, config.host, config.port, tls=config.tls, limits=config.server, metrics=metrics)
    server.metrics_address = metrics_address
    # The write proxy and the range puller are in place before the agent listens and registers:
    # a client that finds it must not be told "not a write proxy" (nor "cannot pull yet") by an
    # agent that is one, as a producer was when it chose the agent the moment it registered.
    proxy = _start_proxy(config, zk, zk_auth, credentials, server)
    metrics.proxy = proxy
    # Copies pulled from peers (PULL_RANGE: repair and re-replication with one network leg).
    server.puller = RangePuller(AgentPool(MetaStore(zk, config.cluster, zk_auth), credentials), store, config.node_id)
    await server.start()

    registration = Registration(
        zk,
        config.cluster,
        config.node_id,
        {
            "region": config.region,
            "rack": config.rack,
            "address": config.advertise,
            "version": __version__,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            # Where this agent's /metrics is served (port 0 resolved); absent when off.
            **({"metrics": metrics_address} if metrics_address is not None else {}),
        },
        zk_auth,
    )
    await loop.run_in_executor(None, registration.start, 2 * config.session_timeout)
    if metrics_address is not None:
        await loop.run_in_executor(None, _remember_metrics_endpoint, zk, config, zk_auth, metrics_address)
    # The auditor stands for election only once this agent is registered and serving: an
    # agent that cannot serve must not be the one that decides others are gone.
    auditor = None
    if config.auditor.enabled:
        auditor = Auditor(zk, config.cluster, config.node_id, credentials, config.auditor, zk_auth, metrics=metrics).start()
    else:
        log.info("re-replication auditor disabled by configuration ([auditor] enabled = false)")
    replication = _start_replication(config, zk, zk_auth, credentials, metrics)
    # Bootstrap segments pulled from a source cluster (PULL_SEGMENT), through the workers' links.
    server.segment_puller = SegmentPuller(store, config.node_id, replication.source_link if replication is not None else None, server.puller.pool)
    # Housekeeping reclaims this agent's stale replicas at once (it may have been down during a
    # collection) and, if elected, applies retention and collects truncated segments' records.
    housekeeping = Housekeeping(zk, config.cluster, config.node_id, store, credentials, config.housekeeping, zk_auth, metrics=metrics).start()
    # Scrubbing re-reads every replica at a bounded rate and puts a damaged one in limbo.
    scrubber = None
    if config.scrub.enabled:
        from .storage.scrub import Scrubber

        # A start from index checkpoints did not read what they cover: the first pass checks it
        # at once rather than an interval later (dlagent.storage.checkpoint).
        first_delay = 0.0 if report.from_checkpoints else None
        scrubber = Scrubber(store, config.scrub.bytes_per_second, config.scrub.interval, first_delay=first_delay).start()
    else:
        log.info("scrubbing disabled by configuration ([scrub] enabled = false)")

    loop_kind = type(asyncio.get_running_loop()).__module__.split(".")[0]  # "uvloop" or "asyncio"
    log.info("dlagent %s ready: node %s of cluster %s serving on %s (event loop: %s)", __version__, config.node_id, config.cluster, config.advertise, loop_kind)

    waiters = [asyncio.ensure_future(stopping.wait()), asyncio.ensure_future(storage_failed.wait())]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()

    log.info("shutting down")
    # Give up the housekeeper role and stop deleting before the store and ZooKeeper go.
    await housekeeping.stop()
    if scrubber is not None:
        await scrubber.stop()  # its thread is idle and its files closed before the store closes
    if replication is not None:
        # Workers flush, checkpoint and release their claims while both clusters still answer.
        await replication.stop()
    if auditor is not None:
        # First, while ZooKeeper and the server still work: give up the role and cancel a
        # re-replication under way (resumable), so the next auditor takes over without waiting
        # for this session to expire.
        await loop.run_in_executor(None, auditor.stop)
    if proxy is not None:
        # Release owned logs gracefully (flush, complete segments) while ZooKeeper and the other
        # agents are still reachable, so clients move to a new owner without waiting for a session.
        await proxy.close()
        await proxy.pool.close()
    if server.puller is not None:
        await server.puller.pool.close()  # pulls under way fail on the closed connections; their copiers redo them
    await loop.run_in_executor(None, registration.stop)
    await loop.run_in_executor(None, lambda: (zk.stop(), zk.close()))
    await server.stop()
    if storage_failed.is_set():
        return EXIT_STORAGE_FAILED
    await store.close()
    return EXIT_OK
