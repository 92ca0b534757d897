"""Mutual TLS on the agent protocol, attacked: real agent servers, real TCP relays on loopback.

* clients without a cluster certificate (plaintext, a foreign CA, none at all) are refused in the
  TLS handshake, before any request;
* a relay on the path cannot inject a frame into an authenticated TLS session (it can into a
  plaintext one: the control that shows the attack works);
* a relay holding a valid cluster certificate that terminates TLS and forwards the HMAC
  handshake is refused, because the proofs are bound to the certificate the agent presented
  (without the binding the same relay authenticates and deletes a segment: the control);
* TLS handshakes count in the pre-authentication budget;
* the files are re-read when they change: a rotated certificate is served to new connections
  while an open one keeps working.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from dlctl import pki
from dlctl.log import format as fmt
from dlctl.log import protocol as p
from dlctl.log import tls as tls_module
from dlctl.log.client import AgentClient
from dlctl.log.errors import AgentError, AgentUnavailableError, UnauthorizedError
from dlctl.log.tls import TlsFiles
from dlctl.secrets import write_secret_file
from dlagent.limits import ServerLimits
from dlagent.server import AgentServer
from dlagent.storage import SegmentStore

pytestmark = pytest.mark.agent

SECRET = b"tls-test-cluster-secret-0123456789"
HOST = "127.0.0.1"


class Pki:
    """A cluster CA and a directory to issue TLS files into."""

    def __init__(self, root: Path, cluster: str = "east") -> None:
        self.root = root
        self.ca = pki.new_ca(cluster)

    def files(self, name: str, *, names: list[str] = (), server: bool = True, ca: pki.Issued | None = None, trust: bytes | None = None) -> TlsFiles:  # type: ignore[assignment]
        issued = pki.issue(ca or self.ca, name, list(names), server=server)
        d = self.root / name
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        for fname, data in (("ca.pem", trust or self.ca.cert_pem), ("cert.pem", issued.cert_pem), ("key.pem", issued.key_pem)):
            write_secret_file(d / fname, data)
        return TlsFiles(d / "ca.pem", d / "cert.pem", d / "key.pem")


@contextlib.asynccontextmanager
async def agent(tmp: Path, tls: TlsFiles | None, limits: ServerLimits = ServerLimits()):
    store = SegmentStore(tmp / "data")
    await store.open()
    server = AgentServer(store, SECRET, HOST, 0, tls=tls, limits=limits)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        await store.close()


def entry(seq: int, entry_id: int, size: int = 100) -> bytes:
    return fmt.encode(fmt.Entry(1, seq, entry_id, entry_id - 1, os.urandom(size)))


class Relay:
    """A TCP relay between clients and an agent; ``inject`` puts bytes into the client→agent
    stream of the current connection. ``terminate``: it ends TLS itself with its own
    certificate and opens its own TLS session to the agent, forwarding the plaintext frames."""

    def __init__(self, upstream: tuple[str, int], *, terminate: tuple[ssl.SSLContext, ssl.SSLContext] | None = None) -> None:
        self.upstream = upstream
        self.terminate = terminate
        self.to_agent: asyncio.StreamWriter | None = None
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        server_ctx = self.terminate[0] if self.terminate else None
        self.server = await asyncio.start_server(self._serve, HOST, 0, ssl=server_ctx)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client_ctx = self.terminate[1] if self.terminate else None
        up_reader, up_writer = await asyncio.open_connection(*self.upstream, ssl=client_ctx, server_hostname=HOST if client_ctx else None)
        self.to_agent = up_writer

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    async def inject(self, frame: bytes) -> None:
        """Bytes into the agent-bound stream: beneath TLS when the relay only forwards (what an
        on-path attacker can do), inside its own session when it terminates TLS."""
        assert self.to_agent is not None, "no connection through the relay yet"
        self.to_agent.write(frame)
        await self.to_agent.drain()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def _eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.05)
    return False


# -- refused before any operation ----------------------------------------------------------------


def test_clients_without_a_cluster_certificate_are_refused_before_any_request(tmp_path: Path) -> None:
    certs = Pki(tmp_path / "pki")
    other = Pki(tmp_path / "other", "evil")

    async def main() -> None:
        async with agent(tmp_path, certs.files("agent", names=[HOST])) as server:
            port = server.address[1]
            async with AgentClient(HOST, port, SECRET, tls=certs.files("operator", server=False)) as good:
                await good.add(entry(1, 0))  # the control: a cluster client is served
            before = server.stat()["requests"]
            attempts = {
                "plaintext": AgentClient(HOST, port, SECRET, connect_timeout=1.0),
                "foreign CA client certificate": AgentClient(HOST, port, SECRET, tls=other.files("intruder", server=False, trust=certs.ca.cert_pem), connect_timeout=3.0),
                "client trusting another CA": AgentClient(HOST, port, SECRET, tls=other.files("lost", server=False), connect_timeout=3.0),
            }
            for what, client in attempts.items():
                with pytest.raises(AgentUnavailableError):
                    await client.delete_segment(1, 1)
                await client.close()
            # No request of theirs reached the protocol; the segment is intact.
            assert server.stat()["requests"] == before
            # The two certificate failures ended in the TLS layer (the plaintext client just
            # timed out waiting for a HELLO that never comes).
            assert await _eventually(lambda: _true(server.stat()["tls_failures"] >= 2))
            async with AgentClient(HOST, port, SECRET, tls=certs.files("operator2", server=False)) as check:
                assert len(await check.read(1, 1, 0)) == fmt.HEADER_SIZE + 100

    asyncio.run(main())


def test_client_without_any_certificate_is_refused(tmp_path: Path) -> None:
    certs = Pki(tmp_path / "pki")

    async def main() -> None:
        async with agent(tmp_path, certs.files("agent", names=[HOST])) as server:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.load_verify_locations(cadata=certs.ca.cert_pem.decode())
            reader, writer = await asyncio.open_connection(HOST, server.address[1], ssl=ctx, server_hostname=HOST)
            # TLS 1.3: the agent checks the client's (missing) certificate after the client's
            # Finished; what comes back is the alert or EOF, never the HELLO challenge.
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                await asyncio.wait_for(reader.readexactly(p.FRAME_HEADER_SIZE), 5.0)
            writer.close()
            assert server.stat()["requests"] == 0

    asyncio.run(main())


# -- injection -----------------------------------------------------------------------------------


async def _inject_delete(tmp_path: Path, server_tls: TlsFiles | None, client_tls: TlsFiles | None) -> bool:
    """Through an on-path relay: a client writes segment 1/1, the relay injects DELETE_SEGMENT
    into that client's authenticated stream. Returns whether the segment was deleted."""
    async with agent(tmp_path, server_tls) as server:
        relay = Relay(server.address)
        port = await relay.start()
        client = AgentClient(HOST, port, SECRET, tls=client_tls, connect_timeout=5.0)
        try:
            await client.add(entry(1, 0))
            await relay.inject(p.delete_segment_request(0x7FFF0001, 1, 1))
            with contextlib.suppress(AgentError):
                await client.stat()  # whatever the injection did to this connection, it is done
        finally:
            await client.close()
            await relay.close()
        direct = AgentClient(*server.address, SECRET, tls=client_tls)
        try:
            return not any(s.log_id == 1 and s.segment_seq == 1 for s in await direct.list_segments())
        finally:
            await direct.close()


def test_a_relay_cannot_inject_a_frame_into_a_tls_session(tmp_path: Path) -> None:
    certs = Pki(tmp_path / "pki")
    deleted = asyncio.run(_inject_delete(tmp_path / "tls", certs.files("agent", names=[HOST]), certs.files("operator", server=False)))
    assert not deleted, "a frame injected under TLS was executed"


def test_control_the_same_relay_injects_into_plaintext(tmp_path: Path) -> None:
    # Shows the relay's injection is a real attack: without TLS it deletes the segment.
    assert asyncio.run(_inject_delete(tmp_path / "plain", None, None)), "the injection control did not delete the segment"


# -- channel binding -----------------------------------------------------------------------------


async def _terminating_relay_attack(tmp_path: Path) -> tuple[bool, bool]:
    """A relay with a *valid* cluster certificate (a stolen member's) terminates the client's
    TLS and opens its own to the agent, forwarding the handshake. Returns (authenticated,
    deleted): whether the relayed client got in, and whether the relay's injected delete ran."""
    certs = Pki(tmp_path / "pki")
    stolen = certs.files("stolen-member", names=[HOST])
    relay_server_ctx, _ = stolen.server()
    relay_client_ctx = stolen.client()
    async with agent(tmp_path, certs.files("agent", names=[HOST])) as server:
        relay = Relay(server.address, terminate=(relay_server_ctx, relay_client_ctx))
        port = await relay.start()
        client = AgentClient(HOST, port, SECRET, tls=certs.files("operator", server=False), connect_timeout=5.0)
        authenticated = False
        try:
            await client.add(entry(1, 0))
            authenticated = True
            await relay.inject(p.delete_segment_request(0x7FFF0002, 1, 1))
            await client.stat()
        except (UnauthorizedError, AgentUnavailableError):
            pass
        finally:
            await client.close()
            await relay.close()
        direct = AgentClient(*server.address, SECRET, tls=certs.files("checker", server=False))
        try:
            segments = await direct.list_segments()
        finally:
            await direct.close()
        deleted = authenticated and not any(s.log_id == 1 and s.segment_seq == 1 for s in segments)
        return authenticated, deleted


def test_the_handshake_is_bound_to_the_tls_channel(tmp_path: Path) -> None:
    authenticated, deleted = asyncio.run(_terminating_relay_attack(tmp_path))
    assert not authenticated, "a client's proof was accepted through a TLS-terminating relay"
    assert not deleted


def test_control_without_the_binding_the_terminating_relay_gets_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both ends lose the binding (the proofs cover only the protocol context): the relay
    # forwards the proofs, is authenticated on both legs, and its injected delete runs.
    import dlagent.server
    import dlctl.log.client

    unbound = lambda context, der: context  # noqa: E731
    monkeypatch.setattr(dlagent.server, "bound_context", unbound)
    monkeypatch.setattr(dlctl.log.client, "bound_context", unbound)
    authenticated, deleted = asyncio.run(_terminating_relay_attack(tmp_path))
    assert authenticated and deleted


def test_binding_is_the_end_point_hash_of_the_agent_certificate() -> None:
    der = b"certificate bytes"
    assert tls_module.channel_binding(der) == b"tls-server-end-point:" + hashlib.sha256(der).digest()
    assert tls_module.bound_context(b"ctx", None) == b"ctx"
    assert tls_module.bound_context(b"ctx", der) != tls_module.bound_context(b"ctx", b"another certificate")


# -- limits and rotation ---------------------------------------------------------------------------


def test_tls_handshakes_count_in_the_pre_authentication_budget(tmp_path: Path) -> None:
    certs = Pki(tmp_path / "pki")
    limits = ServerLimits(max_unauthenticated=8, max_unauthenticated_per_peer=8, handshake_timeout=30)

    async def main() -> None:
        async with agent(tmp_path, certs.files("agent", names=[HOST]), limits) as server:
            silent = [await asyncio.open_connection(HOST, server.address[1]) for _ in range(40)]
            assert await _eventually(lambda: _true(server.stat()["unauthenticated_connections"] <= 8))
            async with AgentClient(HOST, server.address[1], SECRET, tls=certs.files("operator", server=False)) as client:
                await client.add(entry(1, 0))  # served although 40 idle handshakes came first
            assert server.stat()["evicted_unauthenticated"] >= 32
            for _, writer in silent:
                writer.close()

    asyncio.run(main())


async def _true(value: bool) -> bool:
    return value


def test_rotated_files_are_served_to_new_connections_while_open_ones_keep_working(tmp_path: Path) -> None:
    certs = Pki(tmp_path / "pki")
    files = certs.files("agent", names=[HOST])

    async def presented(port: int) -> str:
        ctx = certs.files("probe", server=False).client()
        _, writer = await asyncio.open_connection(HOST, port, ssl=ctx, server_hostname=HOST)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return hashlib.sha256(der).hexdigest()

    async def main() -> None:
        async with agent(tmp_path, files) as server:
            port = server.address[1]
            old = await presented(port)
            long_lived = AgentClient(HOST, port, SECRET, tls=certs.files("operator", server=False))
            await long_lived.add(entry(1, 0))
            # Rotate: a new pair, key first (the agent keeps its old pair until both match).
            fresh = pki.issue(certs.ca, "agent", [HOST])
            write_secret_file(files.key_file, fresh.key_pem)
            assert await presented(port) == old  # a mismatched pair is never served
            write_secret_file(files.cert_file, fresh.cert_pem)
            assert await presented(port) == pki.describe(fresh.cert_pem).fingerprint
            for i in range(1, 50):  # the connection opened before the rotation still works
                await long_lived.add(entry(1, i))
            assert len(await long_lived.read(1, 1, 49)) == fmt.HEADER_SIZE + 100
            await long_lived.close()

    asyncio.run(main())
