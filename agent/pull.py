"""PULL_RANGE (dlctl.log.protocol): this agent copies a range of a segment from a peer agent.

A repair or re-replication that reads entries from a source and writes them to a target through
a third process moves every byte over two connections (with TLS, two encryptions and two
decryptions) and through three processes. Pulled, the target reads from the source itself: one
connection, two processes. The copier (the auditor, ``dlctl recover``) still decides what goes
where and verifies the result with DIGEST; this module only moves bytes.

Safety: the source is a node id resolved in the cluster's availability records by the agent
pool, never an address taken from the request, so an authenticated client cannot point the
agent at arbitrary hosts. Every entry read is checked as any client checks it (CRC-32C, ids)
and stored as a recovery add, exactly as ADD_BATCH stores it: idempotent for identical bytes,
refused whole when one entry is wrong. Memory is bounded by two READ_RANGE answers per request
(one being stored, the next being read), and a few spare buffers while pulls run.

Bytes are copied as little as the transport allows: an answer is decrypted straight into a
buffer of this module's (``AgentClient.read_range(into=...)``, ``dlctl.log.frame_reader``),
reused once its entries are durable, and the store writes read-only views of it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from dlctl.log import protocol as p
from dlctl.log.errors import AgentError, BadRequestError
from dlctl.log.format import stored_crc

log = logging.getLogger(__name__)


class RangePuller:
    """Serves PULL_RANGE for one agent: ``pool`` reaches its peers, ``store`` keeps the copy."""

    # Answers are received into buffers kept for the next reads while pulls run (a fresh
    # buffer of megabytes costs page faults and zeroing, as much as decrypting it); at most
    # this many are kept, and none once no pull is running.
    SPARE_BUFFERS = 8

    def __init__(self, pool: Any, store: Any, node_id: str) -> None:
        self.pool = pool
        self.store = store
        self.node_id = node_id
        self.counters = {"pulls": 0, "pulled_entries": 0, "pulled_bytes": 0, "pulls_cut_short": 0}
        self._running = 0
        self._spare: list[bytearray] = []

    def _buffer(self, size: int) -> bytearray:
        while self._spare:
            buf = self._spare.pop()
            if len(buf) == size:
                return buf
        return bytearray(size)

    def _reuse(self, buf: bytearray) -> None:
        """``buf`` is free again: its answer is durable (the store holds no view of it once the
        entries are durable) and the connection is done with it (its read returned)."""
        if self._running and len(self._spare) < self.SPARE_BUFFERS:
            self._spare.append(buf)

    async def pull(self, log_id: int, seq: int, first: int, last: int, max_bytes: int, source: str, uncached: bool) -> bytes:
        """Copy entries ``first``.. of segment ``seq`` from ``source``; the encoded PULL_RANGE
        result. Stops at ``last``, after about ``max_bytes`` (always at least one answer), or at
        the first failure of the source, which the result's reason names. A failure to store
        raises (the error response): nothing beyond earlier answers is acknowledged."""
        if source == self.node_id:
            raise BadRequestError(f"PULL_RANGE from {source}: that is this agent (nothing to copy)")
        self.counters["pulls"] += 1
        read_cap = max(1, min(max_bytes, p.MAX_RANGE_BYTES))
        buffer_size = p.OK_RESULT_OFFSET + read_cap  # an answer's body, unless its first entry alone is larger
        crcs: list[int] = []
        nbytes = 0
        reason = ""

        async def read(pos: int) -> tuple[bytes, list[tuple[int, int]], bytearray]:
            client = await self.pool.client(source)
            buf = self._buffer(buffer_size)
            data, spans = await client.read_range(log_id, seq, pos, last, read_cap, into=buf)
            return data, spans, buf

        self._running += 1
        pos = first
        pending: asyncio.Future[Any] | None = asyncio.ensure_future(read(pos))
        try:
            while pending is not None:
                try:
                    data, spans, buf = await pending
                except AgentError as exc:
                    reason = f"source {source}: {type(exc).__name__}: {exc.message} (at entry {pos})"
                    break
                pending = None
                size = spans[-1][1] - spans[0][0]
                following = pos + len(spans)
                # Read the next answer while this one is written and synced.
                if following <= last and nbytes + size < max_bytes:
                    pending = asyncio.ensure_future(read(following))
                view = memoryview(data).toreadonly()  # the store keeps read-only views as they are (no copy)
                await self.store.add_batch([view[a:b] for a, b in spans], recovery=True, uncached=uncached)
                crcs.extend(stored_crc(view, a) for a, _ in spans)
                del view, data
                self._reuse(buf)
                nbytes += size
                pos = following
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            self._running -= 1
            if not self._running:
                self._spare.clear()
        self.counters["pulled_entries"] += len(crcs)
        self.counters["pulled_bytes"] += nbytes
        if reason:
            self.counters["pulls_cut_short"] += 1
            log.info("PULL_RANGE of %d/%d/%d..%d stopped after %d entries: %s", log_id, seq, first, last, len(crcs), reason)
        return p.encode_pulled(len(crcs), nbytes, reason, crcs)
