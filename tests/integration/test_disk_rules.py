"""dlagent.disk's start-up rules against a real ZooKeeper: which directories are fresh, what a
fresh one forgets, and which directory is refused (issue 18 item 3)."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from dlagent.disk import LOST_WITH_DISK, is_fresh, memberships, prepare_data_dir
from dlagent.identity import IDENTITY_FILE, read_identity
from dlagent.storage.recovery import read_limbo_marker
from dlctl.errors import RefusedError
from dlctl.meta import paths
from dlctl.meta.records import EnsembleChange, LogConfig, SegmentRecord, SegmentState
from dlctl.meta.store import MetaStore

CLUSTER = "c1"


@pytest.fixture
def meta(zk):
    return MetaStore(zk.client(), CLUSTER)


def _segment(meta: MetaStore, name: str, seq: int, *ensembles: tuple[str, ...], state=SegmentState.COMPLETED) -> None:
    changes = tuple(EnsembleChange(i * 10, nodes) for i, nodes in enumerate(ensembles))
    meta.create_segment(name, meta.get_log(name), SegmentRecord(seq, state, changes, 3, 2, time.time(), last_entry_id=len(changes) * 10 - 1))


def _limbo_keys(data_dir) -> set[tuple[int, int]]:
    return {(int(p.parent.name, 16), int(p.stem, 16)) for p in (data_dir / "segments").rglob("*.limbo")}


def test_a_fresh_directory_marks_every_segment_naming_the_node_limbo_before_it_gets_an_identity(meta, tmp_path):
    a = meta.create_log("a", LogConfig()).log_id
    b = meta.create_log("b", LogConfig()).log_id
    _segment(meta, "a", 1, ("n1", "n2", "n3"))
    _segment(meta, "a", 2, ("n2", "n3", "n4"), ("n1", "n3", "n4"))  # n1 joined by an ensemble change
    _segment(meta, "b", 1, ("n2", "n3", "n4"), state=SegmentState.INPROGRESS)
    _segment(meta, "b", 2, ("n1", "n2", "n3"), state=SegmentState.INPROGRESS)
    assert memberships(meta, "n1") == [(a, 1), (a, 2), (b, 2)]

    check = prepare_data_dir(meta.client, CLUSTER, "n1", tmp_path / "data")
    assert check.fresh and set(check.forgotten) == {(a, 1), (a, 2), (b, 2)}
    assert _limbo_keys(tmp_path / "data") == {(a, 1), (a, 2), (b, 2)}
    marker = read_limbo_marker(tmp_path / "data" / "segments" / f"{b:016x}" / f"{2:016x}.limbo")
    assert marker.reason == LOST_WITH_DISK
    recorded = json.loads(meta.client.get(paths.disk(CLUSTER, "n1"))[0])["disk_id"]
    assert recorded == read_identity(tmp_path / "data").disk_id == check.identity.disk_id
    # Started again on the same directory: not fresh, nothing more forgotten, same disk.
    again = prepare_data_dir(meta.client, CLUSTER, "n1", tmp_path / "data")
    assert (again.fresh, again.forgotten, again.identity.disk_id) == (False, (), recorded)


def test_a_node_in_no_segment_starts_fresh_with_nothing_to_forget(meta, tmp_path):
    meta.create_log("a", LogConfig())
    _segment(meta, "a", 1, ("n2", "n3", "n4"))
    check = prepare_data_dir(meta.client, CLUSTER, "n1", tmp_path / "data")
    assert check.fresh and check.forgotten == () and not _limbo_keys(tmp_path / "data")


def test_a_directory_emptied_below_its_identity_record_is_fresh(meta, tmp_path):
    log_id = meta.create_log("a", LogConfig()).log_id
    data = tmp_path / "data"
    first = prepare_data_dir(meta.client, CLUSTER, "n1", data)
    _segment(meta, "a", 1, ("n1", "n2", "n3"))
    shutil.rmtree(data / "segments")  # wiped, identity.json left behind
    assert is_fresh(data)
    second = prepare_data_dir(meta.client, CLUSTER, "n1", data)
    assert second.fresh and second.forgotten == ((log_id, 1),)
    assert second.identity.disk_id != first.identity.disk_id


def test_a_crash_after_the_markers_and_before_the_identity_leaves_the_directory_fresh(meta, tmp_path, monkeypatch):
    log_id = meta.create_log("a", LogConfig()).log_id
    _segment(meta, "a", 1, ("n1", "n2", "n3"))
    data = tmp_path / "data"
    import dlagent.disk as disk

    def crash(*_args, **_kwargs):
        raise OSError("power lost")

    monkeypatch.setattr(disk, "ensure_identity", crash)
    with pytest.raises(OSError):
        prepare_data_dir(meta.client, CLUSTER, "n1", data)
    monkeypatch.undo()
    assert not (data / IDENTITY_FILE).exists() and _limbo_keys(data) == {(log_id, 1)}
    check = prepare_data_dir(meta.client, CLUSTER, "n1", data)  # not refused as unidentified data
    assert check.fresh and check.forgotten == ((log_id, 1),)


def test_another_copy_of_the_nodes_data_is_refused_naming_both_disks(meta, tmp_path):
    old = tmp_path / "old"
    prepare_data_dir(meta.client, CLUSTER, "n1", old)
    stale = tmp_path / "stale-copy"
    shutil.copytree(old, stale)
    shutil.rmtree(old)
    new = prepare_data_dir(meta.client, CLUSTER, "n1", old)  # the disk replaced: fresh, new id
    with pytest.raises(RefusedError) as refused:
        prepare_data_dir(meta.client, CLUSTER, "n1", stale)
    stale_id = read_identity(stale).disk_id
    assert stale_id in str(refused.value) and new.identity.disk_id in str(refused.value)
    assert "move" in (refused.value.hint or "")


def test_a_directory_from_before_disk_ids_gets_one_and_is_recorded(meta, tmp_path):
    data = tmp_path / "data"
    (data / "segments").mkdir(parents=True)
    (data / IDENTITY_FILE).write_text(json.dumps({"cluster": CLUSTER, "node_id": "n1", "created": 1.0}))
    check = prepare_data_dir(meta.client, CLUSTER, "n1", data)
    assert not check.fresh and check.previous_disk is None and check.identity.disk_id
    assert json.loads(meta.client.get(paths.disk(CLUSTER, "n1"))[0])["disk_id"] == check.identity.disk_id


def test_a_repair_claim_is_held_by_one_session_at_a_time_and_goes_with_it(zk):
    first, second = MetaStore(zk.client(), CLUSTER), MetaStore(zk.client(), CLUSTER)
    assert first.claim_repair("orders", 3, "n2", "auditor n1")
    assert not second.claim_repair("orders", 3, "n2", "operator")
    assert second.claim_repair("orders", 3, "n3", "operator")  # another replica: another claim
    first.client.stop()
    first.client.close()  # the claimant's session ends: so does its claim
    assert second.claim_repair("orders", 3, "n2", "operator")
    second.release_repair("orders", 3, "n2")
    assert MetaStore(zk.client(), CLUSTER).claim_repair("orders", 3, "n2", "third")
