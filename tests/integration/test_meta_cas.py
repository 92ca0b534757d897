"""The one compare-and-set primitive of the metadata (``dlctl.meta.cas``) against a real
ZooKeeper: create when absent, write only at the version read, a conflict when someone else
wrote first, and — the case a retried request meets — a write that was applied but whose answer
was lost counts as done (and only that case: other bytes, or a later version, stay a conflict).
The update loop re-reads and retries after a conflict."""

from __future__ import annotations

import pytest

from dlctl.errors import ConflictError, NotFoundError
from dlctl.meta import cas
from dlctl.meta.records import Versioned

pytestmark = [pytest.mark.zk]


def test_put_creates_writes_at_the_version_read_and_refuses_what_moved(zk):
    client = zk.client()
    path = "/doc"
    assert cas.put(client, path, b"one", cas.ABSENT) == 0
    with pytest.raises(ConflictError, match="changed concurrently"):
        cas.put(client, path, b"other", cas.ABSENT)  # created by someone else meanwhile
    assert cas.put(client, path, b"two", 0) == 1
    with pytest.raises(ConflictError, match="expected version 0"):
        cas.put(client, path, b"three", 0)  # stale: it is at version 1 now
    assert client.get(path)[0] == b"two", "a refused write changed the znode"
    with pytest.raises(NotFoundError, match="gone"):
        cas.put(client, "/missing", b"x", 3, missing=lambda: NotFoundError("gone"))


def test_a_write_applied_whose_answer_was_lost_counts_as_done_and_nothing_else_does(zk):
    client = zk.client()
    path = "/doc"
    client.create(path, b"v0")
    # The first try of a set reached the server (the znode moved to version 1 with our bytes)
    # and the connection dropped before the answer: the client's retry sends it again.
    client.set(path, b"ours", version=0)
    assert cas.put(client, path, b"ours", 0) == 1
    # Someone else's bytes at that version: a real conflict.
    client.set(path, b"theirs", version=1)
    with pytest.raises(ConflictError):
        cas.put(client, path, b"mine", 1)
    # Our bytes, but a version later than ours would have made: someone wrote since.
    client.set(path, b"same", version=2)
    client.set(path, b"same", version=3)
    with pytest.raises(ConflictError):
        cas.put(client, path, b"same", 2)
    # A create whose answer was lost: the znode holds our bytes at version 0.
    client.create("/made", b"ours")
    assert cas.put(client, "/made", b"ours", cas.ABSENT) == 0


def test_the_update_loop_reads_again_after_a_conflict(zk):
    client = zk.client()
    path = "/counter"
    client.create(path, b"0")
    reads = []

    def read() -> Versioned[int]:
        data, stat = client.get(path)
        reads.append(int(data))
        if len(reads) == 1:
            client.set(path, b"10", version=stat.version)  # another writer, between our read and write
        return Versioned(int(data), stat.version)

    def write(value: int, version: int) -> Versioned[int]:
        return Versioned(value, cas.put(client, path, str(value).encode(), version))

    result = cas.update(read, lambda n: n + 1, write, what=path)
    assert result.value == 11 and client.get(path)[0] == b"11", "the other writer's increment was lost"
    assert reads == [0, 10]
    # Nothing to change: no write at all.
    assert cas.update(read, lambda n: None, write, what=path).version == result.version
