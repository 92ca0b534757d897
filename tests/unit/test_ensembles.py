"""Choosing an ensemble whose members answer (dlctl.log.ensembles), with the agents' answers
played by a function: corpses still registered are left out, members that answered are not
asked again, and too few live agents is the placement policy's refusal."""

from __future__ import annotations

import asyncio

import pytest

from dlctl.errors import RefusedError
from dlctl.log.ensembles import probed_ensemble
from dlctl.placement import PlacementPolicy


def nodes(count: int) -> dict[str, dict]:
    return {f"n{i}": {"region": f"r{i % 3}", "rack": "k", "address": f"n{i}:1"} for i in range(count)}


def answering(dead: set[str], asked: list[str]):
    async def answers(node: str) -> bool:
        asked.append(node)
        return node not in dead

    return answers


def test_registered_corpses_are_left_out_and_live_members_asked_once():
    asked: list[str] = []
    dead = {"n0", "n1", "n3"}
    ensemble = asyncio.run(probed_ensemble(nodes(6), PlacementPolicy(3, 3, 2, 1), answering(dead, asked), seed=7))
    assert len(ensemble) == 3 and not set(ensemble) & dead
    assert len(asked) == len(set(asked))  # nobody asked twice
    assert set(ensemble) <= set(asked)  # and every member was asked


def test_excluded_and_known_healthy_agents():
    asked: list[str] = []
    ensemble = asyncio.run(probed_ensemble(nodes(4), PlacementPolicy(3, 3, 2, 1), answering(set(), asked), exclude={"n0"}, known_healthy={"n1", "n2", "n3"}))
    assert set(ensemble) == {"n1", "n2", "n3"} and asked == []


def test_too_few_live_agents_is_the_policys_refusal():
    with pytest.raises(RefusedError):
        asyncio.run(probed_ensemble(nodes(4), PlacementPolicy(3, 3, 2, 1), answering({"n0", "n1"}, [])))
