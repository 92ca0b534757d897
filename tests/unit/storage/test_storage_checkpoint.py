"""Index checkpoints (issue 24 item 7, ``dlagent.storage.checkpoint``): an agent starts by reading
only what its checkpoints do not cover, and still never serves a damaged byte.

Real files in temporary directories; the oracle is the list of entries each test added."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlagent.storage import SegmentStore, SyncPolicy
from dlagent.storage import layout
from dlagent.storage import upkeep as store_mod
from dlagent.storage.index import EntryIndex
from dlctl.log.errors import LimboError, NoSuchEntryError
from dlctl.log.format import HEADER_SIZE


def idx(root: Path, key=(1, 1)) -> Path:
    return layout.segment_path(root, key, layout.IDX_SUFFIX)


def log_file(root: Path, key=(1, 1)) -> Path:
    return layout.segment_path(root, key)


async def filled(root: Path, entries: dict[tuple[int, int], list[bytes]], **kw) -> None:
    store = SegmentStore(root, **kw)
    await store.open()
    for batch in entries.values():
        for e in batch:
            await store.add(e)
    await store.close()


async def reopened(root: Path):
    store = SegmentStore(root)
    return store, await store.open()


def make(entry, key=(1, 1), count: int = 10, first: int = 0) -> list[bytes]:
    return [entry(key[0], key[1], i, payload=f"{key} entry {i} ".encode() * 4) for i in range(first, first + count)]


def test_a_clean_stop_leaves_checkpoints_and_the_next_start_reads_none_of_the_data(tmp_path, entry):
    written = {key: make(entry, key, 20) for key in ((1, 1), (1, 2), (2, 1))}

    async def body():
        await filled(tmp_path, written)
        assert all(idx(tmp_path, key).exists() for key in written)
        store, report = await reopened(tmp_path)
        assert (report.from_checkpoints, report.scanned_bytes, report.entries) == (3, 0, 60)
        for key, entries in written.items():
            assert [store.read(*key, i) for i in range(20)] == entries
            assert store.lac(*key) == 18  # entry i carries LAC i - 1
        await store.close()

    asyncio.run(body())


def test_what_was_added_after_the_checkpoint_is_read_and_a_torn_tail_after_it_cut(tmp_path, entry):
    """A crash after more adds: the file holds the checkpoint's bytes, three more entries and
    half of a fourth. The start reads only those, keeps the three, cuts the half."""
    first, later = make(entry, count=10), make(entry, count=4, first=10)

    async def body():
        await filled(tmp_path, {(1, 1): first})
        covered = log_file(tmp_path).stat().st_size
        with open(log_file(tmp_path), "ab") as f:
            f.write(b"".join(later[:3]) + later[3][: HEADER_SIZE + 5])
        store, report = await reopened(tmp_path)
        assert report.from_checkpoints == 1
        assert report.scanned_bytes == sum(map(len, later[:3])) + HEADER_SIZE + 5  # not one byte it covers
        assert [t.offset for t in report.tails_cut] == [covered + sum(map(len, later[:3]))]
        assert [store.read(1, 1, i) for i in range(13)] == first + later[:3]
        with pytest.raises(NoSuchEntryError):
            store.read(1, 1, 13)
        await store.close()

    asyncio.run(body())


@pytest.mark.parametrize("damage", ["bit flip", "cut short", "not a checkpoint"])
def test_a_checkpoint_that_cannot_be_trusted_means_reading_the_file_in_full(tmp_path, entry, damage):
    written = make(entry, count=12)

    async def body():
        await filled(tmp_path, {(1, 1): written})
        raw = bytearray(idx(tmp_path).read_bytes())
        if damage == "bit flip":
            raw[len(raw) // 2] ^= 0x08
        elif damage == "cut short":
            raw = raw[: len(raw) - 7]
        else:
            raw = bytearray(b"hello" * 10)
        idx(tmp_path).write_bytes(bytes(raw))
        store, report = await reopened(tmp_path)
        assert report.from_checkpoints == 0 and report.scanned_bytes == log_file(tmp_path).stat().st_size
        assert [store.read(1, 1, i) for i in range(12)] == written
        await store.close()

    asyncio.run(body())


def test_a_file_shorter_than_its_checkpoint_is_read_in_full_and_its_acknowledged_length_decides(tmp_path, entry):
    """Cut while the agent was down: the checkpoint is not used; the .acked rule puts the
    replica in limbo, as without a checkpoint."""
    written = make(entry, count=12)

    async def body():
        await filled(tmp_path, {(1, 1): written})
        size = log_file(tmp_path).stat().st_size
        with open(log_file(tmp_path), "r+b") as f:
            f.truncate(size - len(written[-1]))
        store, report = await reopened(tmp_path)
        assert report.from_checkpoints == 0 and [r.segment_seq for r in report.limbo] == [1]
        await store.close()

    asyncio.run(body())


def test_damage_inside_a_checkpoint_is_found_by_the_first_read_and_never_served(tmp_path, entry):
    written = make(entry, count=10)

    async def body():
        await filled(tmp_path, {(1, 1): written})
        offset = sum(map(len, written[:4])) + HEADER_SIZE + 3
        raw = bytearray(log_file(tmp_path).read_bytes())
        raw[offset] ^= 0x20
        log_file(tmp_path).write_bytes(bytes(raw))
        store, report = await reopened(tmp_path)
        assert report.from_checkpoints == 1 and report.limbo == []  # the start did not read it
        assert store.read(1, 1, 3) == written[3]
        with pytest.raises(LimboError, match="CRC-32C"):
            store.read(1, 1, 4)
        with pytest.raises(LimboError):
            store.read(1, 1, 3)  # the whole replica stops serving
        await store.close()
        store, report = await reopened(tmp_path)
        assert [r.segment_seq for r in report.limbo] == [1]  # and says so after a restart
        await store.close()

    asyncio.run(body())


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.data())
def test_whatever_byte_rots_under_a_checkpoint_no_read_returns_other_bytes(entry, count, data):
    written = [entry(3, 7, i, payload=bytes([i]) * (i * 7 % 50)) for i in range(count)]
    total = sum(map(len, written))
    pos, bit = data.draw(st.integers(0, total - 1), label="pos"), data.draw(st.integers(0, 7), label="bit")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        async def body():
            await filled(root, {(3, 7): written})
            path = log_file(root, (3, 7))
            raw = bytearray(path.read_bytes())
            raw[pos] ^= 1 << bit
            path.write_bytes(bytes(raw))
            store, report = await reopened(root)
            assert report.from_checkpoints == 1
            for i, e in enumerate(written):
                try:
                    got = store.read(3, 7, i)
                except (LimboError, NoSuchEntryError):
                    continue
                assert got == e
            await store.close()

        asyncio.run(body())


def test_a_replica_that_rested_gets_a_checkpoint_while_the_agent_runs(tmp_path, entry, monkeypatch):
    """No clean stop: the store checkpoints a replica once its data rested a trim interval; a
    start after a crash then reads only what came after that checkpoint."""
    monkeypatch.setattr(store_mod, "TRIM_IDLE_SECONDS", 0.02)
    first, later = make(entry, count=8), make(entry, count=3, first=8)

    async def until(condition, what: str) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.01)

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        for e in first:
            await store.add(e)
        await until(lambda: idx(tmp_path).exists(), "a checkpoint of the rested replica")
        for e in later:
            await store.add(e)
        grown = log_file(tmp_path).stat().st_size
        await until(lambda: store._segments[(1, 1)].indexed == store._segments[(1, 1)].durable, "a checkpoint of its new entries")
        covered = store._segments[(1, 1)].indexed
        store._trim_timer.cancel()
        store._acked_timer.cancel()
        store._lock.release()  # a crash: no close, nothing flushed or recorded beyond this point
        store2, report = await reopened(tmp_path)
        assert report.from_checkpoints == 1 and report.scanned_bytes == log_file(tmp_path).stat().st_size - covered
        assert covered <= grown and [store2.read(1, 1, i) for i in range(11)] == first + later
        await store2.close()

    asyncio.run(body())


def test_no_checkpoint_where_durable_does_not_mean_synced(tmp_path, entry):
    asyncio.run(filled(tmp_path, {(1, 1): make(entry)}, sync=SyncPolicy(mode="never")))
    assert not idx(tmp_path).exists()


def test_deleting_a_replica_removes_its_checkpoint_and_one_left_alone_is_dropped_at_start(tmp_path, entry):
    async def body():
        await filled(tmp_path, {(1, 1): make(entry), (1, 2): make(entry, (1, 2))})
        store, _ = await reopened(tmp_path)
        assert await store.delete(1, 1)
        await store.close()
        assert not idx(tmp_path).exists() and not log_file(tmp_path).exists()
        # A checkpoint without its log (a delete cut short) and a half-written one.
        orphan = layout.segment_path(tmp_path, (1, 9), layout.IDX_SUFFIX)
        orphan.write_bytes(idx(tmp_path, (1, 2)).read_bytes())
        half = layout.segment_path(tmp_path, (1, 2), layout.IDX_TMP_SUFFIX)
        half.write_bytes(b"half")
        store, report = await reopened(tmp_path)
        assert [(s.log_id, s.segment_seq) for s in store.list_segments()] == [(1, 2)] and report.ignored == []
        assert not orphan.exists() and not half.exists()
        await store.close()

    asyncio.run(body())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3000), unique=True, max_size=60), st.integers(0, 200_000))
def test_an_index_dumped_and_loaded_is_the_same_and_below_drops_what_ends_past_it(ids, below):
    index = EntryIndex()
    for n, entry_id in enumerate(ids):
        index.add(entry_id, n * 1000, 900, entry_id * 7)
    loaded = EntryIndex.load(index.dump())
    assert list(loaded.items()) == list(index.items())
    assert (loaded.count, loaded.last_id, loaded.first_id) == (index.count, index.last_id, index.first_id)
    kept = EntryIndex.load(index.dump(below=below))
    expected = [item for item in index.items() if item[1] + item[2] <= below]
    assert list(kept.items()) == expected and kept.count == len(expected)
    assert kept.last_id == (max(i[0] for i in expected) if expected else -1)
    with pytest.raises(ValueError):
        EntryIndex.load(index.dump()[:-3] if ids else b"short")
