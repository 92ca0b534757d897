"""PULL_SEGMENT (dlctl.log.protocol): this sink agent copies a bootstrap segment from a source cluster.

The copy itself is the library's (``dlctl.spark.segment_pull``); this module decides whether the
agent may do it and turns its outcomes into answers. The agent reads only a cluster declared as a
source on it, through the replication workers' link to that cluster (its credentials, its
ZooKeeper, its routed addresses): a request names a cluster, never an address. A cluster it does
not read is refused with PULL_REFUSED before anything is stored, and the copier relays instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dlctl.errors import ConfigError
from dlctl.log import protocol as p
from dlctl.log.errors import AgentError, BadRequestError, PullRefusedError
from dlctl.log.records import CorruptRecords
from dlctl.spark.recode import NeedsClock
from dlctl.spark.segment_pull import PullRequest, pull_segment
from dlctl.spark.segment_read import CopyFailed

log = logging.getLogger(__name__)

SourceLinks = Callable[[str], Awaitable[Any]]  # cluster -> an open link (its .pool reaches the agents)


class SegmentPuller:
    """Serves PULL_SEGMENT: ``links`` opens the link to a declared source (None: this agent
    runs no replication workers and reads no other cluster), ``store`` keeps the copy."""

    def __init__(self, store: Any, node_id: str, links: SourceLinks | None, peers: Any = None) -> None:
        self.store = store
        self.node_id = node_id
        self.links = links
        self.peers = peers  # an AgentPool of this agent's own cluster: the other members get their entries through it
        self.counters = {
            "segment_pulls": 0, "segment_pulls_running": 0, "segment_pulls_refused": 0, "segment_pulls_failed": 0,
            "segment_pulls_abandoned": 0,  # the requester's connection closed: the pull stopped
            "segment_pulled_bytes": 0, "segment_forwarded_bytes": 0,
        }

    async def pull(self, body: bytes, uncached: bool) -> bytes:
        try:
            request = PullRequest.from_json(body)
        except ValueError as exc:
            raise BadRequestError(f"{exc}; nothing stored") from None
        link = await self._link(request.source_cluster)
        self.counters["segment_pulls"] += 1
        self.counters["segment_pulls_running"] += 1
        where = f"PULL_SEGMENT of segment {request.source.seq} of log {request.log!r} from cluster {request.source_cluster!r}"
        try:
            result = await pull_segment(
                request, link.pool, self.node_id, lambda batch: self._store(batch, uncached),
                self._forward if self.peers is not None else None,
            )
        except asyncio.CancelledError:
            self.counters["segment_pulls_abandoned"] += 1
            log.info("%s abandoned: the requester's connection closed", where)
            raise
        except NeedsClock as exc:
            return json.dumps({"needs_clock": True, "error": str(exc)}).encode()
        except CopyFailed as exc:
            self.counters["segment_pulls_failed"] += 1
            raise AgentError(f"{where}: {exc.message}") from None
        except CorruptRecords as exc:
            self.counters["segment_pulls_failed"] += 1
            raise AgentError(f"{where}: the source's records do not parse: {exc}") from None
        except ValueError as exc:
            raise BadRequestError(f"{where}: {exc}") from None
        except AgentError:
            self.counters["segment_pulls_failed"] += 1
            raise
        finally:
            self.counters["segment_pulls_running"] -= 1
        self.counters["segment_pulled_bytes"] += int(result["source_bytes"])
        return json.dumps(result, separators=(",", ":")).encode()

    async def _forward(self, node: str, batch: Sequence[bytearray]) -> None:
        """Hand ``node`` (a member of the sink ensemble) its entries, durably: ADD_BATCH, or
        ADD_ENTRY for one entry too large for a batch. A failure names the member."""
        try:
            client = await self.peers.client(node)
            if len(batch) == 1 and len(batch[0]) > p.MAX_BATCH_BYTES:
                await client.add(batch[0], uncached=True)
            else:
                await client.add_batch(list(batch), uncached=True)
        except AgentError as exc:
            raise AgentError(f"sink agent {node} did not store what this agent forwarded: {exc.message}") from None
        self.counters["segment_forwarded_bytes"] += sum(len(b) for b in batch)

    def _store(self, batch: Sequence[bytearray], uncached: bool) -> Awaitable[int]:
        """Keep this agent's share of a pull: the re-encoded entries as they are (read-only views:
        the copy never changes an entry it handed over, so the store need not copy it), their
        CRCs not recomputed (``sealed_here``: the recoder just computed them from these bytes)."""
        return self.store.add_batch([memoryview(e).toreadonly() for e in batch], uncached=uncached, sealed_here=True)

    async def _link(self, cluster: str) -> Any:
        if self.links is None:
            self.counters["segment_pulls_refused"] += 1
            raise PullRefusedError(f"agent {self.node_id} runs no replication workers ([replication] enabled = false): it reads no other cluster")
        try:
            return await self.links(cluster)
        except ConfigError as exc:
            self.counters["segment_pulls_refused"] += 1
            raise PullRefusedError(exc.message) from None
        except Exception as exc:  # noqa: BLE001 - whatever stops the link from opening, nothing is stored yet: relay
            self.counters["segment_pulls_refused"] += 1
            raise PullRefusedError(f"agent {self.node_id} cannot reach source cluster {cluster!r}: {type(exc).__name__}: {exc}") from None
