"""Writer, reader and recovery against a simple model, over real agents and real ZooKeeper.

The model of a log is the list of records it must hold, in order: every acknowledged record
(payload, txid, and the DLSN its future returned) plus the unacknowledged records that recovery
kept. BookKeeper's guarantees, which the model encodes (DESIGN.md §5):

- An acknowledged record is on A replicas of its write set; recovery ends only at an entry that
  W − A + 1 replicas lack, so it can never cut an acknowledged record. It stays where it was
  acknowledged (its DLSN) for good, exactly once.
- A record whose outcome is unknown (submitted, and the writer crashed or was deposed before it
  answered) is a *maybe*: recovery may keep it or drop it. Entries are recovered in order up to
  the first one that is missing, so the kept maybes of a writer are a *prefix* of its unanswered
  submissions, and they sit right after its acknowledged records, before anything of the next
  owner. A dropped maybe never appears later. Once recovery has closed the segment, the fate
  of every maybe is final: a kept one never disappears, a dropped one never comes back.
- Readers never deliver past LAC: a reader sees exactly the model (from its start position),
  never a record that recovery later drops.

``LogModel`` is a Hypothesis state machine whose rules are real actions: pipelined appends
through the current owner; clean hand-overs; crashes with records in flight (the ZooKeeper
session expires; or the writer is cut off from agents and ZooKeeper; or its process freezes
mid-flight, to be woken long after a new owner took over) each followed by a new owner that
recovers; an agent paused (SIGSTOP) or SIGKILLed and later healed (at most one at a time, so
A = 2 of 3 still holds); readers opened at random model positions. One reader tails the log
through the whole example. Two scenario tests follow: a reader racing an entry that only one
replica holds, and a tailing reader across an owner SIGKILLed in a child process.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import sys
import textwrap
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss

from dlctl.log import format as fmt
from dlctl.log.dlsn import DLSN
from dlctl.log.errors import AgentError, NoSuchEntryError, NoSuchSegmentError
from dlctl.log.pool import AgentPool
from dlctl.log.reader import LogReader, ReadRecord
from dlctl.log.records import decode_records
from dlctl.log.writer import LogWriter, WriterClosedError, WriterDeposedError, WriterError
from dlctl.meta.records import LogConfig, SegmentState
from dlctl.meta.store import MetaStore
from harness.agents import AgentNode, harness_credentials, heal_agents
from harness.logcluster import eventually, run
from harness.procs import ProcessRegistry, wait_until
from harness.tls import child_env
from harness.zk import ZkClients, ZkNamespace

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]

T = TypeVar("T")
CLUSTER = "c1"
NODES = ("n1", "n2", "n3")
# Small rolls (by size and by time) so a few steps cross segment boundaries, and small batches so
# one append becomes several pipelined entries.
MODEL_CONFIG = LogConfig(3, 3, 2, roll_bytes=6000, roll_seconds=4.0)
WRITER_OPTIONS: dict[str, Any] = {
    "batch_bytes": 512,
    "ensemble_retry": 0.2,  # a healed agent is taken back (by a roll) within a fraction of a second
    # A writer that must start a segment while an agent is impaired gives up after this long
    # (see LogModel._stall_allowed); short, so such an example costs seconds.
    "stall_timeout": 3.0,
    "recovery_timeout": 15.0,
    "ownership_wait": 10.0,
}
REQUEST_TIMEOUT = 1.5  # a paused agent costs this much before the writer counts it failed
STEP_TIMEOUT = 45.0


# -- a module-wide cluster of three agents, one per region ----------------------------------------


@dataclass
class Cluster:
    ns: ZkNamespace
    procs: ProcessRegistry
    agents: dict[str, AgentNode]
    admin: KazooClient

    def heal(self) -> None:
        """Resume paused agents, restart dead ones, and wait until each is registered by its
        current process (a killed predecessor's record lingers until its session expires)."""
        heal_agents(self.agents.values(), self.admin)


@pytest.fixture(scope="module")
def model_cluster(zk_server, tmp_path_factory):
    zk_server.ensure_running()
    base = tmp_path_factory.mktemp("model-agents")
    ns = ZkNamespace(zk_server, label="log-model")
    procs = ProcessRegistry(base / "procs")
    try:
        admin = ns.client()
        # Regions r1/r2/r3: a reader placed in r1 asks n1 first, so a test can make the replica
        # a reader prefers the one holding an unconfirmed entry.
        agents = {
            n: AgentNode(procs, base, ns.connect_string, cluster=CLUSTER, node_id=n, region=f"r{i}")
            for i, n in enumerate(NODES, start=1)
        }
        for node in agents.values():
            node.start(wait=False)
        cluster = Cluster(ns, procs, agents, admin)
        cluster.heal()
        yield cluster
    finally:
        procs.close()
        ns.close()


@pytest.fixture
def cluster(model_cluster: Cluster):
    model_cluster.heal()
    yield model_cluster
    model_cluster.heal()


# -- helpers ---------------------------------------------------------------------------------------


def expire(ns: ZkNamespace, client: KazooClient) -> None:
    """Expire ``client``'s ZooKeeper session for real (the harness retries a lost race)."""
    ns.expire(client, timeout=15.0)


def short(payload: bytes) -> str:
    return payload.rstrip(b".").decode("ascii", "replace")


def show(rows: list[tuple[Any, ...]]) -> str:
    return "[" + ", ".join("(" + ", ".join(short(x) if isinstance(x, bytes) else str(x) for x in row) + ")" for row in rows) + "]"


def first_difference(expected: list[tuple[Any, ...]], observed: list[tuple[Any, ...]]) -> str:
    """Where two record sequences part, with a few records of context on each side."""
    n = next((i for i, (a, b) in enumerate(zip(expected, observed)) if a != b), min(len(expected), len(observed)))
    lo, hi = max(0, n - 3), n + 4
    return (
        f"first difference at index {n} (expected {len(expected)} records, observed {len(observed)})\n"
        f"  expected[{lo}:{hi}] = {show(expected[lo:hi])}\n"
        f"  observed[{lo}:{hi}] = {show(observed[lo:hi])}"
    )


@dataclass(frozen=True)
class Stored:
    """A data record as stored in the log."""

    dlsn: DLSN
    txid: int
    payload: bytes


async def read_direct(meta: MetaStore, pool: AgentPool, name: str, *, avoid: frozenset[str] = frozenset()) -> list[Stored]:
    """Every data record of the log, straight from the agents over the segment metadata (no log
    reader involved). Every segment must be completed: this is called after an owner recovered
    the log or closed it. Replicas in ``avoid`` (a paused agent) are asked last."""
    log_id = (await asyncio.to_thread(meta.get_log, name)).value.log_id
    out: list[Stored] = []
    for versioned in await asyncio.to_thread(meta.segments, name):
        seg = versioned.value
        assert seg.state is SegmentState.COMPLETED, f"segment {seg.seq} of {name} is {seg.state.value}, expected completed"
        for entry_id in range(seg.last_entry_id + 1):
            replicas = sorted(seg.write_set(entry_id), key=lambda n: n in avoid)
            errors = []
            for node in replicas:
                try:
                    encoded = await (await pool.client(node)).read(log_id, seg.seq, entry_id)
                    break
                except AgentError as exc:
                    errors.append(f"{node}: {exc!r}")
            else:
                raise AssertionError(f"entry {entry_id} of segment {seg.seq} is on no replica: {errors}")
            entry = fmt.decode(encoded)
            for slot, record in enumerate(decode_records(entry.payload)):
                if not record.control:
                    out.append(Stored(DLSN(seg.seq, entry_id, slot), record.txid, record.payload))
    return out


async def entries_on(pool: AgentPool, node: str, log_id: int, seq: int) -> list[fmt.Entry]:
    """The entries one agent holds for a segment (0, 1, ... until the first it lacks)."""
    client = await pool.client(node)
    out = []
    for entry_id in itertools.count():
        try:
            out.append(fmt.decode(await client.read(log_id, seq, entry_id)))
        except (NoSuchEntryError, NoSuchSegmentError):
            return out


# -- event loops in threads -------------------------------------------------------------------------


class LoopThread:
    """An event loop in its own thread, like a process of its own. A writer keeps working between
    steps (LAC publication, rolls, ownership-loss callbacks) while the test thread pauses, kills
    and expires things; each step hands coroutines to the loop and waits for their outcome.
    ``freeze`` stops the loop between two callbacks, as SIGSTOP would stop a process: nothing
    more is sent, received or decided until ``wake``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self.thread: threading.Thread | None = None
        self.wake()

    @property
    def frozen(self) -> bool:
        return self.thread is None

    def wake(self) -> None:
        assert self.thread is None
        self.thread = threading.Thread(target=self.loop.run_forever, name=self.name, daemon=True)
        self.thread.start()

    def freeze(self) -> None:
        assert self.thread is not None
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        assert not self.thread.is_alive(), f"{self.name} did not stop"
        self.thread = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = STEP_TIMEOUT) -> T:
        assert self.thread is not None, f"{self.name} is frozen"

        async def bounded() -> T:
            async with asyncio.timeout(timeout):
                return await coro

        return asyncio.run_coroutine_threadsafe(bounded(), self.loop).result()

    def close(self) -> None:
        async def cancel_everything() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_default_executor()

        if self.thread is None:
            self.wake()
        try:
            self.run(cancel_everything(), 20)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            assert self.thread is not None
            self.thread.join(10)
            self.thread = None
            self.loop.close()


# -- the model -------------------------------------------------------------------------------------


@dataclass
class Submitted:
    """One record handed to a writer, and what the writer said about it."""

    payload: bytes
    txid: int
    owner: int  # the writer generation that took it
    future: asyncio.Future[DLSN] = field(repr=False)

    def acked(self) -> DLSN | None:
        """Its DLSN if the writer acknowledged it (so far), else None."""
        fut = self.future
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            return fut.result()
        return None

    def failure(self) -> BaseException | None:
        fut = self.future
        return fut.exception() if fut.done() and not fut.cancelled() else None


@dataclass
class Owner:
    """One writer generation: its writer, its ZooKeeper session and its own event loop."""

    generation: int
    loop: LoopThread
    writer: LogWriter
    client: KazooClient
    submitted: list[Submitted] = field(default_factory=list)


@dataclass(frozen=True)
class Rec:
    """A record the log must hold (model): acknowledged, or unacknowledged but kept by recovery."""

    dlsn: DLSN
    txid: int
    payload: bytes
    acknowledged: bool

    def row(self) -> tuple[DLSN, int, bytes]:
        return (self.dlsn, self.txid, self.payload)


_example_ids = itertools.count(1)


def guarded(fn: Callable[..., T]) -> Callable[..., T]:
    """Remember that a step failed, so teardown only cleans up and does not pile a second
    failure on top of the one Hypothesis is shrinking."""

    @functools.wraps(fn)
    def wrapper(self: LogModel, *args: Any, **kwargs: Any) -> T:
        try:
            return fn(self, *args, **kwargs)
        except BaseException:
            self.failed = True
            raise

    return wrapper


class LogModel(RuleBasedStateMachine):
    cluster: Cluster  # set by the test that runs the machine

    def __init__(self) -> None:
        super().__init__()
        self.failed = False
        self.name = f"model-{next(_example_ids)}"
        self.loop = LoopThread(f"{self.name}-readers")  # readers and direct reads
        self.clients = ZkClients(self.cluster.ns.connect_string, timeout=10.0)
        self.log: list[Rec] = []  # the model: what the log must hold, in order
        self.dropped: list[Submitted] = []  # maybes that recovery dropped: must never appear
        self.owners: list[Owner] = []  # every generation, for the final check and cleanup
        self.frozen: list[Owner] = []  # crashed by freezing, not woken yet
        self.impaired: tuple[str, str] | None = None  # (node, "pause" | "kill")
        self.counter = 0
        self.tailer: asyncio.Task[None] | None = None
        try:
            self.cluster.heal()
            self.reader_meta = MetaStore(self.clients.new(), CLUSTER)
            self.reader_meta.create_log(self.name, MODEL_CONFIG)
            self.reader_pool = AgentPool(self.reader_meta, harness_credentials(), request_timeout=2.0)
            # One reader tails the log for the whole example, across every crash and hand-over.
            self.tailed: list[tuple[DLSN, int, bytes]] = []
            self.tail_failure: BaseException | None = None
            self.tailer = self.loop.run(self._start_tailing())
            self._take_over([])
        except BaseException:
            self.failed = True
            self._cleanup()
            raise

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def owner(self) -> Owner:
        return self.owners[-1]

    @property
    def writer(self) -> LogWriter:
        return self.owner.writer

    def _avoid(self) -> frozenset[str]:
        return frozenset([self.impaired[0]]) if self.impaired else frozenset()

    def _open_owner(self) -> Owner:
        generation = len(self.owners) + 1
        client = self.clients.new()
        loop = LoopThread(f"{self.name}-owner-{generation}")
        meta = MetaStore(client, CLUSTER)
        pool = AgentPool(meta, harness_credentials(), request_timeout=REQUEST_TIMEOUT)
        try:
            writer = loop.run(LogWriter.open(meta, pool, self.name, owner_id=f"owner-{generation}", **WRITER_OPTIONS))
            # The model checks the log right after a takeover: let the previous owner's segment
            # be closed first (appending meanwhile is test_fast_takeover's subject).
            loop.run(writer.recovery_done())
        except BaseException:
            loop.close()
            raise
        owner = Owner(generation, loop, writer, client)
        self.owners.append(owner)
        return owner

    def _submit(self, k: int, txids: str = "auto", gap: int = 1, size: int = 64) -> list[Submitted]:
        """Submit ``k`` records to the current writer, on its loop, without waiting for them."""
        owner = self.owner
        writer = owner.writer

        async def submit() -> list[Submitted]:
            out = []
            for _ in range(k):
                self.counter += 1
                payload = f"{self.name}/owner-{owner.generation}/{self.counter}/".encode().ljust(size, b".")
                # Application txids leave gaps; writer-assigned ones are the last + 1.
                txid = writer.last_txid + gap if txids == "app" else None
                fut = writer.submit(payload, txid)
                out.append(Submitted(payload, writer.last_txid, owner.generation, fut))
            return out

        subs = owner.loop.run(submit())
        owner.submitted += subs
        return subs

    def _acknowledge(self, subs: list[Submitted]) -> None:
        """Add acknowledged records to the model; their DLSNs and txids must keep increasing."""
        for sub in subs:
            dlsn = sub.acked()
            assert dlsn is not None, f"{short(sub.payload)} is not acknowledged"
            if self.log:
                assert dlsn > self.log[-1].dlsn and sub.txid > self.log[-1].txid, (
                    f"{short(sub.payload)} acknowledged at {dlsn} with txid {sub.txid}, "
                    f"not after the model's last record {self.log[-1]}"
                )
            self.log.append(Rec(dlsn, sub.txid, sub.payload, True))

    def _acknowledged_prefix(self, subs: list[Submitted], acked: list[Submitted] | None = None) -> list[Submitted]:
        """The acknowledged ones of ``subs`` (or ``acked``, as seen earlier): acknowledgements
        come in submission order, so they must be a prefix."""
        if acked is None:
            acked = [s for s in subs if s.acked() is not None]
        assert acked == subs[: len(acked)], "acknowledgements are not a prefix of the submissions: " + show(
            [(s.txid, s.payload, s.acked()) for s in subs]
        )
        return acked

    def _take_over(self, maybes: list[Submitted]) -> None:
        """Open the next owner (which recovers what the last one left in progress) and settle the
        fate of ``maybes``, the last owner's records whose outcome is unknown."""
        owner = self._open_owner()
        stored = self.loop.run(read_direct(self.reader_meta, self.reader_pool, self.name, avoid=self._avoid()))
        observed = [(s.dlsn, s.txid, s.payload) for s in stored]
        known = [r.row() for r in self.log]
        assert observed[: len(known)] == known, (
            f"after owner-{owner.generation} recovered the log, the records the model holds are not its prefix "
            "(an acknowledged or earlier recovered record moved or vanished, or something came in between)\n"
            + first_difference(known, observed)
        )
        kept = stored[len(known) :]
        candidates = [(m.txid, m.payload) for m in maybes]
        assert [(s.txid, s.payload) for s in kept] == candidates[: len(kept)], (
            f"after owner-{owner.generation} recovered the log, what follows the model's {len(known)} records is not "
            "a prefix of the last owner's unacknowledged submissions in submission order\n"
            f"  follows:    {show([(s.dlsn, s.txid, s.payload) for s in kept])}\n"
            f"  unanswered: {show(candidates)}"
        )
        for s in kept:
            self.log.append(Rec(s.dlsn, s.txid, s.payload, False))
        self.dropped += maybes[len(kept) :]
        self._check_late_acks(maybes)
        expected_last = self.log[-1].txid if self.log else -1
        # After a crash it continues above what the last owner had reserved (a fast takeover's
        # txid gap); after a clean close, right after the log's last txid.
        exact = not owner.writer.recovered
        assert owner.writer.last_txid == expected_last if exact else owner.writer.last_txid >= expected_last, (
            f"owner-{owner.generation} continues after txid {owner.writer.last_txid}, but the log ends at txid {expected_last}"
        )

    def _check_late_acks(self, subs: list[Submitted]) -> None:
        """Whatever a deposed, isolated or frozen writer reported acknowledged, even late, is in
        the log where it said."""
        for sub in subs:
            dlsn = sub.acked()
            if dlsn is not None:
                assert any(r.payload == sub.payload and r.dlsn == dlsn for r in self.log), (
                    f"{short(sub.payload)} was acknowledged at {dlsn} by owner-{sub.owner} but the log does not hold it there"
                )

    def _await_writer_clear(self) -> None:
        """Wait until the writer no longer counts any agent as failed. With three agents and E = 3
        there is no spare: a degraded segment survives a second failure only after the writer
        has rolled back onto a full ensemble (it retries every ``ensemble_retry``)."""
        writer = self.writer

        def clear() -> bool:
            seg = writer._segment
            return writer.error is not None or seg is None or not seg.failed

        try:
            self.owner.loop.run(eventually(clear, 20, "the writer to roll back onto a full ensemble"))
        except AssertionError:
            seg = writer._segment
            raise AssertionError(
                f"the writer still counts agents as failed 20 s after every agent was healthy again: "
                f"{seg.failed if seg else None} (segment {writer.segment_seq}, error {writer.error!r})"
            ) from None
        assert writer.error is None, f"the writer failed while an agent healed: {writer.error!r}"

    def _stall_allowed(self, exc: BaseException) -> bool:
        """The one way a healthy owner may fail in this machine. A new segment needs E = 3
        healthy agents and there are three: while one is impaired (the writer probes the members
        of a fresh ensemble, and a SIGKILLed or long-paused agent also drops out of the registry),
        a writer that must start a segment (a new owner's first append, or the first append after
        a roll left it without one) waits ``stall_timeout`` for agents and fails, as BookKeeper's
        ledger creation fails with too few bookies. Ack quorum is not the issue: a segment
        already under way carries on with two agents."""
        return (
            self.impaired is not None
            and isinstance(exc, WriterError)
            and not isinstance(exc, WriterDeposedError)
            and "cannot start a segment" in str(exc)
        )

    def _owner_stalled(self, subs: list[Submitted]) -> None:
        """The owner failed as ``_stall_allowed`` permits: whatever it did not acknowledge is of
        unknown fate (it says so), and the next owner takes over."""
        owner = self.owner
        assert all(s.future.done() for s in subs), "a failed writer left appends unanswered"
        acked = self._acknowledged_prefix(subs)
        for sub in subs[len(acked) :]:
            assert isinstance(sub.failure(), WriterError), f"{short(sub.payload)} failed with {sub.failure()!r}"
        owner.loop.run(owner.writer.close())  # quietly: its appends reported the error
        self._acknowledge(acked)
        self._take_over(subs[len(acked) :])

    def _flush_must_succeed(self, subs: list[Submitted], what: str) -> None:
        writer = self.writer

        async def flush() -> None:
            await writer.flush()

        try:
            self.owner.loop.run(flush())
        except Exception as exc:
            if self._stall_allowed(exc):
                self._owner_stalled(subs)
                return
            raise AssertionError(
                f"{what}: flush failed with {exc!r}, although the writer was not deposed and at most one agent "
                f"was impaired ({self.impaired}), so the ack quorum A=2 of 3 held"
            ) from exc
        self._acknowledge(subs)

    async def _start_tailing(self) -> asyncio.Task[None]:
        reader = await LogReader(self.reader_meta, self.reader_pool, self.name, long_poll_timeout=2.0).open()

        async def tail() -> None:
            try:
                async for record in reader.tail():
                    self.tailed.append((record.dlsn, record.txid, record.payload))
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                self.tail_failure = exc
            finally:
                await reader.close()

        return asyncio.ensure_future(tail())

    # -- rules ---------------------------------------------------------------------------------

    @rule(k=st.integers(1, 30), txids=st.sampled_from(["auto", "app"]), gap=st.integers(1, 4), size=st.integers(24, 300))
    @guarded
    def append(self, k: int, txids: str, gap: int, size: int) -> None:
        """Pipelined appends through the current owner; a healthy owner acknowledges them all."""
        subs = self._submit(k, txids, gap, size)
        self._flush_must_succeed(subs, f"append of {k} records")

    @rule()
    @guarded
    def close_and_reopen(self) -> None:
        """A clean hand-over: close completes the segment, so the next owner recovers nothing."""
        owner = self.owner
        owner.loop.run(owner.writer.close())

        async def late() -> None:
            owner.writer.submit(b"after the end")

        with pytest.raises(WriterClosedError):
            owner.loop.run(late())
        owner.loop.close()
        self._take_over([])
        assert self.writer.recovered == (), (
            f"after a clean close the next owner still recovered {[r.to_dict() for r in self.writer.recovered]}"
        )

    @rule(
        k=st.integers(0, 30),
        wait_for=st.integers(0, 30),
        how=st.sampled_from(["expire", "isolate", "freeze"]),
        txids=st.sampled_from(["auto", "app"]),
        size=st.integers(24, 300),
    )
    @guarded
    def crash_and_take_over(self, k: int, wait_for: int, how: str, txids: str, size: int) -> None:
        """The owner dies with ``k`` records submitted, the first ``wait_for`` of them known
        acknowledged and the rest in flight; the next owner must recover.

        - ``expire``: its ZooKeeper session expires; it is deposed and must say so.
        - ``isolate``: its agent connections are cut and its session closed; it lingers on.
        - ``freeze``: its process stops dead (its loop is frozen mid-flight, as by SIGSTOP) and
          its session expires; whatever it had in flight stays where it was. It may be woken
          later (``wake_frozen_owners``)."""
        owner = self.owner
        writer, client = owner.writer, owner.client
        subs = self._submit(k, txids, 1, size)
        first = [s.future for s in subs[: min(wait_for, k)]]
        if first:

            async def wait() -> None:
                await asyncio.gather(*first)

            try:
                owner.loop.run(wait())
            except Exception as exc:
                if not self._stall_allowed(exc):
                    raise
                self._owner_stalled(subs)  # it died before we could crash it
                return
        if how == "expire":
            # Blocks this thread until the client has seen the expiry; the writer's loop goes on,
            # so records in flight may be acknowledged meanwhile.
            expire(self.cluster.ns, client)

            async def settle() -> None:
                if subs:
                    await asyncio.wait([s.future for s in subs], timeout=15)
                with pytest.raises(WriterDeposedError):
                    writer.submit(b"after the expiry")
                await writer.close()  # a writer that already failed closes quietly

            owner.loop.run(settle())
            for sub in subs:
                assert sub.future.done(), f"{short(sub.payload)} still unanswered 15 s after the writer was deposed"
                if sub.acked() is None:
                    exc = sub.failure()
                    assert isinstance(exc, WriterDeposedError), f"{short(sub.payload)} failed with {exc!r}, not as deposed"
            acked = self._acknowledged_prefix(subs)
        elif how == "isolate":

            async def isolate() -> list[Submitted]:
                # What the application learned before the cut; later answers count as unknown.
                known = [s for s in subs if s.acked() is not None]
                await writer.pool.close()
                await asyncio.to_thread(client.stop)
                return known

            acked = self._acknowledged_prefix(subs, owner.loop.run(isolate()))
        else:
            owner.loop.freeze()
            acked = self._acknowledged_prefix(subs)
            self.frozen.append(owner)
            expire(self.cluster.ns, client)  # as its session would time out
        self._acknowledge(acked)
        self._take_over(subs[len(acked) :])

    @precondition(lambda self: bool(self.frozen))
    @rule()
    @guarded
    def wake_frozen_owners(self) -> None:
        """A frozen owner wakes up (a long GC pause ends): it must find out it was deposed (its
        session expired; its adds are fenced) and fail what it had pending. An entry it finds
        acknowledged now was on an ack quorum before the fence, so recovery kept it there."""
        for owner in self.frozen:
            owner.loop.wake()
            writer = owner.writer

            async def settle(owner: Owner = owner, writer: LogWriter = writer) -> None:
                await eventually(lambda: writer.error is not None, 15, f"owner-{owner.generation} to notice it was deposed")
                pending = [s.future for s in owner.submitted if not s.future.done()]
                if pending:
                    await asyncio.wait(pending, timeout=15)
                with pytest.raises(WriterDeposedError):
                    writer.submit(b"after waking up")
                await writer.close()

            owner.loop.run(settle())
            assert isinstance(writer.error, WriterDeposedError), f"owner-{owner.generation} woke up to {writer.error!r}"
            for sub in owner.submitted:
                assert sub.future.done(), f"{short(sub.payload)} unanswered 15 s after its frozen owner woke up"
                if sub.acked() is None:
                    assert isinstance(sub.failure(), WriterDeposedError), f"{short(sub.payload)} failed with {sub.failure()!r}"
            self._check_late_acks(owner.submitted)
        self.frozen = []

    @precondition(lambda self: self.impaired is None)
    @rule(node=st.sampled_from(NODES), how=st.sampled_from(["pause", "kill"]), k=st.integers(0, 20), size=st.integers(24, 300))
    @guarded
    def impair_agent(self, node: str, how: str, k: int, size: int) -> None:
        """SIGSTOP or SIGKILL one agent with ``k`` records in flight; the other two acknowledge them."""
        subs = self._submit(k, size=size)
        proc = self.cluster.agents[node].proc
        assert proc is not None
        if how == "pause":
            proc.pause()
        else:
            proc.kill()
        self.impaired = (node, how)
        self._flush_must_succeed(subs, f"{k} records in flight while {node} was {how}d")

    @precondition(lambda self: self.impaired is not None)
    @rule()
    @guarded
    def heal_agent(self) -> None:
        """Resume or restart (on its data) the impaired agent and wait until it is usable again."""
        assert self.impaired is not None
        node, how = self.impaired
        agent = self.cluster.agents[node]
        assert agent.proc is not None
        if how == "pause":
            agent.proc.resume()
        else:
            agent.start(wait=False)
        agent.wait_ready(self.cluster.admin)
        self.impaired = None
        self._await_writer_clear()

    @rule(index=st.integers(0, 1000), by=st.sampled_from(["txid", "dlsn", "start"]), below=st.integers(0, 3))
    @guarded
    def read_from(self, index: int, by: str, below: int) -> None:
        """A reader opened at a model position reads exactly the model's suffix, then nothing.
        By txid, the start may fall in a gap of application txids (``below`` the record's txid
        but above the previous one): the suffix still starts at that record."""
        pos = index % (len(self.log) + 1)
        expected = self.log[pos:]
        if by == "start":
            options: dict[str, Any] = {}
            expected = self.log
        elif by == "dlsn" and pos < len(self.log):
            options = {"start_dlsn": self.log[pos].dlsn}
        elif pos < len(self.log):
            floor = self.log[pos - 1].txid + 1 if pos > 0 else 0
            options = {"start_txid": max(floor, self.log[pos].txid - below)}
        else:  # past the end, which has no DLSN yet
            options = {"start_txid": self.log[-1].txid + 1 if self.log else 0}
        observed = self.loop.run(self._read(options, len(expected)))
        rows = [r.row() for r in expected]
        assert observed == rows, f"reader from {options or 'the start'}: " + first_difference(rows, observed)

    async def _read(self, options: dict[str, Any], count: int, *, quiet: float = 0.1) -> list[tuple[DLSN, int, bytes]]:
        out: list[tuple[DLSN, int, bytes]] = []
        async with LogReader(self.reader_meta, self.reader_pool, self.name, long_poll_timeout=2.0, **options) as reader:
            for _ in range(count):
                record = await reader.read_next(10)
                if record is None:
                    break  # short: the comparison shows what is missing
                out.append((record.dlsn, record.txid, record.payload))
            if len(out) == count:
                # Nothing beyond the model: no unacknowledged record, no duplicate.
                extra = await reader.read_next(quiet)
                if extra is not None:
                    out.append((extra.dlsn, extra.txid, extra.payload))
        return out

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    @guarded
    def writer_is_healthy(self) -> None:
        # Nothing in this machine may depose or stall the current owner: crashes are followed by
        # a new owner at once, and at most one agent is impaired at a time.
        assert self.writer.error is None, f"owner-{self.owner.generation} failed on its own: {self.writer.error!r}"

    @invariant()
    @guarded
    def tailing_reader_delivered_a_prefix_of_the_model(self) -> None:
        # A reader delivers nothing beyond LAC, so nothing whose fate recovery had yet to decide:
        # what it delivered is always the start of the model (a dropped record would break it).
        assert self.tail_failure is None, f"the tailing reader failed: {self.tail_failure!r}"
        tailed = list(self.tailed)
        rows = [r.row() for r in self.log[: len(tailed)]]
        assert tailed == rows and len(tailed) <= len(self.log), "the tailing reader: " + first_difference(
            [r.row() for r in self.log], tailed
        )

    @invariant()
    @guarded
    def txids_strictly_increase(self) -> None:
        txids = [r.txid for r in self.log]
        assert all(a < b for a, b in itertools.pairwise(txids)), f"txids do not increase: {txids}"

    # -- the end of an example ---------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if not self.failed:
                self._final_check()
        finally:
            self._cleanup()

    def _final_check(self) -> None:
        if self.frozen:
            self.wake_frozen_owners()
        self.owner.loop.run(self.writer.close())
        stored = self.loop.run(read_direct(self.reader_meta, self.reader_pool, self.name, avoid=self._avoid()))
        observed = [(s.dlsn, s.txid, s.payload) for s in stored]
        rows = [r.row() for r in self.log]
        assert observed == rows, "the log as stored on the agents is not the model: " + first_difference(rows, observed)
        by_reader = self.loop.run(self._read({}, len(rows), quiet=0.3))
        assert by_reader == rows, "a reader from the start does not read the model: " + first_difference(rows, by_reader)
        try:
            self.loop.run(eventually(lambda: len(self.tailed) >= len(rows) or self.tail_failure, 15, "the tailing reader"))
        except AssertionError:
            pass  # the comparison below says what is missing
        assert self.tail_failure is None, f"the tailing reader failed: {self.tail_failure!r}"
        assert self.tailed == rows, "the tailing reader did not deliver the model: " + first_difference(rows, self.tailed)
        present = {s.payload: s for s in stored}
        for owner in self.owners:
            for sub in owner.submitted:
                dlsn = sub.acked()
                if dlsn is not None:  # acknowledged, at any time, by any owner
                    assert sub.payload in present and present[sub.payload].dlsn == dlsn, (
                        f"{short(sub.payload)} was acknowledged at {dlsn} but the log has {present.get(sub.payload)}"
                    )
        for sub in self.dropped:
            assert sub.payload not in present, f"{short(sub.payload)} was dropped by recovery but is in the log now"

    def _cleanup(self) -> None:
        try:
            for owner in self.owners:
                try:
                    if not owner.loop.frozen and owner.writer.error is None:
                        owner.loop.run(owner.writer.close(), 20)
                except Exception:
                    pass
                try:
                    if not owner.loop.loop.is_closed():
                        owner.loop.close()
                except Exception:
                    pass
            try:
                if self.tailer is not None:
                    self.tailer.cancel()  # the loop's close awaits it
                self.loop.run(self.reader_pool.close(), 10)
            except Exception:
                pass
            self.loop.close()
        finally:
            self.clients.close()
            # The next example (or test) starts with every agent up.
            self.cluster.heal()


def test_writer_reader_and_recovery_agree_with_the_model(cluster):
    LogModel.cluster = cluster
    run_state_machine_as_test(
        LogModel,
        settings=settings(
            max_examples=15,
            stateful_step_count=10,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# -- an entry beyond LAC that recovery decides ------------------------------------------------------


@pytest.mark.parametrize("lone_replica", ["dead-during-recovery", "alive-during-recovery"])
def test_reader_never_observes_an_entry_beyond_lac_that_later_disappears(cluster, lone_replica):
    """End to end (test_reader.py has the hand-fed variant): a real writer, a tailing reader in
    r1 (so it asks n1 first), n2 and n3 SIGKILLed so the writer's next entry reaches n1 only and
    is never acknowledged. The reader must not deliver it while it is beyond LAC. The writer
    is then deposed and a new owner recovers: with n1 dead during recovery, n2 and n3
    (W − A + 1 = 2) say the entry is absent and it must vanish; with n1 alive recovery may
    keep it, and then the reader delivers it exactly once, in its place."""
    name = f"beyond-lac-{lone_replica}"
    lone, others = "n1", ("n2", "n3")
    clients = ZkClients(cluster.ns.connect_string, timeout=10.0)

    async def scenario() -> None:
        reader_meta = MetaStore(clients.new(), CLUSTER)
        await asyncio.to_thread(reader_meta.create_log, name, LogConfig(3, 3, 2))
        reader_pool = AgentPool(reader_meta, harness_credentials(), request_timeout=2.0)
        first_client = clients.new()
        first_meta = MetaStore(first_client, CLUSTER)
        first = await LogWriter.open(first_meta, AgentPool(first_meta, harness_credentials(), request_timeout=2.0), name, owner_id="first")
        seen: list[ReadRecord] = []
        reader = await LogReader(reader_meta, reader_pool, name, region="r1", long_poll_timeout=0.5).open()

        async def consume() -> None:
            async for record in reader.tail():
                seen.append(record)

        consumer = asyncio.ensure_future(consume())
        try:
            acked = list(await asyncio.gather(*(first.submit(f"acked-{i}".encode()) for i in range(20))))
            await eventually(lambda: len(seen) >= 20, 10, "the reader to deliver the 20 acknowledged records")
            seq = acked[-1].segment_seq
            log_id = reader.log_id
            # The idle writer's control entry publishes the LAC: every replica has it (and its LAC).
            await eventually(
                lambda: _all_have(reader_pool, log_id, seq, acked[-1].entry_id + 1), 5, "the LAC-publishing control entry on every replica"
            )

            for node in others:
                cluster.agents[node].proc.kill()
            phantoms = [first.submit(f"phantom-{i}".encode()) for i in range(3)]

            async def phantom_on_lone() -> bool:
                return any(
                    any(r.payload.startswith(b"phantom") for r in decode_records(e.payload))
                    for e in await entries_on(reader_pool, lone, log_id, seq)
                )

            await eventually(phantom_on_lone, 10, f"the unacknowledged entry to reach {lone}")
            phantom_entry = max(e.entry_id for e in await entries_on(reader_pool, lone, log_id, seq))
            # The reader has caught up to everything n1 can confirm (the control entry before the
            # phantom, LAC = phantom - 1) and then kept polling n1, which holds the phantom: it had
            # every chance to deliver it.
            await eventually(lambda: reader.stats.entries_fetched >= phantom_entry, 10, "the reader to fetch up to the LAC n1 knows")
            polls = reader.stats.long_polls
            await eventually(lambda: reader.stats.long_polls >= polls + 3, 10, "three more long polls by the reader")
            assert not [r for r in seen if r.payload.startswith(b"phantom")], (
                f"the reader delivered an entry beyond LAC (only on {lone}, never acknowledged): {seen[20:]}"
            )
            assert all(not f.done() for f in phantoms), "an entry that reached one replica of three was acknowledged"

            # Depose the first writer (its session expires); then the next owner recovers.
            await asyncio.to_thread(expire, cluster.ns, first_client)
            for fut in phantoms:
                with pytest.raises(WriterDeposedError):
                    await fut
            await first.close()
            await first.pool.close()
            if lone_replica == "dead-during-recovery":
                cluster.agents[lone].proc.kill()
            for node in others:
                cluster.agents[node].start(wait=False)
            for node in others:
                await asyncio.to_thread(cluster.agents[node].wait_ready, cluster.admin)
            second_meta = MetaStore(clients.new(), CLUSTER)
            second = await LogWriter.open(
                second_meta, AgentPool(second_meta, harness_credentials(), request_timeout=2.0), name, owner_id="second", ownership_wait=10
            )
            (result,) = await second.recovery_done()
            if lone_replica == "dead-during-recovery":
                # n1 comes back with the phantom still on disk, past the segment's end: nothing
                # later may bring it to light. (It must be back before the next segment anyway:
                # with three agents and E = 3 a segment cannot be started without it.)
                cluster.agents[lone].start(wait=False)
                await asyncio.to_thread(cluster.agents[lone].wait_ready, cluster.admin)
            later = list(await asyncio.gather(*(second.submit(f"later-{i}".encode()) for i in range(10))))
            await second.close()

            stored = await read_direct(reader_meta, reader_pool, name)
            kept = [s for s in stored if s.payload.startswith(b"phantom")]
            if lone_replica == "dead-during-recovery":
                assert kept == [], f"recovery kept an entry that only the dead replica held: {kept} ({result.to_dict()})"
            # Recovery keeps the phantom entry whole or not at all; its records follow the
            # acknowledged ones and precede the second owner's.
            assert [s.payload for s in stored] == (
                [f"acked-{i}".encode() for i in range(20)]
                + [f"phantom-{i}".encode() for i in range(3) if kept]
                + [f"later-{i}".encode() for i in range(len(later))]
            ), show([(s.dlsn, s.txid, s.payload) for s in stored])
            assert [s.dlsn for s in stored if not s.payload.startswith(b"phantom")] == acked + later
            rows = [(s.dlsn, s.txid, s.payload) for s in stored]
            await eventually(lambda: len(seen) >= len(rows), 15, f"the tailing reader to deliver all {len(rows)} records")
            extra = await _next_seen(seen, len(rows), 0.3)
            assert extra is None, f"the tailing reader delivered more than the log holds: {extra}"
            observed = [(r.dlsn, r.txid, r.payload) for r in seen]
            assert observed == rows, "the tailing reader disagrees with the recovered log: " + first_difference(rows, observed)
            # A fresh reader in r1 asks n1 first, which holds the phantom past the segment's end.
            async with LogReader(reader_meta, reader_pool, name, region="r1") as fresh:
                again = []
                for _ in rows:
                    record = await fresh.read_next(10)
                    assert record is not None, f"the fresh reader stopped after {len(again)} of {len(rows)} records"
                    again.append((record.dlsn, record.txid, record.payload))
                assert await fresh.read_next(0.3) is None, "the fresh reader delivered more than the log holds"
            assert again == rows, "a fresh reader disagrees with the recovered log: " + first_difference(rows, again)
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await reader.close()
            await reader_pool.close()

    with clients:
        run(scenario(), timeout=120)


async def _all_have(pool: AgentPool, log_id: int, seq: int, entry_id: int) -> bool:
    for node in NODES:
        try:
            await (await pool.client(node)).read(log_id, seq, entry_id)
        except AgentError:
            return False
    return True


# -- an owner SIGKILLed while a reader tails ---------------------------------------------------------

_OWNER = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    from dlctl.log.auth import Credentials
    from dlctl.log.pool import AgentPool
    from dlctl.log.tls import TlsFiles
    from dlctl.log.writer import LogWriter
    from dlctl.meta.store import MetaStore
    from dlctl.meta.zk import ZkAuth, connect
    from dlctl.secrets import read_secret_file

    async def main(zk, name, secret_file, zk_auth_file, acked_path):
        # A short session: after SIGKILL the next owner waits about a second for the znode to go.
        auth = ZkAuth.from_file(Path(zk_auth_file))
        meta = MetaStore(connect(zk, auth, session_timeout=1.0), "c1", auth)
        tls_paths = os.environ.get("HARNESS_CLIENT_TLS")  # harness.tls.child_env: the agents run TLS
        tls = TlsFiles(*(Path(p) for p in tls_paths.split(os.pathsep))) if tls_paths else None
        pool = AgentPool(meta, Credentials(read_secret_file(Path(secret_file)), tls))
        writer = await LogWriter.open(meta, pool, name, owner_id="child", batch_bytes=2048)
        out = open(acked_path, "w", buffering=1)  # line-buffered: a line is in the file once acknowledged

        def acked(fut, i):
            if not fut.cancelled() and fut.exception() is None:
                out.write(f"{i} {writer_txids[i]} {fut.result()}\\n")

        writer_txids = {}
        i = 0
        while True:
            for _ in range(20):
                payload = f"child-{i}".encode()
                fut = writer.submit(payload)
                writer_txids[i] = writer.last_txid
                fut.add_done_callback(lambda f, i=i: acked(f, i))
                i += 1
            await writer.wait_writable()
            await asyncio.sleep(0.003)

    asyncio.run(main(*sys.argv[1:]))
    """
)


def test_tailing_reader_continues_without_gaps_when_the_owner_is_sigkilled(cluster, tmp_path):
    name = "sigkilled-owner"
    script = tmp_path / "owner.py"
    script.write_text(_OWNER)
    acked_path = tmp_path / "acked.txt"
    clients = ZkClients(cluster.ns.connect_string, timeout=10.0)

    def acked_lines() -> list[tuple[int, int, DLSN]]:
        text = acked_path.read_text() if acked_path.exists() else ""
        rows = []
        for line in text.split("\n")[:-1]:  # the last piece may be a torn line
            i, txid, dlsn = line.split()
            rows.append((int(i), int(txid), DLSN.parse(dlsn)))
        return rows

    async def scenario() -> None:
        meta = MetaStore(clients.new(), CLUSTER)
        await asyncio.to_thread(meta.create_log, name, LogConfig(3, 3, 2, roll_bytes=64 * 1024))
        pool = AgentPool(meta, harness_credentials(), request_timeout=2.0)
        seen: list[ReadRecord] = []
        reader = await LogReader(meta, pool, name, long_poll_timeout=1.0).open()

        async def consume() -> None:
            async for record in reader.tail():
                seen.append(record)

        consumer = asyncio.ensure_future(consume())
        child = cluster.procs.start(
            [sys.executable, script, cluster.ns.connect_string, name, cluster.agents["n1"].secret_file, cluster.agents["n1"].zk_auth_file, acked_path], name="owner-child",
            env=child_env(cluster.agents["n1"].client_tls),
        )
        try:
            # Kill it mid-stream, with the reader live behind it (it has delivered some already).
            await asyncio.to_thread(
                wait_until, lambda: len(acked_lines()) >= 3000 and len(seen) >= 500, 60, message="3000 acknowledged, 500 read", watch=child
            )
            child.kill()
            acked = acked_lines()
            assert [i for i, _, _ in acked] == list(range(len(acked))), "the child's acknowledgements are not in submission order"
            # The next owner waits for the dead one's session to expire, then recovers.
            second_meta = MetaStore(clients.new(), CLUSTER)
            second = await LogWriter.open(
                second_meta, AgentPool(second_meta, harness_credentials()), name, owner_id="second", ownership_wait=20
            )
            # It appends at once (a fast takeover); the child's segment is recovered meanwhile.
            later = list(await asyncio.gather(*(second.submit(f"second-{i}".encode()) for i in range(200))))
            await second.recovery_done()
            await second.close()
            child_ends = [s.value.last_txid for s in await asyncio.to_thread(meta.segments, name) if s.value.seq <= second.taken_over_seq]
            survived = max(child_ends) + 1  # the child's txids are 0, 1, ...: this many of its records are in the log
            assert survived >= len(acked), f"the child's segments end at txid {survived - 1} but it had {len(acked)} acknowledged"
            total = survived + len(later)
            await eventually(lambda: len(seen) >= total, 30, f"the reader to deliver {total} records")
            extra = []
            while (record := await _next_seen(seen, total + len(extra), 0.3)) is not None:
                extra.append(record)
            assert not extra, f"the reader delivered more than the log holds: {extra[:5]}"

            observed = [(r.txid, r.payload) for r in seen]
            second_txids = [r.txid for r in seen[survived:]]  # above what the child had reserved: a gap may come first
            expected = [(i, f"child-{i}".encode()) for i in range(survived)] + [
                (txid, f"second-{i}".encode()) for i, txid in enumerate(second_txids)
            ]
            assert second_txids == list(range(second_txids[0], second_txids[0] + len(later))) and second_txids[0] >= survived
            # Every acknowledged record exactly once and in order, no gap; the child's
            # unacknowledged-but-recovered records only at the crash point, before the new owner's.
            assert observed == expected, first_difference(expected, observed)
            positions = {r.txid: r.dlsn for r in seen}
            moved = [(i, d, positions[txid]) for i, txid, d in acked if positions[txid] != d]
            assert not moved, f"acknowledged records read at another DLSN than acknowledged: {moved[:5]}"
            assert [r.dlsn for r in seen[survived:]] == later
            assert all(a.dlsn < b.dlsn for a, b in itertools.pairwise(seen)), "DLSNs do not increase"
            stored = await read_direct(meta, pool, name)
            assert [(s.txid, s.payload) for s in stored] == expected, "the reader and the stored log disagree"
        finally:
            child.kill()
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await reader.close()
            await pool.close()

    with clients:
        run(scenario(), timeout=120)


async def _next_seen(seen: list[ReadRecord], index: int, timeout: float) -> ReadRecord | None:
    """The record the consumer delivers at ``index``, if one comes within ``timeout``."""
    try:
        return await eventually(lambda: seen[index] if len(seen) > index else None, timeout, "more records")
    except AssertionError:
        return None




# -- a deposed writer's segment creation ------------------------------------------------------------


class _AnswerLostOnFirstCreate(MetaStore):
    """The metadata store of a writer whose first ``create_segment`` request is caught by a
    connection drop: it is held until the test says so, then fails with ``ConnectionLoss``,
    which is what kazoo gives every request in flight when its connection drops (the request
    did not reach the server: nothing was created). Later calls go to ZooKeeper as usual."""

    def __init__(self, client: KazooClient, cluster: str) -> None:
        super().__init__(client, cluster)
        self.creating = threading.Event()
        self.drop = threading.Event()
        self.creates = 0

    def create_segment(self, *args: Any, **kwargs: Any) -> Any:
        self.creates += 1
        if self.creates == 1:
            self.creating.set()
            assert self.drop.wait(30), "the test never dropped the connection"
            raise ConnectionLoss()
        return super().create_segment(*args, **kwargs)


def test_a_deposed_writer_never_creates_a_segment_after_the_next_owner_took_over(cluster):
    """The interleaving: the owner starts its first segment; the ZooKeeper connection drops with
    the create in flight and, while it is down, the owner's session expires; the next owner
    takes the log over. The old writer learns it was deposed (LOST) and fails its appends, but
    its segment transition still runs: ``WriterMeta._create_segment`` (dlctl.log.writer_meta) retries after the blip on
    kazoo's new session, its compare-and-set on the log record succeeds (the new owner has not
    created a segment yet), and the deposed writer creates an in-progress segment. The new
    owner's first append then loses its own compare-and-set and it deposes *itself* ("another
    writer created segment 1"): the legitimate owner is thrown out by a dead one."""
    name = "deposed-creates-segment"
    clients = ZkClients(cluster.ns.connect_string, timeout=10.0)

    async def scenario() -> None:
        admin = MetaStore(clients.new(), CLUSTER)
        await asyncio.to_thread(admin.create_log, name, LogConfig(3, 3, 2))
        first_client = clients.new()
        first_meta = _AnswerLostOnFirstCreate(first_client, CLUSTER)
        first = await LogWriter.open(first_meta, AgentPool(first_meta, harness_credentials()), name, owner_id="first")
        pending = first.submit(b"from the first owner")  # no segment yet: the writer creates one
        assert await asyncio.to_thread(first_meta.creating.wait, 10), "the first writer never started a segment"
        await asyncio.to_thread(expire, cluster.ns, first_client)
        with pytest.raises(WriterDeposedError):
            await pending
        second_meta = MetaStore(clients.new(), CLUSTER)
        second = await LogWriter.open(
            second_meta, AgentPool(second_meta, harness_credentials()), name, owner_id="second", ownership_wait=10
        )
        try:
            first_meta.drop.set()  # the create in flight fails with the connection
            await eventually(lambda: first._transition is None, 10, "the deposed writer's segment transition to end")
            segments = [s.value for s in await asyncio.to_thread(admin.segments, name)]
            created = [(s.seq, s.state.value) for s in segments if s.writer == "first"]
            assert created == [], (
                f"the deposed writer created segments {created} after its session expired and owner "
                f"'second' took the log over (it made {first_meta.creates} create_segment calls)"
            )
            await second.append(b"from the second owner")
        finally:
            await second.close()
            await first.close()

    with clients:
        run(scenario(), timeout=60)


# -- a ZooKeeper connection blip while choosing an ensemble -------------------------------------------


class _PolicyReadLostOnce:
    """A kazoo client whose first read of the placement policy is lost to a connection blip:
    it fails with ``ConnectionLoss``, as kazoo fails a request in flight when its connection
    drops, while the session lives on (kazoo reconnects to it). Everything else is the real
    client."""

    def __init__(self, real: KazooClient, path: str) -> None:
        self._real = real
        self._path = path
        self.blips = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def get(self, path: str, *args: Any, **kwargs: Any) -> Any:
        if path == self._path and self.blips == 0:
            self.blips += 1
            raise ConnectionLoss()
        return self._real.get(path, *args, **kwargs)


def test_a_zookeeper_blip_while_a_writer_chooses_its_first_ensemble_does_not_kill_it(cluster):
    """The writer rides out ZooKeeper connection blips everywhere (``writer_meta.ZK_BLIPS``: agents as last
    seen, compare-and-sets retried until ``stall_timeout``), and a SUSPENDED connection is not
    a loss of ownership. ``WriterMeta.placement`` alone re-raises a blip when it has no policy
    cached yet, i.e. on the writer's first ensemble choice: the first append then fails with
    "failed unexpectedly: ConnectionLoss()" on a healthy session. (Under a real session expiry
    the same path makes pending appends fail with that generic WriterError instead of
    WriterDeposedError; the state machine above trips over it that way.)"""
    from dlctl.meta.policy import placement_path

    name = "policy-read-blip"
    clients = ZkClients(cluster.ns.connect_string, timeout=10.0)

    async def scenario() -> None:
        admin = MetaStore(clients.new(), CLUSTER)
        await asyncio.to_thread(admin.create_log, name, LogConfig(3, 3, 2))
        flaky = _PolicyReadLostOnce(clients.new(), placement_path(CLUSTER))
        meta = MetaStore(flaky, CLUSTER)  # type: ignore[arg-type]
        writer = await LogWriter.open(meta, AgentPool(meta, harness_credentials()), name, owner_id="blipped")
        try:
            dlsn = await writer.append(b"through a blip")
            assert flaky.blips == 1, "the placement policy was never read: the blip did not happen"
            assert dlsn == DLSN(1, 0, 0)
        finally:
            await writer.close()

    with clients:
        run(scenario(), timeout=60)
