"""Minimal ensemble placement: distinct available agents, deterministic under a seed.

This is the interface the writer and re-replication call; the region-aware policy of
DESIGN.md §6 (spread over regions and racks, the ``min_regions_for_durability`` invariant,
drained regions) replaces the body of these functions in its own issue, not their signatures.
Pure functions: the caller passes the availability records (``AgentPool.nodes``).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence

from .errors import RefusedError


def _candidates(nodes: Mapping[str, dict], exclude: Collection[str]) -> list[str]:
    # Sorted so that a seed gives the same choice whatever order the records came in.
    return sorted(n for n in nodes if n not in exclude)


def choose_ensemble(
    nodes: Mapping[str, dict], size: int, *, exclude: Collection[str] = (), seed: int | None = None
) -> tuple[str, ...]:
    """``size`` distinct agents from ``nodes`` (node id -> availability record), none in ``exclude``.

    The choice is random (so load spreads over the cluster) and reproducible with ``seed``.
    Raises ``RefusedError`` naming how many agents are needed and which are available.
    """
    if size < 1:
        raise ValueError(f"ensemble size must be >= 1, not {size}")
    pool = _candidates(nodes, exclude)
    if len(pool) < size:
        excluded = sorted(set(exclude) & set(nodes))
        raise RefusedError(
            f"an ensemble of {size} agents is needed but only {len(pool)} are available"
            + (f" ({', '.join(pool)})" if pool else "")
            + (f"; excluded as failed: {', '.join(excluded)}" if excluded else ""),
            hint="start or repair agents, or lower the log's ensemble size",
            details={"needed": size, "available": pool, "excluded": excluded},
        )
    return tuple(random.Random(seed).sample(pool, size))


def replace_member(
    ensemble: Sequence[str],
    failed: str,
    nodes: Mapping[str, dict],
    *,
    exclude: Collection[str] = (),
    seed: int | None = None,
) -> tuple[str, ...]:
    """``ensemble`` with ``failed`` swapped for an available agent outside the ensemble and ``exclude``.

    Positions are kept (write sets of the other members do not move). Raises ``RefusedError``
    when no agent is left to take the place.
    """
    if failed not in ensemble:
        raise ValueError(f"agent {failed!r} is not a member of ensemble {list(ensemble)}")
    spare = _candidates(nodes, set(exclude) | set(ensemble))
    if not spare:
        raise RefusedError(
            f"no agent can replace {failed!r}: every available agent is already in ensemble "
            f"{', '.join(ensemble)} or excluded",
            hint="start or repair an agent, then retry",
            details={"ensemble": list(ensemble), "failed": failed},
        )
    replacement = random.Random(seed).choice(spare)
    return tuple(replacement if member == failed else member for member in ensemble)
