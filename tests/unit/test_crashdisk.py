"""The power-loss disk model (harness.crashdisk) without FUSE: what survives a power loss.

A file's content and size survive exactly as of its last fsync/fdatasync; a directory's entries
exactly as of its last fsync. The state machine checks FileData against the plainest possible
model (two byte strings: what processes see, and what the disk holds) over random writes,
truncates, preallocations, syncs, fsyncs in flight (called, then returning later, with writes in
between that they must not cover) and power losses.
"""

from __future__ import annotations

import errno
import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from harness.crashdisk import FALLOC_FL_KEEP_SIZE, PAGE, RENAME_EXCHANGE, RENAME_NOREPLACE, Directory, File, FileData, Volume

# -- one file's bytes ----------------------------------------------------------------------------------


def test_unsynced_write_is_gone_after_power_loss_and_synced_one_stays():
    f = FileData()
    f.write(0, b"durable")
    f.sync()
    f.write(7, b" and more")
    f.write(0, b"D")
    assert f.read(0, 100) == b"Durable and more"
    assert f.power_loss() == 1
    assert f.read(0, 100) == b"durable" and f.size == 7


def test_fdatasync_point_is_exact_to_the_byte_across_pages():
    f = FileData()
    first = bytes(range(256)) * 20  # 5120 bytes: past the first page
    f.write(0, first)
    f.sync()
    f.write(5000, b"x" * 9000)  # overwrites the durable tail and appends three pages
    f.power_loss()
    assert f.read(0, 1 << 20) == first


def test_preallocated_size_is_lost_unless_synced_and_synced_zeros_stay_zeros():
    f = FileData()
    f.write(0, b"entry-1")
    f.allocate(0, 3 * PAGE, keep_size=False)
    assert f.size == 3 * PAGE and f.read(7, 10) == bytes(10)
    f.power_loss()
    assert f.size == 0, "neither the write nor the preallocation was synced"
    f.write(0, b"entry-1")
    f.allocate(0, 3 * PAGE, keep_size=False)
    f.sync()  # the preallocated size is durable now (zeros after the data)
    f.write(7, b"entry-2")  # inside the durable size: a change to durable zeros
    f.power_loss()
    assert f.size == 3 * PAGE and f.read(0, 14) == b"entry-1" + bytes(7)


def test_keep_size_preallocation_changes_nothing_visible():
    f = FileData()
    f.write(0, b"abc")
    f.allocate(0, 10 * PAGE, keep_size=True)
    assert f.size == 3


def test_truncate_since_the_last_sync_is_undone_with_the_cut_bytes():
    f = FileData()
    f.write(0, b"a" * 3 * PAGE + b"tail")
    f.sync()
    f.truncate(10)
    f.write(10, b"new")  # refills part of the cut range
    f.truncate(2 * PAGE)  # grows again: zeros
    assert f.read(10, 5) == b"new\0\0"
    f.power_loss()
    assert f.read(0, 1 << 20) == b"a" * 3 * PAGE + b"tail"


def test_sync_after_truncate_makes_the_cut_durable():
    f = FileData()
    f.write(0, b"0123456789")
    f.sync()
    f.truncate(4)
    f.sync()
    f.write(4, b"zz")
    f.power_loss()
    assert f.read(0, 100) == b"0123"


def test_a_torn_power_loss_can_keep_a_later_page_and_lose_an_earlier_one():
    f = FileData()
    f.write(0, b"d" * 100)
    f.sync()
    f.write(100, b"a" * (PAGE - 100) + b"b" * PAGE)  # fills page 0, then page 1
    outcomes = set()
    for seed in range(64):
        g = FileData()
        g.write(0, b"d" * 100)
        g.sync()
        g.write(100, b"a" * (PAGE - 100) + b"b" * PAGE)
        g.power_loss(0.5, random.Random(seed))
        outcomes.add((g.size, g.read(100, 1), g.read(PAGE, 1)))
    assert (2 * PAGE, b"\0", b"b") in outcomes, "page 1 kept while page 0 went back: possible on real disks"
    assert (100, b"", b"") in outcomes and (2 * PAGE, b"a", b"b") in outcomes
    f.power_loss(1.0, random.Random(0))  # keeping everything: a process crash
    assert f.size == 2 * PAGE and f.read(PAGE, 1) == b"b"


def test_durable_content_is_what_power_loss_leaves():
    f = FileData()
    f.write(0, b"q" * 9000)
    f.sync()
    f.write(4000, b"r" * 200)
    f.truncate(100)
    expected = f.durable_content()
    f.power_loss()
    assert f.read(0, 1 << 20) == expected == b"q" * 9000


class FileAgainstModel(RuleBasedStateMachine):
    """FileData vs two byte strings: ``now`` (what reads see) and ``disk`` (the last sync)."""

    def __init__(self) -> None:
        super().__init__()
        self.f = FileData()
        self.now = b""
        self.disk = b""
        self.in_flight: list[tuple[object, bytes]] = []  # fsyncs called and not returned yet

    offsets = st.integers(0, 5 * PAGE)

    @rule(offset=offsets, data=st.binary(min_size=1, max_size=2 * PAGE))
    def write(self, offset, data):
        self.f.write(offset, data)
        now = self.now.ljust(offset, b"\0")
        self.now = now[:offset] + data + now[offset + len(data) :]

    @rule(length=offsets)
    def truncate(self, length):
        self.f.truncate(length)
        self.now = self.now[:length].ljust(length, b"\0")

    @rule(offset=offsets, length=st.integers(1, 3 * PAGE), keep_size=st.booleans())
    def allocate(self, offset, length, keep_size):
        self.f.allocate(offset, length, keep_size)
        if not keep_size:
            self.now = self.now.ljust(offset + length, b"\0")

    @rule()
    def sync(self):
        self.f.sync()
        self.disk = self.now

    @rule()
    def call_fsync(self):
        self.in_flight.append((self.f.snapshot(), self.now))

    @rule(data=st.data())
    def fsync_returns(self, data):
        if self.in_flight:
            snap, then = self.in_flight.pop(data.draw(st.integers(0, len(self.in_flight) - 1)))
            self.f.sync_to(snap)
            self.disk = then  # what the file held when that fsync was called; nothing later

    @rule()
    def power_loss(self):
        self.f.power_loss()
        self.now = self.disk
        self.in_flight.clear()  # they never return

    @rule(keep=st.floats(0.05, 1.0), seed=st.integers(0, 2**32))
    def torn_power_loss(self, keep, seed):
        """Size either the durable or the current one; every page either its durable or its
        current bytes (zeros past either end)."""
        self.f.power_loss(keep, random.Random(seed))
        size = self.f.size
        assert size in (len(self.disk), len(self.now))
        after = self.f.read(0, size)
        now, disk = self.now.ljust(size, b"\0")[:size], self.disk.ljust(size, b"\0")[:size]
        for lo in range(0, size, PAGE):
            page = after[lo : lo + PAGE]
            assert page in (now[lo : lo + PAGE], disk[lo : lo + PAGE]), f"page at {lo} is neither"
        self.now = self.disk = after
        self.in_flight.clear()

    @rule(offset=offsets, length=st.integers(0, 3 * PAGE))
    def read(self, offset, length):
        assert self.f.read(offset, length) == self.now[offset : offset + length]

    @invariant()
    def agrees(self):
        assert self.f.size == len(self.now)
        assert self.f.read(0, len(self.now)) == self.now
        assert self.f.durable_content() == self.disk
        assert self.f.dirty or self.now == self.disk


TestFileAgainstModel = FileAgainstModel.TestCase
TestFileAgainstModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# -- the namespace ---------------------------------------------------------------------------------------


def test_created_file_vanishes_unless_its_directory_was_fsynced_even_if_the_file_was():
    v = Volume()
    v.mkdir("/d")
    v.fsync(v.root)
    f = v.create("/d/seg.log")
    v.write(f, 0, b"data")
    v.fsync(f)  # data durable, name not
    report = v.power_loss()
    assert v.listdir(v.lookup("/d")) == [] and report.entries_reverted == 1
    f = v.create("/d/seg.log")
    v.write(f, 0, b"data")
    v.fsync(f)
    v.fsync(v.lookup("/d"))
    v.power_loss()
    assert v.read(v.lookup("/d/seg.log"), 0, 10) == b"data"


def test_new_directory_vanishes_with_its_contents_unless_its_parent_was_fsynced():
    v = Volume()
    v.mkdir("/segments")
    v.fsync(v.root)
    v.mkdir("/segments/0001")
    f = v.create("/segments/0001/a.log")
    v.fsync(f)
    v.fsync(v.lookup("/segments/0001"))  # the file's name is durable in its directory...
    v.power_loss()  # ...but the directory's name in segments/ is not
    assert v.listdir(v.lookup("/segments")) == []
    with pytest.raises(OSError) as err:
        v.lookup("/segments/0001/a.log")
    assert err.value.errno == errno.ENOENT


def test_unlink_and_rmdir_are_undone_until_the_directory_is_fsynced():
    v = Volume()
    v.mkdir("/d")
    f = v.create("/d/x")
    v.write(f, 0, b"kept")
    v.fsync(f)
    v.fsync(v.lookup("/d"))
    v.fsync(v.root)
    v.unlink("/d/x")
    v.rmdir("/d")
    v.power_loss()
    assert v.read(v.lookup("/d/x"), 0, 10) == b"kept", "the unlink (and rmdir) were never made durable"
    v.unlink("/d/x")
    v.fsync(v.lookup("/d"))
    v.rmdir("/d")
    v.fsync(v.root)
    v.power_loss()
    assert v.listdir(v.root) == []


def test_rename_over_a_file_is_durable_only_with_a_directory_fsync():
    v = Volume()
    old = v.create("/identity.json")
    v.write(old, 0, b"old")
    v.fsync(old)
    v.fsync(v.root)
    tmp = v.create("/identity.tmp")
    v.write(tmp, 0, b"new")
    v.fsync(tmp)
    v.rename("/identity.tmp", "/identity.json")
    v.power_loss()
    assert v.read(v.lookup("/identity.json"), 0, 9) == b"old" and v.listdir(v.root) == ["identity.json"]
    tmp = v.create("/identity.tmp")
    v.write(tmp, 0, b"new")
    v.fsync(tmp)
    v.rename("/identity.tmp", "/identity.json")
    v.fsync(v.root)
    v.power_loss()
    assert v.read(v.lookup("/identity.json"), 0, 9) == b"new" and v.listdir(v.root) == ["identity.json"]


def test_an_unlinked_file_still_takes_writes_through_its_node_and_both_are_undone():
    v = Volume()
    f = v.create("/x")
    v.fsync(v.root)
    v.unlink("/x")
    v.write(f, 0, b"orphan")
    assert v.read(f, 0, 6) == b"orphan"
    v.power_loss()
    assert v.read(v.lookup("/x"), 0, 6) == b"", "the unlink was not durable; the writes were never synced"


def test_power_loss_counts_what_it_discarded_and_bumps_the_epoch():
    v = Volume()
    f = v.create("/a")
    v.fsync(v.root)
    v.write(f, 0, b"x" * (2 * PAGE + 1))
    v.create("/b")
    assert v.unsynced() == {"files": 1, "pages": 3, "entries": 1}
    report = v.power_loss()
    assert (report.files_reverted, report.pages_discarded, report.entries_reverted, report.epoch) == (1, 3, 1, 1)
    assert v.unsynced() == {"files": 0, "pages": 0, "entries": 0}


def test_an_fsync_in_flight_at_a_power_loss_makes_nothing_durable_and_fails():
    v = Volume()
    f = v.create("/f")
    v.fsync(v.root)
    v.write(f, 0, b"batch")
    token = v.begin_fsync(f)
    v.power_loss()
    with pytest.raises(OSError) as err:
        v.finish_fsync(f, token)
    assert err.value.errno == errno.EIO
    assert v.read(f, 0, 10) == b""


def test_an_fsync_covers_what_was_written_before_it_was_called_not_during():
    v = Volume()
    d = v.mkdir("/d")
    f = v.create("/d/f")
    v.write(f, 0, b"before")
    token = v.begin_fsync(f)
    dir_token = v.begin_fsync(d)
    v.write(f, 6, b"+during")
    v.create("/d/g")
    v.finish_fsync(f, token)
    v.finish_fsync(d, dir_token)
    v.fsync(v.root)
    v.power_loss()
    assert v.read(v.lookup("/d/f"), 0, 20) == b"before" and v.listdir(d) == ["f"]


def test_refused_operations_say_so():
    v = Volume()
    v.mkdir("/d")
    v.create("/f")
    cases = [
        (lambda: v.rename("/d", "/e"), errno.EPERM),
        (lambda: v.rename("/f", "/g", RENAME_EXCHANGE), errno.EINVAL),
        (lambda: v.fallocate(v.lookup("/f"), 0x02, 0, 10), errno.EOPNOTSUPP),  # punch hole
        (lambda: v.create("/f", exclusive=True), errno.EEXIST),
        (lambda: v.unlink("/d"), errno.EISDIR),
        (lambda: v.rmdir("/f"), errno.ENOTDIR),
        (lambda: v.lookup("/f/x"), errno.ENOTDIR),
    ]
    v.create("/g")
    cases.append((lambda: v.rename("/f", "/g", RENAME_NOREPLACE), errno.EEXIST))
    v.create("/d/x")
    cases.append((lambda: v.rmdir("/d"), errno.ENOTEMPTY))
    for call, code in cases:
        with pytest.raises(OSError) as err:
            call()
        assert err.value.errno == code
    v.fallocate(v.lookup("/f"), FALLOC_FL_KEEP_SIZE, 0, 100)
    assert isinstance(v.lookup("/d"), Directory) and isinstance(v.lookup("/f"), File)
