"""The re-replication copy engine (``copy_replica``: what ``dlctl recover`` and the auditor's
repairs run) against real agent processes, without ZooKeeper: segment records are built here and
the entries written to the members their write sets name. Whole ensembles (E = W) are read in
ranges and written in batches; a striped replica (E > W) gets exactly its entries; a source
that stops serving in the middle of a run hands the rest of the run to the next one; every copy
is verified by the target's digest."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest
from test_agent_protocol import Agent

from dlctl.log.auth import generate_secret
from dlctl.log.client import AgentClient
from dlctl.log.errors import LimboError, NoSuchEntryError
from dlctl.log.format import Entry, decode_header, encode
from dlctl.log.rereplication import digest_of, entries_on
from dlctl.log.rereplication_copy import CopyProgress, StuckError, copy_replica
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.ratelimit import TokenBucket

pytestmark = pytest.mark.agent

T = TypeVar("T")
NODES = ("a", "b", "t")  # "a" shares the target's rack (tried first), "b" does not; "t" is the target


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Agent]]:
    secret = generate_secret()
    out: dict[str, Agent] = {}
    try:
        for n in NODES:
            out[n] = Agent(tmp_path_factory.mktemp(f"agent-{n}"), secret)
        yield out
    finally:
        for n, a in out.items():
            alive = a.alive()
            code = a.stop() if alive else a.proc.returncode
            log = a.log_path.read_text(errors="replace")
            assert alive and code == 0, f"agent {n} died; log:\n{log[-4000:]}"
            assert "Traceback" not in log and "internal error" not in log, log[-4000:]


class Pool:
    """The agents by node id, as ``copy_replica`` expects of an ``AgentPool``."""

    def __init__(self, agents: dict[str, Agent]) -> None:
        self.clients = {n: a.aclient(request_timeout=10) for n, a in agents.items()}
        self.nodes = {n: {"region": "r1", "rack": "k2" if n == "b" else "k1"} for n in agents}

    async def client(self, node: str) -> AgentClient:
        if node not in self.clients:
            raise AssertionError(f"the copy asked for {node}, which is lost")
        return self.clients[node]

    async def requests(self, node: str) -> int:
        return (await self.clients[node].stat())["server"]["requests"]

    async def close(self) -> None:
        for c in self.clients.values():
            await c.close()


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(120):
            return await coro

    return asyncio.run(bounded())


def segment(seq: int, nodes: tuple[str, ...], w: int, count: int) -> SegmentRecord:
    return SegmentRecord(seq, SegmentState.COMPLETED, (EnsembleChange(0, nodes),), w, min(w, 2), time.time(), last_entry_id=count - 1)


async def write(pool: Pool, log_id: int, seg: SegmentRecord, *, upto: dict[str, int] | None = None) -> list[bytes]:
    """Every entry of ``seg`` (random sizes) on the live members of its write set; ``upto``: a
    member that holds only the entries before that id (it lost the rest)."""
    upto = upto or {}
    data = [encode(Entry(log_id, seg.seq, i, i - 1, os.urandom(500 + (i * 7919) % 3000))) for i in range(seg.last_entry_id + 1)]
    for node in pool.clients:
        mine = [d for i, d in enumerate(data) if node in seg.write_set(i) and i < upto.get(node, len(data))]
        await asyncio.gather(*(pool.clients[node].add(d) for d in mine))
    return data


async def assert_target_holds(pool: Pool, log_id: int, seg: SegmentRecord, ids: list[int], data: list[bytes], result: Any) -> None:
    expected = digest_of((i, decode_header(data[i]).crc) for i in ids)
    assert (result.entries, result.digest) == (len(ids), expected)
    assert result.bytes == sum(len(data[i]) for i in ids)
    got = await pool.clients["t"].digest(log_id, seg.seq, 0, seg.last_entry_id)
    assert (got.entries, got.digest) == (len(ids), expected)  # exactly these entries, nothing else
    for i in ids[:: max(1, len(ids) // 20)]:
        assert await pool.clients["t"].read(log_id, seg.seq, i) == data[i]


def test_a_whole_ensemble_segment_is_read_in_ranges_written_in_batches_and_verifies(agents: dict[str, Agent]) -> None:
    async def body() -> None:
        pool = Pool(agents)
        try:
            seg = segment(1, ("a", "b", "lost"), 3, 400)
            data = await write(pool, 11, seg)
            before = {n: await pool.requests(n) for n in NODES}
            # Chunks of a few entries (16 KiB): many runs, many batches, each one request.
            result = await copy_replica(pool, 11, seg, "lost", "t", {"lost"}, window=32, batch_bytes=16 * 1024)
            used = {n: await pool.requests(n) - before[n] - 1 for n in NODES}
            ids = entries_on(seg, "lost")
            await assert_target_holds(pool, 11, seg, ids, data, result)
            assert used["b"] == 0, "the nearer replica serves every range"
            assert 0 < used["a"] < len(ids) / 4, f"{used['a']} reads for {len(ids)} entries: not ranges"
            assert 0 < used["t"] < len(ids) / 4, f"{used['t']} requests to the target for {len(ids)} entries: not batches"
            # In place (the auditor's repair): the member itself is refilled from its peers,
            # paced by its byte-rate limit (one second of burst) and counted as it goes.
            seg = segment(2, ("a", "t"), 2, 120)
            data = await write(pool, 11, seg, upto={"t": 0})
            total, rate = sum(map(len, data)), 100_000
            progress = CopyProgress()
            started = time.monotonic()
            result = await copy_replica(pool, 11, seg, "t", "t", set(), progress=progress, throttle=TokenBucket(rate), batch_bytes=16 * 1024)
            assert time.monotonic() - started >= (total - rate) / rate * 0.9, "the throttle paced the copy"
            assert (progress.entries, progress.bytes) == (120, total)
            await assert_target_holds(pool, 11, seg, list(range(120)), data, result)
        finally:
            await pool.close()

    run(body())


def test_a_striped_replica_gets_exactly_its_entries(agents: dict[str, Agent]) -> None:
    async def body() -> None:
        pool = Pool(agents)
        try:
            seg = segment(11, ("a", "b", "lost"), 2, 301)  # E = 3, W = 2: the sources alternate
            data = await write(pool, 12, seg)
            ids = entries_on(seg, "lost")
            assert 0 < len(ids) < 301
            before = await pool.requests("t")
            result = await copy_replica(pool, 12, seg, "lost", "t", {"lost"}, window=32, batch_bytes=32 * 1024)
            used = await pool.requests("t") - before - 1
            assert 0 < used < len(ids) / 4, f"{used} requests to the target for {len(ids)} entries: not batches"
            await assert_target_holds(pool, 12, seg, ids, data, result)
            missing = next(i for i in range(301) if i not in ids)
            with pytest.raises(NoSuchEntryError):
                await pool.clients["t"].read(12, seg.seq, missing)
        finally:
            await pool.close()

    run(body())


def test_a_source_that_stops_serving_mid_run_hands_the_rest_to_the_next(agents: dict[str, Agent]) -> None:
    async def body() -> None:
        pool = Pool(agents)
        try:
            # "a" (tried first) lost everything from entry 37 on: its range answers stop at the
            # gap, then it answers NO_SUCH_ENTRY, and "b" serves the rest of each run.
            seg = segment(21, ("a", "b", "lost"), 3, 150)
            data = await write(pool, 13, seg, upto={"a": 37})
            before = await pool.requests("b")
            result = await copy_replica(pool, 13, seg, "lost", "t", {"lost"}, window=32, batch_bytes=64 * 1024)
            await assert_target_holds(pool, 13, seg, list(range(150)), data, result)
            assert await pool.requests("b") > before + 1, "the next replica served the rest"
            # "a" answers LIMBO in the middle of a run: a flipped bit in entry 60 of its file.
            seg = segment(22, ("a", "b", "lost"), 3, 150)
            data = await write(pool, 13, seg)
            await pool.clients["a"].fence(13, 22)  # durable, read from the file from now on
            path = agents["a"].data_dir / "segments" / f"{13:016x}" / f"{22:016x}.log"
            offset = sum(map(len, data[:60])) + 100
            with open(path, "r+b") as f:
                f.seek(offset)
                b = f.read(1)
                f.seek(offset)
                f.write(bytes([b[0] ^ 0x01]))
            result = await copy_replica(pool, 13, seg, "lost", "t", {"lost"}, window=32, batch_bytes=64 * 1024)
            await assert_target_holds(pool, 13, seg, list(range(150)), data, result)
            with pytest.raises(LimboError):
                await pool.clients["a"].read(13, 22, 0)  # it was asked, and found its corruption
        finally:
            await pool.close()

    run(body())


def test_an_entry_no_source_serves_is_named_with_every_answer(agents: dict[str, Agent]) -> None:
    async def body() -> None:
        pool = Pool(agents)
        try:
            seg = segment(31, ("a", "b", "lost"), 3, 60)
            await write(pool, 14, seg, upto={"a": 20, "b": 45})
            with pytest.raises(StuckError) as err:
                await copy_replica(pool, 14, seg, "lost", "t", {"lost"}, window=16, batch_bytes=8 * 1024)
            message = err.value.message
            assert "segment 31 of log id 14: entry 45 could not be read from any surviving replica" in message, message
            assert "a: NoSuchEntryError" in message and "b: NoSuchEntryError" in message, message
            assert err.value.details["entry"] == 45 and set(err.value.details["answers"]) == {"a", "b"}
        finally:
            await pool.close()

    run(body())
