"""The power-loss filesystem through the kernel: real syscalls on a FUSE mount, then a power loss.

Shows the model of harness.crashdisk holds for real processes: bytes written without an fsync are
gone after a power loss, fsynced (or fdatasynced) bytes stay, a name survives only once its
directory was fsynced, a process SIGKILLed while writing loses what it had not synced, and a cut
that falls inside an fdatasync (armed on the disk) makes nothing of it durable. No skip: a
machine without FUSE fails here, naming what to install.
"""

from __future__ import annotations

import errno
import os
import sys
import textwrap
from pathlib import Path

import pytest

from harness.powerfs import PowerFs, is_mounted
from harness.procs import wait_until


@pytest.fixture
def fs(procs, tmp_path):
    mount = PowerFs(procs, tmp_path / "mnt").start()
    yield mount
    mount.close()
    assert not is_mounted(mount.mountpoint)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_file(path: Path) -> int:
    """Create ``path`` and make its name durable (file and directory fsynced, as the agent does)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.fsync(fd)
    fsync_path(path.parent)
    return fd


def test_bytes_written_without_fsync_are_gone_after_power_loss_and_fdatasynced_ones_stay(fs):
    path = fs.mountpoint / "seg.log"
    fd = new_file(path)
    os.pwrite(fd, b"acknowledged;", 0)
    os.fdatasync(fd)
    os.pwrite(fd, b"in flight", 13)
    os.close(fd)
    assert path.read_bytes() == b"acknowledged;in flight", "before the power loss every process sees all of it"
    report = fs.power_loss()
    assert report["files_reverted"] == 1 and report["pages_discarded"] == 1
    assert path.read_bytes() == b"acknowledged;"
    assert os.stat(path).st_size == 13


def test_without_any_fsync_the_data_is_gone_and_with_fsync_it_is_kept(fs):
    unsynced, synced = fs.mountpoint / "unsynced", fs.mountpoint / "synced"
    for path, sync in ((unsynced, False), (synced, True)):
        fd = new_file(path)
        os.write(fd, b"x" * 10_000)
        if sync:
            os.fsync(fd)
        os.close(fd)
    fs.power_loss()
    assert unsynced.read_bytes() == b"" and synced.read_bytes() == b"x" * 10_000


def test_preallocated_size_and_writes_into_it_follow_the_last_fdatasync(fs):
    path = fs.mountpoint / "prealloc.log"
    fd = new_file(path)
    os.pwrite(fd, b"entry-0", 0)
    os.posix_fallocate(fd, 0, 64 * 1024)
    os.fdatasync(fd)
    os.pwrite(fd, b"entry-1", 7)  # into the preallocated zeros
    os.posix_fallocate(fd, 0, 128 * 1024)  # grows again, never synced
    assert os.fstat(fd).st_size == 128 * 1024
    os.close(fd)
    fs.power_loss()
    data = path.read_bytes()
    assert len(data) == 64 * 1024 and data[:14] == b"entry-0" + bytes(7) and data.count(0) == len(data) - 7


def test_a_name_survives_only_once_its_directory_was_fsynced(fs):
    logdir = fs.mountpoint / "segments"
    logdir.mkdir()
    fsync_path(fs.mountpoint)
    named = logdir / "a.log"
    fd = os.open(named, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"data")
    os.fsync(fd)  # the file's data, not its name
    os.close(fd)
    fs.power_loss()
    assert os.listdir(logdir) == []
    fd = new_file(named)
    os.write(fd, b"data")
    os.fsync(fd)
    os.close(fd)
    fs.power_loss()
    assert named.read_bytes() == b"data"


def test_atomic_replace_keeps_the_old_file_until_the_directory_fsync(fs):
    target = fs.mountpoint / "identity.json"
    fd = new_file(target)
    os.write(fd, b"old")
    os.fsync(fd)
    os.close(fd)
    tmp = fs.mountpoint / "identity.tmp"
    tmp.write_bytes(b"new")
    fd = os.open(tmp, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp, target)
    fs.power_loss()
    assert target.read_bytes() == b"old" and sorted(os.listdir(fs.mountpoint)) == ["identity.json"]


def test_a_descriptor_open_across_a_power_loss_is_dead(fs):
    path = fs.mountpoint / "f"
    fd = new_file(path)
    try:
        fs.power_loss()
        with pytest.raises(OSError) as err:
            os.pwrite(fd, b"after", 0)
        assert err.value.errno == errno.EIO
    finally:
        os.close(fd)


def test_a_writer_killed_mid_stream_keeps_exactly_what_it_fdatasynced(fs, procs, tmp_path):
    """A child appends numbered lines and fdatasyncs every 10th, reporting each sync on stdout;
    SIGKILL, power loss: the file holds exactly the lines up to the last sync it reported."""
    path = fs.mountpoint / "stream.log"
    progress = tmp_path / "synced.txt"
    code = textwrap.dedent(f"""
        import os
        fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT, 0o644)
        os.fsync(fd)
        d = os.open({str(path.parent)!r}, os.O_RDONLY); os.fsync(d); os.close(d)
        out = os.open({str(progress)!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        offset = 0
        for i in range(10**9):
            line = b"line %08d\\n" % i
            offset += os.pwrite(fd, line, offset)
            if i % 10 == 9:
                os.fdatasync(fd)
                os.write(out, b"%d\\n" % offset)
    """)
    writer = procs.start([sys.executable, "-c", code], name="writer")
    wait_until(lambda: progress.exists() and len(progress.read_text().split()) >= 50, 20, message="50 syncs", watch=writer)
    writer.kill()
    fs.power_loss()
    synced = int(progress.read_text().split()[-1])  # the last sync the child reported
    data = path.read_bytes()
    # The child may have been killed after an fdatasync returned but before it reported it.
    assert len(data) in (synced, synced + 10 * 14), (len(data), synced)
    assert data == b"".join(b"line %08d\n" % i for i in range(len(data) // 14))


def test_a_cut_inside_an_fdatasync_makes_nothing_it_covered_durable(procs, tmp_path):
    """The disk freezes the writer inside its second fdatasync (which takes 50 ms); the power
    loss comes before that fdatasync returns: the first batch stays, the second is gone."""
    fs = PowerFs(procs, tmp_path / "mnt", sync_latency_ms=50).start()
    try:
        path = fs.mountpoint / "seg.log"
        go, progress = tmp_path / "go", tmp_path / "progress"
        code = textwrap.dedent(f"""
            import os, time
            fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT, 0o644)
            os.fsync(fd)
            d = os.open({str(path.parent)!r}, os.O_RDONLY); os.fsync(d); os.close(d)
            os.pwrite(fd, b"batch-1;", 0)
            os.fdatasync(fd)
            open({str(progress)!r}, "w").write("batch-1 durable")
            while not os.path.exists({str(go)!r}):
                time.sleep(0.01)
            os.pwrite(fd, b"batch-2;", 8)
            os.fdatasync(fd)
            open({str(progress)!r}, "w").write("batch-2 durable")
        """)
        writer = procs.start([sys.executable, "-c", code], name="writer")
        wait_until(lambda: progress.exists(), 20, message="the first batch durable", watch=writer)
        fs.arm("fsync", [writer.pid])
        go.touch()
        wait_until(lambda: fs.fired() == "fsync", 20, message="the writer frozen inside its fdatasync")
        report = fs.power_loss(dead_pids=[writer.pid])
        writer.kill()
        assert report["fsyncs_in_flight"] == 1 and report["pages_discarded"] == 1
        assert progress.read_text() == "batch-1 durable"
        assert path.read_bytes() == b"batch-1;"
        assert fs.stats()["counters"]["fsync_cut_short"] == 1
    finally:
        fs.close()
