"""A replica file shorter than what its agent acknowledged is found at start-up and put in
limbo, never trusted to say what it lacks (issue 18 item 3; the .acked files of recovery.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from dlagent.storage import SegmentStore
from dlagent.storage import store as store_module
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
