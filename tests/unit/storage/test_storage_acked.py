"""A replica file shorter than what its agent acknowledged is found at start-up and put in
limbo, never trusted to say what it lacks (issue 18 item 3; the .acked files of recovery.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from dlagent.storage import SegmentStore
from dlagent.storage import upkeep as store_module
from dlagent.storage.recovery import encode_acked, read_acked
from dlctl.log.errors import LimboError, NoSuchEntryError, NoSuchSegmentError

from test_storage_recovery import log_path, offsets, ten, write_entries  # this folder is on sys.path (rootdir conftest, no package)


def acked_path(root: Path, log_id: int = 1, seq: int = 1) -> Path:
    return log_path(root, log_id, seq).with_suffix(".acked")


def reopen(root: Path):
    async def body():
        store = SegmentStore(root)
        report = await store.open()
        try:
            outcome = {}
            for eid in (0, 9):
                try:
                    outcome[eid] = store.read(1, 1, eid)
                except (LimboError, NoSuchEntryError, NoSuchSegmentError) as exc:
                    outcome[eid] = type(exc).__name__
            return report, outcome
        finally:
            await store.close()

    return asyncio.run(body())


def test_a_clean_close_records_the_whole_length(tmp_path, entry):
    encoded = ten(entry)
    write_entries(tmp_path, encoded)
    assert read_acked(acked_path(tmp_path)) == sum(map(len, encoded)) == log_path(tmp_path, 1, 1).stat().st_size


@pytest.mark.parametrize("keep", [0, 3, 9])
def test_a_file_cut_at_an_entry_boundary_while_down_is_limbo_not_short(tmp_path, entry, keep):
    encoded = ten(entry)
    write_entries(tmp_path, encoded)
    os.truncate(log_path(tmp_path, 1, 1), offsets(encoded)[keep])
    report, outcome = reopen(tmp_path)
    (limbo,) = report.limbo
    assert "acknowledged" in limbo.reason and limbo.offset == offsets(encoded)[keep]
    assert outcome == {0: "LimboError", 9: "LimboError"}  # never "no such entry"
    # The verdict is durable: the next start still says limbo, whatever the .acked file says.
    acked_path(tmp_path).unlink()
    again, _ = reopen(tmp_path)
    assert [r.segment_seq for r in again.limbo] == [1]


def test_a_replica_file_gone_while_down_is_limbo(tmp_path, entry):
    write_entries(tmp_path, ten(entry))
    log_path(tmp_path, 1, 1).unlink()
    report, outcome = reopen(tmp_path)
    (limbo,) = report.limbo
    assert "missing" in limbo.reason and outcome[0] == "LimboError"


def test_negative_check_without_the_record_a_cut_file_passes_for_a_shorter_replica(tmp_path, entry):
    """What the .acked record prevents: the same cut, the record gone, and the replica answers
    "no such entry" for acknowledged entries."""
    encoded = ten(entry)
    write_entries(tmp_path, encoded)
    acked_path(tmp_path).unlink()
    os.truncate(log_path(tmp_path, 1, 1), offsets(encoded)[3])
    report, outcome = reopen(tmp_path)
    assert report.limbo == [] and outcome[9] == "NoSuchEntryError"


def test_a_torn_record_claims_nothing(tmp_path, entry):
    encoded = ten(entry)
    write_entries(tmp_path, encoded)
    acked_path(tmp_path).write_bytes(encode_acked(10**9)[:7])
    report, outcome = reopen(tmp_path)
    assert report.limbo == [] and outcome[9] == encoded[9]


def test_a_deleted_replica_leaves_no_record_behind(tmp_path, entry):
    write_entries(tmp_path, ten(entry))

    async def delete():
        store = SegmentStore(tmp_path)
        await store.open()
        assert await store.delete(1, 1)
        await store.close()

    asyncio.run(delete())
    assert not acked_path(tmp_path).exists()
    report, _ = reopen(tmp_path)
    assert report.segments == 0 and report.limbo == []


def test_a_running_store_records_the_durable_length_of_a_growing_replica(tmp_path, entry, monkeypatch):
    monkeypatch.setattr(store_module, "ACKED_SECONDS", 0.01)
    encoded = ten(entry)

    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        try:
            for e in encoded[:4]:
                await store.add(e)
            want = sum(map(len, encoded[:4]))
            async with asyncio.timeout(5):
                while read_acked(acked_path(tmp_path)) != want:
                    await asyncio.sleep(0.005)
            for e in encoded[4:]:
                await store.add(e)
            async with asyncio.timeout(5):
                while read_acked(acked_path(tmp_path)) != sum(map(len, encoded)):
                    await asyncio.sleep(0.005)
        finally:
            await store.close()

    asyncio.run(body())


def _append_raw(path: Path, *chunks: bytes) -> None:
    with open(path, "ab") as f:
        for chunk in chunks:
            f.write(chunk)


def test_zeros_then_a_later_entry_past_the_durable_length_are_a_torn_tail_not_limbo(tmp_path, entry):
    """A power loss that kept a later page and lost an earlier one: entry 10's bytes are zeros,
    entry 11 is whole. Past the recorded durable length nothing was acknowledged here: cut."""
    encoded = ten(entry)
    write_entries(tmp_path, encoded)
    later = [entry(1, 1, 10, payload=b"x" * 150), entry(1, 1, 11, payload=b"y" * 150)]
    _append_raw(log_path(tmp_path, 1, 1), b"\0" * len(later[0]), later[1])
    report, outcome = reopen(tmp_path)
    assert report.limbo == [] and [t.offset for t in report.tails_cut] == [sum(map(len, encoded))]
    assert "never synced" in report.tails_cut[0].reason
    assert outcome == {0: encoded[0], 9: encoded[9]}
    assert log_path(tmp_path, 1, 1).stat().st_size == sum(map(len, encoded))


def test_zeros_inside_the_durable_length_are_damage_even_with_valid_entries_after(tmp_path, entry, forget_checkpoints):
    encoded = ten(entry)
    write_entries(tmp_path, encoded)
    forget_checkpoints(tmp_path)  # the start reads it all
    with open(log_path(tmp_path, 1, 1), "r+b") as f:
        f.seek(offsets(encoded)[5])
        f.write(b"\0" * len(encoded[5]))
    report, outcome = reopen(tmp_path)
    (limbo,) = report.limbo
    assert limbo.offset == offsets(encoded)[5] and outcome[0] == "LimboError"


def test_garbage_that_is_not_zeros_before_a_valid_entry_stays_limbo_past_the_durable_length(tmp_path, entry):
    encoded = ten(entry)
    write_entries(tmp_path, encoded)
    _append_raw(log_path(tmp_path, 1, 1), b"\x5a" * 200, entry(1, 1, 11, payload=b"y" * 150))
    report, _ = reopen(tmp_path)
    assert [r.segment_seq for r in report.limbo] == [1] and report.tails_cut == []


def test_a_log_directory_left_by_a_crashed_run_gets_its_parent_synced_on_first_use(tmp_path, entry):
    """An earlier run made segments/<log>/ and crashed before fsyncing segments/: the first file
    this run creates there syncs segments/ too (a power loss could otherwise drop the dir)."""
    (tmp_path / "segments" / f"{1:016x}").mkdir(parents=True)
    synced: list[str] = []

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        os.fsync(fd)

    async def body():
        store = SegmentStore(tmp_path, fsync=fsync)
        await store.open()
        synced.clear()
        await store.add(entry(1, 1, 0, payload=b"a"))
        await store.add(entry(1, 2, 0, payload=b"b"))  # same log directory, second file
        await store.close()

    asyncio.run(body())
    segments = str(tmp_path / "segments")
    assert synced.count(segments) == 1
