"""Choosing an ensemble whose members answer now: the placement policy's choice, checked
against the agents themselves (the writer's new segments, the bootstrap copy's sink segments).

A crashed agent stays registered until its ZooKeeper session expires, so an ensemble chosen
from the registrations alone may hold a corpse; a segment would start degraded (or roll again
at once). Each round excludes at least one more agent, so it ends: with an ensemble, or with
the policy's ``RefusedError`` once too few answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping

from ..placement import PlacementPolicy, choose_ensemble


async def probed_ensemble(
    nodes: Mapping[str, dict],
    policy: PlacementPolicy,
    answers: Callable[[str], Awaitable[bool]],
    *,
    exclude: Collection[str] = (),
    known_healthy: Collection[str] = (),
    seed: int | None = None,
) -> tuple[str, ...]:
    """An ensemble under ``policy`` from ``nodes`` whose members ``answers`` (those in
    ``known_healthy`` are not asked again); ``exclude``: never these."""
    excluded, healthy = set(exclude), set(known_healthy)
    while True:
        ensemble = choose_ensemble(nodes, exclude=excluded, policy=policy, seed=seed)
        unknown = [n for n in ensemble if n not in healthy]
        checks = await asyncio.gather(*(answers(n) for n in unknown))
        dead = {n for n, ok in zip(unknown, checks) if not ok}
        if not dead:
            return ensemble
        excluded |= dead
        healthy |= set(unknown) - dead


__all__ = ["probed_ensemble"]
