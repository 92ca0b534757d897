"""``SegmentStore.read_range``: consecutive entries in one answer, each CRC-checked, with the
same limbo rules as ``read`` (real files in a tmp dir)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dlagent.storage import SegmentStore
from dlctl.log import protocol as p
from dlctl.log.errors import LimboError, NoSuchEntryError, NoSuchSegmentError
from dlctl.log.format import HEADER_SIZE


def log_path(root: Path, log_id: int = 1, seq: int = 1) -> Path:
    return root / "segments" / f"{log_id:016x}" / f"{seq:016x}.log"


def ten(entry) -> list[bytes]:
    return [entry(1, 1, i, payload=bytes([i]) * (100 + i)) for i in range(10)]


def test_a_range_is_the_entries_back_to_back_up_to_last_the_byte_cap_or_the_first_gap(tmp_path, entry):
    entries = ten(entry)

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        for e in entries[:8]:
            await store.add(e)
        await store.add(entries[9])  # entry 8 missing: a gap
        assert store.read_range(1, 1, 0, 7, 1 << 20) == b"".join(entries[:8])
        assert store.read_range(1, 1, 2, 4, 1 << 20) == b"".join(entries[2:5])
        assert store.read_range(1, 1, 5, 100, 1 << 20) == b"".join(entries[5:8])  # stops before the gap
        cap = len(entries[3]) + len(entries[4]) + 1
        assert store.read_range(1, 1, 3, 9, cap) == entries[3] + entries[4]  # no more than max bytes ...
        assert store.read_range(1, 1, 3, 9, 1) == entries[3]  # ... but always the first entry
        with pytest.raises(NoSuchEntryError):
            store.read_range(1, 1, 8, 9, 1 << 20)
        with pytest.raises(NoSuchSegmentError):
            store.read_range(1, 2, 0, 9, 1 << 20)
        # The answer splits back into the entries, as the client splits it.
        data = store.read_range(1, 1, 0, 9, 1 << 20)
        assert [data[s:e] for s, e in p.split_entries(data)] == entries[:8]
        await store.close()

    asyncio.run(body())


def test_entries_not_yet_durable_are_served_from_memory_among_the_others(tmp_path, entry, counting_sync, threaded):
    entries = ten(entry)
    sync = counting_sync()

    async def body():
        store = SegmentStore(tmp_path, threaded, fdatasync=sync)  # the held fdatasync is the thread's
        await store.open()
        for e in entries[:5]:
            await store.add(e)
        sync.gate.clear()  # the next batch is written but held before its fdatasync
        pending = [asyncio.ensure_future(store.add(e)) for e in entries[5:]]
        await asyncio.sleep(0)
        assert store.read_range(1, 1, 0, 9, 1 << 20) == b"".join(entries)
        sync.gate.set()
        await asyncio.gather(*pending)
        assert store.read_range(1, 1, 0, 9, 1 << 20) == b"".join(entries)
        await store.close()

    asyncio.run(body())


def test_a_flipped_bit_inside_a_range_puts_the_replica_in_limbo_and_is_never_served(tmp_path, entry):
    entries = ten(entry)
    path = log_path(tmp_path)

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        for e in entries:
            await store.add(e)
        await store.fence(1, 1)
        offset = sum(len(e) for e in entries[:6]) + HEADER_SIZE + 3
        with open(path, "r+b") as f:  # bit rot under a running agent, in the middle of a range
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0x10]))
        assert store.read_range(1, 1, 0, 5, 1 << 20) == b"".join(entries[:6])  # before the bad entry: fine
        with pytest.raises(LimboError, match="entry 6: CRC-32C"):
            store.read_range(1, 1, 2, 9, 1 << 20)
        with pytest.raises(LimboError):
            store.read_range(1, 1, 0, 1, 1 << 20)  # the whole replica stops serving
        await store.close()
        assert path.with_suffix(".limbo").exists()

    asyncio.run(body())
