"""Three real agents shared by a test module, and helpers to write and read logs on them.

Used by the writer, recovery and model tests: a module-scoped ``AgentCluster`` (healed before
and after every test: paused agents resumed, dead ones restarted), a per-test ``LogEnv`` with a
fresh log name and writers each on their own ZooKeeper session, and read-back straight from the
agents over the segment metadata (not through the log reader, so writer tests judge the writer).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient

from dlctl.log import format as fmt
from dlctl.log.dlsn import DLSN
from dlctl.log.errors import AgentError
from dlctl.log.pool import AgentPool
from dlctl.log.records import Record, decode_records
from dlctl.log.writer import LogWriter
from dlctl.meta.records import LogConfig, SegmentRecord, SegmentState
from dlctl.meta.store import MetaStore

from .agents import AgentNode, harness_credentials, heal_agents
from .procs import ProcessRegistry
from .zk import ZkNamespace, ZooKeeperServer, bench_zookeeper, close_all, make_client

T = TypeVar("T")
CLUSTER = "c1"
NODES = ("n1", "n2", "n3")


@dataclass
class AgentCluster:
    ns: ZkNamespace
    procs: ProcessRegistry
    agents: dict[str, AgentNode]
    admin: KazooClient
    base: Path

    def heal(self) -> None:
        """Resume paused agents, restart dead ones, and wait until all are registered."""
        heal_agents(self.agents.values(), self.admin)


def agent_cluster(
    zk_server: ZooKeeperServer, base: Path, label: str, nodes: tuple[str, ...] = NODES, extra_config: str = "", *, regions: dict[str, str] | None = None
) -> Iterator[AgentCluster]:
    """Body of a module-scoped fixture: ``yield from agent_cluster(...)``; ``extra_config`` is
    TOML appended to every agent's configuration; ``regions``: node -> region (then nodes are
    ``regions``' keys, each in a rack of its own), else every node in the default region."""
    ns = ZkNamespace(zk_server, label=label)
    procs = ProcessRegistry(base / "procs")
    placed = {n: {"region": r, "rack": f"rack-{n}"} for n, r in regions.items()} if regions else {n: {} for n in nodes}
    try:
        admin = ns.client()
        agents = {n: AgentNode(procs, base, ns.connect_string, cluster=CLUSTER, node_id=n, extra_config=extra_config, **where) for n, where in placed.items()}
        for node in agents.values():
            node.start(wait=False)
        for node in agents.values():
            node.wait_ready(admin)
        yield AgentCluster(ns, procs, agents, admin, base)
    finally:
        procs.close()
        ns.close()


@contextlib.contextmanager
def bench_agents(prefix: str, nodes: tuple[str, ...] = NODES, *, regions: dict[str, str] | None = None) -> Iterator[AgentCluster]:
    """For a benchmark script: ``agent_cluster``'s agents on a ZooKeeper of their own, in a
    scratch directory that is removed with everything started in it."""
    work, procs, zk = bench_zookeeper(prefix)
    cluster = agent_cluster(zk, work, prefix.strip("-"), nodes, regions=regions)
    try:
        yield next(cluster)
    finally:
        cluster.close()  # its agents and ZooKeeper namespace, before the server goes
        procs.close()
        shutil.rmtree(work, ignore_errors=True)


def solo_agent(zk: ZkNamespace, procs: ProcessRegistry, base: Path, log: str, extra_config: str = "") -> tuple[AgentNode, MetaStore]:
    """One agent of its own (``extra_config``: TOML for it), ready, and log ``log`` created on it
    (E = W = A = 1); the metadata store's client is the namespace's (stopped with it)."""
    node = AgentNode(procs, base, zk.connect_string, cluster=CLUSTER, node_id="solo", extra_config=extra_config)
    node.start(wait=False)
    admin = zk.client()
    node.wait_ready(admin)
    meta = MetaStore(admin, CLUSTER)
    meta.create_log(log, LogConfig(1, 1, 1))
    return node, meta


class LogEnv:
    """Per test: a fresh log name, and metadata stores / pools / writers that are closed after."""

    def __init__(self, cluster: AgentCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self._clients: list[KazooClient] = []

    @classmethod
    def for_test(cls, cluster: AgentCluster, test_name: str) -> LogEnv:
        # Parametrized ids ("name[11]") carry characters log names may not.
        return cls(cluster, re.sub(r"[^a-z0-9-]+", "-", test_name.lower().replace("_", "-"))[:60].strip("-"))

    def meta(self, session_timeout: float = 10.0, connect: str | None = None) -> MetaStore:
        client = self.cluster.ns.client(timeout=session_timeout) if connect is None else make_client(connect, timeout=session_timeout)
        self._clients.append(client)
        return MetaStore(client, CLUSTER)

    def pool(self, meta: MetaStore, request_timeout: float = 5.0) -> AgentPool:
        return AgentPool(meta, harness_credentials(), request_timeout=request_timeout)

    def create_log(self, config: LogConfig | None = None) -> int:
        return self.meta().create_log(self.name, config or LogConfig()).log_id

    async def writer(self, *, session_timeout: float = 10.0, request_timeout: float = 5.0, connect: str | None = None, **options: Any) -> LogWriter:
        meta = self.meta(session_timeout, connect)
        return await LogWriter.open(meta, self.pool(meta, request_timeout), self.name, **options)

    def close(self) -> None:
        close_all(self._clients)


E = TypeVar("E", bound=LogEnv)


def healed_env(cluster: AgentCluster, test_name: str, cls: type[E] = LogEnv) -> Iterator[E]:  # type: ignore[assignment]
    """Body of a per-test fixture: the cluster healed before and after, a fresh log name, and
    the test's writers and sessions closed after it."""
    cluster.heal()
    env = cls.for_test(cluster, test_name)
    try:
        yield env
    finally:
        env.close()
        cluster.heal()


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    """``asyncio.run(coro)`` bounded by ``timeout``, except that it does not wait for the default
    executor's threads at the end: a kazoo call of a cluster a test killed (a pool's refresh in
    flight at the kill) blocks its thread until the test's teardown stops that client, and
    asyncio.run would wait for it for ever instead of returning or raising."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(bounded())
    finally:
        try:
            # Cancelling can start tasks (a writer whose replica connections are cancelled rolls):
            # cancel those too, or they are left never started when the loop closes.
            for _ in range(10):
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                if not pending:
                    break
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()  # shuts the default executor down without waiting for its threads


async def eventually(predicate: Callable[[], Any], timeout: float = 10.0, message: str = "condition") -> Any:
    """The asyncio twin of ``wait_until``: poll without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def log_writer(meta: MetaStore, name: str) -> AsyncIterator[LogWriter]:
    """A writer of log ``name`` on an agent pool of its own, both closed after the block (the
    writer's close completes its segment)."""
    pool = AgentPool(meta, harness_credentials())
    try:
        writer = await LogWriter.open(meta, pool, name)
        try:
            yield writer
        finally:
            await writer.close()
    finally:
        await pool.close()


async def read_entry(pool: AgentPool, log_id: int, seg: SegmentRecord, entry_id: int) -> bytes:
    errors = []
    for node in seg.write_set(entry_id):
        try:
            return await (await pool.client(node)).read(log_id, seg.seq, entry_id)
        except AgentError as exc:
            errors.append(f"{node}: {exc}")
    raise AssertionError(f"entry {entry_id} of segment {seg.seq} is on no replica: {errors}")


async def segment_lac(pool: AgentPool, log_id: int, seg: SegmentRecord) -> int:
    lacs = []
    for node in seg.ensembles[-1].nodes:
        try:
            lacs.append(await (await pool.client(node)).read_lac(log_id, seg.seq))
        except AgentError:
            pass
    return max(lacs, default=-1)


async def read_back(meta: MetaStore, pool: AgentPool, name: str, *, require_completed: bool = False) -> list[tuple[DLSN, Record]]:
    """Every data record of the log: completed segments up to their last entry, an in-progress
    one up to the LAC its agents know (or, with ``require_completed``, fail on one)."""
    log_id = meta.get_log(name).value.log_id
    out = []
    for versioned in meta.segments(name):
        seg = versioned.value
        if require_completed:
            assert seg.state is SegmentState.COMPLETED, f"segment {seg.seq} is still {seg.state.value}"
        last = seg.last_entry_id if seg.state is not SegmentState.INPROGRESS else await segment_lac(pool, log_id, seg)
        for entry_id in range(last + 1):
            entry = fmt.decode(await read_entry(pool, log_id, seg, entry_id))
            for slot, record in enumerate(decode_records(entry.payload)):
                if not record.control:
                    out.append((DLSN(seg.seq, entry_id, slot), record))
    return out
