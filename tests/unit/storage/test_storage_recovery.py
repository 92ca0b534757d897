"""Startup recovery: torn tails are cut, corruption before valid data means limbo."""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlagent.storage import SegmentStore, SyncPolicy, scan_file
from dlctl.log.errors import BadRequestError, FencedError, LimboError, NoSuchEntryError
from dlctl.log.format import HEADER_SIZE, Entry, encode


def log_path(root: Path, log_id: int = 1, seq: int = 1) -> Path:
    return root / "segments" / f"{log_id:016x}" / f"{seq:016x}.log"


def write_entries(root: Path, entries: list[bytes], **kw) -> None:
    async def body():
        store = SegmentStore(root, **kw)
        await store.open()
        for e in entries:
            await store.add(e)
        await store.close()

    asyncio.run(body())


def forget_acked(root: Path) -> None:
    """As if the agent had crashed before recording its replicas' acknowledged lengths: a
    clean close records them, and a cut below them is then corruption, not a torn tail."""
    for path in (root / "segments").rglob("*.acked"):
        path.unlink()


def offsets(entries: list[bytes]) -> list[int]:
    out, pos = [], 0
    for e in entries:
        out.append(pos)
        pos += len(e)
    return out


def ten(entry) -> list[bytes]:
    return [entry(1, 1, i, payload=bytes([i]) * (100 + i)) for i in range(10)]


TORN_TAILS = {
    "truncated header": lambda nxt: nxt[:20],
    "truncated payload": lambda nxt: nxt[:-7],
    "header only": lambda nxt: nxt[:HEADER_SIZE],
    "zeros after a partial header": lambda nxt: nxt[:9] + bytes(4096),
    "garbage": lambda nxt: random.Random(7).randbytes(3000).replace(b"DLE1", b"XXXX"),
    # A valid entry, but of another segment: not a continuation of this file.
    "entry of another segment": lambda nxt: encode(Entry(1, 2, 10, 9, b"belongs elsewhere")),
}


@pytest.mark.parametrize("kind", sorted(TORN_TAILS))
def test_torn_tail_is_cut_and_acknowledged_entries_survive(tmp_path, entry, kind):
    entries = ten(entry)
    write_entries(tmp_path, entries)
    path = log_path(tmp_path)
    good_size = path.stat().st_size
    tail = TORN_TAILS[kind](entry(1, 1, 10, payload=b"n" * 500))
    with open(path, "ab") as f:
        f.write(tail)

    async def body():
        store = SegmentStore(tmp_path)
        report = await store.open()
        [cut] = report.tails_cut
        assert (cut.log_id, cut.segment_seq, cut.offset, cut.bytes_cut) == (1, 1, good_size, len(tail))
        assert cut.path == str(path)
        assert report.limbo == []
        assert report.to_dict()["tails_cut"][0]["offset"] == good_size
        assert path.stat().st_size == good_size  # cut on disk
        for i, e in enumerate(entries):
            assert store.read(1, 1, i) == e
        with pytest.raises(NoSuchEntryError):
            store.read(1, 1, 10)
        await store.add(entry(1, 1, 10))  # appends right after the last valid entry
        await store.close()

        store = SegmentStore(tmp_path)
        report = await store.open()
        assert report.tails_cut == [] and report.entries == 11
        assert store.read(1, 1, 10) == entry(1, 1, 10)
        await store.close()

    asyncio.run(body())


@pytest.mark.parametrize("zeros", [1, HEADER_SIZE - 1, HEADER_SIZE, 4096, 3 << 20])
def test_zeros_behind_the_data_are_preallocated_space_trimmed_quietly(tmp_path, entry, zeros):
    """A crash leaves the space the store preallocated: zeros up to the end of the file. No
    entry starts with a zero byte, so nothing was torn: trimmed, not reported, nothing lost."""
    entries = ten(entry)
    write_entries(tmp_path, entries)
    path = log_path(tmp_path)
    good_size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(good_size + zeros)

    async def body():
        store = SegmentStore(tmp_path)
        report = await store.open()
        assert report.tails_cut == [] and report.limbo == [] and report.entries == 10
        assert path.stat().st_size == good_size
        await store.add(entry(1, 1, 10))  # right after the last valid entry, not after the zeros
        assert [store.read(1, 1, i) for i in range(11)] == entries + [entry(1, 1, 10)]
        await store.close()

    asyncio.run(body())


def test_whole_file_torn_leaves_an_empty_replica(tmp_path, entry):
    path = log_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(entry(1, 1, 0)[:30])

    async def body():
        store = SegmentStore(tmp_path)
        report = await store.open()
        assert report.tails_cut[0].offset == 0
        assert store.last_entry_id(1, 1) == -1
        await store.close()

    asyncio.run(body())


def corrupt(path: Path, pos: int, xor: int = 0x40) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ xor]))


MID_FILE = {
    "bit flip in payload": lambda offs, entries: (offs[3] + HEADER_SIZE + 5, 0x04),
    "bit flip in header": lambda offs, entries: (offs[3] + 20, 0x01),  # segment seq
    "bad length": lambda offs, entries: (offs[3] + 42, 0x01),  # payload length field
    "bad magic": lambda offs, entries: (offs[3], 0x20),
    "bit flip in the first entry": lambda offs, entries: (offs[0] + HEADER_SIZE, 0x80),
}


@pytest.mark.parametrize("kind", sorted(MID_FILE))
def test_corruption_before_valid_data_puts_the_replica_in_limbo(tmp_path, entry, kind, forget_checkpoints):
    entries = ten(entry)
    write_entries(tmp_path, entries)
    forget_checkpoints(tmp_path)  # the start reads it all (with a checkpoint: test_storage_checkpoint.py)
    path = log_path(tmp_path)
    offs = offsets(entries)
    pos, xor = MID_FILE[kind](offs, entries)
    corrupt(path, pos, xor)
    damaged = path.read_bytes()
    bad_entry = max(i for i, o in enumerate(offs) if o <= pos)

    async def body():
        for _ in range(2):  # and it survives a restart
            store = SegmentStore(tmp_path)
            report = await store.open()
            assert report.tails_cut == []
            [limbo] = report.limbo
            assert (limbo.log_id, limbo.segment_seq, limbo.offset) == (1, 1, offs[bad_entry])
            assert limbo.next_valid_offset == offs[bad_entry + 1]
            assert path.read_bytes() == damaged  # untouched
            info = store.list_segments()[0]
            assert info.limbo
            # Never served, not even the entries before the damage; no fence, no LAC, no adds.
            for i in range(10):
                with pytest.raises(LimboError):
                    store.read(1, 1, i)
            with pytest.raises(LimboError):
                await store.fence(1, 1)
            with pytest.raises(LimboError):
                store.lac(1, 1)
            with pytest.raises(LimboError):
                store.digest(1, 1)
            with pytest.raises(LimboError):
                await store.wait_lac(1, 1, -1, 0.01)
            with pytest.raises(LimboError):
                await store.add(entry(1, 1, 10), recovery=True)
            assert store.stat()["limbo"] == 1
            await store.close()
        assert path.with_suffix(".limbo").exists()

        # Re-replication deletes the replica and writes it afresh.
        store = SegmentStore(tmp_path)
        await store.open()
        assert await store.delete(1, 1)
        for e in entries:
            await store.add(e)
        assert store.read(1, 1, 3) == entries[3]
        await store.close()
        store = SegmentStore(tmp_path)
        report = await store.open()
        assert report.limbo == [] and report.entries == 10
        await store.close()

    asyncio.run(body())


def test_corruption_found_on_read_puts_the_replica_in_limbo(tmp_path, entry):
    entries = ten(entry)
    path = log_path(tmp_path)

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        for e in entries:
            await store.add(e)
        await store.fence(1, 1)
        corrupt(path, offsets(entries)[6] + HEADER_SIZE + 1)  # bit rot under a running agent
        assert store.read(1, 1, 5) == entries[5]
        with pytest.raises(LimboError, match="CRC-32C"):
            store.read(1, 1, 6)
        with pytest.raises(LimboError):
            store.read(1, 1, 5)  # the whole replica stops serving
        await store.close()  # waits for the limbo marker to be persisted
        assert path.with_suffix(".limbo").exists()

        store = SegmentStore(tmp_path)
        report = await store.open()
        assert len(report.limbo) == 1
        with pytest.raises(LimboError):
            store.read(1, 1, 0)
        await store.close()

    asyncio.run(body())


def test_conflicting_duplicate_in_a_file_is_limbo(tmp_path, entry):
    path = log_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(entry(1, 1, 0) + entry(1, 1, 1) + entry(1, 1, 0, payload=b"other"))

    async def body():
        store = SegmentStore(tmp_path)
        report = await store.open()
        assert "stored twice" in report.limbo[0].reason
        await store.close()

    asyncio.run(body())


def test_limbo_does_not_spread_to_other_segments(tmp_path, entry, forget_checkpoints):
    write_entries(tmp_path, ten(entry) + [entry(1, 2, i) for i in range(3)])
    forget_checkpoints(tmp_path)
    corrupt(log_path(tmp_path, 1, 1), HEADER_SIZE + 2)

    async def body():
        store = SegmentStore(tmp_path)
        report = await store.open()
        assert [(r.log_id, r.segment_seq) for r in report.limbo] == [(1, 1)]
        assert store.read(1, 2, 2) == entry(1, 2, 2)
        await store.add(entry(1, 2, 3))
        await store.fence(1, 2)
        with pytest.raises(FencedError):
            await store.add(entry(1, 2, 4))
        await store.close()

    asyncio.run(body())


def test_scan_file_reads_without_modifying(tmp_path, entry):
    entries = ten(entry)
    write_entries(tmp_path, entries)
    path = log_path(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\xff" * 100)
    before = path.stat()
    scan = scan_file(path, 1, 1)
    assert scan.torn_reason is not None and scan.valid_end == sum(map(len, entries))
    assert scan.index.count == 10 and scan.lac == 8
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


# -------------------------------------------------------------------- property


entry_lists = st.lists(
    st.tuples(st.integers(0, 60), st.binary(max_size=300)),
    min_size=1,
    max_size=25,
    unique_by=lambda t: t[0],
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=entry_lists, data=st.data())
def test_any_truncation_keeps_exactly_the_whole_entries_before_it(entry, items, data):
    encoded = [entry(3, 7, eid, lac=-1, payload=payload) for eid, payload in items]
    total = sum(map(len, encoded))
    cut = data.draw(st.integers(0, total), label="cut")
    junk = data.draw(st.sampled_from([b"", b"\0" * 64, b"DLE1", b"\xff" * 13]), label="junk")
    ends = [o + len(e) for o, e in zip(offsets(encoded), encoded)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_entries(root, encoded, sync=SyncPolicy(mode="never"))
        forget_acked(root)
        path = log_path(root, 3, 7)
        with open(path, "r+b") as f:
            f.truncate(cut)
            f.seek(cut)
            f.write(junk)  # a torn write may also leave junk behind the cut

        async def body():
            store = SegmentStore(root)
            report = await store.open()
            assert report.limbo == []
            # An entry is whole if the damaged file still holds its exact bytes — usually those
            # before the cut, but the junk may by chance restore a cut entry's last bytes.
            original = b"".join(encoded)
            damaged = original[:cut] + junk
            whole = [i for i, end in enumerate(ends) if damaged[:end] == original[:end]]
            kept = sum(len(encoded[i]) for i in whole)
            # Zeros alone behind the kept entries are preallocated space, trimmed unreported.
            assert bool(report.tails_cut) == (damaged[kept:].count(0) != len(damaged) - kept)
            assert path.stat().st_size == kept
            for i, (eid, _payload) in enumerate(items):
                if i in whole:
                    assert store.read(3, 7, eid) == encoded[i]
                else:
                    with pytest.raises(NoSuchEntryError):
                        store.read(3, 7, eid)
            # The replica takes new adds where the valid data ends.
            fresh = entry(3, 7, 100, payload=b"after recovery")
            await store.add(fresh)
            assert store.read(3, 7, 100) == fresh
            await store.close()

        asyncio.run(body())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=entry_lists, data=st.data())
def test_a_flipped_bit_is_never_served(entry, items, data):
    """Whatever byte rots, the store either refuses the replica (limbo), cuts the damaged
    last entry as a torn tail, or (if the damage is in the last entry) no longer has it —
    it never returns bytes that differ from what was added."""
    encoded = [entry(3, 7, eid, lac=-1, payload=payload) for eid, payload in items]
    total = sum(map(len, encoded))
    pos = data.draw(st.integers(0, total - 1), label="pos")
    bit = data.draw(st.integers(0, 7), label="bit")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_entries(root, encoded, sync=SyncPolicy(mode="never"))
        corrupt(log_path(root, 3, 7), pos, 1 << bit)

        async def body():
            store = SegmentStore(root)
            report = await store.open()
            in_last = pos >= total - len(encoded[-1])
            if not in_last:
                assert len(report.limbo) == 1
            for (eid, _payload), e in zip(items, encoded):
                try:
                    got = store.read(3, 7, eid)
                except (LimboError, NoSuchEntryError):
                    continue
                assert got == e
            await store.close()

        asyncio.run(body())


def test_recovery_adds_do_not_bypass_validation(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        bad = bytearray(entry(1, 1, 0))
        bad[-1] ^= 1
        with pytest.raises(BadRequestError):
            await store.add(bytes(bad), recovery=True)
        await store.close()

    asyncio.run(body())


def test_open_scans_each_file_once_in_reasonable_time(tmp_path, entry):
    # 20k entries: the scan must not be quadratic or per-byte.
    path = log_path(tmp_path)
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        for i in range(20_000):
            f.write(entry(1, 1, i, payload=b"p" * 200))
    async def body():
        store = SegmentStore(tmp_path)
        started = time.monotonic()
        report = await store.open()
        assert report.entries == 20_000
        assert time.monotonic() - started < 5
        await store.close()

    asyncio.run(body())
