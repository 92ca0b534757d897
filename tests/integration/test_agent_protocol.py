"""A real AgentServer over a real SegmentStore, in a child process, driven over TCP on loopback
by the real AgentClient and by raw sockets speaking (and mangling) the wire protocol.

Run as a script (``python test_agent_protocol.py serve ...``) this module is the child: it
serves a data directory until its stdin closes and prints its port on stdout.

Agents serve mutual TLS with a certificate of the harness CA (``harness.tls``), as production
does; ``Agent(..., tls=False)`` serves plaintext for the tests of that path. ``Raw`` speaks the
wire protocol by hand inside the same TLS session a real client would have (its HMAC handshake
bound to the agent's certificate).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlctl.log import protocol as p
from dlctl.log.auth import DEFAULT_CONTEXT, ClientHandshake, generate_secret, load_secret
from dlctl.log.client import AgentClient, SyncAgentClient
from dlctl.log.errors import (
    AgentUnavailableError,
    BadRequestError,
    FencedError,
    NoSuchEntryError,
    NoSuchSegmentError,
    UnauthorizedError,
)
from dlctl.log.format import Entry, encode
from dlctl.log.tls import TlsFiles, bound_context

from dlagent.storage import SegmentStore

pytestmark = pytest.mark.agent

START_TIMEOUT = 30.0


# The child process -------------------------------------------------------------------------------


def _serve(argv: list[str]) -> None:
    """serve DATA_DIR SECRET_FILE LIMITS_JSON [CA CERT KEY]"""
    import logging

    from dlagent.server import AgentServer, ServerLimits

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    data_dir, secret_file, limits = Path(argv[0]), argv[1], ServerLimits(**json.loads(argv[2]))
    tls = TlsFiles(Path(argv[3]), Path(argv[4]), Path(argv[5])) if len(argv) > 3 else None

    async def main() -> int:
        store = SegmentStore(data_dir)
        await store.open()
        server = AgentServer(store, load_secret(secret_file), "127.0.0.1", 0, tls=tls, limits=limits)
        await server.start()
        loop = asyncio.get_running_loop()
        stdin_closed = loop.create_future()
        threading.Thread(
            target=lambda: (sys.stdin.buffer.read(), loop.call_soon_threadsafe(stdin_closed.set_result, None)),
            daemon=True,
        ).start()
        print(json.dumps({"port": server.address[1]}), flush=True)
        await asyncio.wait([stdin_closed, asyncio.ensure_future(server.wait_stopped())], return_when=asyncio.FIRST_COMPLETED)
        await server.stop()
        await store.close()
        return 1 if server.failure else 0

    sys.exit(asyncio.run(main()))


# Harness -----------------------------------------------------------------------------------------


def _harness_tls():  # noqa: ANN202 - the child runs this file without tests/ on its path
    from harness import tls

    return tls


class Agent:
    """One agent child process serving ``data_dir`` on 127.0.0.1: mutual TLS with a certificate
    of the harness CA (``tls=True``, the default), or given ``TlsFiles``, or plaintext (``False``)."""

    def __init__(self, root: Path, secret: bytes, *, tls: bool | TlsFiles = True, **limits: float) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.secret = secret
        secret_file = root / "secret"
        secret_file.write_bytes(secret)
        secret_file.chmod(0o600)
        self.log_path = root / "agent.log"
        args = [sys.executable, __file__, "serve", str(self.data_dir), str(secret_file), json.dumps(limits)]
        if tls is True:
            tls = _harness_tls().agent_tls(root / "tls", "127.0.0.1")
        self.tls: TlsFiles | None = tls or None
        if self.tls is not None:
            args += [str(path) for path in self.tls.paths]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, start_new_session=True
        )
        line = self._read_line()
        self.port: int = json.loads(line)["port"]

    def _read_line(self) -> bytes:
        assert self.proc.stdout is not None
        result: list[bytes] = []
        stdout = self.proc.stdout
        reader = threading.Thread(target=lambda: result.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        if not result or not result[0]:
            self.kill()
            raise AssertionError(f"agent did not start; log:\n{self.log_path.read_text(errors='replace')[-4000:]}")
        return result[0]

    @property
    def client_tls(self) -> TlsFiles | None:
        """What a client of this agent presents: the harness client certificate under TLS."""
        return _harness_tls().client_tls() if self.tls is not None else None

    def client(self, secret: bytes | None = None, **options: object) -> SyncAgentClient:
        options.setdefault("tls", self.client_tls)
        return SyncAgentClient("127.0.0.1", self.port, self.secret if secret is None else secret, **options)  # type: ignore[arg-type]

    def aclient(self, **options: object) -> AgentClient:
        options.setdefault("tls", self.client_tls)
        return AgentClient("127.0.0.1", self.port, self.secret, **options)  # type: ignore[arg-type]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("agent did not stop within 15 s of its stdin closing") from None
        finally:
            self.log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def entry(log_id: int, seg: int, entry_id: int, payload: bytes = b"", lac: int | None = None) -> bytes:
    lac = entry_id - 1 if lac is None else lac
    return encode(Entry(log_id, seg, entry_id, lac, payload or f"entry {log_id}/{seg}/{entry_id}".encode()))


class Raw:
    """A raw protocol connection for hostile-client tests: inside a TLS session with the
    harness client certificate when the agent serves TLS (a hostile client that holds a cluster
    certificate, the only kind that reaches the protocol), plain TCP otherwise."""

    def __init__(self, agent: Agent, timeout: float = 10.0) -> None:
        sock = socket.create_connection(("127.0.0.1", agent.port), timeout=timeout)
        self.tls = agent.tls is not None
        self.context = DEFAULT_CONTEXT
        if self.tls:
            assert agent.client_tls is not None
            sock = agent.client_tls.client().wrap_socket(sock, server_hostname="127.0.0.1")
            # The HMAC proofs are bound to the certificate the agent presented (dlctl.log.tls).
            self.context = bound_context(DEFAULT_CONTEXT, sock.getpeercert(binary_form=True))
        self.sock = sock
        self.decoder = p.FrameDecoder()

    def close(self) -> None:
        self.sock.close()

    def handshake(self, secret: bytes) -> ClientHandshake:
        """A client handshake with ``secret`` for this connection (bound to its TLS session)."""
        return ClientHandshake(secret, self.context)

    def shutdown_write(self) -> None:
        """Tell the agent no more bytes come: a TCP half-close, or under TLS a close_notify
        (the agent then ends the session: TLS has no half-close it could keep)."""
        if not self.tls:
            self.sock.shutdown(socket.SHUT_WR)
            return
        try:
            self.sock = self.sock.unwrap()  # type: ignore[attr-defined]
        except (ssl.SSLError, OSError):
            pass  # the agent closed first, or answered before its close_notify: ended either way

    def frame(self) -> p.Frame | None:
        """The next frame, or None at EOF."""
        while True:
            frame = self.decoder.next_frame()
            if frame is not None:
                return frame
            try:
                data = self.sock.recv(65536)
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return None  # the TLS session ended (with or without close_notify)
            if not data:
                return None
            self.decoder.feed(data)

    def hello(self) -> bytes:
        frame = self.frame()
        assert frame is not None and frame.opcode == p.Op.HELLO | p.RESPONSE
        return p.decode_response(frame)

    def authenticate(self, secret: bytes) -> None:
        hs = self.handshake(secret)
        self.sock.sendall(p.auth_request(1, *hs.respond(self.hello())))
        reply = self.frame()
        assert reply is not None
        hs.verify_server(p.decode_response(reply))

    def eof(self) -> bool:
        """True if the agent closes the connection (after any frames it still sends)."""
        try:
            while self.frame() is not None:
                pass
        except (ConnectionResetError, p.ProtocolError):
            pass
        return True


@pytest.fixture(scope="module")
def secret() -> bytes:
    return generate_secret()


def _module_agent(root: Path, secret: bytes, *, tls: bool) -> Iterator[Agent]:
    a = Agent(root, secret, tls=tls, handshake_timeout=2.0, frame_timeout=2.0)
    yield a
    assert a.alive(), f"the agent died; log:\n{a.log_path.read_text(errors='replace')[-4000:]}"
    assert a.stop() == 0
    log = a.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log, log[-4000:]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, secret: bytes) -> Iterator[Agent]:
    """The module's agent: mutual TLS, as production runs it."""
    yield from _module_agent(tmp_path_factory.mktemp("agent"), secret, tls=True)


@pytest.fixture(scope="module")
def plain_agent(tmp_path_factory: pytest.TempPathFactory, secret: bytes) -> Iterator[Agent]:
    """A plaintext agent (no [tls]), for what only plain TCP has: a half-close."""
    yield from _module_agent(tmp_path_factory.mktemp("plain-agent"), secret, tls=False)


@pytest.fixture()
def client(agent: Agent) -> Iterator[SyncAgentClient]:
    with agent.client() as c:
        yield c


_next_log = iter(range(1000, 10**6))


@pytest.fixture()
def log_id() -> int:
    """A log id no other test uses (the module's agent is shared)."""
    return next(_next_log)


# Round trips -------------------------------------------------------------------------------------


def test_add_read_round_trip(client: SyncAgentClient, log_id: int) -> None:
    data = [entry(log_id, 1, i, os.urandom(100 + i)) for i in range(5)]
    for d in data:
        client.add(d)
    for i, d in enumerate(data):
        assert client.read(log_id, 1, i) == d
    decoded = client.read_entry(log_id, 1, 4)
    assert (decoded.entry_id, decoded.lac, decoded.payload) == (4, 3, data[4][48:])
    assert client.read_lac(log_id, 1) == 3
    d = client.digest(log_id, 1)
    assert (d.entries, d.first_entry_id, d.last_entry_id, d.lac) == (5, 0, 4, 3)
    assert client.digest(log_id, 1, 1, 2).entries == 2
    segs = {(s.log_id, s.segment_seq): s for s in client.list_segments()}
    assert segs[(log_id, 1)].entries == 5 and not segs[(log_id, 1)].fenced
    stat = client.stat()
    assert stat["segments"] >= 1 and stat["server"]["requests"] > 0
    assert client.fence(log_id, 1) == (4, 3)
    assert client.delete_segment(log_id, 1) is True
    assert client.delete_segment(log_id, 1) is False
    with pytest.raises(NoSuchSegmentError):
        client.read(log_id, 1, 0)


def test_missing_entries_and_segments(client: SyncAgentClient, log_id: int) -> None:
    with pytest.raises(NoSuchSegmentError):
        client.read_lac(log_id, 1)
    client.add(entry(log_id, 1, 0))
    with pytest.raises(NoSuchEntryError):
        client.read(log_id, 1, 1)


def test_large_entries(client: SyncAgentClient, log_id: int) -> None:
    big = entry(log_id, 1, 0, os.urandom(4 * 1024 * 1024))
    client.add(big)
    assert client.read(log_id, 1, 0) == big


def test_uncached_adds_leave_the_agents_page_cache_and_ordinary_ones_stay(agent: Agent, client: SyncAgentClient) -> None:
    """FLAG_UNCACHED over the wire: the agent drops a bulk copy's pages once they are durable."""
    from harness.pagecache import pages, resident_pages  # here: the child process runs this file without tests/ on its path

    sizes = {}
    for uncached in (True, False):
        log_id = next(_next_log)
        data = [entry(log_id, 1, i, os.urandom(64 * 1024)) for i in range(16)]
        for d in data:
            client.add(d, uncached=uncached)
        sizes[uncached] = (log_id, sum(map(len, data)))
    resident = {u: resident_pages(agent.data_dir / "segments" / f"{log_id:016x}" / f"{1:016x}.log", n) for u, (log_id, n) in sizes.items()}
    assert resident[True] <= 1 and resident[False] == pages(sizes[False][1]), resident
    log_id = sizes[True][0]
    assert client.read(log_id, 1, 15)[-10:] and client.digest(log_id, 1).entries == 16  # all there, read from disk


def test_pipelined_adds_complete_out_of_order(agent: Agent, log_id: int) -> None:
    async def main() -> None:
        async with agent.aclient() as c:
            done: list[str] = []

            async def tracked(name: str, coro):  # type: ignore[no-untyped-def]
                result = await coro
                done.append(name)
                return result

            # The long poll goes out first on the connection, but only the adds to segment 2
            # that follow the 200 adds to segment 1 release it: later requests complete first,
            # and every response finds its request by id.
            poll = asyncio.ensure_future(tracked("poll", c.long_poll(log_id, 2, -1, timeout=20)))
            adds = [tracked(f"add{i}", c.add(entry(log_id, 1, i))) for i in range(200)]
            await asyncio.gather(*adds)
            assert not poll.done()
            await c.add(entry(log_id, 2, 0))
            await c.add(entry(log_id, 2, 1))
            lac, piggy = await asyncio.wait_for(poll, 20)
            assert done[-1] == "poll" and len(done) == 201
            assert lac == 0 and piggy == entry(log_id, 2, 0)
            reads = await asyncio.gather(*(c.read(log_id, 1, i) for i in range(200)))
            assert reads == [entry(log_id, 1, i) for i in range(200)]

    asyncio.run(main())


def _raw_pipelining(agent: Agent, log_id: int, *, half_close: bool) -> None:
    raw = Raw(agent)
    try:
        raw.authenticate(agent.secret)
        frames = [p.add_entry_request(100 + i, entry(log_id, 1, i)) for i in range(20)]
        frames.append(p.read_lac_request(500, log_id + 10**9, 1))  # no such segment
        raw.sock.sendall(b"".join(frames))
        if half_close:
            raw.sock.shutdown(socket.SHUT_WR)  # a half-close still gets every answer, then EOF
        replies = {}
        while len(replies) < 21:
            f = raw.frame()
            assert f is not None
            replies[f.request_id] = f
        if half_close:
            assert raw.eof()
        assert all(p.decode_response(replies[100 + i]) == b"" for i in range(20))
        with pytest.raises(NoSuchSegmentError):
            p.decode_response(replies[500])
    finally:
        raw.close()


def test_raw_pipelining_matches_request_ids(agent: Agent, log_id: int) -> None:
    _raw_pipelining(agent, log_id, half_close=False)


def test_plaintext_half_close_still_gets_every_answer(plain_agent: Agent, log_id: int) -> None:
    """TCP half-close (TLS has none the agent could keep: a close_notify ends the session)."""
    _raw_pipelining(plain_agent, log_id, half_close=True)


# Fencing -----------------------------------------------------------------------------------------


def test_fence_refuses_normal_adds_and_accepts_recovery_adds(client: SyncAgentClient, log_id: int) -> None:
    for i in range(3):
        client.add(entry(log_id, 1, i))
    assert client.fence(log_id, 1) == (2, 1)
    with pytest.raises(FencedError):
        client.add(entry(log_id, 1, 3))
    client.add(entry(log_id, 1, 3), recovery=True)
    assert client.read(log_id, 1, 3) == entry(log_id, 1, 3)
    assert client.fence(log_id, 1) == (3, 2)  # idempotent
    info = {(s.log_id, s.segment_seq): s for s in client.list_segments()}[(log_id, 1)]
    assert info.fenced


def test_fencing_read_fences(client: SyncAgentClient, log_id: int) -> None:
    client.add(entry(log_id, 1, 0))
    client.add(entry(log_id, 1, 1))
    assert client.read(log_id, 1, 0, fence=True) == entry(log_id, 1, 0)
    with pytest.raises(FencedError):
        client.add(entry(log_id, 1, 2))
    # A recovery read of a segment this agent never saw fences it too (creating it empty), and
    # answers "no such entry", which is the vote recovery counts.
    with pytest.raises(NoSuchEntryError):
        client.read(log_id, 2, 0, fence=True)
    with pytest.raises(FencedError):
        client.add(entry(log_id, 2, 0))


# Long poll ---------------------------------------------------------------------------------------


def test_long_poll_returns_promptly_when_the_entry_arrives(agent: Agent, log_id: int) -> None:
    async def main() -> None:
        async with agent.aclient() as c:
            await c.add(entry(log_id, 1, 0))
            start = time.monotonic()
            poll = asyncio.ensure_future(c.long_poll(log_id, 1, -1, timeout=30))
            await asyncio.sleep(0.2)  # the scenario: the entry arrives later than the poll
            assert not poll.done()
            await c.add(entry(log_id, 1, 1))  # carries LAC 0
            lac, piggy = await asyncio.wait_for(poll, 30)
            elapsed = time.monotonic() - start
            assert lac == 0 and piggy == entry(log_id, 1, 0)
            assert elapsed < 5, f"long poll took {elapsed:.2f}s after the entry arrived"

    asyncio.run(main())


def test_long_poll_times_out(client: SyncAgentClient, log_id: int) -> None:
    client.add(entry(log_id, 1, 0))
    start = time.monotonic()
    assert client.long_poll(log_id, 1, -1, 0.5) == (-1, None)
    elapsed = time.monotonic() - start
    assert 0.45 <= elapsed < 5
    # Already past: no wait at all.
    client.add(entry(log_id, 1, 1))
    start = time.monotonic()
    assert client.long_poll(log_id, 1, -1, 30) == (0, entry(log_id, 1, 0))
    assert time.monotonic() - start < 5


def test_long_poll_on_another_connection_does_not_block_it(agent: Agent, log_id: int) -> None:
    async def main() -> None:
        async with agent.aclient() as poller, agent.aclient() as writer:
            polls = [asyncio.ensure_future(poller.long_poll(log_id, 1, -1, timeout=30)) for _ in range(5)]
            await writer.add(entry(log_id, 1, 0))
            assert await poller.read(log_id, 1, 0) == entry(log_id, 1, 0)  # not blocked by the polls
            await writer.add(entry(log_id, 1, 1))
            results = await asyncio.wait_for(asyncio.gather(*polls), 30)
            assert all(r == (0, entry(log_id, 1, 0)) for r in results)

    asyncio.run(main())


# Authentication ----------------------------------------------------------------------------------


def assert_unauthorized_then_closed(raw: Raw, request_id: int) -> None:
    """The agent answers ``request_id`` (the first reply) with UNAUTHORIZED, then closes."""
    reply = raw.frame()
    assert reply is not None and reply.request_id == request_id
    with pytest.raises(UnauthorizedError):
        p.decode_response(reply)
    assert raw.eof()


def test_wrong_secret_is_unauthorized(agent: Agent) -> None:
    with agent.client(secret=b"not the cluster secret at all!!") as c:
        with pytest.raises(UnauthorizedError, match="secret"):
            c.stat()


def test_nothing_is_served_after_a_failed_authentication(agent: Agent, client: SyncAgentClient, log_id: int) -> None:
    raw = Raw(agent)
    try:
        hs = raw.handshake(b"not the cluster secret at all!!")
        nonce, proof = hs.respond(raw.hello())
        # AUTH with a wrong proof, immediately followed by a pipelined add.
        raw.sock.sendall(p.auth_request(1, nonce, proof) + p.add_entry_request(2, entry(log_id, 1, 0)))
        assert_unauthorized_then_closed(raw, 1)
    finally:
        raw.close()
    with pytest.raises(NoSuchSegmentError):
        client.read(log_id, 1, 0)


def test_request_before_authentication_is_rejected_and_closed(agent: Agent, client: SyncAgentClient, log_id: int) -> None:
    raw = Raw(agent)
    try:
        raw.hello()
        raw.sock.sendall(p.add_entry_request(7, entry(log_id, 1, 0)) + p.stat_request(8))
        assert_unauthorized_then_closed(raw, 7)
    finally:
        raw.close()
    with pytest.raises(NoSuchSegmentError):
        client.read(log_id, 1, 0)


def test_replayed_auth_response_is_refused(agent: Agent) -> None:
    first = Raw(agent)
    hs = first.handshake(agent.secret)
    recorded = p.auth_request(1, *hs.respond(first.hello()))
    first.sock.sendall(recorded)
    assert first.frame() is not None
    first.close()
    second = Raw(agent)
    try:
        second.hello()
        second.sock.sendall(recorded)
        reply = second.frame()
        assert reply is not None
        with pytest.raises(UnauthorizedError):
            p.decode_response(reply)
        assert second.eof()
    finally:
        second.close()


def test_silent_client_is_dropped_after_the_handshake_timeout(agent: Agent) -> None:
    raw = Raw(agent)
    try:
        raw.hello()
        start = time.monotonic()
        assert raw.eof()
        assert time.monotonic() - start < 8
    finally:
        raw.close()


def test_slowloris_partial_frame_is_dropped(agent: Agent) -> None:
    raw = Raw(agent)
    try:
        raw.authenticate(agent.secret)
        frame = p.stat_request(2)
        raw.sock.sendall(frame[:7])  # a frame that never completes
        start = time.monotonic()
        assert raw.eof()
        assert time.monotonic() - start < 8
    finally:
        raw.close()


# Hostile input -----------------------------------------------------------------------------------


def test_out_of_range_ids_are_bad_requests_and_touch_nothing(agent: Agent, client: SyncAgentClient, log_id: int) -> None:
    client.add(entry(log_id, 1, 0))
    # The agent records the replica's acknowledged length in the background (storage upkeep):
    # under load that came after the snapshot below and looked like a file the calls made.
    from harness.procs import wait_until  # (here: the agents this module starts import it without the harness)

    acked = agent.data_dir / "segments" / f"{log_id:016x}" / f"{1:016x}.acked"
    wait_until(acked.exists, 30, message=f"{acked} written by the agent's upkeep")
    outside = agent.root.parent
    data_rel = str(agent.data_dir.relative_to(outside))

    def outside_data() -> set[str]:
        return {x for x in tree(outside) if not x.startswith(data_rel)}

    before_outside = outside_data()
    before = tree(agent.data_dir)
    calls = [
        lambda: client.read(0, 1, 0),
        lambda: client.read(log_id, 0, 0),
        lambda: client.read(log_id, 1, -1),
        lambda: client.read(0, 0, 0, fence=True),
        lambda: client.fence(0, 1),
        lambda: client.fence(log_id, 0),
        lambda: client.read_lac(0, 0),
        lambda: client.long_poll(0, 1, -1, 0.1),
        lambda: client.long_poll(log_id, 1, -2, 0.1),
        lambda: client.digest(log_id, 1, -5),
        lambda: client.digest(log_id, 1, 5, 2),
        lambda: client.delete_segment(0, 0),
    ]
    for call in calls:
        with pytest.raises(BadRequestError):
            call()
    # Raw bodies that look like paths never become paths: they are the wrong size or not an entry.
    raw = Raw(agent)
    try:
        raw.authenticate(agent.secret)
        hostile = [
            p.encode_frame(p.Op.READ_ENTRY, 0, 2, b"../../../../etc/passwd\0"),
            p.encode_frame(p.Op.FENCE, 0, 3, b"../../x\0../../y\0"),  # 16 bytes: two ids, not a path
            p.encode_frame(p.Op.ADD_ENTRY, 0, 4, b"DLE1" + b"../" * 30),
            p.encode_frame(p.Op.ADD_ENTRY, 0, 5, bytearray(entry(log_id, 1, 1))[:-1] + b"X"),  # bad CRC
        ]
        raw.sock.sendall(b"".join(hostile))
        statuses = {}
        for _ in hostile:
            f = raw.frame()
            assert f is not None
            statuses[f.request_id] = f.body[0]
        assert statuses[2] == statuses[4] == statuses[5] == BadRequestError.status
        assert statuses[3] == 0  # 16 bytes are two ids, whatever they look like: a legal fence
    finally:
        raw.close()
    after = tree(agent.data_dir)
    assert outside_data() == before_outside
    fenced_log = f"{struct.unpack('>Q', b'../../x' + bytes(1))[0]:016x}"
    assert after - before and all(fenced_log in x for x in after - before), after - before  # only the legal fence

    with pytest.raises(NoSuchEntryError):
        client.read(log_id, 1, 1)


def test_oversize_and_garbage_frames_close_the_connection(agent: Agent, client: SyncAgentClient) -> None:
    for junk in (
        struct.pack(">I", p.MAX_FRAME + 1) + b"x" * 100,
        struct.pack(">I", 2) + b"xx",
        struct.pack(">IBBHQ", 12, 99, 1, 0, 1),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    ):
        raw = Raw(agent)
        try:
            raw.authenticate(agent.secret)
            raw.sock.sendall(junk)
            f = raw.frame()
            assert f is not None and f.request_id == 0 and f.body[0] == BadRequestError.status
            assert raw.eof()
        finally:
            raw.close()
    assert client.stat()["server"]["open_connections"] >= 1


def test_bad_request_keeps_the_connection_usable(agent: Agent, log_id: int) -> None:
    raw = Raw(agent)
    try:
        raw.authenticate(agent.secret)
        raw.sock.sendall(p.encode_frame(77, 0, 5, b"?") + p.encode_frame(p.Op.READ_LAC, 0, 6, b"short"))
        raw.sock.sendall(p.add_entry_request(7, entry(log_id, 1, 0)))
        replies = {}
        for _ in range(3):
            f = raw.frame()
            assert f is not None
            replies[f.request_id] = f
        assert replies[5].body[0] == replies[6].body[0] == BadRequestError.status
        assert p.decode_response(replies[7]) == b""
    finally:
        raw.close()


# Fuzzing over the socket --------------------------------------------------------------------------

_REF_LOG = 77_000_001
_FUZZ_LOG = 5
_VALID = [
    p.add_entry_request(11, entry(_FUZZ_LOG, 1, 0)),
    p.add_entry_request(12, entry(_FUZZ_LOG, 1, 1), recovery=True),
    p.read_entry_request(13, _FUZZ_LOG, 1, 0),
    p.read_entry_request(14, _FUZZ_LOG, 2, 0, fence=True),
    p.read_lac_request(15, _FUZZ_LOG, 1),
    p.long_poll_request(16, _FUZZ_LOG, 1, 5, 50),
    p.fence_request(17, _FUZZ_LOG, 3),
    p.digest_request(18, _FUZZ_LOG, 1),
    p.list_segments_request(19),
    p.delete_segment_request(20, _FUZZ_LOG, 4),
    p.stat_request(21),
]

@st.composite
def fuzz_input(draw: st.DrawFn) -> tuple[bool, bytes]:
    authenticate = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        return authenticate, draw(st.binary(min_size=1, max_size=600))
    data = bytearray(b"".join(draw(st.lists(st.sampled_from(_VALID), min_size=1, max_size=5))))
    for _ in range(draw(st.integers(0, 6))):
        i = draw(st.integers(0, len(data) - 1)) if data else 0
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert", "length"]))
        if not data:
            break
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[i] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[i : i + draw(st.integers(1, 40))]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=40))
        else:  # a hostile length prefix
            data[0:4] = struct.pack(">I", draw(st.sampled_from([0, 11, 12, 2**31, 2**32 - 1, p.MAX_FRAME])))
    return authenticate, bytes(data)


@pytest.fixture(scope="module")
def reference(agent: Agent) -> list[bytes]:
    data = [entry(_REF_LOG, 1, i, os.urandom(64)) for i in range(5)]
    with agent.client() as c:
        for d in data:
            c.add(d)
    return data


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=fuzz_input())
def test_fuzzed_frames_never_crash_hang_or_damage(agent: Agent, reference: list[bytes], case: tuple[bool, bytes]) -> None:
    authenticate, data = case
    raw = Raw(agent, timeout=5)
    try:
        if authenticate:
            raw.authenticate(agent.secret)
        else:
            raw.hello()
        raw.sock.sendall(data)
        raw.shutdown_write()  # the agent sees EOF (or close_notify) and must end the connection
        assert raw.eof()
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        raise AssertionError(f"agent neither answered nor closed within 5 s for input {data[:64]!r}") from None
    finally:
        raw.close()
    assert agent.alive()
    with agent.client(request_timeout=5.0, connect_timeout=5.0) as c:
        assert [c.read(_REF_LOG, 1, i) for i in range(5)] == reference
        assert c.read_lac(_REF_LOG, 1) == 3


# Connection loss, reconnection, TLS, store failure -----------------------------------------------


def test_client_fails_promptly_when_the_agent_disappears(tmp_path: Path, secret: bytes) -> None:
    agent = Agent(tmp_path, secret)
    try:

        async def main() -> None:
            async with agent.aclient(request_timeout=60, connect_timeout=5) as c:
                await c.add(entry(1, 1, 0))
                polls = [asyncio.ensure_future(c.long_poll(1, seg, 5, timeout=60)) for seg in (1, 2, 3)]
                await asyncio.sleep(0.1)  # let the requests reach the agent
                start = time.monotonic()
                agent.kill()
                for fut in polls:
                    with pytest.raises(AgentUnavailableError):
                        await asyncio.wait_for(fut, 10)
                assert time.monotonic() - start < 5
                start = time.monotonic()
                with pytest.raises(AgentUnavailableError, match="cannot connect|refused"):
                    await c.read_lac(1, 1)
                assert time.monotonic() - start < 5

        asyncio.run(main())
    finally:
        agent.kill()


def test_client_reconnects_after_the_connection_drops(tmp_path: Path, secret: bytes) -> None:
    agent = Agent(tmp_path, secret, idle_timeout=0.3)
    try:

        async def main() -> None:
            async with agent.aclient() as c:
                await c.add(entry(1, 1, 0))
                conn = c._conn
                assert conn is not None
                while not conn.lost:  # the agent drops the idle connection
                    await asyncio.sleep(0.05)
                assert await c.read(1, 1, 0) == entry(1, 1, 0)  # a new connection, transparently
                assert c._conn is not conn

        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        assert agent.stop() == 0


def test_request_timeout_is_agent_unavailable(agent: Agent, log_id: int) -> None:
    async def main() -> None:
        async with agent.aclient(request_timeout=0.3) as c:
            await c.add(entry(log_id, 1, 0))
            # Nothing will raise LAC, and the client allows the poll only 0.3 s beyond its own timeout.
            start = time.monotonic()
            task = c._call(p.Op.LONG_POLL, p.long_poll_request, log_id, 1, 5, 30_000, timeout=0.3)
            with pytest.raises(AgentUnavailableError, match="timed out"):
                await task
            assert time.monotonic() - start < 5
            assert await c.read(log_id, 1, 0) == entry(log_id, 1, 0)  # the connection is still usable

    asyncio.run(main())


def _cluster_pki(tmp: Path) -> tuple[TlsFiles, TlsFiles]:
    """A CA of this test's own (not the harness's), an agent certificate for ``localhost`` and a
    client certificate, as TlsFiles (agent, client)."""
    from dlctl import pki
    from dlctl.secrets import write_secret_file

    ca = pki.new_ca("test-tls")
    out = []
    for name, names, server in (("agent", ["localhost"], True), ("client", [], False)):
        issued = pki.issue(ca, name, names, server=server)
        d = tmp / f"{name}-tls"
        for fname, data in (("ca.pem", ca.cert_pem), ("cert.pem", issued.cert_pem), ("key.pem", issued.key_pem)):
            write_secret_file(d / fname, data)
        out.append(TlsFiles(d / "ca.pem", d / "cert.pem", d / "key.pem"))
    return out[0], out[1]


def test_tls(tmp_path: Path, secret: bytes) -> None:
    agent_files, client_files = _cluster_pki(tmp_path)
    agent = Agent(tmp_path, secret, tls=agent_files)
    try:
        with agent.client(tls=client_files, server_hostname="localhost") as c:  # type: ignore[arg-type]
            c.add(entry(1, 1, 0, os.urandom(200_000)))
            assert len(c.read(1, 1, 0)) == 200_048
        with agent.client(tls=None, connect_timeout=1) as plain:  # TLS-only agent: plaintext fails, never hangs
            with pytest.raises(AgentUnavailableError):
                plain.stat()
        # A certificate of another CA (the harness's) is refused in the TLS handshake.
        with agent.client(tls=_harness_tls().client_tls(), server_hostname="localhost", connect_timeout=2) as foreign:  # type: ignore[arg-type]
            with pytest.raises(AgentUnavailableError):
                foreign.stat()
    finally:
        assert agent.stop() == 0


def test_store_failure_stops_the_server(tmp_path: Path, secret: bytes) -> None:
    from dlagent.server import AgentServer

    async def main() -> None:
        store = SegmentStore(tmp_path / "data")
        await store.open()
        tls = _harness_tls()
        server = AgentServer(store, secret, "127.0.0.1", 0, tls=tls.agent_tls(tmp_path / "tls", "127.0.0.1"))
        await server.start()
        host, port = server.address
        c = AgentClient(host, port, secret, tls=tls.client_tls())
        await c.add(entry(1, 1, 0))
        poll = asyncio.ensure_future(c.long_poll(1, 1, 5, timeout=60))
        await asyncio.sleep(0.05)
        assert store.on_failure is not None
        store.on_failure(OSError(5, "simulated fsync failure"))  # what the store calls after a failed fsync
        assert isinstance(await asyncio.wait_for(server.wait_stopped(), 5), OSError)
        with pytest.raises(AgentUnavailableError):
            await asyncio.wait_for(poll, 5)
        with pytest.raises(AgentUnavailableError):
            await c.stat()  # no longer accepting
        await c.close()
        await server.stop()
        await store.close()

    asyncio.run(main())


def test_connection_and_in_flight_limits(tmp_path: Path, secret: bytes) -> None:
    from dlagent.server import AgentServer, ServerLimits

    async def main() -> None:
        store = SegmentStore(tmp_path / "data")
        await store.open()
        tls = _harness_tls()
        server = AgentServer(
            store, secret, "127.0.0.1", 0, tls=tls.agent_tls(tmp_path / "tls", "127.0.0.1"),
            limits=ServerLimits(max_connections=2, max_in_flight=2, max_long_polls=3),
        )
        await server.start()
        host, port = server.address
        a, b, c = (AgentClient(host, port, secret, tls=tls.client_tls()) for _ in range(3))
        try:
            await a.connect()
            await b.connect()
            with pytest.raises(AgentUnavailableError, match="too many connections"):
                await c.connect()
            # Long polls waiting count apart from the in-flight budget: two of them (the budget)
            # leave a read through at once (a reader polling ahead must not hold its reads back).
            polls = [asyncio.ensure_future(a.long_poll(1, 1, 5, timeout=0.5)) for _ in range(2)]
            await asyncio.sleep(0)  # let the polls go out first
            await a.stat()
            assert not any(poll.done() for poll in polls), "the read waited for the long polls"
            await asyncio.gather(*polls)
            # Three long polls fill their own budget: the agent stops reading the connection,
            # so a further request waits for a slot instead of piling up in memory.
            polls = [asyncio.ensure_future(a.long_poll(1, 1, 5, timeout=0.5)) for _ in range(3)]
            await asyncio.sleep(0)
            start = time.monotonic()
            stat = await a.stat()
            assert time.monotonic() - start >= 0.4
            assert all(poll.done() for poll in polls)
            assert stat["server"]["open_connections"] == 2
            assert await b.list_segments() == []  # other connections are unaffected
        finally:
            for cl in (a, b, c):
                await cl.close()
            await server.stop()
            await store.close()

    asyncio.run(main())


if __name__ == "__main__":
    _serve(sys.argv[2:])
