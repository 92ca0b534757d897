"""agent/pull.py's receive buffers: an answer is read into a buffer the puller lends, reused for a
later answer only once the entries read into it are durable, never after a failed store."""

from __future__ import annotations

import asyncio

import pytest

from dlagent.pull import RangePuller
from dlctl.log import protocol as p
from dlctl.log.errors import AgentIOError
from dlctl.log.format import Entry, encode

SIZE = 3000


def _entries(count: int) -> list[bytes]:
    return [encode(Entry(1, 1, i, i - 1, bytes([i % 251]) * SIZE)) for i in range(count)]


class Source:
    """A source's client: answers READ_RANGE into the lent buffer, as the connection does."""

    def __init__(self, entries: list[bytes], fail_at: int | None = None) -> None:
        self.entries = entries
        self.fail_at = fail_at
        self.lent: list[bytearray] = []

    async def read_range(self, log_id, seq, first, last, max_bytes, *, into=None):
        await asyncio.sleep(0)
        if first == self.fail_at:
            raise AgentIOError(f"entry 1/1/{first} from agent src is corrupt: CRC-32C mismatch")
        body, spans, pos = bytearray(p.OK_PREAMBLE), [], p.OK_RESULT_OFFSET
        for data in self.entries[first : last + 1]:
            if spans and pos + len(data) - p.OK_RESULT_OFFSET > max_bytes:
                break
            body += data
            spans.append((pos, pos + len(data)))
            pos += len(data)
        assert into is not None and len(into) >= len(body)
        self.lent.append(into)
        into[: len(body)] = body
        return memoryview(into)[: len(body)], spans


class Pool:
    def __init__(self, source: Source) -> None:
        self.source = source

    async def client(self, node: str) -> Source:
        return self.source


class Store:
    """Keeps what it was given until the batch is "durable" (a few loop turns later), then checks
    it was not overwritten meanwhile (a buffer reused too early would have been)."""

    def __init__(self, fail_batch: int | None = None) -> None:
        self.stored: list[bytes] = []
        self.batches = 0
        self.fail_batch = fail_batch

    async def add_batch(self, views, *, recovery, uncached):
        assert recovery and all(view.readonly for view in views)
        self.batches += 1
        if self.batches == self.fail_batch:
            raise OSError("disk gone")
        seen = [bytes(view) for view in views]
        for _ in range(5):
            await asyncio.sleep(0)  # the next answer is being read meanwhile
        assert [bytes(view) for view in views] == seen
        self.stored.extend(seen)
        return len(views)


def _pull(source: Source, store: Store, count: int, max_bytes: int, read_cap_entries: int = 3, puller: RangePuller | None = None) -> tuple[RangePuller, bytes]:
    puller = puller or RangePuller(Pool(source), store, "dst")

    async def run() -> bytes:
        cap = read_cap_entries * (SIZE + 48)
        original = source.read_range

        async def capped(log_id, seq, first, last, max_bytes_, *, into=None):
            return await original(log_id, seq, first, last, min(max_bytes_, cap), into=into)

        source.read_range = capped  # type: ignore[method-assign]
        return await puller.pull(1, 1, 0, count - 1, max_bytes, "src", True)

    return puller, asyncio.run(run())


def test_answers_go_into_few_buffers_reused_only_once_their_entries_are_durable() -> None:
    entries = _entries(30)
    source, store = Source(entries), Store()
    puller, answer = _pull(source, store, 30, 1 << 30)
    assert store.stored == entries
    assert p.decode_pulled(answer).entries == 30
    assert len(source.lent) == 10 and len({id(buf) for buf in source.lent}) <= 3  # reused, not one per answer
    assert puller._spare == []  # no pull running: nothing kept


def test_a_buffer_whose_store_failed_is_never_lent_again() -> None:
    entries = _entries(12)
    source, store = Source(entries), Store(fail_batch=2)
    puller = RangePuller(Pool(source), store, "dst")
    puller._running = 1  # another pull runs meanwhile: spare buffers are kept
    with pytest.raises(OSError):
        _pull(source, store, 12, 1 << 30, puller=puller)
    failed = source.lent[1]  # the second answer's: its batch was refused
    assert source.lent[0] in puller._spare and all(buf is not failed for buf in puller._spare)


def test_a_source_failure_still_cuts_the_pull_short_with_the_reason() -> None:
    entries = _entries(12)
    source, store = Source(entries, fail_at=6), Store()
    _puller, answer = _pull(source, store, 12, 1 << 30)
    result = p.decode_pulled(answer)
    assert result.entries == 6 and "CRC-32C mismatch" in result.reason and "(at entry 6)" in result.reason
    assert store.stored == entries[:6]
