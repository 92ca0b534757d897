"""Power losses under load: every acknowledged record survives (and the test can tell when not).

Three real agents (E = W = 3, A = 2), each with its data directory on its own power-loss
filesystem (``harness.powerfs`` over FUSE; the model, in ``harness.crashdisk``: a file's data and
size survive only as of its last returned fsync/fdatasync, a name only as of its directory's last
fsync; everything else is discarded at a power loss). Each fsync on those disks takes
SYNC_LATENCY_MS, like a device's flush. Producers append through the write proxies without pause.

Over 20 cycles the test cuts the power of some agents — all three at once in two cycles of three,
one or two otherwise. A cut falls at one instant for all its victims: the first victim's disk
freezes them all (SIGSTOP) inside its next write ("write": data written, not durable) or inside
its next fsync of a file ("fsync": called, not returned; it never returns), or the test freezes
them at once ("now"). Then each victim's disk discards what was not durable, the victims are
SIGKILLed and reaped, and started again on the same directories. Producers fail over to whichever
agent claims the log; its recovery fences and closes the previous owner's segment.

The oracle is the test's own: every record a producer got an acknowledgement (a DLSN) for, by its
unique payload. At the end comes a last whole-cluster cut, a new owner recovers the log (a final
marker record goes through it), and the log is read back with the project's LogReader up to the
marker: every acknowledged payload must be there, at the DLSN it was acknowledged with.

``sync = "always"`` (the default) must lose nothing. The same scenario with ``sync = "never"``
must lose records — that is what proves the filesystem layer sees a missing fsync; the negative
test asserts the loss and says how many. (Its log stops taking records after the first whole
cut: the new owner cannot read the tail the old one acknowledged. Cycles then end early, and the
records are counted by a tolerant direct read of every replica, as the reader cannot get past
an entry no replica holds.)

Reproduce a run with POWER_LOSS_SEED=<seed> (printed with every result and failure); the timing
of real processes still varies.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from dlctl.log import format as fmt
from dlctl.log.dlsn import DLSN
from dlctl.log.errors import AgentError
from dlctl.log.producer import LogProducer, ProducerOptions
from dlctl.log.reader import LogReader
from dlctl.log.records import decode_records
from dlctl.log.speculative import EntryReadError
from dlctl.meta.records import LogConfig, SegmentState
from dlctl.meta.store import MetaStore
from harness.agents import AgentNode
from harness.logcluster import CLUSTER, AgentCluster, LogEnv, run
from harness.powerfs import PowerFs
from harness.procs import ProcessRegistry, wait_until
from harness.zk import ZkNamespace

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]

NODES = ("n1", "n2", "n3")
SESSION_TIMEOUT = 1.0  # agents' ZooKeeper sessions: a dead owner's log moves on within about a second
# Small segments, so that each cycle's writes cross rolls (new files, directory fsyncs) besides
# the roll every change of owner brings.
LOG_CONFIG = LogConfig(3, 3, 2, roll_bytes=48 * 1024, roll_seconds=5.0)
PRODUCERS = 2
IN_FLIGHT = 200  # unsettled records per producer: there is always something in flight at a cut
PAYLOAD_BYTES = 100
ACKS_PER_CYCLE = (450, 750)  # acknowledgements awaited between two power cuts (uniform)
# Where a cut falls (PowerCluster.cut_power): inside a write, inside an fsync, or at once.
TRIGGERS = ("write", "fsync", "write", "fsync", "now")
# Each fsync/fdatasync takes this long on the power-loss disks, like a flush to a real device:
# a cut then often finds one in flight, with written batches not yet durable.
SYNC_LATENCY_MS = 3.0


@dataclass
class PowerCluster:
    agents: dict[str, AgentNode]
    disks: dict[str, PowerFs]
    cluster: AgentCluster  # for LogEnv (metadata clients, pools)
    losses: list[tuple[int, tuple[str, ...], str, dict[str, dict]]] = field(default_factory=list)

    def cut_power(self, cycle: int, victims: tuple[str, ...], trigger: str = "now") -> str:
        """One instant for all victims: every victim agent frozen (SIGSTOP) at once, then each one's
        disk discards what was not fsynced (an fsync in flight fails with EIO and nothing it
        covered stays; requests the frozen agent still had queued are refused), then the agents
        are SIGKILLed and reaped. ``trigger``: "now", or "write"/"fsync" to have the first
        victim's disk freeze them all inside its next write or file fsync — the instants where
        acknowledged and not-yet-durable data sit side by side. Returns the trigger that cut."""
        procs = {n: self.agents[n].proc for n in victims}
        pids = [p.pid for p in procs.values()]
        if trigger != "now":
            disk = self.disks[victims[0]]
            disk.arm(trigger, pids)
            try:
                wait_until(lambda: disk.fired() is not None, 5.0, message=f"a {trigger} on {victims[0]}'s disk")
            except AssertionError:
                if disk.fired(disarm=True) is None:
                    trigger = "now"  # nothing to write for 5 s: cut at once instead
        for proc in procs.values():
            proc.pause()  # those the disk froze already: no change
        reports = {n: self.disks[n].power_loss(dead_pids=[proc.pid]) for n, proc in procs.items()}
        for proc in procs.values():
            proc.kill()
        self.losses.append((cycle, victims, trigger, reports))
        return trigger

    def restart(self, victims: tuple[str, ...]) -> None:
        for n in victims:
            self.agents[n].start(wait=False)
        for n in victims:
            self.agents[n].wait_ready(self.cluster.admin, timeout=30.0)

    def fsync_counts(self) -> Counter:
        total: Counter = Counter()
        for disk in self.disks.values():
            counters = disk.stats()["counters"]
            total.update({k: counters.get(k, 0) for k in ("fsync", "fdatasync", "fsync_dir", "write", "fallocate")})
        return total


def power_cluster(zk_server, base, label: str, sync: str) -> Iterator[PowerCluster]:
    zk_server.ensure_running()
    ns = ZkNamespace(zk_server, label=label)
    procs = ProcessRegistry(base / "procs")
    disks: dict[str, PowerFs] = {}
    try:
        admin = ns.client()
        agents = {
            n: AgentNode(procs, base, ns.connect_string, cluster=CLUSTER, node_id=n, region=f"r{i}", session_timeout=SESSION_TIMEOUT, sync=sync)
            for i, n in enumerate(NODES, start=1)
        }
        # The filesystems start first, so the registry (which ends processes newest first) stops
        # the agents before the mounts under them.
        for n, node in agents.items():
            disks[n] = PowerFs(procs, node.data_dir, name=f"powerfs-{n}", sync_latency_ms=SYNC_LATENCY_MS).start()
        for node in agents.values():
            node.start(wait=False)
        for node in agents.values():
            node.wait_ready(admin)
        yield PowerCluster(agents, disks, AgentCluster(ns, procs, agents, admin, base))
    finally:
        procs.close()
        for disk in disks.values():
            disk.close()  # detaches a mount whose process died
        ns.close()


@pytest.fixture
def always_cluster(zk_server, tmp_path):
    yield from power_cluster(zk_server, tmp_path, "power-always", "always")


@pytest.fixture
def never_cluster(zk_server, tmp_path):
    yield from power_cluster(zk_server, tmp_path, "power-never", "never")


@pytest.fixture
def seed() -> int:
    return int(os.environ.get("POWER_LOSS_SEED") or random.SystemRandom().randrange(1 << 32))


# -- the scenario ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    acked: dict[bytes, DLSN]  # the oracle: payload -> DLSN acknowledged
    failed: int  # records whose futures failed (never acknowledged: not in the oracle)
    cycles: int
    marker: DLSN | None  # the last record, appended through the owner that recovered the log
    found: dict[bytes, list[DLSN]]  # read back
    reader_error: str | None  # why the LogReader could not read to the marker (then found is from replicas)
    unreadable_entries: int  # entries of the metadata that no replica could serve (tolerant read)
    stalled: str | None  # the log stopped taking records (the power cuts then ended early)
    seconds: float

    @property
    def lost(self) -> list[bytes]:
        return [p for p in self.acked if p not in self.found]

    @property
    def moved(self) -> list[bytes]:
        return [p for p, d in self.acked.items() if p in self.found and d not in self.found[p]]


def victims_for(cycle: int, rng: random.Random) -> tuple[str, ...]:
    """All three agents in two cycles of three; one or two of them otherwise."""
    if cycle % 3 != 2:
        return NODES
    return tuple(sorted(rng.sample(NODES, rng.choice((1, 2)))))


def payload(producer: int, seq: int) -> bytes:
    head = b"p%d-%08d|" % (producer, seq)
    return head + b"x" * (PAYLOAD_BYTES - len(head))


async def produce(i: int, producer: LogProducer, acked: dict[bytes, DLSN], failed: list[int], stop: asyncio.Event) -> None:
    """Submit records until ``stop``, never more than IN_FLIGHT unsettled; wait for all at the end."""
    unsettled: set[asyncio.Future] = set()
    seq = 0

    def settled(fut: asyncio.Future, data: bytes) -> None:
        unsettled.discard(fut)
        if fut.cancelled() or fut.exception() is not None:
            failed[0] += 1
        else:
            acked[data] = fut.result()

    while not stop.is_set():
        if len(unsettled) >= IN_FLIGHT:
            await asyncio.wait(list(unsettled), return_when=asyncio.FIRST_COMPLETED)
            continue
        await producer.wait_writable()
        data = payload(i, seq)
        seq += 1
        fut = producer.submit(data)
        unsettled.add(fut)
        fut.add_done_callback(lambda f, d=data: settled(f, d))
        if seq % 50 == 0:
            await asyncio.sleep(0)  # let the other producer and the orchestration run
    if unsettled:
        await asyncio.wait(list(unsettled))


async def read_with_log_reader(env: LogEnv, marker: DLSN) -> dict[bytes, list[DLSN]]:
    """Every record up to ``marker`` through the project's reader (raises if it cannot get there)."""
    meta = env.meta()
    pool = env.pool(meta)
    found: dict[bytes, list[DLSN]] = {}
    try:
        async with LogReader(meta, pool, env.name, long_poll_timeout=1.0) as reader:
            while True:
                record = await reader.read_next(timeout=30.0)
                if record is None:
                    raise AssertionError(f"the reader made no progress for 30 s at {reader.position}, before the marker at {marker}")
                found.setdefault(record.payload, []).append(record.dlsn)
                if record.dlsn >= marker:
                    return found
    finally:
        await pool.close()


async def read_tolerant(env: LogEnv) -> tuple[dict[bytes, list[DLSN]], int]:
    """Every record any replica still serves, entry by entry over the segment metadata, skipping
    (and counting) entries no replica has: for counting what a lossy run kept."""
    meta: MetaStore = env.meta()
    pool = env.pool(meta, request_timeout=3.0)
    found: dict[bytes, list[DLSN]] = {}
    unreadable = 0
    try:
        log_id = meta.get_log(env.name).value.log_id
        for versioned in meta.segments(env.name):
            seg = versioned.value
            if seg.state is SegmentState.INPROGRESS:
                last = -1
                for node in seg.ensembles[-1].nodes:
                    try:
                        last = max(last, await (await pool.client(node)).read_lac(log_id, seg.seq))
                    except AgentError:
                        pass
            else:
                last = seg.last_entry_id
            for entry_id in range(last + 1):
                for node in seg.write_set(entry_id):
                    try:
                        encoded = await (await pool.client(node)).read(log_id, seg.seq, entry_id)
                        break
                    except AgentError:
                        continue
                else:
                    unreadable += 1
                    continue
                entry = fmt.decode(encoded)
                for slot, record in enumerate(decode_records(entry.payload)):
                    if not record.control:
                        found.setdefault(record.payload, []).append(DLSN(seg.seq, entry_id, slot))
    finally:
        await pool.close()
    return found, unreadable


class Stalled(Exception):
    """No acknowledgement for STALL_SECONDS: the log stopped taking records."""


async def await_acks(acked: dict, target: int, tasks: list[asyncio.Task], what: str, stall_seconds: float) -> None:
    """Until ``target`` records are acknowledged; Stalled if none arrives for ``stall_seconds``."""
    count, since = len(acked), time.monotonic()
    while len(acked) < target:
        for t in tasks:
            if t.done():
                t.result()  # a producer task died: show why
                raise AssertionError(f"a producer stopped before {what}")
        if len(acked) != count:
            count, since = len(acked), time.monotonic()
        elif time.monotonic() - since > stall_seconds:
            raise Stalled(f"no acknowledgement for {stall_seconds:g} s while waiting for {what} ({count} so far)")
        await asyncio.sleep(0.05)


def run_power_losses(pc: PowerCluster, env: LogEnv, cycles: int, seed: int, *, stall_seconds: float) -> Outcome:
    """Producers write while ``cycles`` power cuts hit the agents, then a last cut of all three, a
    new owner and a marker; then the read-back. A Stalled log ends the cycles early (the negative
    test expects that); the caller decides whether a stall is acceptable (``Outcome.stalled``)."""
    rng = random.Random(seed)
    env.create_log(LOG_CONFIG)
    started = time.monotonic()

    async def scenario() -> Outcome:
        acked: dict[bytes, DLSN] = {}
        failed = [0]
        stalled: str | None = None
        stop = asyncio.Event()
        producers = []
        for i in range(PRODUCERS):
            meta = env.meta()
            producers.append(LogProducer(meta, env.pool(meta), env.name, region=f"r{i + 1}", options=ProducerOptions(retry_timeout=120.0)))
        tasks = [asyncio.ensure_future(produce(i, p, acked, failed, stop)) for i, p in enumerate(producers)]
        done_cycles = 0
        try:
            for cycle in range(cycles):
                target = len(acked) + rng.randint(*ACKS_PER_CYCLE)
                await await_acks(acked, target, tasks, f"{target} acknowledgements before power cut {cycle + 1}", stall_seconds)
                victims = victims_for(cycle, rng)
                await asyncio.to_thread(pc.cut_power, cycle, victims, rng.choice(TRIGGERS))
                done_cycles += 1
                await asyncio.to_thread(pc.restart, victims)
            # Writes go on through the last recovery; then everything submitted settles.
            target = len(acked) + ACKS_PER_CYCLE[0]
            await await_acks(acked, target, tasks, "acknowledgements after the last restart", stall_seconds)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=150.0)
        except Stalled as exc:
            stalled = f"after {done_cycles} power cut(s): {exc}"
        finally:
            stop.set()
            for t in tasks:
                t.cancel()  # records still unsettled stay unacknowledged
            await asyncio.gather(*tasks, return_exceptions=True)
            for producer in producers:
                try:
                    await asyncio.wait_for(producer.close(), timeout=5.0)
                except Exception:  # noqa: BLE001 - the outcome is judged on what was acknowledged
                    pass
                await producer.pool.close()
        # The last cut: all three. A new owner recovers the log before the marker is appended.
        await asyncio.to_thread(pc.cut_power, done_cycles, NODES)  # nothing is being written now
        done_cycles += 1
        await asyncio.to_thread(pc.restart, NODES)
        meta = env.meta()
        final = LogProducer(meta, env.pool(meta), env.name, options=ProducerOptions(retry_timeout=stall_seconds))
        marker: DLSN | None = None
        reader_error: str | None = None
        try:
            marker = await asyncio.wait_for(final.append(b"end-of-test-marker"), timeout=stall_seconds + 30.0)
        except Exception as exc:  # noqa: BLE001 - reported; the read-back then has no end to aim for
            reader_error = f"the marker could not be appended: {type(exc).__name__}: {exc}"
        finally:
            try:
                await asyncio.wait_for(final.close(), timeout=5.0)
            except Exception:  # noqa: BLE001
                pass
            await final.pool.close()
        unreadable = 0
        found: dict[bytes, list[DLSN]] = {}
        if marker is not None:
            try:
                found = await asyncio.wait_for(read_with_log_reader(env, marker), timeout=180.0)
            except (EntryReadError, AssertionError, TimeoutError) as exc:
                reader_error = f"{type(exc).__name__}: {exc}"
        if reader_error is not None:
            found, unreadable = await read_tolerant(env)
        return Outcome(acked, failed[0], done_cycles, marker, found, reader_error, unreadable, stalled, time.monotonic() - started)

    try:
        return run(scenario(), timeout=900.0)
    except BaseException as exc:
        exc.add_note(f"POWER_LOSS_SEED={seed}")
        raise
    finally:
        env.close()


def describe(outcome: Outcome, pc: PowerCluster, seed: int) -> str:
    reports = [r for *_, by_node in pc.losses for r in by_node.values()]
    discarded = sum(r["pages_discarded"] for r in reports)
    mid_fsync = sum(1 for r in reports if r["fsyncs_in_flight"])
    hit = sum(1 for r in reports if r["pages_discarded"])
    whole = sum(1 for _, victims, _, _ in pc.losses if len(victims) == len(NODES))
    triggers = Counter(trigger for _, _, trigger, _ in pc.losses)
    return (
        f"seed {seed}: {outcome.cycles} power cuts ({whole} of all three agents; cut at {dict(triggers)}), {len(outcome.acked)} records acknowledged, "
        f"{outcome.failed} failed, {len(outcome.lost)} acknowledged records lost, {len(outcome.moved)} found only at another DLSN; "
        f"{discarded} unsynced pages discarded ({hit} of {len(reports)} disk cuts found written pages not yet durable, "
        f"{mid_fsync} an fsync in flight); disk calls {dict(pc.fsync_counts())}; "
        f"stalled: {outcome.stalled or 'no'}; reader: {outcome.reader_error or 'read to the marker'}"
        f"{f', {outcome.unreadable_entries} entries on no replica' if outcome.unreadable_entries else ''}; {outcome.seconds:.0f} s"
    )


# -- the tests ---------------------------------------------------------------------------------------


def test_power_cuts_of_agents_under_load_lose_no_acknowledged_record(always_cluster, seed, request):
    pc = always_cluster
    env = LogEnv.for_test(pc.cluster, request.node.name)
    outcome = run_power_losses(pc, env, cycles=20, seed=seed, stall_seconds=45.0)
    summary = describe(outcome, pc, seed)
    print(summary)
    lost = sorted(outcome.lost)
    assert not lost, f"{summary}\nfirst lost: {[(p[:12], outcome.acked[p]) for p in lost[:10]]}"
    moved = sorted(outcome.moved)
    assert not moved, f"{summary}\nfirst moved: {[(p[:12], outcome.acked[p], outcome.found[p]) for p in moved[:10]]}"
    assert outcome.stalled is None and outcome.reader_error is None, summary
    assert outcome.cycles >= 20 and len(outcome.acked) >= 10_000, summary
    assert pc.fsync_counts()["fdatasync"] > 0, "the agents' group commits must reach the filesystem as fdatasyncs"


def test_the_same_power_cuts_with_sync_never_do_lose_acknowledged_records(never_cluster, seed, request, record_property):
    """The negative control: without fdatasync the agents acknowledge what a power cut takes away,
    and this test sees it. If it ever passes without loss, the filesystem layer keeps unsynced data."""
    pc = never_cluster
    env = LogEnv.for_test(pc.cluster, request.node.name)
    outcome = run_power_losses(pc, env, cycles=4, seed=seed, stall_seconds=10.0)
    summary = describe(outcome, pc, seed)
    print(summary)
    assert pc.fsync_counts()["fdatasync"] == 0, "sync = never issues no fdatasync"
    record_property("acknowledged", len(outcome.acked))
    record_property("lost", len(outcome.lost))
    assert len(outcome.acked) > 0, summary
    assert len(outcome.lost) > 0, f"records were expected to be lost without fsync: {summary}"
