"""A copy task runs with fewer cyclic collections, and leaves the collector as it found it."""

from __future__ import annotations

import gc

import pytest

from dlctl.spark import task


def test_a_task_raises_the_collection_threshold_and_freezes_what_was_there_then_restores_both():
    before = gc.get_threshold()
    with task._fewer_collections(threshold=12_345):
        assert gc.get_threshold() == (12_345, *before[1:])
        assert gc.get_freeze_count() > 0  # the worker's earlier objects are out of the scans
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_collector_is_restored_when_the_task_fails():
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), task._fewer_collections():
        raise RuntimeError("a failing task")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_cycles_made_during_a_task_are_still_collected():
    class Node:
        pass

    with task._fewer_collections(threshold=100):
        for _ in range(1_000):
            a, b = Node(), Node()
            a.other, b.other = b, a  # a reference cycle, unreachable at the end of each round
        assert sum(type(o) is Node for o in gc.get_objects()) < 1_000


def test_tasks_overlapping_on_threads_restore_the_collector_only_when_the_last_one_ends():
    # The in-process engine runs several tasks at once on threads of one process: a task that
    # ends while another runs must not restore the settings under it, nor keep the other's.
    import threading

    before = gc.get_threshold()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, tuple] = {}

    def first() -> None:
        with task._fewer_collections(threshold=12_345):
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with task._fewer_collections(threshold=12_345):
            second_in.set()
            first_out.wait(10)
            seen["after first ended"] = gc.get_threshold()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen["after first ended"] == (12_345, *before[1:])
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
