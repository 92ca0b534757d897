"""The fault proxy's faults are real TCP behaviour: latency, silence, resets, partitions."""

from __future__ import annotations

import socket
import socketserver
import statistics
import threading
import time
from collections.abc import Iterator

import pytest

from harness.faultproxy import FaultNetwork, FaultProxy
from harness.procs import free_port, wait_until

# Addresses of their own, so these tests never meet sshd nodes (127.0.1.x...) of the session.
EAST_A, EAST_B, WEST_A = "127.0.201.1", "127.0.201.2", "127.0.202.1"
SHORT = 0.5  # how long "no answer" is awaited; nothing on loopback takes this long


class EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str) -> None:
        self.peers: list[str] = []
        super().__init__((host, free_port(host)), EchoHandler)


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.server.peers.append(self.client_address[0])  # type: ignore[attr-defined]
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except ConnectionResetError:
            pass  # the proxy resets connections on purpose


@pytest.fixture
def echo_servers() -> Iterator[dict[str, EchoServer]]:
    servers = {addr: EchoServer(addr) for addr in (EAST_A, EAST_B, WEST_A)}
    for s in servers.values():
        threading.Thread(
            target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
    yield servers
    for s in servers.values():
        s.shutdown()
        s.server_close()


@pytest.fixture
def net(fault_network: FaultNetwork, echo_servers: dict[str, EchoServer]) -> FaultNetwork:
    fault_network.add_node("ea", "east", EAST_A)
    fault_network.add_node("eb", "east", EAST_B)
    fault_network.add_node("wa", "west", WEST_A)
    for addr, server in echo_servers.items():
        fault_network.proxy(server.server_address)  # labelled from the registered node
    return fault_network


def proxy_for(net: FaultNetwork, node: str) -> FaultProxy:
    return next(p for p in net.proxies if p.endpoint.node == node)


def connect(proxy: FaultProxy, source: str | None = None) -> socket.socket:
    s = socket.create_connection(
        proxy.address, timeout=5, source_address=(source, 0) if source else None
    )
    s.settimeout(5)
    return s


def echoes(sock: socket.socket, payload: bytes = b"ping", timeout: float = 5.0) -> bool:
    """Send ``payload`` and say whether it comes back within ``timeout``."""
    sock.settimeout(timeout)
    sock.sendall(payload)
    got = b""
    try:
        while len(got) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                return False
            got += chunk
    except TimeoutError:
        return False
    assert got == payload
    return True


def round_trip(sock: socket.socket) -> float:
    started = time.perf_counter()
    assert echoes(sock)
    return time.perf_counter() - started


def test_forwards_and_keeps_the_client_source_address(
    net: FaultNetwork, echo_servers: dict[str, EchoServer]
) -> None:
    with connect(proxy_for(net, "wa"), source=EAST_A) as s:
        assert echoes(s, b"hello" * 10000)
    assert echo_servers[WEST_A].peers == [EAST_A]


def test_delay_adds_about_twice_the_one_way_delay_to_a_round_trip(net: FaultNetwork) -> None:
    proxy = proxy_for(net, "wa")
    with connect(proxy) as s:
        base = statistics.median(round_trip(s) for _ in range(5))
        proxy.set_delay(0.15)
        delayed = statistics.median(round_trip(s) for _ in range(3))
        proxy.set_delay(0)
        after = round_trip(s)
    assert 0.28 <= delayed - base <= 0.8, (base, delayed)
    assert after < 0.25  # well under the 0.3 s a leftover delay would cost


def test_region_link_delay_applies_across_regions_only(net: FaultNetwork) -> None:
    net.set_link_delay("east", "west", 0.1)
    cross = connect(proxy_for(net, "wa"), source=EAST_A)
    local = connect(proxy_for(net, "eb"), source=EAST_A)
    with cross, local:
        assert 0.18 <= round_trip(cross) <= 0.8
        assert round_trip(local) < 0.15  # a link delay would cost >= 0.2 s


def test_partition_cuts_regions_apart_and_heal_restores_traffic(net: FaultNetwork) -> None:
    to_west, to_east = proxy_for(net, "wa"), proxy_for(net, "eb")
    existing = connect(to_west, source=EAST_A)
    assert echoes(existing)

    net.partition("east", "west")

    assert not echoes(existing, b"lost?", timeout=SHORT)  # open, but silent
    fresh = connect(to_west, source=EAST_A)  # accepted by the proxy, never forwarded
    assert not echoes(fresh, b"new", timeout=SHORT)
    with connect(to_east, source=EAST_A) as same_region:
        assert echoes(same_region)
    with connect(proxy_for(net, "ea"), source=WEST_A) as other_way:
        assert not echoes(other_way, timeout=SHORT)

    net.heal()

    # What was sent during the partition arrives, in order, like TCP retransmissions.
    existing.settimeout(5)
    assert existing.recv(5) == b"lost?"
    fresh.settimeout(5)
    assert fresh.recv(3) == b"new"
    assert echoes(existing) and echoes(fresh)
    with connect(to_west, source=EAST_A) as after:
        assert echoes(after)
    existing.close()
    fresh.close()


def test_one_way_partition_drops_only_one_direction(net: FaultNetwork) -> None:
    net.partition("east", "west", one_way=True)
    with connect(proxy_for(net, "wa"), source=EAST_A) as s:
        assert not echoes(s, timeout=SHORT)
    net.heal()


def test_partition_between_two_nodes_leaves_the_rest_alone(net: FaultNetwork) -> None:
    net.partition_nodes("ea", "wa")
    cut = connect(proxy_for(net, "wa"), source=EAST_A)
    neighbour = connect(proxy_for(net, "wa"), source=EAST_B)
    with cut, neighbour:
        assert not echoes(cut, timeout=SHORT)
        assert echoes(neighbour)
        net.heal("ea", "wa")
        cut.settimeout(5)
        assert cut.recv(4) == b"ping"


def test_path_proxy_labels_its_clients_without_source_binding(
    net: FaultNetwork, echo_servers: dict[str, EchoServer]
) -> None:
    path = net.proxy(echo_servers[WEST_A].server_address, client_region="east", name="east->wa")
    assert path.endpoint.region == "west"
    net.partition("east", "west")
    with connect(path) as s:  # from 127.0.0.1, yet counted as east
        assert not echoes(s, timeout=SHORT)
    net.heal()


def test_drop_connections_resets_live_connections(net: FaultNetwork) -> None:
    proxy = proxy_for(net, "wa")
    live = connect(proxy)
    assert echoes(live)
    wait_until(lambda: proxy.active_connections == 1, 5, message="the proxy to track it")

    assert proxy.drop_connections() == 1

    with pytest.raises(ConnectionResetError):
        live.sendall(b"x")
        live.recv(1)
    live.close()
    with connect(proxy) as again:
        assert echoes(again)


def test_blackhole_silences_then_resumes(net: FaultNetwork) -> None:
    proxy = proxy_for(net, "wa")
    with connect(proxy) as s:
        proxy.blackhole(True)
        assert not echoes(s, b"into the void", timeout=SHORT)
        up_before = proxy.bytes_forwarded["up"]
        proxy.blackhole(False)
        s.settimeout(5)
        assert s.recv(64) == b"into the void"
        assert proxy.bytes_forwarded["up"] > up_before


def test_refuse_resets_new_connections_only(net: FaultNetwork) -> None:
    proxy = proxy_for(net, "wa")
    with connect(proxy) as existing:
        assert echoes(existing)  # the proxy has accepted it (connect() returns before that)
        proxy.refuse(True)
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            with connect(proxy) as refused:
                refused.sendall(b"x")
                if refused.recv(1) == b"":
                    raise ConnectionResetError("closed")
        assert echoes(existing)
        proxy.refuse(False)
    with connect(proxy) as s:
        assert echoes(s)


def test_close_stops_listening_and_resets(echo_servers: dict[str, EchoServer]) -> None:
    network = FaultNetwork()
    proxy = network.proxy(echo_servers[EAST_A].server_address)
    s = connect(proxy)
    assert echoes(s)
    network.close()
    with pytest.raises(ConnectionResetError):
        s.sendall(b"x")
        s.recv(1)
    s.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=2)


def test_reset_clears_every_fault(net: FaultNetwork) -> None:
    proxy = proxy_for(net, "wa")
    net.partition("east", "west")
    net.set_link_delay("east", "west", 1.0)
    proxy.set_delay(1.0)
    proxy.blackhole(True)
    proxy.refuse(True)

    net.reset()

    with connect(proxy, source=EAST_A) as s:
        assert round_trip(s) < 0.5
