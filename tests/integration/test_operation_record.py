"""The record of a resumable operation in a real ZooKeeper (``dlctl.meta.operations``): started,
resumed by the next run, started afresh once finished, and updated by two runs (or many threads)
at once without either's change being lost."""

from __future__ import annotations

import threading

import pytest

from dlctl.errors import ConflictError
from dlctl.meta.operations import OperationRecord
from dlctl.meta.store import MetaStore

pytestmark = [pytest.mark.zk]


def _append(item: str):
    return lambda record: {**record, "items": [*record.get("items", []), item]}


def test_a_second_run_continues_the_record_the_first_left(zk):
    meta = MetaStore(zk.client(), "c")
    first = OperationRecord.start(meta, "op-1", {"kind": "copy", "items": []})
    assert (first.value["state"], first.value["runs"]) == ("running", 1)
    first.update(_append("a"))
    first.set(state="incomplete")

    second = OperationRecord.start(meta, "op-1", {"kind": "copy", "items": []}, resume=lambda r: {**r, "resumed": True})
    stored = meta.get_op("op-1").value
    assert stored == second.value
    assert (stored["state"], stored["runs"], stored["items"], stored["resumed"]) == ("running", 2, ["a"], True)
    assert stored["created_at"] == first.value["created_at"]


def test_a_finished_operation_is_started_afresh_when_the_caller_says_so(zk):
    meta = MetaStore(zk.client(), "c")
    done = OperationRecord.start(meta, "op-2", {"kind": "copy", "items": []})
    done.update(_append("old"))
    done.set(state="done")

    kept = OperationRecord.start(meta, "op-2", {"kind": "copy", "items": []})
    assert kept.value["items"] == ["old"] and kept.value["runs"] == 2  # by default: continued

    kept.set(state="done")
    again = OperationRecord.start(meta, "op-2", {"kind": "copy", "items": []}, restart_if=lambda r: r.get("state") == "done")
    assert (again.value["items"], again.value["runs"], again.value["state"]) == ([], 1, "running")
    assert meta.get_op("op-2").value == again.value


def test_two_runs_writing_at_once_keep_both_changes(zk):
    meta = MetaStore(zk.client(), "c")
    ours = OperationRecord.start(meta, "op-3", {"items": []})
    theirs = OperationRecord(MetaStore(zk.client(), "c"), "op-3", meta.get_op("op-3"))
    theirs.update(_append("theirs"))
    # ``ours`` last saw the version before theirs: a blind write at it is refused ...
    with pytest.raises(ConflictError):
        meta.update_op("op-3", ours.versioned, {**ours.value, "items": ["ours"]})
    # ... and the record's update re-reads and builds on their change instead.
    ours.update(_append("ours"))
    assert meta.get_op("op-3").value["items"] == ["theirs", "ours"]


def test_updates_from_many_threads_of_one_run_are_all_recorded(zk):
    meta = MetaStore(zk.client(), "c")
    record = OperationRecord.start(meta, "op-4", {"items": []})

    def work(tag: str) -> None:
        for i in range(10):
            record.update(_append(f"{tag}{i}"))

    threads = [threading.Thread(target=work, args=(f"t{t}-",)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    items = meta.get_op("op-4").value["items"]
    assert sorted(items) == sorted(f"t{t}-{i}" for t in range(6) for i in range(10))
