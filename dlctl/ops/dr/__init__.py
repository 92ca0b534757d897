"""Disaster recovery between clusters (issue 11; DESIGN.md §7): one plan per runbook.

- ``failover_plan`` (``failover``): unplanned, the primary A is gone — fence A -> B for good,
  settle what is at risk, promote B.
- ``switchover_plan`` (``switchover``): planned, RPO 0 — freeze A, drain, promote B, reverse the
  stream, verify 0 lost.
- ``failback_plan`` (``failback``): A returns after a failover — freeze it, reconcile or discard
  what diverged, then B -> A (incremental, or A's log rebuilt from B).
- ``recover_plan`` (``recover``): a location that lost data gets its clock raised, its peers'
  progress reset to what it still has, and its records back from its peers.
- ``promote_plan`` (``fencing``): make a cluster's logs writable again (typed confirmation in
  the CLI); ``dr_status`` (``status``).

Every runbook reads immutable facts (``facts``, ``recover_facts``), decides with pure functions
over them (``decide``, ``recover_decide``, ``truncated``; ``tests/unit/test_dr_*decisions.py``)
and emits plan steps whose actions do the I/O (the runbook modules, ``recover_steps``). Access
modes are ``dlctl.meta.access``; clock bases ``dlctl.replication.clock``.
"""

from __future__ import annotations

from .decide import refuse_undecided
from .failback import failback_plan, failed_over_from
from .failover import at_risk_of, failover_plan
from .fencing import depose_owner, freeze_logs, promote_logs, promote_plan
from .recover import recover_gaps, recover_plan
from .status import dr_status
from .switchover import one_way_source, switchover_plan, verify_copy

__all__ = [
    "at_risk_of", "depose_owner", "dr_status", "failback_plan", "failed_over_from", "failover_plan", "freeze_logs", "one_way_source", "promote_logs",
    "promote_plan", "recover_gaps", "recover_plan", "refuse_undecided", "switchover_plan", "verify_copy",
]
