"""Records read on a thread of their own (dlctl.ops.threaded_input): each reaches the coroutine
while the source is still blocked on the next, in order, with the source's error after the
records before it, and no more than ``max_bytes`` read ahead."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from dlctl.ops.threaded_input import RECORD_OVERHEAD, records_from_thread


class Gated:
    """A blocking source: record i is produced once ``release(i)`` was called (a slow pipe)."""

    def __init__(self, records: list[bytes], error: Exception | None = None) -> None:
        self.records, self.error = records, error
        self.gates = [threading.Event() for _ in records]
        self.produced = 0

    def release(self, i: int) -> None:
        self.gates[i].set()

    def __iter__(self):
        for i, record in enumerate(self.records):
            assert self.gates[i].wait(10), f"record {i} was never released"
            self.produced += 1
            yield record
        if self.error is not None:
            raise self.error


def test_each_record_arrives_while_the_source_blocks_on_the_next():
    source = Gated([b"a", b"b", b"c"])

    async def scenario() -> list[bytes]:
        got = []
        async with contextlib.aclosing(records_from_thread(source)) as arriving:
            for i in range(3):
                source.release(i)  # only this one: the source then blocks on the next
                got.append(await asyncio.wait_for(anext(arriving), 5))
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(anext(arriving), 5)
        return got

    assert asyncio.run(scenario()) == [b"a", b"b", b"c"]


def test_the_sources_error_comes_after_the_records_before_it():
    source = Gated([b"a", b"b"], error=ValueError("standard input: truncated length prefix at byte 9"))
    source.release(0)
    source.release(1)

    async def scenario() -> list[bytes]:
        got = []
        with pytest.raises(ValueError, match="truncated length prefix"):
            async for record in records_from_thread(source):
                got.append(record)
        return got

    assert asyncio.run(scenario()) == [b"a", b"b"]


def test_no_more_than_max_bytes_are_read_ahead_of_the_consumer():
    records = [b"x" * 100 for _ in range(50)]
    source = Gated(records)
    for i in range(50):
        source.release(i)
    limit = 5 * (100 + RECORD_OVERHEAD)

    async def scenario() -> None:
        async with contextlib.aclosing(records_from_thread(source, max_bytes=limit)) as arriving:
            await anext(arriving)
            await asyncio.sleep(0.3)  # time for the reader to run ahead as far as it may
            assert source.produced <= 1 + limit // (100 + RECORD_OVERHEAD) + 1, source.produced
            rest = [r async for r in arriving]
        assert len(rest) == 49

    asyncio.run(scenario())


def test_leaving_early_stops_the_reader():
    source = Gated([b"r%d" % i for i in range(20)])
    for i in range(20):
        source.release(i)

    async def scenario() -> None:
        async with contextlib.aclosing(records_from_thread(source, max_bytes=3 * (2 + RECORD_OVERHEAD))) as arriving:
            await anext(arriving)
        await asyncio.sleep(0.3)

    asyncio.run(scenario())
    assert source.produced < 20  # it stopped at its next record instead of reading everything
