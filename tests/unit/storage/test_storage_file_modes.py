"""Least privilege on disk (DESIGN.md §10, issue 19): the store makes directories 0700 and files
0600 by explicit modes, whatever the umask of the process that opens it, and narrows a data
directory that other users can reach.

Every test runs under umask 022, the usual default, under which the modes the store used to
pass (0644 files, default-mode directories) gave every local user read access to replicas.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlagent.identity import IDENTITY_FILE, ensure_identity
from dlagent.storage import SegmentStore
from dlagent.storage import layout
from dlagent.storage.recovery import write_limbo_markers
from dlagent.storage.types import LimboRecord
from dlctl.log.format import HEADER_SIZE


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def modes_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): mode(p) for p in [root, *root.rglob("*")]}


def test_every_directory_and_file_the_store_writes_is_private(tmp_path, entry):
    data = tmp_path / "data"

    async def body():
        store = SegmentStore(data)
        await store.open()
        for i in range(3):
            await store.add(entry(1, 1, i))
        await store.add(entry(2, 1, 0))
        await store.fence(2, 1)  # a .fenced marker
        await store.close()  # a clean close records each replica's length: .acked files
        # A replica damaged while the agent was down goes to limbo at the next open: .limbo
        # (one the open reads: no index checkpoint of it, as after a crash while it grew).
        layout.segment_path(data, (1, 1), layout.IDX_SUFFIX).unlink()
        log = layout.segment_path(data, (1, 1))
        raw = bytearray(log.read_bytes())
        raw[HEADER_SIZE + 3] ^= 0x10
        log.write_bytes(bytes(raw))
        store = SegmentStore(data)
        report = await store.open()
        assert [r.log_id for r in report.limbo] == [1]
        await store.add(entry(3, 1, 0))
        assert await store.delete(3, 1)  # a delete records reclaimed space: reclaimed.json
        await store.close()

    asyncio.run(body())
    found = modes_under(data)
    names = {Path(p).name for p in found}
    expected_kinds = {"LOCK", "reclaimed.json", f"{1:016x}.log", f"{1:016x}.acked", f"{1:016x}.fenced", f"{1:016x}.limbo", f"{1:016x}.idx"}
    assert expected_kinds <= names, f"the test no longer produces every kind of file: {sorted(names)}"
    wider = {p: f"{m:04o}" for p, m in found.items() if m != (0o700 if (data / p).is_dir() else 0o600)}
    assert not wider, f"not 0700 (directories) / 0600 (files): {wider}"


def test_an_existing_data_dir_open_to_others_is_narrowed_and_the_log_says_so(tmp_path, caplog):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)  # as `mkdir -p` or an older agent left it

    async def body():
        store = SegmentStore(data)
        await store.open()
        await store.close()

    with caplog.at_level(logging.WARNING, logger="dlagent.storage"):
        asyncio.run(body())
    assert mode(data) == 0o700
    assert any("was mode 0755" in r.getMessage() and "narrowed to 0700" in r.getMessage() for r in caplog.records), caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dlagent.storage"):
        asyncio.run(body())  # already private: nothing to say
    assert not [r for r in caplog.records if "narrowed" in r.getMessage()]


def test_a_private_data_dir_is_left_as_it_is(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o500)  # owner-only and narrower than 0700: nothing to narrow, nothing widened
    assert layout.secure_data_dir(data) is None
    assert mode(data) == 0o500


def test_limbo_markers_for_a_fresh_directory_and_the_identity_record_are_private(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    write_limbo_markers(data, [LimboRecord(7, 1, str(layout.segment_path(data, (7, 1))), -1, "lost with the disk")])
    ensure_identity(data, "east", "n1")
    found = modes_under(data)
    assert found[str(layout.segment_path(data, (7, 1), layout.LIMBO_SUFFIX).relative_to(data))] == 0o600
    assert found[IDENTITY_FILE] == 0o600
    assert found["segments"] == 0o700 and found[f"segments/{7:016x}"] == 0o700


def test_a_stale_identity_temp_file_does_not_pass_its_mode_on(tmp_path):
    """A crash can leave identity.tmp behind, made by an agent that still wrote 0644 files:
    the record renamed from it must still be 0600."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    stale = data / "identity.tmp"
    stale.write_text("{}")
    os.chmod(stale, 0o644)
    ensure_identity(data, "east", "n1")
    assert mode(data / IDENTITY_FILE) == 0o600
