"""Quorum arithmetic of a segment, pure and in one place (DESIGN.md §4; issue 26 item 5).

An ensemble of E agents stores each entry on a **write set** of W of them, striped round-robin:
entry ``i`` goes to the W consecutive members from ``i mod E``. An entry is acknowledged once A
of its write set have it. From these follow the numbers every part of the log relies on:

- **fencing**: W − A + 1 fenced members of every write set leave too few to form an ack quorum;
- **a LAC read**: the highest LAC among any E − A + 1 members' answers is at least every
  acknowledged entry's (any A members that acknowledged meet them);
- **acks still possible** while answers are outstanding.

Nothing here imports anything of dlctl: the metadata records, the writer, recovery, repair,
re-replication and the bootstrap copy all take their striping from here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def write_set_of(ensemble: Sequence[str], write_quorum: int, entry_id: int) -> tuple[str, ...]:
    """The W members storing ``entry_id``: round-robin striping from ``entry_id mod E``."""
    e = len(ensemble)
    return tuple(ensemble[(entry_id + i) % e] for i in range(write_quorum))


def write_sets(ensemble: Sequence[str], write_quorum: int) -> list[tuple[str, ...]]:
    """Every distinct write set of an ensemble: one per starting position (E of them; for E = W
    they are all the same members)."""
    return [write_set_of(ensemble, write_quorum, start) for start in range(len(ensemble))]


def stores(ensemble: Sequence[str], write_quorum: int, node: str, entry_id: int) -> bool:
    """Whether ``node`` is in ``entry_id``'s write set."""
    return node in write_set_of(ensemble, write_quorum, entry_id)


def fence_quorum(write_quorum: int, ack_quorum: int) -> int:
    """Replicas of a write set that must be fenced (or say "absent") so that the remaining ones
    can no longer form an ack quorum: W − A + 1."""
    return write_quorum - ack_quorum + 1


def lac_quorum(ensemble_size: int, ack_quorum: int) -> int:
    """Members whose LAC answers, the highest taken, cover every acknowledged entry: E − A + 1."""
    return ensemble_size - ack_quorum + 1


def fence_covered(ensemble: Sequence[str], write_quorum: int, ack_quorum: int, fenced: Collection[str]) -> bool:
    """True when every write set has at least W − A + 1 fenced members."""
    need = fence_quorum(write_quorum, ack_quorum)
    return all(sum(member in fenced for member in ws) >= need for ws in write_sets(ensemble, write_quorum))


def fence_possible(ensemble: Sequence[str], write_quorum: int, ack_quorum: int, unreachable: Collection[str]) -> bool:
    """False once some write set has too few reachable members to ever be covered."""
    need = fence_quorum(write_quorum, ack_quorum)
    return all(sum(member not in unreachable for member in ws) >= need for ws in write_sets(ensemble, write_quorum))


def can_still_ack(acks: int, outstanding: int, ack_quorum: int) -> bool:
    """Whether an entry with ``acks`` confirmations and ``outstanding`` unanswered adds may still
    reach its ack quorum."""
    return acks + outstanding >= ack_quorum


__all__ = ["can_still_ack", "fence_covered", "fence_possible", "fence_quorum", "lac_quorum", "stores", "write_set_of", "write_sets"]
