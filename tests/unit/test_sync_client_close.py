"""``SyncAgentClient.close`` leaves nothing running on the private loop it closes.

A request that gives up while its connection attempt is still under way leaves the attempt
running (callers share it, shielded). Closing the client then closed the loop under it: the
attempt was dropped half-way through its handshake and complained when collected (a warning
seen in CI)."""

from __future__ import annotations

import asyncio
import gc
import socket
import warnings

import pytest

from dlctl.log.client import SyncAgentClient
from dlctl.log.errors import AgentUnavailableError


def test_closing_cancels_a_connection_attempt_a_caller_gave_up_on():
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never says HELLO
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        client = SyncAgentClient("127.0.0.1", silent.getsockname()[1], b"s" * 32, connect_timeout=60)
        inner = client._client

        async def give_up() -> asyncio.Future:
            caller = asyncio.ensure_future(inner.connect())
            await asyncio.sleep(0)  # one loop turn: the caller has started the attempt and waits on it
            attempt = inner._connecting
            caller.cancel()  # the caller gives up; the shared attempt goes on
            await asyncio.gather(caller, return_exceptions=True)
            return attempt

        attempt = asyncio.run_coroutine_threadsafe(give_up(), client._loop).result(10)
        assert attempt is not None and not attempt.done()
        client.close()
        assert client._loop.is_closed()
        assert attempt.done(), "the connection attempt was left running on the closed loop"
        assert not [t for t in asyncio.all_tasks(client._loop) if not t.done()]


def test_a_request_on_a_closed_client_is_refused_and_leaves_no_coroutine_behind():
    # A request after close() used to raise RuntimeError("Event loop is closed") and drop the
    # request's coroutine unstarted: "coroutine 'AgentClient.stat' was never awaited" when the
    # collector found it, under whichever test ran then (seen in CI).
    client = SyncAgentClient("127.0.0.1", 9, b"s" * 32)  # nothing is dialled before a request
    client.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(AgentUnavailableError, match="is closed"):
            client.stat()
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
