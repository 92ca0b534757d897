"""How each request of an authenticated connection runs (``ServingConnection``, the connection
the protocol server builds; connection.py is the rest of a connection, handlers.py what each
request does).

Reads the store answers synchronously are answered inline; everything that waits (fences,
long polls, deletes, pulls, a proxy's acknowledgement) runs in a task of its own, so a slow
fsync or a long poll never holds up later requests, and answers go out as they complete.

Adds are the hot path: no task per add. The store queues an entry (or a whole ADD_BATCH, all or
nothing) at once and calls back when group commit made it durable, and the answer goes out with
the others of that commit; only an add whose segment must first be created takes a task.
APPENDs are handed to the write proxy in arrival order; only the wait for the acknowledgement
is a task.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from dlctl.log import protocol as p
from dlctl.log.compression import Compressor
from dlctl.log.errors import AgentError, AgentIOError, BadRequestError, ProxyDisabledError
from dlctl.log.format import HEADER_SIZE as ENTRY_HEADER_SIZE
from dlctl.log.format import NO_ENTRY, CorruptEntry, decode_header

from .connection import Connection
from .handlers import trim_entry

if TYPE_CHECKING:
    from .server import AgentServer

log = logging.getLogger("dlagent.server")  # the server's logger, as before the split: log filters name it

_ENTRY_FIELDS = struct.Struct(">4sBBHQQqqI")


def _check_entry(entry: bytes) -> None:
    """Ids and length of an entry to add, before the store sees it (the store verifies the CRC)."""
    _, _, _, _, log_id, seg, entry_id, lac, length = _ENTRY_FIELDS.unpack_from(entry, 0)
    # Inline fast path for the hottest request; decode_header gives the precise complaint.
    ok_ids = log_id > 0 and seg > 0 and 0 <= entry_id and NO_ENTRY <= lac < entry_id
    if not (ok_ids and length == len(entry) - ENTRY_HEADER_SIZE):
        try:
            header = decode_header(entry)
        except CorruptEntry as exc:
            raise BadRequestError(f"ADD_ENTRY: {exc.reason}") from None
        raise BadRequestError(f"ADD_ENTRY body is {len(entry)} bytes, entry header says {header.total_size}")


class ServingConnection(Connection):
    """A client connection that serves requests: dispatch, execution, the add hot path."""

    def __init__(self, server: AgentServer) -> None:
        super().__init__(server)
        self.handlers = server.handlers
        self._add_nowait = getattr(self.store, "add_nowait", None)
        self._compressor: Compressor | None = None  # made on the first compressed answer

    def dispatch(self, op: p.Op, flags: int, rid: int, args: tuple[Any, ...], started: float) -> None:
        handlers = self.handlers
        if op is p.Op.ADD_ENTRY:
            self._add_now(rid, args[0], flags, started)
        elif op is p.Op.ADD_BATCH:
            self._add_batch(rid, args[0], args[1], flags, started)
        elif op is p.Op.READ_ENTRY:
            if flags & p.FLAG_FENCE:
                self._spawn(self._run_async(op, rid, handlers.read_entry_fencing(*args, room=self.room), started), 0)
            elif flags & (p.FLAG_SKIP_SEEN | p.FLAG_SUMMARY):
                seen = args[3] if flags & p.FLAG_SKIP_SEEN else None
                self._run_sync(
                    op, rid, lambda log_id, seg, entry_id, *_: trim_entry(handlers.read_entry(log_id, seg, entry_id), seen, bool(flags & p.FLAG_SUMMARY)), args, started,
                    compress=bool(flags & p.FLAG_COMPRESS),
                )
            else:
                self._run_sync(op, rid, handlers.read_entry, args, started, compress=bool(flags & p.FLAG_COMPRESS))
        elif op is p.Op.READ_RANGE:
            self._run_sync(op, rid, handlers.read_range, args, started)
        elif op is p.Op.READ_LAC:
            self._run_sync(op, rid, handlers.read_lac, args, started)
        elif op is p.Op.LONG_POLL:
            self.long_polls += 1
            self._spawn(self._long_poll(rid, started, *args, compress=bool(flags & p.FLAG_COMPRESS)), 0, name="long-poll")
        elif op is p.Op.FENCE:
            self._spawn(self._run_async(op, rid, handlers.fence(*args), started), 0)
        elif op is p.Op.DIGEST:
            self._run_sync(op, rid, handlers.digest, args, started)
        elif op is p.Op.LIST_SEGMENTS:
            self._run_sync(op, rid, handlers.list_segments, args, started)
        elif op is p.Op.DELETE_SEGMENT:
            self._spawn(self._run_async(op, rid, handlers.delete_segment(*args), started), 0)
        elif op is p.Op.STAT:
            self._run_sync(op, rid, handlers.stat_all, args, started)
        elif op is p.Op.APPEND:
            self._append(rid, flags, args, started)
        elif op is p.Op.RELEASE:
            self._spawn(self._run_async(op, rid, handlers.release(*args), started), 0)
        elif op is p.Op.PULL_RANGE:
            # Counted at the two answers it may hold at once (dlagent.pull).
            held = 2 * min(args[4], p.MAX_RANGE_BYTES)
            self._spawn(self._run_async(op, rid, handlers.pull_range(*args, uncached=bool(flags & p.FLAG_UNCACHED)), started), held, name="pull-range")
        elif op is p.Op.PULL_SEGMENT:
            # Counted at about what it holds at once for itself: read-ahead plus a batch on its way
            # (each member it forwards to adds up to two batches of BATCH_BYTES; dlctl.spark.segment_pull).
            held = 2 * p.MAX_RANGE_BYTES
            self._spawn(self._run_async(op, rid, handlers.pull_segment(*args, uncached=bool(flags & p.FLAG_UNCACHED)), started), held, name="pull-segment")
        else:  # AUTH again
            self.send(p.error_response(op, rid, BadRequestError.status, "already authenticated"))
            self._observe(op, perf_counter() - started)

    # Execution ------------------------------------------------------------------------------------
    def _run_sync(self, op: int, rid: int, handler: Callable[..., bytes], args: tuple[Any, ...], started: float, compress: bool = False) -> None:
        try:
            result = handler(*args)
            self.send(self._ok_compressed(op, rid, result) if compress else p.ok_response_parts(op, rid, result))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a response
            self.send(self._error(op, rid, exc))
        self._observe(op, perf_counter() - started)

    def _ok_compressed(self, op: int, rid: int, result: p.Buffer) -> p.Outgoing:
        """The answer to a FLAG_COMPRESS request: the result zstd-compressed and flagged when
        that pays, else plain (``dlctl.log.compression``)."""
        if self._compressor is None:
            self._compressor = Compressor()
        packed = self._compressor.compress(result)
        if packed is None:
            return p.ok_response_parts(op, rid, result)
        counters = self.server.counters
        counters["compressed_answers"] += 1
        counters["compressed_saved_bytes"] += len(result) - len(packed)
        return p.ok_response_parts(op, rid, packed, p.FLAG_COMPRESSED)

    async def _long_poll(
        self, rid: int, started: float, log_id: int, seg: int, previous: int, timeout_ms: int, seen: p.Seen | None = None, *, compress: bool = False,
    ) -> None:
        handlers = self.handlers
        try:
            try:
                result = await handlers.long_poll(log_id, seg, previous, 0 if self.eof else timeout_ms, room=self.room)
            except asyncio.CancelledError:
                if not self.eof or self.closing:
                    raise
                result = await handlers.long_poll(log_id, seg, previous, 0, room=self.room)  # hurried by a half-close
            finally:
                self.long_polls -= 1  # answered (or given up): it counts as any request from here
            if seen is not None:
                lac, entry = p.decode_long_poll_result(result)
                if entry is not None:
                    result = p.encode_long_poll_result(lac, bytes(trim_entry(entry, seen)))
        except Exception as exc:  # noqa: BLE001
            self.send(self._error(p.Op.LONG_POLL, rid, exc))
        else:
            self.send(self._ok_compressed(p.Op.LONG_POLL, rid, result) if compress else p.ok_response_parts(p.Op.LONG_POLL, rid, result))
        self._observe(p.Op.LONG_POLL, perf_counter() - started)

    async def _run_async(self, op: int, rid: int, work: Awaitable[bytes], started: float) -> None:
        try:
            result = await work
        except Exception as exc:  # noqa: BLE001
            self.send(self._error(op, rid, exc))
        else:
            self.send(p.ok_response_parts(op, rid, result))
        self._observe(op, perf_counter() - started)

    def _error(self, op: int, rid: int, exc: Exception) -> bytes:
        if isinstance(exc, CorruptEntry):
            exc = BadRequestError(exc.reason)
        if isinstance(exc, AgentError):
            if isinstance(exc, BadRequestError):
                self.server.counters["bad_requests"] += 1
            elif isinstance(exc, AgentIOError) and self.store.failed:
                self.server.fail(exc)
            return p.response_for_error(op, rid, exc)
        self.server.counters["internal_errors"] += 1
        log.error("internal error in %s request %d from %s", p.Op(op).name, rid, self.peer, exc_info=exc)
        return p.error_response(op, rid, p.STATUS_INTERNAL, f"internal error in the agent: {type(exc).__name__}")

    # The hot path: adds, and appends through the write proxy ------------------------------------
    def _add_now(self, rid: int, entry: bytes, flags: int, started: float) -> None:
        """The hot path: no task per add. The store queues the entry at once and calls back when
        it is durable, and the response goes out with the others of that batch; only an add
        that must wait for its segment to be created takes the task path."""
        add_nowait = self._add_nowait
        if add_nowait is None:
            self._spawn(self._add(rid, entry, flags, started), len(entry))
            return
        size = len(entry)
        self.in_flight += 1
        self.in_flight_bytes += size
        try:
            _check_entry(entry)
            queued = add_nowait(
                entry, lambda exc: self._add_done(rid, size, exc, started), recovery=bool(flags & p.FLAG_RECOVERY), uncached=bool(flags & p.FLAG_UNCACHED)
            )
        except Exception as exc:  # noqa: BLE001 - every failure becomes a response
            self._add_done(rid, size, exc, started)
            return
        if not queued:
            self.in_flight -= 1
            self.in_flight_bytes -= size
            self._spawn(self._add(rid, entry, flags, started), size)

    def _add_done(
        self, rid: int, size: int, exc: BaseException | None, started: float, op: int = p.Op.ADD_ENTRY, answer: bytes | None = None
    ) -> None:
        self.in_flight -= 1
        self.in_flight_bytes -= size
        self._check_drained()
        if exc is None:
            self.send(p.add_ok_response(rid) if answer is None else answer)
        else:
            self.send(self._error(op, rid, exc))  # type: ignore[arg-type]
        self._observe(op, perf_counter() - started)
        if not self.closing and (self.read_paused or self.decoder.buffered):
            # Not from inside the store's callback: parsing more requests re-enters the store.
            self.loop.call_soon(self._resume)  # type: ignore[union-attr]
        if self.eof:
            self._finish_if_done()

    def _resume(self) -> None:
        if not self.closing:
            self._process()

    async def _add(self, rid: int, entry: bytes, flags: int, started: float) -> None:
        try:
            _check_entry(entry)
            await self.store.add(entry, recovery=bool(flags & p.FLAG_RECOVERY), uncached=bool(flags & p.FLAG_UNCACHED))
        except Exception as exc:  # noqa: BLE001
            self.send(self._error(p.Op.ADD_ENTRY, rid, exc))
        else:
            self.send(p.add_ok_response(rid))
        self._observe(p.Op.ADD_ENTRY, perf_counter() - started)

    def _add_batch(self, rid: int, body: bytes, spans: list[tuple[int, int]], flags: int, started: float) -> None:
        """ADD_BATCH: the entries (views of ``body``, not copies) are checked and queued all or
        none, as ``_add_now`` does one entry, and answered once all are durable. The batch is one
        request of ``len(body)`` bytes in the in-flight limits until then."""
        size, count = len(body), len(spans)
        self.in_flight += 1
        self.in_flight_bytes += size
        recovery, uncached = bool(flags & p.FLAG_RECOVERY), bool(flags & p.FLAG_UNCACHED)
        answer = p.ok_response(p.Op.ADD_BATCH, rid, p.encode_added(count))
        try:
            view = memoryview(body)
            entries = [view[a:b] for a, b in spans]
            for k, entry in enumerate(entries):
                try:
                    _check_entry(entry)  # the ids, as for ADD_ENTRY (the store checks the rest)
                except BadRequestError as exc:
                    why = exc.message.removeprefix("ADD_ENTRY: ")
                    raise BadRequestError(f"batch entry {k + 1} of {count}: {why}; nothing of the batch stored") from None
            queued = self.store.add_batch_nowait(
                entries, lambda exc: self._add_done(rid, size, exc, started, p.Op.ADD_BATCH, answer), recovery=recovery, uncached=uncached
            )
        except Exception as exc:  # noqa: BLE001 - every failure becomes a response
            self._add_done(rid, size, exc, started, p.Op.ADD_BATCH)
            return
        if not queued:  # a new segment: created first, on the task path
            self.in_flight -= 1
            self.in_flight_bytes -= size
            self._spawn(self._run_async(p.Op.ADD_BATCH, rid, self._store_batch(entries, recovery, uncached), started), size)

    async def _store_batch(self, entries: list[memoryview], recovery: bool, uncached: bool) -> bytes:
        return p.encode_added(await self.store.add_batch(entries, recovery=recovery, uncached=uncached))

    def _append(self, rid: int, flags: int, args: tuple[Any, ...], started: float) -> None:
        proxy = self.server.proxy
        if proxy is None:
            self.send(p.error_response(p.Op.APPEND, rid, ProxyDisabledError.status, "this agent is not a write proxy ([proxy] enabled = false)"))
            self._observe(p.Op.APPEND, perf_counter() - started)
            return
        name, producer, count, records, epoch, seq = args
        # Handed to the proxy now, in arrival order; only the wait for the acknowledgement is a task.
        result = proxy.append(
            name, producer, count, records, barrier=self.barrier, hold=self.hold, reset=bool(flags & p.FLAG_RESET_ORDER), epoch=epoch, seq=seq,
            retry=bool(flags & p.FLAG_RETRY), forward=bool(flags & p.FLAG_FORWARD),
        )
        self._spawn(self._answer_append(rid, result, started), len(records))

    async def _answer_append(self, rid: int, result: asyncio.Future[Any], started: float) -> None:
        try:
            positions = await result
        except Exception as exc:  # noqa: BLE001
            self.send(self._error(p.Op.APPEND, rid, exc))
        else:
            self.send(p.ok_response(p.Op.APPEND, rid, p.encode_dlsns(positions)))
        self._observe(p.Op.APPEND, perf_counter() - started)
