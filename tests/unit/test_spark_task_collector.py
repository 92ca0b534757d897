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
