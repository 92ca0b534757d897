"""The one compare-and-set primitive of the metadata (``dlctl.meta.cas``) against a real
ZooKeeper: create when absent, write only at the version read, a conflict when someone else
wrote first — even when they wrote the very bytes we meant to (two allocators of the same next
id), which must never pass for our own success. The update loop re-reads and retries after a
conflict, building on the other writer's change."""

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


def test_another_writers_identical_bytes_are_a_conflict_never_our_success(zk):
    client = zk.client()
    path = "/counter"
    client.create(path, b"2")
    # Two allocators read version 0 ("2") and both write "3": the second must not get id 3 too.
    assert cas.put(client, path, b"3", 0) == 1
    with pytest.raises(ConflictError):
        cas.put(client, path, b"3", 0)
    # The same for two creators of one znode with the same bytes.
    assert cas.put(client, "/made", b"same", cas.ABSENT) == 0
    with pytest.raises(ConflictError):
        cas.put(client, "/made", b"same", cas.ABSENT)


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
