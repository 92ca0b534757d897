"""``SegmentStore.add_batch``: several entries of one segment stored as single adds would store
them, all or nothing (every entry checked before any is queued), answered once all are durable;
the entries may be views of one request body, kept without a copy."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from dlagent.storage import SegmentStore, digest_of
from dlctl.log.errors import BadRequestError, FencedError, NoSuchSegmentError
from dlctl.log.format import HEADER_SIZE, decode_header

LOG_PATH = Path("segments") / f"{1:016x}" / f"{1:016x}.log"


def views(*entries: bytes) -> list[memoryview]:
    """The entries as views of one buffer, as the server hands a batch's body to the store."""
    body = memoryview(b"".join(entries))
    out, pos = [], 0
    for e in entries:
        out.append(body[pos : pos + len(e)])
        pos += len(e)
    return out


def flipped(buf: bytes, pos: int) -> bytes:
    b = bytearray(buf)
    b[pos] ^= 0x01
    return bytes(b)


def test_a_batch_is_stored_as_its_single_adds_would_be(tmp_path, entry, threaded):
    entries = [entry(1, 1, i, payload=os.urandom(100 + i)) for i in range(6)]

    async def body():
        store = SegmentStore(tmp_path, threaded)
        await store.open()
        assert await store.add_batch(views(*entries[:4])) == 4  # a new segment
        assert await store.add_batch(views(entries[4], entries[5])) == 2
        for i, e in enumerate(entries):
            got = store.read(1, 1, i)
            assert got == e and type(got) is bytes
        assert store.read_range(1, 1, 0, 5, 1 << 20) == b"".join(entries)
        assert store.lac(1, 1) == 4
        d = store.digest(1, 1, 0, 5)
        assert (d.entries, d.digest) == (6, digest_of((i, decode_header(e).crc) for i, e in enumerate(entries)))
        size = (tmp_path / LOG_PATH).stat().st_size
        assert size == sum(map(len, entries))
        assert await store.add_batch(views(*entries[2:])) == 4  # identical bytes again: idempotent
        assert (tmp_path / LOG_PATH).stat().st_size == size
        await store.close()
        store = SegmentStore(tmp_path)
        await store.open()
        assert [store.read(1, 1, i) for i in range(6)] == entries
        await store.close()

    asyncio.run(body())


def test_a_pulls_own_entries_are_kept_as_the_views_it_hands_over_and_read_back_verified(tmp_path, entry, threaded):
    # A pull hands its share as read-only views of the entries it sealed (sealed_here: no second
    # CRC pass over them); they are stored as given and read back through the CRC-checked reads.
    sealed = [bytearray(entry(1, 1, i, payload=os.urandom(300 + i))) for i in range(5)]

    async def body():
        store = SegmentStore(tmp_path, threaded)
        await store.open()
        handed = [memoryview(e).toreadonly() for e in sealed]
        assert await store.add_batch(handed, sealed_here=True) == 5
        for i, e in enumerate(sealed):
            assert store.read(1, 1, i) == bytes(e)
        # Other rules still hold: the same ids with other bytes are refused, sealed here or not.
        with pytest.raises(BadRequestError):
            await store.add_batch([memoryview(bytes(entry(1, 1, 0, payload=b"other"))).toreadonly()], sealed_here=True)
        await store.close()
        store = SegmentStore(tmp_path)
        await store.open()
        assert [store.read(1, 1, i) for i in range(5)] == [bytes(e) for e in sealed]
        await store.close()

    asyncio.run(body())


def test_a_striped_replica_batch_may_skip_ids(tmp_path, entry):
    entries = [entry(1, 1, i) for i in (0, 2, 3, 5, 6)]

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        assert await store.add_batch(views(*entries)) == 5
        assert store.digest(1, 1, 0, 6).entries == 5
        await store.close()

    asyncio.run(body())


@pytest.mark.parametrize("existing", [False, True], ids=["new segment", "existing segment"])
def test_a_batch_with_one_bad_entry_is_refused_whole_naming_it(tmp_path, entry, threaded, existing):
    good = [entry(1, 1, i, payload=b"payload %d" % i) for i in range(10, 14)]
    cases = [
        ([good[0], flipped(good[1], HEADER_SIZE + 2), good[2]], r"batch entry 2 of 3 \(entry 11\): CRC-32C mismatch in entry 11"),
        ([good[0], good[1], flipped(good[2], 0)], r"batch entry 3 of 3: bad entry header: bad magic"),
        ([good[0], entry(1, 2, 11), good[2]], r"batch entry 2 of 3 \(entry 11\) is of segment 2 of log 1, the batch's first of segment 1 of log 1"),
        ([good[0], entry(2, 1, 11)], r"batch entry 2 of 2 \(entry 11\) is of segment 1 of log 2"),
        ([good[1], good[0]], r"batch entry 2 of 2 \(entry 10\) follows entry 11: a batch's entry ids must increase"),
        ([good[0], good[0]], r"batch entry 2 of 2 \(entry 10\) follows entry 10"),
        ([good[0], good[1] + b"x"], r"batch entry 2 of 2: entry is \d+ bytes but its header says \d+"),
    ]

    async def body():
        store = SegmentStore(tmp_path, threaded)
        await store.open()
        if existing:
            await store.add(entry(1, 1, 0))
        size = (tmp_path / LOG_PATH).stat().st_size if existing else 0
        for batch, message in cases:
            with pytest.raises(BadRequestError, match=message) as err:
                await store.add_batch(views(*batch))
            assert "nothing of the batch stored" in err.value.message
            with pytest.raises(BadRequestError, match=message):
                store.add_batch_nowait(views(*batch), lambda exc: None) if existing else await store.add_batch(batch)
        if existing:
            assert store.digest(1, 1).entries == 1  # none of the good entries before or after the bad one
            assert (tmp_path / LOG_PATH).stat().st_size == size
        else:
            with pytest.raises(NoSuchSegmentError):
                store.read(1, 1, 10)
            assert store.list_segments() == []  # not even created
        with pytest.raises(BadRequestError, match="empty batch"):
            await store.add_batch([])
        await store.close()

    asyncio.run(body())


def test_a_conflict_anywhere_in_a_batch_stores_nothing_of_it(tmp_path, entry, threaded):
    async def body():
        store = SegmentStore(tmp_path, threaded)
        await store.open()
        await store.add(entry(1, 1, 1, payload=b"original"))
        size = (tmp_path / LOG_PATH).stat().st_size
        batch = [entry(1, 1, 0), entry(1, 1, 1, payload=b"imposter"), entry(1, 1, 2)]
        with pytest.raises(BadRequestError, match=r"batch entry 2 of 3 \(entry 1\): entry 1 of segment 1 of log 1 is already stored .* different contents"):
            await store.add_batch(views(*batch))
        assert store.digest(1, 1).entries == 1 and (tmp_path / LOG_PATH).stat().st_size == size
        await store.add_batch(views(entry(1, 1, 0), entry(1, 1, 1, payload=b"original"), entry(1, 1, 2)))  # known + new
        assert store.digest(1, 1).entries == 3
        await store.close()

    asyncio.run(body())


def test_a_fenced_replica_takes_a_batch_only_as_recovery(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        await store.add(entry(1, 1, 0))
        await store.fence(1, 1)
        batch = views(entry(1, 1, 1), entry(1, 1, 2))
        with pytest.raises(FencedError, match=r"batch of entries 1..2 refused, nothing stored"):
            await store.add_batch(batch)
        assert store.digest(1, 1).entries == 1
        assert await store.add_batch(batch, recovery=True) == 2
        assert store.digest(1, 1).entries == 3
        await store.close()

    asyncio.run(body())


def test_a_batch_is_answered_only_once_durable(tmp_path, entry, counting_sync, threaded):
    sync = counting_sync()
    entries = [entry(1, 1, i) for i in range(8)]

    async def body():
        store = SegmentStore(tmp_path, threaded, fdatasync=sync)
        await store.open()
        assert not store.add_batch_nowait(views(entries[0]), lambda exc: None)  # no segment yet: use add_batch
        await store.add_batch(views(entries[0]))
        sync.gate.clear()
        sync.entered.clear()
        done: list[BaseException | None] = []
        assert store.add_batch_nowait(views(*entries[1:4]), done.append, uncached=True)
        pending = asyncio.ensure_future(store.add_batch(views(*entries[4:]), recovery=True))
        assert await asyncio.to_thread(sync.entered.wait, 10)
        await asyncio.sleep(0.05)
        assert done == [] and not pending.done()
        assert store.read(1, 1, 2) == entries[2]  # accepted, served from memory meanwhile
        sync.gate.set()
        assert await pending == 4
        await store.add_batch(views(entries[7]))  # after the nowait batch: in order
        assert done == [None]
        await store.close()

    asyncio.run(body())
