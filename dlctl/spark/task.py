"""What one Spark task does in an executor: copy one source segment into one sink segment.

``copy_segment(task, endpoints)`` (and ``scan_clock`` for the clock pre-pass) are plain
functions of picklable values. They talk to agents only — no ZooKeeper — with the cluster
secrets from ``SecretRef``, the operator's TLS certificate from ``TlsRef`` (for a cluster that
runs TLS) and the agents' addresses as the driver saw them.

The copy, for one segment:

1. **Ensemble.** Choose the sink ensemble with ``dlctl.placement.choose_ensemble`` under the
   sink log's policy, over the sink agents that answer a probe right now (a retried task
   avoids the agents that failed the previous attempt the same way). Delete whatever an
   earlier, unverified attempt left of this sink segment on those agents: the segment is not
   in the sink's metadata yet, so nothing can be reading it.
2. **Pipeline.** About ``window`` source entries are read ahead. When every replica holds
   every entry (E = W, the usual case) they are read in ranges of about 2 MiB (READ_RANGE: one
   request and one disk read for many entries, the first choice of replica rotating from range
   to range); otherwise one entry per request. Either way each read goes to any replica of the
   write set (nearest first, speculative after an adaptive timeout, CRC-verified end to end by
   the agent and again by the client; a corrupt or missing replica hands over to the next).
   Entries are re-encoded in entry order (``transform.EntryCopier``, straight from the buffer
   they arrived in) and each sink entry is added to all W agents of its write set, with many
   adds in flight and bounded bytes outstanding. A ``throttle`` caps this task's rate (token
   bucket). The segments of one Spark task share an event loop and the agents' connections,
   two at a time: the next one is read while the previous waits for its last fdatasync.
3. **Verify.** The content digest of the source entries as read must equal the content digest
   of the sink entries as written, and every sink replica's own DIGEST (entry ids and CRCs it
   stores) must equal the digest of the entries sent to it.

The result is a JSON-able dict; errors are returned in it (``error``, naming the segment), not
raised, so one bad segment does not hide the others and the driver can record the good ones.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
import zlib
from collections.abc import Coroutine, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from ..allocator import keep_large_buffers
from ..errors import DlctlError, RefusedError
from ..log.auth import Credentials
from ..log.client import AgentClient
from ..log.errors import AgentError, BadRequestError, NoSuchSegmentError, PullRefusedError
from ..log import format as fmt
from ..log.ensembles import probed_ensemble
from ..log.protocol import SegmentDigest
from ..log.quorum import write_set_of
from ..log.records import CorruptRecords
from ..log.rereplication import digest_of
from ..ratelimit import TokenBucket
from .credentials import SecretRef, TlsRef
from .plan import SegmentTask
from .recode import NeedsClock, SegmentRecoder
from .segment_pull import PullRequest
from .segment_read import CopyFailed, EncodedReader, read_entries
from .transform import ClockScanner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoints:
    """The two clusters as an executor needs them: agents' availability records, secrets and
    TLS files (None: the cluster's agents speak plaintext)."""

    source_cluster: str
    source_nodes: dict[str, dict]
    source_secret: SecretRef
    sink_cluster: str
    sink_nodes: dict[str, dict]
    sink_secret: SecretRef
    window: int = 32  # source entries read ahead
    max_outstanding_bytes: int = 32 * 1024 * 1024  # sink bytes sent but not yet acknowledged
    request_timeout: float = 30.0
    throttle: float | None = None  # bytes per second for this task (None: unlimited)
    source_tls: TlsRef | None = None
    sink_tls: TlsRef | None = None
    pull: bool = True  # sink agents that read the source cluster pull each segment themselves (one network leg)
    pull_throttle: float | None = None  # bytes per second of one pull (set from throttle)

    def source_credentials(self) -> Credentials:
        return Credentials(self.source_secret.get(), self.source_tls.get() if self.source_tls else None)

    def sink_credentials(self) -> Credentials:
        return Credentials(self.sink_secret.get(), self.sink_tls.get() if self.sink_tls else None)


class StaticPool:
    """An ``AgentPool`` over a fixed set of availability records (executors have no ZooKeeper)."""

    def __init__(self, nodes: Mapping[str, Mapping[str, Any]], credentials: Credentials | bytes, request_timeout: float) -> None:
        self._nodes = {n: dict(i) for n, i in nodes.items()}
        self._credentials = Credentials.of(credentials)  # bare bytes: a secret, plaintext
        self._timeout = request_timeout
        self._clients: dict[str, AgentClient] = {}

    def __repr__(self) -> str:
        return f"StaticPool({sorted(self._nodes)})"

    @property
    def nodes(self) -> dict[str, dict]:
        return dict(self._nodes)

    async def refresh(self) -> dict[str, dict]:
        return self.nodes

    async def client(self, node_id: str) -> AgentClient:
        client = self._clients.get(node_id)
        if client is None:
            info = self._nodes.get(node_id)
            if info is None:
                from ..log.errors import AgentUnavailableError

                raise AgentUnavailableError(f"agent {node_id!r} was not available when the job started")
            host, _, port = str(info["address"]).rpartition(":")
            client = self._clients[node_id] = AgentClient(host, int(port), self._credentials.secret, tls=self._credentials.tls, request_timeout=self._timeout)
        return client

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


# -- the entry points Spark calls ------------------------------------------------------------------


def _run(main: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run`` on uvloop when it is installed: a task moves every byte through the
    loop three times (source read, sink adds, their replies), and libuv's reads and writes
    cost fewer CPU seconds per GiB than the selector loop's. The worker's allocator keeps the
    copy's large buffers on warm pages (``dlctl.allocator``)."""
    keep_large_buffers()
    with _fewer_collections():
        try:
            import uvloop
        except ImportError:
            return asyncio.run(main)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)


_collections_lock = threading.Lock()
_collections_users = 0  # tasks of this process inside _fewer_collections (the in-process engine runs several)
_collections_saved: tuple[int, ...] = ()


@contextmanager
def _fewer_collections(threshold: int = 50_000) -> Iterator[None]:
    """A copy allocates a few short-lived containers per entry (futures, handles, views), and
    CPython's cyclic collector, run after every 700 of them and scanning all the worker holds,
    took about 6 % of a task's CPU (tests/benchmarks/profile_bootstrap.py). During a task it
    runs after every ``threshold`` instead, over the task's own objects: what the worker held
    before is frozen out of its scans. Reference counting still frees every buffer at once;
    the collector's settings come back when the task ends — when the last of them ends, for
    tasks that run on threads of one process (``dlctl.spark.local``): the collector's settings
    are the process's, and a task that restored them under another would undo its own."""
    global _collections_users, _collections_saved
    with _collections_lock:
        if _collections_users == 0:
            _collections_saved = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(threshold, *_collections_saved[1:])
        _collections_users += 1
    try:
        yield
    finally:
        with _collections_lock:
            _collections_users -= 1
            if _collections_users == 0:
                gc.set_threshold(*_collections_saved)
                gc.unfreeze()


def copy_segment(task: SegmentTask, endpoints: Endpoints, attempt: int = 0) -> dict[str, Any]:
    """Copy one segment (see the module docstring); never raises for a per-segment failure."""
    return _run(_copy_segments([task], endpoints, attempt))[0]


def copy_segments(tasks: list[SegmentTask], endpoints: Endpoints) -> list[dict[str, Any]]:
    """One Spark task covering a range of segments (fewer, larger tasks: Spark's per-task cost
    is tens of ms, more than copying a small segment). The segments share one event loop and
    the agents' connections, and the next segment starts while the previous one waits for its
    last adds to be durable and its replicas' digests (``overlap`` segments at a time)."""
    return _run(_copy_segments(tasks, endpoints))


async def _copy_segments(tasks: list[SegmentTask], endpoints: Endpoints, attempt: int = 0, overlap: int = 2) -> list[dict[str, Any]]:
    source = StaticPool(endpoints.source_nodes, endpoints.source_credentials(), endpoints.request_timeout)
    sink = StaticPool(endpoints.sink_nodes, endpoints.sink_credentials(), endpoints.request_timeout)
    bucket = TokenBucket(endpoints.throttle) if endpoints.throttle else None  # the task's rate, whatever overlaps
    gate = asyncio.Semaphore(overlap)  # FIFO: segments start in order
    route = _Route(endpoints.pull)
    if endpoints.throttle:  # each overlapping pull gets its share of the task's rate
        endpoints = replace(endpoints, pull_throttle=endpoints.throttle / overlap)

    async def one(task: SegmentTask) -> dict[str, Any]:
        async with gate:
            return await _copy_result(task, endpoints, attempt, source, sink, bucket, route)

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        await source.close()
        await sink.close()


async def _copy_result(
    task: SegmentTask, endpoints: Endpoints, attempt: int, source: StaticPool, sink: StaticPool, bucket: TokenBucket | None, route: _Route,
) -> dict[str, Any]:
    started = time.monotonic()
    base = {"log": task.log, "source_seq": task.source.seq, "sink_seq": task.sink_seq, "first_entry": task.source.min_active_entry, "last_entry": task.source.last_entry_id, "start_vv": dict(task.start_vv)}
    try:
        result = await _copy(task, endpoints, attempt, source, sink, bucket, route)
    except NeedsClock as exc:
        return dict(base, error=str(exc), needs_clock=True, seconds=round(time.monotonic() - started, 3))
    except (DlctlError, CorruptRecords, ValueError, OSError) as exc:
        message = exc.message if isinstance(exc, DlctlError) else f"{type(exc).__name__}: {exc}"
        return dict(base, error=message, seconds=round(time.monotonic() - started, 3))
    return dict(base, **result, seconds=round(time.monotonic() - started, 3))


def scan_clocks(tasks: list[SegmentTask], endpoints: Endpoints) -> list[dict[str, Any]]:
    return [scan_clock(t, endpoints) for t in tasks]


def scan_clock(task: SegmentTask, endpoints: Endpoints) -> dict[str, Any]:
    """The clock pre-pass: read the segment and return its ``ClockEffect`` (for logs that hold
    records replicated from elsewhere, whose timestamps are not derivable from metadata)."""
    try:
        effect, replicated = _run(_scan(task, endpoints))
    except (DlctlError, CorruptRecords, ValueError, OSError) as exc:
        message = exc.message if isinstance(exc, DlctlError) else f"{type(exc).__name__}: {exc}"
        return {"log": task.log, "source_seq": task.source.seq, "error": f"segment {task.source.seq} of log {task.log!r}: {message}"}
    return {"log": task.log, "source_seq": task.source.seq, "effect": effect, "replicated": replicated}


# -- reading --------------------------------------------------------------------------------------


async def _scan(task: SegmentTask, endpoints: Endpoints) -> tuple[dict, int]:
    pool = StaticPool(endpoints.source_nodes, endpoints.source_credentials(), endpoints.request_timeout)
    scanner = ClockScanner(task.source_cluster)
    try:
        async for buf, start, _end in read_entries(task, pool, endpoints.window, {}):
            scanner.add_entry(buf, start)
    finally:
        await pool.close()
    return scanner.effect.to_dict(), scanner.replicated


# -- writing --------------------------------------------------------------------------------------


async def _healthy(pool: StaticPool, node: str) -> bool:
    try:
        client = await pool.client(node)
        await asyncio.wait_for(client.stat(), 2.0)
        return True
    except (AgentError, TimeoutError):
        return False


async def _ensemble(task: SegmentTask, pool: StaticPool) -> tuple[str, ...]:
    """An ensemble under the sink policy whose members answer now (probing as the writer does)."""
    seed = zlib.crc32(f"{task.log}/{task.sink_seq}/{task.seed}".encode())
    try:
        return await probed_ensemble(pool.nodes, task.sink_policy, lambda node: _healthy(pool, node), seed=seed)
    except RefusedError as exc:
        raise CopyFailed(f"segment {task.source.seq} of log {task.log!r}: no sink ensemble: {exc.message}", hint=exc.hint) from None


async def _clear(where: str, task: SegmentTask, clients: dict[str, AgentClient]) -> None:
    """A stale replica of this (uncommitted) sink segment from an earlier attempt goes first."""
    for node, client in clients.items():
        try:
            await client.delete_segment(task.sink_log_id, task.sink_seq)
        except NoSuchSegmentError:
            pass
        except AgentError as exc:
            raise CopyFailed(f"{where}: cannot clear sink agent {node} before copying: {exc.message}") from None


class _Route:
    """How the segments of one task travel: pulled by the sink agents until a puller refuses,
    then relayed through this process for the rest of the task."""

    def __init__(self, pull: bool) -> None:
        self.pull = pull


async def _copy(task: SegmentTask, endpoints: Endpoints, attempt: int, source: StaticPool, sink: StaticPool, bucket: TokenBucket | None, route: _Route) -> dict[str, Any]:
    where = f"segment {task.source.seq} of log {task.log!r}"
    task = replace(task, seed=task.seed + attempt)
    ensemble = await _ensemble(task, sink)
    clients = {n: await sink.client(n) for n in ensemble}
    await _clear(where, task, clients)
    if route.pull:
        pulled = await _pull(task, endpoints, ensemble, clients, where)
        if pulled is not None:
            return pulled
        route.pull = False  # (a refusal comes before the puller stores anything: nothing to clear)
    return await _relay(task, endpoints, ensemble, clients, where, source, bucket)


PULL_RATE_FLOOR = 1024 * 1024  # bytes/s below which a pull is taken to have hung (its timeout)


async def _pull(task: SegmentTask, endpoints: Endpoints, ensemble: tuple[str, ...], clients: dict[str, AgentClient], where: str) -> dict[str, Any] | None:
    """One member of the sink ensemble (members take turns, segment by segment) pulls the
    segment and hands the others their entries (``dlctl.spark.segment_pull``); then each
    member's DIGEST must match what the puller says it handed that member, for exactly the
    entries the member's write sets hold. None: the puller does not read the source cluster (or
    predates PULL_SEGMENT): the segment is relayed instead."""
    w = task.sink_policy.write_quorum
    request = PullRequest(
        log=task.log, source_cluster=task.source_cluster, source_log_id=task.source_log_id, source=task.source,
        sink_log_id=task.sink_log_id, sink_seq=task.sink_seq, ensemble=ensemble, write_quorum=w, start_vv=dict(task.start_vv),
        settled=dict(task.settled), assume_local=task.assume_local, window=endpoints.window, throttle=endpoints.pull_throttle, forward=True,
    )
    puller = ensemble[task.source.seq % len(ensemble)]
    timeout = endpoints.request_timeout + task.source.bytes / (request.throttle or PULL_RATE_FLOOR)
    try:
        result = await clients[puller].pull_segment(request.to_json(), timeout=timeout)
    except AgentError as exc:
        if _refused(exc):
            log.info("%s: relayed, not pulled: sink agent %s: %s", where, puller, exc.message)
            return None
        raise CopyFailed(f"{where}: sink agent {puller} could not pull it: {exc.message}", hint="check the source and sink agents; re-run to resume") from None
    if result.get("needs_clock"):
        raise NeedsClock(str(result.get("error")))
    replicas = result.pop("replicas", None)
    if not isinstance(replicas, dict) or sorted(replicas) != sorted(ensemble):
        raise CopyFailed(f"{where}: sink agent {puller} answered for members {sorted(replicas or {})}, not the ensemble {sorted(ensemble)}")
    expected, entries, check = {}, {}, {}
    for node, got in (await _digests(where, task, clients)).items():
        want = request.entries_of(node)
        said = replicas[node] if isinstance(replicas[node], dict) else {}
        expected[node], entries[node] = str(said.get("digest")), want
        ok = said.get("entries") == want and got.entries == want and got.digest == expected[node]
        check[node] = "ok" if ok else f"holds {got.entries} entries (its write sets hold {want}; {puller} says it handed it {said.get('entries')}), digest {got.digest[:16]}… (expected {expected[node][:16]}…)"
    return dict(result, ensemble=list(ensemble), replica_expected=expected, replica_entries=entries, replica_check=check, replica_failures=0, pulled=True, puller=puller)


async def _digests(where: str, task: SegmentTask, clients: dict[str, AgentClient]) -> dict[str, SegmentDigest]:
    """Each member's own DIGEST of the sink segment: what it stores, whatever it was told."""
    out = {}
    for node, client in clients.items():
        try:
            out[node] = await client.digest(task.sink_log_id, task.sink_seq)
        except AgentError as exc:
            raise CopyFailed(f"{where}: cannot verify the copy on sink agent {node}: {exc.message}") from None
    return out


def _refused(answer: object) -> bool:
    return isinstance(answer, PullRefusedError) or (isinstance(answer, BadRequestError) and "unknown opcode" in answer.message)


async def _relay(
    task: SegmentTask, endpoints: Endpoints, ensemble: tuple[str, ...], clients: dict[str, AgentClient], where: str, source: StaticPool, bucket: TokenBucket | None,
) -> dict[str, Any]:
    """Read the segment here, re-encode it and add every entry to its write set's members."""
    w = task.sink_policy.write_quorum
    recoder = SegmentRecoder.of(task)
    crcs: dict[str, list[tuple[int, int]]] = {n: [] for n in ensemble}
    outstanding = 0
    room = asyncio.Condition()
    failures: list[str] = []
    adds: set[asyncio.Future] = set()
    read_stats: dict[str, int] = {}
    limit = endpoints.max_outstanding_bytes

    async def add(node: str, encoded: bytearray, entry_id: int) -> None:
        nonlocal outstanding
        try:
            # Nobody reads a sink segment before the commit: keep it out of the agents' page cache.
            await clients[node].add(encoded, uncached=True)
        except AgentError as exc:
            failures.append(f"sink agent {node} did not store entry {entry_id}: {exc.message}")
        finally:
            async with room:
                outstanding -= len(encoded)
                room.notify_all()

    try:
        async for buf, start, end in read_entries(task, source, endpoints.window, read_stats):
            if failures:
                break
            out = recoder.recode(buf, start, end)
            entry_id, crc = fmt.stored_entry_id(out), fmt.stored_crc(out)
            if bucket is not None:
                await bucket.take(len(out))
            if outstanding >= limit:
                async with room:
                    await room.wait_for(lambda: outstanding < limit)
            outstanding += len(out) * w
            for node in write_set_of(ensemble, w, entry_id):
                crcs[node].append((entry_id, crc))
                t = asyncio.ensure_future(add(node, out, entry_id))
                adds.add(t)
                t.add_done_callback(adds.discard)
        if adds:
            await asyncio.gather(*list(adds))
    finally:
        for t in adds:
            t.cancel()  # only after a failure: the sink copy is abandoned (the driver sweeps it)
    if failures:
        raise CopyFailed(f"{where}: " + "; ".join(failures[:3]), hint="check the sink agents; re-run to resume")

    # Verify: each replica's own digest of what it stores = the digest of what was sent to it.
    expected = {n: digest_of(pairs) for n, pairs in crcs.items()}
    check: dict[str, str] = {}
    for node, got in (await _digests(where, task, clients)).items():
        ok = got.digest == expected[node] and got.entries == len(crcs[node])
        check[node] = "ok" if ok else f"holds {got.entries} entries (sent {len(crcs[node])}), digest {got.digest[:16]}… (expected {expected[node][:16]}…)"
    return dict(
        recoder.result(), ensemble=list(ensemble), replica_expected=expected, replica_entries={n: len(p) for n, p in crcs.items()},
        replica_check=check, replica_failures=read_stats.get("replica_failures", 0),
    )


__all__ = ["CopyFailed", "EncodedReader", "Endpoints", "StaticPool", "copy_segment", "copy_segments", "scan_clock", "scan_clocks"]
