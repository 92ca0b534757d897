"""A failed read of a replica file: want of a resource (EMFILE, ENOMEM, ...) fails that read with
the retryable AgentResourceError and never puts the replica in limbo; a media error (EIO) does;
anything else (EACCES) fails the read without limbo. Issue 19 item 4.

Errors are injected into ``pread`` (both read paths: ``read`` and ``read_range``), and one test
exhausts the process's real descriptor limit so the store's ``open`` fails with a real EMFILE.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource

import pytest

from dlagent.storage import SegmentStore
from dlagent.storage import reads as store_module
from dlctl.log.errors import AgentIOError, AgentResourceError, AgentUnavailableError, LimboError

RESOURCE = ["EMFILE", "ENFILE", "ENOMEM", "EAGAIN", "EINTR", "ENOBUFS"]


class FailingPread:
    """``os.pread`` that fails with ``error`` while ``armed`` (the store's reads only: the test
    arms it around them)."""

    def __init__(self, error: OSError) -> None:
        self.error = error
        self.armed = False
        self.failed = 0
        self.real = os.pread

    def __call__(self, fd: int, n: int, off: int) -> bytes:
        if self.armed:
            self.failed += 1
            raise self.error
        return self.real(fd, n, off)


def oserror(name: str) -> OSError:
    code = getattr(errno, name)
    return OSError(code, f"{os.strerror(code)} (injected)")


async def store_with(tmp_path, entry, n: int = 10) -> tuple[SegmentStore, list[bytes]]:
    store = SegmentStore(tmp_path)
    await store.open()
    entries = [entry(1, 1, i) for i in range(n)]
    for e in entries:
        await store.add(e)
    return store, entries


def read_both_ways(store: SegmentStore, how: str) -> bytes:
    return store.read(1, 1, 3) if how == "read" else store.read_range(1, 1, 3, 6, 1 << 20)


@pytest.mark.parametrize("how", ["read", "read_range"])
@pytest.mark.parametrize("code", RESOURCE)
def test_a_resource_error_fails_the_read_retryably_and_never_puts_the_replica_in_limbo(tmp_path, entry, monkeypatch, code, how):
    pread = FailingPread(oserror(code))
    monkeypatch.setattr(store_module.os, "pread", pread)

    async def body():
        store, entries = await store_with(tmp_path, entry)
        pread.armed = True
        with pytest.raises(AgentResourceError, match="short of a resource") as caught:
            read_both_ways(store, how)
        pread.armed = False
        assert pread.failed == 1
        # Retryable on the client's side: the class it maps to is "unavailable", not I/O or limbo.
        assert isinstance(caught.value, AgentUnavailableError) and caught.value.status == AgentResourceError.status
        st = store.stat()
        assert st["limbo"] == 0 and st["read_resource_errors"] == 1
        assert not store.list_segments()[0].limbo
        # The same read succeeds once the resource is back.
        assert store.read(1, 1, 3) == entries[3]
        assert store.read_range(1, 1, 3, 6, 1 << 20) == b"".join(entries[3:7])
        await store.close()
        assert not list(tmp_path.rglob("*.limbo"))

    asyncio.run(body())


@pytest.mark.parametrize("how", ["read", "read_range"])
def test_a_media_error_still_puts_the_replica_in_limbo(tmp_path, entry, monkeypatch, how):
    """The contrast: EIO is evidence about the medium, and the replica stops serving."""
    pread = FailingPread(oserror("EIO"))
    monkeypatch.setattr(store_module.os, "pread", pread)

    async def body():
        store, _ = await store_with(tmp_path, entry)
        pread.armed = True
        with pytest.raises(LimboError, match="unreadable"):
            read_both_ways(store, how)
        pread.armed = False
        assert store.stat()["limbo"] == 1 and store.stat()["read_resource_errors"] == 0
        with pytest.raises(LimboError, match="in limbo"):
            store.read(1, 1, 0)  # the whole replica, not just that entry
        await store.close()
        assert len(list(tmp_path.rglob("*.limbo"))) == 1

    asyncio.run(body())


def test_another_error_fails_the_read_without_limbo(tmp_path, entry, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    pread = FailingPread(oserror("EACCES"))
    monkeypatch.setattr(store_module.os, "pread", pread)

    async def body():
        store, entries = await store_with(tmp_path, entry)
        pread.armed = True
        with pytest.raises(AgentIOError) as caught:
            store.read(1, 1, 3)
        pread.armed = False
        assert not isinstance(caught.value, (AgentResourceError, LimboError))
        assert store.stat()["limbo"] == 0 and store.read(1, 1, 3) == entries[3]
        await store.close()

    asyncio.run(body())
    assert any("not taken as damage" in r.getMessage() for r in caplog.records)


def test_a_real_emfile_when_opening_the_replica_is_not_corruption(tmp_path, entry):
    """The process really runs out of descriptors (soft RLIMIT_NOFILE lowered to the lowest free
    descriptor number) while the replica's file is closed: the store's ``open`` fails with EMFILE."""

    async def body():
        store, entries = await store_with(tmp_path, entry)
        [seg] = store._segments.values()
        store._fds.close(seg)  # the next read must open the file
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest_free = os.dup(0)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
        try:
            with pytest.raises(OSError) as probe:
                os.open(os.devnull, os.O_RDONLY)  # the limit really bites
            assert probe.value.errno == errno.EMFILE
            with pytest.raises(AgentResourceError, match="Too many open files"):
                store.read(1, 1, 3)
            with pytest.raises(AgentResourceError):
                store.read_range(1, 1, 0, 9, 1 << 20)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        st = store.stat()
        assert st["limbo"] == 0 and st["read_resource_errors"] == 2
        assert store.read(1, 1, 3) == entries[3]  # descriptors back: the read succeeds
        await store.close()
        assert not list(tmp_path.rglob("*.limbo"))

    asyncio.run(body())


def test_a_flood_of_failed_reads_logs_a_bounded_number_of_lines(tmp_path, entry, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="dlagent.storage")
    pread = FailingPread(oserror("EMFILE"))
    monkeypatch.setattr(store_module.os, "pread", pread)

    async def body():
        store, _ = await store_with(tmp_path, entry)
        pread.armed = True
        for _ in range(1000):
            with pytest.raises(AgentResourceError):
                store.read(1, 1, 3)
        pread.armed = False
        assert store.stat()["read_resource_errors"] == 1000
        await store.close()

    asyncio.run(body())
    lines = [r for r in caplog.records if "want of a resource" in r.getMessage()]
    # One line per second at most (this loop takes well under a few seconds).
    assert 1 <= len(lines) <= 5, [r.getMessage() for r in lines]
