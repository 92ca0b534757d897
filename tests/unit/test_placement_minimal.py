"""The minimal placement interface: distinct available agents, reproducible under a seed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlctl.errors import RefusedError
from dlctl.placement import choose_ensemble, replace_member

NODES = {f"n{i}": {"region": "r1", "address": f"127.0.0.1:{9000 + i}"} for i in range(1, 7)}


@given(size=st.integers(1, 6), seed=st.integers(0, 2**32), excluded=st.sets(st.sampled_from(sorted(NODES)), max_size=3))
def test_ensembles_are_distinct_available_agents_outside_the_exclusions(size, seed, excluded):
    if size > len(NODES) - len(excluded):
        with pytest.raises(RefusedError):
            choose_ensemble(NODES, size, exclude=excluded, seed=seed)
        return
    ensemble = choose_ensemble(NODES, size, exclude=excluded, seed=seed)
    assert len(ensemble) == len(set(ensemble)) == size
    assert set(ensemble) <= set(NODES) - excluded


def test_a_seed_makes_the_choice_reproducible_whatever_the_order_of_the_records():
    reordered = dict(reversed(list(NODES.items())))
    assert choose_ensemble(NODES, 3, seed=7) == choose_ensemble(reordered, 3, seed=7)
    assert len({choose_ensemble(NODES, 3, seed=s) for s in range(30)}) > 1  # and seeds spread the load


def test_too_few_agents_is_refused_saying_how_many_are_needed_and_available():
    with pytest.raises(RefusedError, match=r"an ensemble of 3 agents is needed but only 2 are available \(n1, n2\)") as info:
        choose_ensemble({"n1": {}, "n2": {}, "n3": {}}, 3, exclude={"n3"})
    assert "excluded as failed: n3" in info.value.message
    assert info.value.details == {"needed": 3, "available": ["n1", "n2"], "excluded": ["n3"]}
    with pytest.raises(RefusedError, match="only 0 are available"):
        choose_ensemble({}, 1)


def test_an_ensemble_size_below_one_is_a_programming_error():
    with pytest.raises(ValueError):
        choose_ensemble(NODES, 0)


def test_replace_member_keeps_the_other_positions_and_picks_an_agent_outside_the_ensemble():
    ensemble = ("n1", "n2", "n3")
    new = replace_member(ensemble, "n2", NODES, exclude={"n4"}, seed=1)
    assert (new[0], new[2]) == ("n1", "n3")
    assert new[1] in {"n5", "n6"}
    assert replace_member(ensemble, "n2", NODES, exclude={"n4"}, seed=1) == new


def test_replace_member_refuses_when_no_agent_is_left_and_rejects_non_members():
    with pytest.raises(RefusedError, match="no agent can replace 'n2'"):
        replace_member(("n1", "n2", "n3"), "n2", {"n1": {}, "n2": {}, "n3": {}})
    with pytest.raises(ValueError, match="not a member"):
        replace_member(("n1", "n2"), "n9", NODES)
