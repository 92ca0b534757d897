"""The metadata store against a real ZooKeeper: CAS conflicts, ACLs, atomic segment creation."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from kazoo.exceptions import NoAuthError

from dlctl.errors import ConflictError, NotFoundError, RefusedError
from dlctl.meta import paths
from dlctl.meta.records import EnsembleChange, LogConfig, SegmentRecord, SegmentState
from dlctl.meta.store import MetaStore
from dlctl.meta.zk import ZkAuth, connect

pytestmark = pytest.mark.zk


@pytest.fixture
def meta(zk):
    return MetaStore(zk.client(), "c1")


def new_segment(seq: int) -> SegmentRecord:
    return SegmentRecord(seq, SegmentState.INPROGRESS, (EnsembleChange(0, ("a", "b", "c")),), 3, 2, 0.0, writer="w1")


def test_log_create_list_show_delete(meta):
    a = meta.create_log("a", LogConfig())
    b = meta.create_log("b", LogConfig(5, 3, 2))
    assert a.log_id != b.log_id
    assert meta.list_logs() == ["a", "b"]
    assert meta.get_log("b").value.config.ensemble_size == 5
    meta.delete_log("a")
    assert meta.list_logs() == ["b"]
    with pytest.raises(NotFoundError, match="log 'a' does not exist"):
        meta.get_log("a")


def test_log_ids_are_never_reused_after_delete(meta):
    first = meta.create_log("a", LogConfig()).log_id
    meta.delete_log("a")
    assert meta.create_log("a", LogConfig()).log_id > first


def test_creating_an_existing_log_is_a_conflict(meta):
    meta.create_log("a", LogConfig())
    with pytest.raises(ConflictError, match="already exists"):
        meta.create_log("a", LogConfig())


def test_concurrent_log_creation_allocates_distinct_ids(zk):
    stores = [MetaStore(zk.client(), "c1") for _ in range(4)]
    ids: list[int] = []

    def create(i: int) -> None:
        ids.append(stores[i].create_log(f"log{i}", LogConfig()).log_id)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 4


def test_stale_config_update_is_refused_and_nothing_is_overwritten(meta):
    meta.create_log("a", LogConfig())
    seen = meta.get_log("a")
    meta.update_log_config("a", LogConfig(4, 3, 2), seen.version)
    with pytest.raises(ConflictError, match="changed concurrently"):
        meta.update_log_config("a", LogConfig(9, 9, 9), seen.version)
    assert meta.get_log("a").value.config.ensemble_size == 4


def test_two_writers_cannot_create_the_same_segment(meta, zk):
    other = MetaStore(zk.client(), "c1")
    meta.create_log("a", LogConfig())
    log_view_1 = meta.get_log("a")
    log_view_2 = other.get_log("a")
    meta.create_segment("a", log_view_1, new_segment(1))
    with pytest.raises(ConflictError, match="changed concurrently"):
        other.create_segment("a", log_view_2, new_segment(1))
    assert [s.value.seq for s in meta.segments("a")] == [1]
    assert meta.get_log("a").value.max_segment_seq == 1


def test_segments_come_back_in_numeric_order(meta):
    meta.create_log("a", LogConfig())
    for seq in range(1, 13):
        log = meta.get_log("a")
        meta.create_segment("a", log, new_segment(seq))
    assert [s.value.seq for s in meta.segments("a")] == list(range(1, 13))


def test_segment_close_is_a_compare_and_set(meta):
    meta.create_log("a", LogConfig())
    meta.create_segment("a", meta.get_log("a"), new_segment(1))
    (seen,) = meta.segments("a")
    closed = seen.value.completed_with(9, 100, 10, 1000, 1.0)
    meta.update_segment("a", seen, closed)
    with pytest.raises(ConflictError):
        meta.update_segment("a", seen, replace(closed, last_entry_id=3))  # a deposed writer's close
    assert meta.segments("a")[0].value.last_entry_id == 9


def test_in_progress_segments_are_never_deleted(meta):
    meta.create_log("a", LogConfig())
    meta.create_segment("a", meta.get_log("a"), new_segment(1))
    with pytest.raises(RefusedError, match="in progress"):
        meta.delete_segment("a", meta.segments("a")[0])


def test_a_log_with_a_live_owner_is_not_deleted(meta):
    meta.create_log("a", LogConfig())
    meta.client.create(paths.log_owner("c1", "a"), b"w1", ephemeral=True)
    with pytest.raises(RefusedError, match="live owner"):
        meta.delete_log("a")


def test_acls_keep_other_credentials_out(zk):
    auth = ZkAuth("dlctl", "right-password")
    owner = connect(zk.connect_string, auth)
    try:
        MetaStore(owner, "c1", auth).create_log("a", LogConfig())
        intruder = connect(zk.connect_string, ZkAuth("dlctl", "wrong-password"))
        try:
            with pytest.raises(NoAuthError):
                intruder.get(paths.log("c1", "a"))
            with pytest.raises(NoAuthError):
                intruder.set(paths.log("c1", "a"), b"{}")
        finally:
            intruder.stop()
            intruder.close()
    finally:
        owner.stop()
        owner.close()
