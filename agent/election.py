"""A cluster-wide role that one agent at a time holds (the re-replication auditor, the
housekeeper): contend in a thread through a kazoo ``Election`` under the role's znode.

Subclasses set ``role`` (for logs) and ``metrics_role`` (the ``dlagent_role`` label), implement
``_election_path()`` and ``_lead()`` (called while this agent holds the role; returning gives it
up), and provide ``client``, ``auth``, ``node_id``, ``metrics`` (an AgentMetrics or None) and
the ``_stop``/``_leader_exit`` events, the ``_guard`` lock and the ``_election`` slot.
"""

from __future__ import annotations

import logging
from typing import Any

from dlctl.meta.zk import acl_for

log = logging.getLogger(__name__)


class ElectedRole:
    role = "role"
    metrics_role = ""
    metrics: Any = None  # AgentMetrics (dlagent.metrics), set by the subclass when the agent has one

    def _hold(self) -> None:
        """``_lead``, shown as ``dlagent_role{role=...} 1`` for as long as it holds the role."""
        metrics = self.metrics
        if metrics is not None:
            metrics.role(self.metrics_role, True)
        try:
            self._lead()
        finally:
            if metrics is not None:
                metrics.role(self.metrics_role, False)

    def _election_path(self) -> str:
        raise NotImplementedError

    def _lead(self) -> None:
        raise NotImplementedError

    def _election_loop(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():  # type: ignore[attr-defined]
            try:
                # The election parent carries the cluster ACL (kazoo's recipe would create it
                # open): only cluster principals can delete contenders.
                self.client.ensure_path(self._election_path(), acl=acl_for(self.auth))  # type: ignore[attr-defined]
                self._leader_exit.clear()  # type: ignore[attr-defined]
                # A fresh Election per round: one whose session was lost still thinks it holds.
                with self._guard:  # type: ignore[attr-defined]
                    if self._stop.is_set():  # type: ignore[attr-defined]
                        return
                    self._election = self.client.Election(self._election_path(), self.node_id)  # type: ignore[attr-defined]
                    election = self._election
                election.run(self._hold)
                backoff = 0.5
            except Exception as exc:  # noqa: BLE001 - e.g. connection loss: contend again
                if self._stop.is_set():  # type: ignore[attr-defined]
                    return
                log.warning("%s election: %s: %s; contending again in %.1fs", self.role, type(exc).__name__, exc, backoff)
                self._stop.wait(backoff)  # type: ignore[attr-defined]
                backoff = min(backoff * 2, 10.0)
