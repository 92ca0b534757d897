"""The agent server's add hot path (store callbacks, no task per add), draining on stop, and
long polls on a half-closed connection. In-process server over real TCP, fdatasync injected.
Servers run mutual TLS with the harness CA, except where plain TCP is the subject (a half-close)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest
from dlagent.server import AgentServer
from dlagent.storage import SegmentStore, SyncPolicy

from dlctl.log import protocol as p
from dlctl.log.auth import ClientHandshake, generate_secret
from dlctl.log.client import AgentClient
from dlctl.log.errors import AgentIOError, AgentUnavailableError, FencedError
from dlctl.log.format import Entry, encode
from harness.tls import agent_tls, client_tls

pytestmark = pytest.mark.agent


def entry(seq: int, entry_id: int) -> bytes:
    return encode(Entry(7, seq, entry_id, entry_id - 1, os.urandom(100)))


class GatedSync:
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, fd: int) -> None:
        self.entered.set()
        self.gate.wait(10)
        os.fdatasync(fd)


def server_tls(tmp_path):
    """An agent certificate of the harness CA for 127.0.0.1, beside (not in) the data dir."""
    return agent_tls(tmp_path.with_name(tmp_path.name + "-tls"), "127.0.0.1")


async def serve(tmp_path, sync, *, tls: bool = True):
    secret = generate_secret()
    # A held fdatasync must be the sync thread's: inline, it would block this loop (the client's too).
    store = SegmentStore(tmp_path, SyncPolicy(inline_bytes=0), fdatasync=sync)
    await store.open()
    server = AgentServer(store, secret, "127.0.0.1", 0, tls=server_tls(tmp_path) if tls else None)
    await server.start()
    return store, server, secret


def test_adds_are_answered_only_once_durable(tmp_path):
    sync = GatedSync()

    async def body():
        store, server, secret = await serve(tmp_path, sync)
        async with AgentClient("127.0.0.1", server.address[1], secret, tls=client_tls()) as c:
            await c.add(entry(1, 0))  # a new segment: the task path
            sync.gate.clear()
            sync.entered.clear()
            encoded = [entry(1, i) for i in range(20)]
            adds = [asyncio.ensure_future(c.add(encoded[i])) for i in range(1, 20)]
            assert await asyncio.to_thread(sync.entered.wait, 10)
            await asyncio.sleep(0.05)
            assert not any(a.done() for a in adds)
            sync.gate.set()
            await asyncio.gather(*adds)
            assert [s.entries for s in await c.list_segments()] == [20]
            await c.add(encoded[5])  # idempotent re-add of a durable entry
        await server.stop()
        await store.close()

    asyncio.run(body())


def test_a_batch_is_answered_only_once_durable_and_counts_as_one_request_in_flight(tmp_path):
    sync = GatedSync()

    async def body():
        store, server, secret = await serve(tmp_path, sync)
        async with AgentClient("127.0.0.1", server.address[1], secret, tls=client_tls()) as c:
            await c.stat()
            (conn,) = server._conns
            for what, batch in (("a new segment: the task path", [entry(1, i) for i in range(5)]), ("the hot path", [entry(1, i) for i in range(5, 60)])):
                sync.gate.clear()
                sync.entered.clear()
                pending = asyncio.ensure_future(c.add_batch(batch, True, uncached=True))
                assert await asyncio.to_thread(sync.entered.wait, 10), what
                await asyncio.sleep(0.05)
                assert not pending.done(), f"{what}: answered before its fdatasync"
                assert (conn.in_flight, conn.in_flight_bytes) == (1, sum(map(len, batch))), what
                sync.gate.set()
                assert await pending == len(batch)
                assert (conn.in_flight, conn.in_flight_bytes) == (0, 0)
            assert [s.entries for s in await c.list_segments()] == [60]
        await server.stop()
        await store.close()

    asyncio.run(body())


def test_stop_waits_for_adds_in_flight(tmp_path):
    sync = GatedSync()

    async def body():
        store, server, secret = await serve(tmp_path, sync)
        c = AgentClient("127.0.0.1", server.address[1], secret, tls=client_tls())
        await c.add(entry(1, 0))
        sync.gate.clear()
        sync.entered.clear()
        pending = asyncio.ensure_future(c.add(entry(1, 1)))
        assert await asyncio.to_thread(sync.entered.wait, 10)
        threading.Timer(0.2, sync.gate.set).start()
        started = time.monotonic()
        await server.stop()
        assert time.monotonic() - started >= 0.15, "stop() returned while an add was in flight"
        assert store.stat()["pending_bytes"] == 0
        await asyncio.gather(pending, return_exceptions=True)
        await c.close()
        await store.close()

    asyncio.run(body())


def test_half_closed_connection_gets_its_long_polls_answered_at_once(tmp_path):
    async def body():
        store, server, secret = await serve(tmp_path, os.fdatasync, tls=False)  # TCP half-close: TLS has none
        port = server.address[1]

        def client() -> list[p.Frame]:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            decoder = p.FrameDecoder()

            def frame():
                while (f := decoder.next_frame()) is None:
                    data = sock.recv(65536)
                    if not data:
                        return None
                    decoder.feed(data)
                return f

            hs = ClientHandshake(secret)
            sock.sendall(p.auth_request(1, *hs.respond(p.decode_response(frame()))))
            hs.verify_server(p.decode_response(frame()))
            # Two long polls that would wait up to the server's maximum (120 s), then EOF.
            sock.sendall(p.long_poll_request(2, 7, 1, 5, 2**32 - 1) + p.long_poll_request(3, 7, 2, -1, 2**32 - 1))
            sock.shutdown(socket.SHUT_WR)
            frames = []
            while (f := frame()) is not None:
                frames.append(f)
            sock.close()
            return frames

        started = time.monotonic()
        frames = await asyncio.to_thread(client)
        assert time.monotonic() - started < 3
        assert sorted(f.request_id for f in frames) == [2, 3]
        for f in frames:
            assert p.decode_long_poll_result(p.decode_response(f)) == (-1, None)
        await server.stop()
        await store.close()

    asyncio.run(body())


def test_client_read_verifies_crc_and_ids_without_decoding(tmp_path):
    class Tampering(SegmentStore):
        mode = "ok"

        def read(self, log_id, segment_seq, entry_id):
            data = bytearray(super().read(log_id, segment_seq, entry_id))
            if self.mode == "flip":
                data[-1] ^= 1
            elif self.mode == "other":
                return super().read(log_id, segment_seq, entry_id + 1)
            elif self.mode == "short":
                return bytes(data[:-1])
            return bytes(data)

    async def body():
        secret = generate_secret()
        store = Tampering(tmp_path)
        await store.open()
        server = AgentServer(store, secret, "127.0.0.1", 0, tls=server_tls(tmp_path))
        await server.start()
        e0, e1 = entry(1, 0), entry(1, 1)
        async with AgentClient("127.0.0.1", server.address[1], secret, tls=client_tls()) as c:
            await c.add(e0)
            await c.add(e1)
            assert await c.read(7, 1, 0) == e0
            for mode, message in (("flip", "CRC-32C mismatch"), ("other", "returned entry 7/1/1 instead"), ("short", "header says")):
                store.mode = mode
                with pytest.raises(AgentIOError, match=message):
                    await c.read(7, 1, 0)
        await server.stop()
        await store.close()

    asyncio.run(body())


async def _nowait(c: AgentClient, encoded: bytes, *, flush: bool = False) -> BaseException | None:
    """add_nowait awaited through its callback: None once durable, else the error."""
    done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    assert c.add_nowait(encoded, done.set_result, flush=flush)
    return await done


def test_client_add_nowait_calls_back_once_durable(tmp_path):
    sync = GatedSync()

    async def body():
        store, server, secret = await serve(tmp_path, sync)
        async with AgentClient("127.0.0.1", server.address[1], secret, tls=client_tls()) as c:
            await c.add(entry(1, 0))
            sync.gate.clear()
            sync.entered.clear()
            results: list[BaseException | None] = []
            assert c.add_nowait(entry(1, 1), results.append, flush=True)
            assert c.add_nowait(entry(1, 2), results.append)
            assert await asyncio.to_thread(sync.entered.wait, 10)
            await asyncio.sleep(0.05)
            assert results == [], "called back before the fdatasync returned"
            sync.gate.set()
            assert await asyncio.wait_for(_nowait(c, entry(1, 3)), 10) is None
            assert results == [None, None]
            assert [s.entries for s in await c.list_segments()] == [4]
        await server.stop()
        await store.close()

    asyncio.run(body())


def test_client_add_nowait_reports_the_agents_error_and_timeouts(tmp_path):
    sync = GatedSync()

    async def body():
        store, server, secret = await serve(tmp_path, sync)
        async with AgentClient("127.0.0.1", server.address[1], secret, tls=client_tls(), request_timeout=0.3) as c:
            await c.add(entry(1, 0))
            await c.fence(7, 1)
            error = await _nowait(c, entry(1, 1))
            assert isinstance(error, FencedError) and "fenced" in str(error)
            # An add the agent does not answer in time (its fdatasync is held).
            await c.add(entry(2, 0))
            sync.gate.clear()
            error = await asyncio.wait_for(_nowait(c, entry(2, 1)), 10)
            assert isinstance(error, AgentUnavailableError) and "timed out after 0.3s" in str(error)
            sync.gate.set()
        await server.stop()
        await store.close()

    asyncio.run(body())


def test_client_add_nowait_refuses_without_a_ready_connection_and_fails_on_loss(tmp_path):
    sync = GatedSync()

    async def body():
        store, server, secret = await serve(tmp_path, sync)
        c = AgentClient("127.0.0.1", server.address[1], secret, tls=client_tls())
        assert not c.add_nowait(entry(1, 0), lambda exc: None), "sent without a connection"
        await c.add(entry(1, 0))
        sync.gate.clear()
        sync.entered.clear()
        results: list[BaseException | None] = []
        assert c.add_nowait(entry(1, 1), results.append, flush=True)
        assert await asyncio.to_thread(sync.entered.wait, 10)
        await c.close()  # the connection goes while the add is in flight
        assert len(results) == 1 and isinstance(results[0], AgentUnavailableError)
        sync.gate.set()
        await server.stop()
        await store.close()

    asyncio.run(body())
