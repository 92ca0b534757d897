"""Uncached adds (a bulk copy's writes) leave the page cache once durable; ordinary adds stay.

Real files and the real kernel: which pages of a segment file are resident is asked of the
kernel itself (``mincore`` on a mapping of the file) after the adds were acknowledged.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from harness.pagecache import pages, resident_pages

from dlagent.storage import SegmentStore, SyncPolicy

LOG_PATH = Path("segments") / f"{1:016x}" / f"{1:016x}.log"
ENTRIES = 64
PAYLOAD = 16 * 1024


def write_segment(tmp_path: Path, entry, *, uncached: bool, policy: SyncPolicy | None = None) -> tuple[int, list[bytes]]:
    """Add ENTRIES entries of PAYLOAD bytes to one segment, several at a time (so batches hold
    more than one), and close the store; returns the data length and the entries. Nothing is
    read back here: a read would bring the pages back into the cache."""
    entries = [entry(1, 1, i, payload=os.urandom(PAYLOAD)) for i in range(ENTRIES)]

    async def body() -> None:
        store = SegmentStore(tmp_path, policy or SyncPolicy())
        await store.open()
        for first in range(0, ENTRIES, 8):
            await asyncio.gather(*(store.add(e, uncached=uncached) for e in entries[first : first + 8]))
        await store.close()

    asyncio.run(body())
    return sum(len(e) for e in entries), entries


def test_uncached_adds_leave_the_page_cache_once_durable(tmp_path, entry):
    length, _ = write_segment(tmp_path, entry, uncached=True)
    # The last page is partly written: the kernel keeps a partial page (the next batch drops it).
    assert resident_pages(tmp_path / LOG_PATH, length) <= 1, f"of {pages(length)} pages"


def test_ordinary_adds_stay_in_the_page_cache(tmp_path, entry):
    length, _ = write_segment(tmp_path, entry, uncached=False)
    assert resident_pages(tmp_path / LOG_PATH, length) == pages(length)


def test_uncached_adds_survive_a_reopen_byte_for_byte(tmp_path, entry):
    _, written = write_segment(tmp_path, entry, uncached=True)

    async def reopen() -> list[bytes]:
        store = SegmentStore(tmp_path)
        await store.open()
        try:
            return [store.read(1, 1, i) for i in range(ENTRIES)]
        finally:
            await store.close()

    assert asyncio.run(reopen()) == written


def test_without_fdatasync_nothing_is_dropped(tmp_path, entry):
    """``sync = never``: the pages may still be dirty, so they are left alone."""
    length, _ = write_segment(tmp_path, entry, uncached=True, policy=SyncPolicy(mode="never"))
    assert resident_pages(tmp_path / LOG_PATH, length) == pages(length)
