"""What each request does, once its connection has decoded it (dispatch.py decides how it runs).

Each handler validates the ids it was given before the store sees them, and returns the
answer's body; a typed ``AgentError`` it raises becomes the error response. Reads that wait
(fencing reads, long polls) take ``room``: the connection's wait until its queued answers leave
room for one more, so the entry is read only when its answer can be queued.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from dlctl.log import protocol as p
from dlctl.log.errors import AgentUnavailableError, BadRequestError, NoSuchEntryError, ProxyDisabledError
from dlctl.log.format import NO_ENTRY, validate_ids
from dlctl.replication.seen import stub_seen, summary_only

if TYPE_CHECKING:
    from .server import AgentServer

_I64_MAX = 2**63 - 1

Room = Callable[[], Awaitable[None]]


def trim_entry(entry: bytes, seen: p.Seen | None, summary: bool = False) -> bytes | memoryview:
    """``entry`` with the records the reading stream's sink holds as stubs (FLAG_SKIP_SEEN), or
    every data record (FLAG_SUMMARY; ``dlctl.replication.seen``); whole when its records cannot
    be parsed (the reader's own checks then name what is wrong)."""
    try:
        return summary_only(entry) if summary else stub_seen(entry, *seen) if seen is not None else entry
    except ValueError:
        return entry


def check_ids(log_id: int, seg: int, entry_id: int | None = None) -> None:
    try:
        validate_ids(log_id, seg, entry_id)
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None


class RequestHandlers:
    """The handlers of ``server``'s requests: its store, and the write proxy and range puller
    the daemon gives it once ZooKeeper is up."""

    def __init__(self, server: AgentServer) -> None:
        self.server = server
        self.store = server.store

    def read_entry(self, log_id: int, seg: int, entry_id: int) -> bytes:
        check_ids(log_id, seg, entry_id)
        return self.store.read(log_id, seg, entry_id)

    def read_range(self, log_id: int, seg: int, first: int, last: int, max_bytes: int) -> bytes:
        check_ids(log_id, seg, first)
        return self.store.read_range(log_id, seg, first, last, min(max_bytes, p.MAX_RANGE_BYTES))

    async def read_entry_fencing(self, log_id: int, seg: int, entry_id: int, room: Room | None = None) -> bytes:
        check_ids(log_id, seg, entry_id)
        await self.store.fence(log_id, seg)  # durable before the read is answered
        if room is not None:
            await room()  # read the entry only when its answer can be queued
        return self.store.read(log_id, seg, entry_id)

    def read_lac(self, log_id: int, seg: int) -> bytes:
        check_ids(log_id, seg)
        return p.encode_lac(self.store.lac(log_id, seg))

    async def long_poll(self, log_id: int, seg: int, previous: int, timeout_ms: int, room: Room | None = None) -> bytes:
        check_ids(log_id, seg)
        if not NO_ENTRY <= previous < _I64_MAX:
            raise BadRequestError(f"previous LAC {previous} out of range (-1..2^63-2)")
        timeout = min(timeout_ms / 1000.0, self.server.limits.max_long_poll)
        lac = await self.store.wait_lac(log_id, seg, previous, timeout)
        entry = None
        if lac > previous:
            if room is not None:
                await room()  # read the entry only when its answer can be queued
            try:
                entry = self.store.read(log_id, seg, previous + 1)
            except NoSuchEntryError:
                pass  # striped ensembles: this replica need not hold every entry
        return p.encode_long_poll_result(lac, entry)

    async def fence(self, log_id: int, seg: int) -> bytes:
        check_ids(log_id, seg)
        result = await self.store.fence(log_id, seg)
        return p.encode_fence_result(result.last_entry_id, result.lac)

    def digest(self, log_id: int, seg: int, first: int, last: int | None) -> bytes:
        check_ids(log_id, seg, first)
        if last is not None and last < first:
            raise BadRequestError(f"digest range {first}..{last} is empty")
        return p.encode_digest(self.store.digest(log_id, seg, first, last))

    def list_segments(self) -> bytes:
        return p.encode_segments(self.store.list_segments())

    async def delete_segment(self, log_id: int, seg: int) -> bytes:
        check_ids(log_id, seg)
        return p.encode_deleted(await self.store.delete(log_id, seg))

    def stat_all(self) -> bytes:
        server = self.server
        extra: dict[str, Any] = {"proxy": server.proxy.stat()} if server.proxy is not None else {}
        if server.puller is not None:
            extra["pull"] = dict(server.puller.counters)
        if server.segment_puller is not None:
            extra["pull"] = {**extra.get("pull", {}), **server.segment_puller.counters}
        if server.metrics_address is not None:
            extra["metrics"] = server.metrics_address
        return p.encode_stat({**self.store.stat(), "server": server.stat(), **extra})

    async def pull_range(self, log_id: int, seg: int, first: int, last: int, max_bytes: int, source: str, uncached: bool) -> bytes:
        check_ids(log_id, seg, first)
        puller = self.server.puller
        if puller is None:
            raise AgentUnavailableError("this agent cannot pull yet (it is not connected to its cluster's metadata)")
        return await puller.pull(log_id, seg, first, last, max_bytes, source, uncached)

    async def pull_segment(self, body: bytes, uncached: bool) -> bytes:
        puller = self.server.segment_puller
        if puller is None:
            raise AgentUnavailableError("this agent cannot pull yet (it is not connected to its cluster's metadata)")
        return await puller.pull(body, uncached)

    async def release(self, name: str) -> bytes:
        proxy = self.server.proxy
        if proxy is None:
            raise ProxyDisabledError("this agent is not a write proxy")
        return b"\x01" if await proxy.release(name) else b"\x00"
