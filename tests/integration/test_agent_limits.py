"""Limits before authentication, bounded answers, and descriptor exhaustion that is not
corruption (issue 19 items 3 and 4), against real ``dlagent serve`` processes.

Attacks come from raw sockets bound to other loopback addresses (127.0.0.2, ...), so the agent
sees them as other peers than the legitimate clients on 127.0.0.1. Some agents run under a low
open-files limit (``prlimit``, soft below hard: the agent raises its soft limit itself).

Agents serve mutual TLS (the harness default). Floods come from plain TCP sockets, attackers
without a cluster certificate: each connection is admitted as an unauthenticated one and stalls
in the TLS handshake. Attacks that need the protocol (a HELLO, a frame) come from holders of a
cluster certificate (``Raw(..., tls=node.client_tls)``): with mutual TLS nobody else reaches it.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import ssl
import sys
import threading
import time
from pathlib import Path

import pytest

from dlctl.log import format as fmt
from dlctl.log import protocol as p
from dlctl.log.auth import DEFAULT_CONTEXT, ClientHandshake
from dlctl.log.client import AgentClient, SyncAgentClient
from dlctl.log.errors import AgentResourceError, AgentUnavailableError
from dlctl.log.tls import TlsFiles, bound_context

from dlagent.server import AgentServer, ServerLimits
from dlagent.storage import SegmentStore
from harness.agents import AgentNode
from harness.procs import wait_until
from harness.tls import agent_tls, client_tls

pytestmark = pytest.mark.agent  # (tests using the zk fixture are marked zk by conftest)

LOG_ID, SEG = 42, 1
MiB = 1024 * 1024
PER_PEER = ServerLimits().max_unauthenticated_per_peer  # the default under test: 128
QUIET = "[scrub]\nenabled = false\n[auditor]\nenabled = false\n"  # nothing else opens files meanwhile


def entry(entry_id: int, payload: bytes | None = None, seg: int = SEG) -> bytes:
    body = payload if payload is not None else f"entry-{entry_id}-".encode() * 8
    return fmt.encode(fmt.Entry(LOG_ID, seg, entry_id, entry_id - 1, body))


class ClosedByAgent(Exception):
    pass


class Raw:
    """A raw protocol connection from ``source`` (an attacker, or a client that never reads):
    plain TCP, or with ``tls`` inside a TLS session with that certificate (its HMAC handshake
    bound to the session, as a real client's)."""

    def __init__(self, port: int, source: str = "127.0.0.1", timeout: float = 5.0, rcvbuf: int | None = None, tls: TlsFiles | None = None) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(timeout)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        self.sock = sock
        self.context = DEFAULT_CONTEXT
        if tls is not None:
            try:
                self.sock = tls.client().wrap_socket(sock, server_hostname="127.0.0.1")
            except BaseException:
                sock.close()
                raise
            self.context = bound_context(DEFAULT_CONTEXT, self.sock.getpeercert(binary_form=True))
        self.decoder = p.FrameDecoder()

    def close(self) -> None:
        self.sock.close()

    def frame(self) -> p.Frame | None:
        while True:
            frame = self.decoder.next_frame()
            if frame is not None:
                return frame
            try:
                data = self.sock.recv(1 << 20)
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return None  # the TLS session ended
            if not data:
                return None
            self.decoder.feed(data)

    def hello(self) -> bytes:
        frame = self.frame()
        if frame is None:
            raise ClosedByAgent("the agent closed the connection instead of saying HELLO")
        return p.decode_response(frame)  # raises the refusal, if it is one

    def authenticate(self, secret: bytes) -> None:
        hs = ClientHandshake(secret, self.context)
        self.sock.sendall(p.auth_request(1, *hs.respond(self.hello())))
        reply = self.frame()
        if reply is None:
            raise ClosedByAgent("the agent closed the connection during AUTH")
        hs.verify_server(p.decode_response(reply))

    def closed_by_agent(self) -> bool:
        try:
            while self.frame() is not None:
                pass
        except (ConnectionResetError, p.ProtocolError, ssl.SSLError):
            pass
        return True


def start(node: AgentNode, admin, nofile: tuple[int, int] | None = None) -> AgentNode:
    """Start ``node``'s agent, under ``prlimit --nofile=soft:hard`` if given."""
    argv = [sys.executable, "-m", "dlagent", "serve", "--config", str(node.config_path), "-v"]
    if nofile is not None:
        prlimit = shutil.which("prlimit")
        assert prlimit, "prlimit (util-linux) is needed to start an agent under a descriptor limit"
        argv = [prlimit, f"--nofile={nofile[0]}:{nofile[1]}", "--", *argv]
    node.proc = node.procs.start(argv, name=f"dlagent-{node.node_id}")
    node.wait_ready(admin)
    return node


def restart(node: AgentNode, admin) -> None:
    """Stop and start again (same limits): no replica file is open until something reads it."""
    assert node.proc is not None
    assert node.proc.terminate(timeout=15) == 0
    node.proc.start()
    node.wait_ready(admin)


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", text, re.M).group(1)) / 1024  # type: ignore[union-attr]


def server_stat(client: SyncAgentClient) -> dict:
    return client.stat()["server"]


@pytest.fixture
def admin(zk):
    return zk.client()


# -- which unauthenticated connection makes room (an AgentServer in this process) -------------------


def test_a_new_unauthenticated_connection_closes_the_oldest_of_its_own_address_or_of_the_busiest(tmp_path):
    """Per address over max_unauthenticated_per_peer: that address's oldest goes. All addresses
    over max_unauthenticated: the oldest of the address holding the most goes. Authenticated
    connections are never touched."""
    secret = b"a-secret-for-this-test-0123456789abcdef"

    async def main() -> None:
        store = SegmentStore(tmp_path / "data")
        await store.open()
        limits = ServerLimits(max_unauthenticated=4, max_unauthenticated_per_peer=2, handshake_timeout=30)
        server = AgentServer(store, secret, "127.0.0.1", 0, tls=agent_tls(tmp_path / "tls", "127.0.0.1"), limits=limits)
        await server.start()
        port = server.address[1]
        conns: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]] = {}
        client_files = client_tls()

        async def frame(reader: asyncio.StreamReader) -> p.Frame:
            decoder = p.FrameDecoder()
            head = await reader.readexactly(4)
            decoder.feed(head + await reader.readexactly(int.from_bytes(head, "big")))
            return decoder.next_frame()  # type: ignore[return-value]

        async def connect(name: str, source: str) -> None:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(source, 0), ssl=client_files.client(), server_hostname="127.0.0.1"
            )
            hello = await frame(reader)  # taken in (admission happens before HELLO is sent)
            conns[name] = (reader, writer, p.decode_response(hello))

        async def closed_by_agent(name: str) -> bool:
            reader = conns[name][0]
            try:
                async with asyncio.timeout(5):
                    await reader.read()  # returns at EOF only (after the agent's error frame)
            except (ConnectionResetError, ssl.SSLError):
                pass
            return True

        async def authenticates(name: str) -> bool:
            reader, writer, challenge = conns[name]
            peer_cert = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            hs = ClientHandshake(secret, bound_context(DEFAULT_CONTEXT, peer_cert))
            writer.write(p.auth_request(1, *hs.respond(challenge)))
            async with asyncio.timeout(5):
                hs.verify_server(p.decode_response(await frame(reader)))
            return True

        try:
            authed = AgentClient("127.0.0.1", port, secret, tls=client_files)
            await authed.connect()  # an authenticated connection from 127.0.0.1, all along
            await connect("a1", "127.0.0.2")
            await connect("a2", "127.0.0.2")
            await connect("a3", "127.0.0.2")  # over 2 for 127.0.0.2: a1 goes
            await connect("b1", "127.0.0.3")
            await connect("b2", "127.0.0.3")  # 4 unauthenticated: a2 a3 b1 b2, the budget is full
            await connect("c1", "127.0.0.4")  # 127.0.0.2 and .3 hold 2 each: the first, .2, loses a2
            assert await closed_by_agent("a1") and await closed_by_agent("a2")
            st = server.stat()
            assert st["unauthenticated_connections"] == 4 and st["evicted_unauthenticated"] == 2
            for name in ("a3", "b1", "b2", "c1"):
                assert await authenticates(name)  # still there, and served
            assert (await authed.stat())["server"]["authenticated_connections"] == 5
            await authed.close()
        finally:
            for _, writer, _ in conns.values():
                writer.close()
            await server.stop()
            await store.close()

    asyncio.run(main())


# -- connection floods --------------------------------------------------------------------------


def test_a_flood_of_unauthenticated_connections_from_one_peer_leaves_legitimate_clients_served(procs, tmp_path, zk, admin):
    """The issue's attack: 1,100 unauthenticated connections from one peer against an agent at
    nofile = 1024 took every slot and its descriptors (reads failed with EMFILE, the replica went
    to limbo). Now that peer holds at most max_unauthenticated_per_peer (128) at once, each new one
    closing its own oldest, while 20 clients on another address connect, write and read — with a
    second wave of the flood still arriving."""
    node = start(AgentNode(procs, tmp_path, zk.connect_string, extra_config=QUIET), admin, nofile=(1024, 1024))
    with node.client() as c:
        for i in range(10):
            c.add(entry(i))
    restart(node, admin)  # the replica's file is closed: the reads below must open it
    flood: list[Raw] = []
    try:
        for _ in range(1100):
            flood.append(Raw(node.port, source="127.0.0.2"))
        with node.client() as watcher:
            wait_until(
                lambda: server_stat(watcher)["evicted_unauthenticated"] >= 1100 - PER_PEER, 30,
                message="the agent to have taken in all 1,100 flood connections", watch=node.proc,
            )
            st = server_stat(watcher)
            assert st["unauthenticated_connections"] <= PER_PEER
            assert st["refused_connections"] == 0  # nobody was refused: the flood evicted itself
            assert st["fds_headroom"] > 512, st  # descriptors to spare, at the limit of 1,024

        second_wave_done = threading.Event()

        def second_wave() -> None:
            try:
                for _ in range(1000):
                    flood.append(Raw(node.port, source="127.0.0.2"))
            finally:
                second_wave_done.set()

        waver = threading.Thread(target=second_wave, daemon=True)
        waver.start()
        served = 0
        for k in range(20):
            with node.client(connect_timeout=10) as c:
                c.add(entry(0, seg=100 + k))
                assert c.read(LOG_ID, 100 + k, 0) == entry(0, seg=100 + k)
                assert c.read(LOG_ID, SEG, 5) == entry(5)
                served += 1
        waver.join(60)
        assert second_wave_done.is_set()
        assert served == 20
        with node.client() as c:
            st = c.stat()
            assert st["limbo"] == 0 and st["read_resource_errors"] == 0
            assert st["server"]["evicted_unauthenticated"] >= 2100 - PER_PEER
            assert st["server"]["unauthenticated_connections"] <= PER_PEER
        # The flood's connections were closed by the agent, not left hanging.
        assert sum(1 for r in flood[:100] if r.closed_by_agent()) == 100
    finally:
        for r in flood:
            r.close()


def test_unauthenticated_connections_never_take_a_slot_an_authenticated_client_needs(procs, tmp_path, zk, admin):
    """Every unauthenticated slot is kept full from 10 addresses; all max_connections (20)
    authenticated clients still get in; the 21st is refused for being over the total, which is
    the limit the flood could not touch."""
    limits = "[server]\nmax_connections = 20\nmax_unauthenticated = 32\nmax_unauthenticated_per_peer = 8\n"
    node = start(AgentNode(procs, tmp_path, zk.connect_string, extra_config=QUIET + limits), admin)
    flood: list[Raw] = []
    clients: list[SyncAgentClient] = []
    try:
        for i in range(400):
            flood.append(Raw(node.port, source=f"127.0.0.{2 + i % 10}"))
        for k in range(20):
            c = node.client(connect_timeout=10)
            clients.append(c)
            assert c.stat()["server"]["authenticated_connections"] == k + 1
        st = server_stat(clients[0])
        # The budget was full when the first client arrived (the agent accepts in arrival order):
        # it closed the oldest flood connection to make room, and each later client took the
        # slot the one before it left on authenticating.
        assert st["unauthenticated_connections"] == 31
        assert st["evicted_unauthenticated"] == 400 - 32 + 1
        assert st["refused_connections"] == 0
        with pytest.raises(AgentUnavailableError, match="too many connections"):
            with node.client() as extra:
                extra.stat()
    finally:
        for c in clients:
            c.close()
        for r in flood:
            r.close()


# -- a big frame before authentication ---------------------------------------------------------------


def test_a_16_mib_frame_before_authentication_is_refused_unread(procs, tmp_path, zk, admin):
    """The issue: 48 connections each sending a ~16 MiB frame before AUTH grew the agent by 807
    MiB. Now the length prefix alone closes the connection: the agent reads at most one socket
    read of each, and its memory does not move."""
    node = start(AgentNode(procs, tmp_path, zk.connect_string, extra_config=QUIET), admin)
    body = bytes(16 * MiB)
    with node.client() as watcher:
        before = server_stat(watcher)
        rss_before = rss_mib(node.proc.pid)
        sent: list[int] = []
        for i in range(48):
            raw = Raw(node.port, source=f"127.0.0.{2 + i % 4}", timeout=10, tls=node.client_tls)
            try:
                raw.hello()
                header = p.FRAME_HEADER.pack(16 * MiB + p.FRAME_HEADER_SIZE - 4, p.PROTOCOL_VERSION, p.Op.ADD_ENTRY, 0, 1)
                n = 0
                try:
                    raw.sock.sendall(header)
                    view = memoryview(body)
                    while n < len(body):
                        n += raw.sock.send(view[n : n + MiB])
                except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):
                    pass  # closed by the agent mid-send (under TLS, seen as an EOF): the point
                sent.append(n)
                assert raw.closed_by_agent()
            finally:
                raw.close()
        after = server_stat(watcher)
        rss_after = rss_mib(node.proc.pid)
    read_by_agent = after["unauthenticated_bytes"] - before["unauthenticated_bytes"]
    assert after["auth_failures"] - before["auth_failures"] == 48
    # Each connection: the HELLO exchange and at most one socket read (256 KiB) of the frame.
    assert read_by_agent <= 48 * 256 * 1024, read_by_agent
    assert min(sent) < 16 * MiB  # no connection got its whole frame in
    assert rss_after - rss_before < 32, (rss_before, rss_after)
    print(
        f"\n48 pre-auth 16 MiB frames: agent read {read_by_agent / MiB:.2f} MiB in all, clients got "
        f"{sum(sent) / MiB:.0f} MiB into socket buffers before the reset, agent RSS {rss_before:.1f} -> {rss_after:.1f} MiB"
    )


# -- answers count ----------------------------------------------------------------------------


def test_pipelined_large_reads_that_are_never_taken_are_bounded_by_max_response_bytes(procs, tmp_path, zk, admin):
    """An authenticated client pipelines 64 READ_RANGE requests of 8 MiB each (512 MiB of answers
    for 3 KiB of requests) and reads nothing: the agent queues at most max_response_bytes (16 MiB)
    plus one answer, stops reading that connection, and carries on once the client reads."""
    node = start(AgentNode(procs, tmp_path, zk.connect_string, extra_config=QUIET), admin)
    payload = bytes(MiB - fmt.HEADER_SIZE)
    with node.client() as c:
        for i in range(9):
            c.add(entry(i, payload))
    answer = 8 * MiB + 1024  # 8 entries of 1 MiB (the range's byte cap) and a response header
    limit = 16 * MiB
    rss_before = rss_mib(node.proc.pid)
    raw = Raw(node.port, rcvbuf=64 * 1024, timeout=30, tls=node.client_tls)
    try:
        raw.authenticate(node.secret)
        requests = b"".join(p.read_range_request(10 + k, LOG_ID, SEG, 0, 8, 8 * MiB) for k in range(64))
        raw.sock.sendall(requests)
        with node.client() as watcher:
            wait_until(lambda: server_stat(watcher)["response_bytes_peak"] >= limit, 30, message="answers queued up to the limit", watch=node.proc)
            handled = server_stat(watcher)["requests"]
            # Hold still: the agent is not reading the connection, so nothing more is handled.
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                st = server_stat(watcher)
                assert st["response_bytes_peak"] <= limit + answer + 1 * MiB, st["response_bytes_peak"]
                assert st["requests"] - handled <= 1  # the watcher's own STAT only
                handled = st["requests"]
                assert rss_mib(node.proc.pid) - rss_before < 100
            peak_rss = rss_mib(node.proc.pid)
        got = 0
        while got < 64:
            frame = raw.frame()
            assert frame is not None
            assert len(frame.body) > 8 * MiB - 1024
            got += 1
    finally:
        raw.close()
    print(f"\n64 x 8 MiB pipelined reads, not taken: agent RSS {rss_before:.1f} -> {peak_rss:.1f} MiB while held back")


def test_long_polls_and_fencing_reads_that_wait_read_their_entry_only_when_there_is_room(procs, tmp_path, zk, admin):
    """Requests answered from tasks (long polls, fencing reads) are all taken in at once (64 in
    flight) and would each queue a 1 MiB entry in the same instant; they wait for room instead."""
    node = start(AgentNode(procs, tmp_path, zk.connect_string, extra_config=QUIET), admin)
    payload = bytes(MiB - fmt.HEADER_SIZE)
    with node.client() as c:
        for i in range(9):
            c.add(entry(i, payload))  # LAC 7: a long poll from previous < 7 answers at once, with an entry
    limit, answer = 16 * MiB, MiB + 1024
    for kind in ("long poll", "fencing read"):
        raw = Raw(node.port, rcvbuf=64 * 1024, timeout=30, tls=node.client_tls)
        try:
            raw.authenticate(node.secret)
            if kind == "long poll":
                requests = [p.long_poll_request(10 + k, LOG_ID, SEG, k % 7 - 1, 1000) for k in range(64)]
            else:
                requests = [p.read_entry_request(10 + k, LOG_ID, SEG, k % 8, fence=True) for k in range(64)]
            raw.sock.sendall(b"".join(requests))
            with node.client() as watcher:
                wait_until(lambda: server_stat(watcher)["response_bytes_peak"] >= limit, 30, message=f"{kind} answers queued up to the limit", watch=node.proc)
                assert server_stat(watcher)["response_bytes_peak"] <= limit + answer + 1 * MiB
            got = 0
            while got < 64:
                frame = raw.frame()
                assert frame is not None and p.decode_response(frame)
                got += 1
        finally:
            raw.close()
    with node.client() as watcher:
        assert server_stat(watcher)["response_bytes_peak"] <= limit + answer + 1 * MiB


# -- descriptor exhaustion ------------------------------------------------------------------------


def test_descriptor_exhaustion_fails_reads_retryably_and_never_puts_a_replica_in_limbo(procs, tmp_path, zk, admin):
    """The agent runs at nofile 64 soft / 160 hard: it raises its soft limit to 160 itself.
    Authenticated connections then use up every descriptor; a read that must open its replica's
    file fails with the retryable AgentResourceError, stat shows headroom 0 and no limbo, and
    once the connections go the same read succeeds."""
    node = start(AgentNode(procs, tmp_path, zk.connect_string, extra_config=QUIET), admin, nofile=(64, 160))
    with node.client() as c:
        for i in range(10):
            c.add(entry(i))
        st = server_stat(c)
        assert st["fds_limit"] == 160 and st["fds_headroom"] > 60, st
    restart(node, admin)  # nothing has the replica's file open now
    reader = node.client(request_timeout=10)
    hogs: list[Raw] = []
    try:
        assert server_stat(reader)["fds_limit"] == 160
        for _ in range(300):
            try:
                raw = Raw(node.port, timeout=2, tls=node.client_tls)
            except OSError:  # (ssl.SSLError is one)
                break
            hogs.append(raw)
            try:
                raw.authenticate(node.secret)
            except (TimeoutError, ConnectionResetError, ClosedByAgent):
                break  # not accepted any more (or accepted and dropped at once): out of descriptors
        else:
            raise AssertionError("300 connections and the agent still had descriptors")
        assert len(hogs) > 60
        wait_until(lambda: server_stat(reader)["fds_headroom"] == 0, 10, message="the agent to be out of descriptors", watch=node.proc)
        with pytest.raises(AgentResourceError, match="short of a resource") as caught:
            reader.read(LOG_ID, SEG, 3)
        assert "Too many open files" in str(caught.value)
        st = reader.stat()
        assert st["limbo"] == 0 and st["read_resource_errors"] >= 1, st
        for raw in hogs:
            raw.close()
        hogs.clear()
        assert wait_until(lambda: reader.read(LOG_ID, SEG, 3), 20, message="the read to succeed again", ignore=(AgentResourceError,)) == entry(3)
        st = reader.stat()
        assert st["limbo"] == 0 and st["server"]["fds_headroom"] > 60
        assert [reader.read(LOG_ID, SEG, i) for i in range(10)] == [entry(i) for i in range(10)]
    finally:
        reader.close()
        for raw in hogs:
            raw.close()
    assert not list(node.data_dir.rglob("*.limbo"))
    restart(node, admin)
    with node.client() as c:
        assert c.stat()["limbo"] == 0 and c.read(LOG_ID, SEG, 9) == entry(9)


# -- logging ------------------------------------------------------------------------------------


def test_a_flood_of_rejected_connections_logs_a_bounded_number_of_lines(procs, tmp_path, zk, admin):
    """2,000 connections that send a request before authenticating, each refused and closed:
    at most one log line per second for that reason, and the lines that were held back are
    counted in the ones that were written, so the log still adds up to 2,000."""
    node = start(AgentNode(procs, tmp_path, zk.connect_string, extra_config=QUIET), admin)
    log_path = node.proc.log_path
    offset = log_path.stat().st_size
    started = time.monotonic()
    for i in range(2000):
        raw = Raw(node.port, source=f"127.0.0.{2 + i % 8}", tls=node.client_tls)
        try:
            raw.hello()
            raw.sock.sendall(p.stat_request(7))
            reply = raw.frame()
            assert reply is not None and reply.body[0] == 5  # UNAUTHORIZED
        finally:
            raw.close()
    elapsed = time.monotonic() - started
    pattern = re.compile(r"closing connection from [\d.:]+: STAT before authentication")
    held = re.compile(r"\(and (\d+) more requests before authentication since|(\d+) more requests before authentication in the last")

    def accounted() -> tuple[int, int]:
        text = log_path.read_bytes()[offset:].decode(errors="replace")
        lines = [line for line in text.splitlines() if "before authentication" in line]
        counted = sum(1 for line in lines if pattern.search(line)) + sum(int(a or b) for a, b in held.findall(text))
        return counted, len(lines)

    counted, lines = wait_until(lambda: (r := accounted())[0] == 2000 and r, 10, message="the log to account for all 2,000 refusals")
    assert lines <= 2 * (elapsed + 2), (lines, elapsed)  # about one a second (+ the reports of what was held back)
    with node.client() as c:
        st = server_stat(c)
    assert st["auth_failures"] == 2000 and st["log_lines_suppressed"] >= 2000 - lines
    print(f"\n2,000 refused connections in {elapsed:.1f}s: {lines} log lines")
