"""Helpers for the segment store's unit tests (real files in tmp dirs, asyncio.run)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from dlagent.storage import SyncPolicy
from dlctl.log.format import Entry, encode


def make_entry(log_id: int = 1, seq: int = 1, entry_id: int = 0, lac: int | None = None, payload: bytes | None = None) -> bytes:
    if lac is None:
        lac = entry_id - 1
    if payload is None:
        payload = f"entry {log_id}/{seq}/{entry_id}".encode() * 3
    return encode(Entry(log_id, seq, entry_id, lac, payload))


def _forget_checkpoints(root) -> None:
    """As if the agent had crashed while its replicas grew: no index checkpoint covers them, and
    the next start reads (and checks) every byte. A clean close writes them; damage inside what
    one covers is found by reads and the scrubber instead (test_storage_checkpoint.py)."""
    for path in (root / "segments").rglob("*.idx"):
        path.unlink()


class CountingSync:
    """An fdatasync/fsync stand-in: counts calls, can fail from the n-th call, can be held."""

    def __init__(self, real: Callable[[int], None] = os.fdatasync) -> None:
        self.real = real
        self.calls = 0
        self.fail_from: int | None = None
        self.error = OSError(5, "Input/output error (injected)")
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self.lock:
            self.calls += 1
            n = self.calls
        self.entered.set()
        self.gate.wait(10)
        if self.fail_from is not None and n >= self.fail_from:
            raise self.error
        self.real(fd)


@pytest.fixture(scope="session")
def entry() -> Callable[..., bytes]:
    return make_entry


@pytest.fixture(scope="session")
def forget_checkpoints() -> Callable[..., None]:
    return _forget_checkpoints


@pytest.fixture(scope="session")
def counting_sync() -> type[CountingSync]:
    return CountingSync


@pytest.fixture(scope="session")
def threaded() -> SyncPolicy:
    """For tests that hold or step fdatasync, or read file sizes: every batch goes to the sync
    thread (none is synced inline on the loop, which a held fdatasync would block), and files
    grow with each write (no preallocation)."""
    return SyncPolicy(inline_bytes=0, prealloc_bytes=0)
