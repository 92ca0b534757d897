"""``dlctl top``: the cluster's agents, streams and logs as their metrics show them, refreshed.

Each round scrapes every live agent's metrics endpoint (the address it published in its
availability record) in parallel; a round's view compares it with the previous round.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import DlctlError
from ..metrics import rates
from ..metrics.scrape import Snapshot, addresses, fetch
from ..session import ClusterSession


class Top:
    def __init__(self, session: ClusterSession, timeout: float = 2.0) -> None:
        self.session = session
        self.timeout = timeout
        self.previous: dict[str, Snapshot] = {}

    def scrape(self) -> tuple[dict[str, Snapshot], dict[str, str]]:
        """(snapshot per node, error per node) for every live agent."""
        available = self.session.meta.available_nodes()
        targets = addresses(available)
        errors = {node: "metrics off ([metrics] listen = \"off\")" for node in available if node not in targets}
        snapshots: dict[str, Snapshot] = {}

        def one(item: tuple[str, str]) -> tuple[str, Snapshot | str]:
            node, address = item
            try:
                return node, fetch(address, self.timeout)
            except DlctlError as exc:
                return node, str(exc)

        if targets:
            with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
                for node, result in pool.map(one, sorted(targets.items())):
                    if isinstance(result, Snapshot):
                        snapshots[node] = result
                    else:
                        errors[node] = result
        return snapshots, errors

    def round(self) -> dict[str, Any]:
        """Scrape once and compare with the previous round (the first round has totals only)."""
        snapshots, errors = self.scrape()
        befores = {node: self.previous.get(node) for node in snapshots}
        view = {
            "cluster": self.session.cluster.name,
            "agents": [rates.agent_row(node, befores[node], snap) for node, snap in sorted(snapshots.items())],
            "streams": rates.stream_rows(befores, snapshots),
            "logs": rates.log_rows(snapshots),
            "errors": [{"node": node, "error": error} for node, error in sorted(errors.items())],
        }
        self.previous = snapshots
        return view
