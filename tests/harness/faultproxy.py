"""A TCP fault-injection network for tests: latency, resets, blackholes, refusals, partitions.

A ``FaultNetwork`` runs one asyncio loop in a background thread and owns many ``FaultProxy``
listeners. Each proxy fronts one target (an agent, a ZooKeeper server...) and is labelled with
the target's node and region. A connection's *source* is found from the address the client
connected from (clients bind to their node's loopback address, ``127.0.<region>.<n>``, and
nodes are registered with ``add_node``) or, for a proxy made for one path, from the
``client_node``/``client_region`` it was created with. So "region A talking to region B" is
every connection whose source is in A and whose proxy fronts a node in B.

Faults model a network, not a broken program:

* A partition or blackhole stops forwarding but keeps every socket open and every byte
  buffered, like packets dropped while TCP keeps retransmitting: the sender's writes stall once
  buffers fill, and the peer's reads time out. Healing resumes forwarding, in order, on
  existing connections; new connections made while cut are accepted by the proxy but only
  connected onwards when healed (a real partition would leave ``connect()`` hanging instead).
* Delay is added per chunk and per direction, never reordering (``due = max(previous due,
  arrival + delay)``), so it is latency, not a bandwidth cap.
* ``drop_connections`` and ``refuse`` send RSTs (SO_LINGER 0), so peers see
  ``ConnectionResetError``.

Control methods are thread-safe and synchronous: when one returns, its effect is in force.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .procs import free_port

T = TypeVar("T")

UP = "up"  # client -> target
DOWN = "down"  # target -> client
CHUNK = 65536


@dataclass(frozen=True)
class Endpoint:
    node: str | None = None
    region: str | None = None


class _NodeLike(Protocol):
    name: str
    region: str
    address: str


def _rst_close(writer: asyncio.StreamWriter | None) -> None:
    """Close with an RST instead of a FIN, as a crashed peer or a firewall reject would."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class _Connection:
    """One proxied connection: two pumps (up, down), each gated and delayed independently."""

    def __init__(
        self,
        proxy: FaultProxy,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        src: Endpoint,
    ) -> None:
        self.proxy = proxy
        self.client_reader = reader
        self.client_writer = writer
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.src = src
        self.gates = {UP: asyncio.Event(), DOWN: asyncio.Event()}
        self.task: asyncio.Task[None] | None = None
        self.refresh()

    @property
    def peer_ip(self) -> str:
        peer = self.client_writer.get_extra_info("peername")
        return peer[0] if peer else "127.0.0.1"

    def refresh(self) -> None:
        """Open or close each direction's gate from the proxy's and the network's state."""
        net, dst = self.proxy.network, self.proxy.endpoint
        for direction, (a, b) in ((UP, (self.src, dst)), (DOWN, (dst, self.src))):
            blocked = self.proxy.blackholed or net.is_cut(a, b)
            if blocked:
                self.gates[direction].clear()
            else:
                self.gates[direction].set()

    def delay(self, direction: str) -> float:
        dst = self.proxy.endpoint
        a, b = (self.src, dst) if direction == UP else (dst, self.src)
        jitter = self.proxy.jitter
        extra = random.uniform(0.0, jitter) if jitter > 0 else 0.0
        return self.proxy.delay + extra + self.proxy.network.link_delay(a.region, b.region)

    async def _gate(self, direction: str) -> None:
        # Re-check after every wake-up: a heal immediately followed by a partition must not
        # let a chunk slip through.
        gate = self.gates[direction]
        while not gate.is_set():
            await gate.wait()

    async def run(self) -> None:
        try:
            while not (self.gates[UP].is_set() and self.gates[DOWN].is_set()):
                await self._gate(UP)
                await self._gate(DOWN)
            host, port = self.proxy.target
            try:
                # Keep the client's source address so the target (or a proxy behind it) still
                # sees which node is talking.
                up_reader, self.upstream_writer = await asyncio.open_connection(
                    host, port, local_addr=(self.peer_ip, 0)
                )
            except OSError:
                _rst_close(self.client_writer)
                return
            pumps = [
                asyncio.ensure_future(self._pump(UP, self.client_reader, self.upstream_writer)),
                asyncio.ensure_future(self._pump(DOWN, up_reader, self.client_writer)),
            ]
            try:
                done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
                if any(t.exception() is not None for t in done):
                    # One side reset the connection: reset the other side too, as the end
                    # host itself would have.
                    self.reset()
                else:
                    await asyncio.gather(*pumps)
                    self.client_writer.close()
                    self.upstream_writer.close()
            finally:
                for t in pumps:
                    t.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except (ConnectionError, OSError):
            self.reset()
        finally:
            self.proxy._connections.discard(self)

    async def _pump(
        self, direction: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        # Bounded, so a closed gate or a slow reader pushes back on the sender as TCP would.
        queue: asyncio.Queue[tuple[float, bytes | BaseException]] = asyncio.Queue(maxsize=64)

        async def read_side() -> None:
            last_due = 0.0
            while True:
                try:
                    data: bytes | BaseException = await reader.read(CHUNK)
                except (ConnectionError, OSError) as e:
                    data = e
                last_due = max(last_due, loop.time() + self.delay(direction))
                await queue.put((last_due, data))
                if not isinstance(data, bytes) or not data:
                    return

        async def write_side() -> None:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._gate(direction)
                if isinstance(data, BaseException):
                    raise data
                if not data:
                    if writer.can_write_eof() and not writer.is_closing():
                        writer.write_eof()
                    return
                writer.write(data)
                self.proxy.bytes_forwarded[direction] += len(data)
                await writer.drain()

        reader_task = asyncio.ensure_future(read_side())
        try:
            await write_side()
        finally:
            reader_task.cancel()
            await asyncio.gather(reader_task, return_exceptions=True)

    def reset(self) -> None:
        _rst_close(self.client_writer)
        _rst_close(self.upstream_writer)
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
        self.proxy._connections.discard(self)


class FaultProxy:
    """Listens on ``address`` and forwards to ``target``; faults are switched at run time."""

    def __init__(
        self,
        network: FaultNetwork,
        target: tuple[str, int],
        listen: tuple[str, int],
        endpoint: Endpoint,
        client: Endpoint | None,
        name: str,
    ) -> None:
        self.network = network
        self.target = target
        self.address = listen
        self.endpoint = endpoint
        self.client = client
        self.name = name
        self.delay = 0.0
        self.jitter = 0.0
        self.blackholed = False
        self.refusing = False
        self.accepted = 0
        self.bytes_forwarded = {UP: 0, DOWN: 0}
        self._connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    @property
    def host(self) -> str:
        return self.address[0]

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def active_connections(self) -> int:
        return len(self._connections)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.address[0], self.address[1], reuse_address=True
        )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.refusing:
            _rst_close(writer)
            return
        peer = writer.get_extra_info("peername")
        src = self.client or self.network.endpoint_of(peer[0] if peer else "")
        conn = _Connection(self, reader, writer, src)
        self._connections.add(conn)
        conn.task = asyncio.current_task()
        try:
            await conn.run()
        except asyncio.CancelledError:
            pass

    # -- controls (any thread) ---------------------------------------------------------------

    def set_delay(self, seconds: float, jitter: float = 0.0) -> None:
        """Add ``seconds`` (+ up to ``jitter``) of one-way latency to each direction."""
        self.delay, self.jitter = float(seconds), float(jitter)

    def drop_connections(self) -> int:
        """Reset every live connection (both sides get an RST). Returns how many."""

        def drop() -> int:
            conns = list(self._connections)
            for c in conns:
                c.reset()
            return len(conns)

        return self.network._call(drop)

    def blackhole(self, on: bool = True) -> None:
        """Keep connections open but forward nothing (buffered data flows again when off)."""
        self.blackholed = on
        self.network._call(self._refresh)

    def refuse(self, on: bool = True) -> None:
        """New connections are reset as soon as they are accepted."""
        self.refusing = on

    def reset_faults(self) -> None:
        self.set_delay(0.0)
        self.refuse(False)
        self.blackhole(False)

    def close(self) -> None:
        self.network._call(self._close_now)

    def _refresh(self) -> None:
        for c in list(self._connections):
            c.refresh()

    def _close_now(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self._connections):
            c.reset()

    def __repr__(self) -> str:
        return (
            f"<FaultProxy {self.name} {self.host}:{self.port} -> {self.target[0]}:{self.target[1]}"
            f" node={self.endpoint.node} region={self.endpoint.region}>"
        )


class FaultNetwork:
    """Many proxies, one loop thread, and the partition table they all consult."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fault-network", daemon=True
        )
        self._thread.start()
        self._nodes: dict[str, Endpoint] = {}  # address -> endpoint
        self._regions_of_nodes: dict[str, str] = {}
        self._cuts: set[tuple[str, str, str]] = set()  # (kind, from, to); kind: region | node
        self._link_delays: dict[tuple[str, str], float] = {}
        self.proxies: list[FaultProxy] = []
        self._closed = False

    def _call(self, fn: Callable[[], T] | Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
        """Run ``fn`` in the loop thread and return its result (so effects are in force)."""
        if self._closed:
            raise RuntimeError("FaultNetwork is closed")

        async def run() -> Any:
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result

        if threading.current_thread() is self._thread:
            raise RuntimeError("FaultNetwork controls must not be called from its own loop")
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    # -- topology ----------------------------------------------------------------------------

    def add_node(self, name: str, region: str, address: str) -> None:
        """Register a node so connections from ``address`` are attributed to it."""
        self._nodes[address] = Endpoint(name, region)
        self._regions_of_nodes[name] = region

    def add_nodes(self, nodes: Iterable[_NodeLike]) -> None:
        for n in nodes:
            self.add_node(n.name, n.region, n.address)

    def endpoint_of(self, address: str) -> Endpoint:
        return self._nodes.get(address, Endpoint())

    def proxy(
        self,
        target: tuple[str, int],
        *,
        node: str | None = None,
        region: str | None = None,
        listen: tuple[str, int] | None = None,
        client_node: str | None = None,
        client_region: str | None = None,
        name: str | None = None,
    ) -> FaultProxy:
        """A proxy in front of ``target``; connect to ``proxy.address`` instead of the target.

        The target's labels default to the registered node at the target's address. Listens on
        the target's host (a free port) unless ``listen`` is given. ``client_node`` /
        ``client_region`` label every connection through this proxy as coming from there
        (a per-path proxy); otherwise the source is looked up from the client's address.
        """
        known = self.endpoint_of(target[0])
        node = node or known.node
        region = region or known.region or (self._regions_of_nodes.get(node) if node else None)
        client = None
        if client_node or client_region:
            client = Endpoint(
                client_node,
                client_region or (self._regions_of_nodes.get(client_node) if client_node else None),
            )
        host = listen[0] if listen else target[0]
        for attempt in range(3):
            port = listen[1] if listen else free_port(host)
            p = FaultProxy(
                self,
                target,
                (host, port),
                Endpoint(node, region),
                client,
                name or f"proxy{len(self.proxies) + 1}",
            )
            try:
                self._call(p._start)
                break
            except OSError:
                # A free port can be taken before we bind it (other test runs pick ports too).
                if listen or attempt == 2:
                    raise
        self.proxies.append(p)
        return p

    # -- faults ------------------------------------------------------------------------------

    def is_cut(self, src: Endpoint, dst: Endpoint) -> bool:
        """Whether bytes from ``src`` to ``dst`` are currently dropped by a partition."""
        if src.region and dst.region and ("region", src.region, dst.region) in self._cuts:
            return True
        return bool(src.node and dst.node and ("node", src.node, dst.node) in self._cuts)

    def link_delay(self, src_region: str | None, dst_region: str | None) -> float:
        if src_region is None or dst_region is None:
            return 0.0
        return self._link_delays.get((src_region, dst_region), 0.0)

    def _cut(
        self, kind: str, a: str | Iterable[str], b: str | Iterable[str], one_way: bool
    ) -> None:
        side_a = [a] if isinstance(a, str) else list(a)
        side_b = [b] if isinstance(b, str) else list(b)
        for x in side_a:
            for y in side_b:
                self._cuts.add((kind, x, y))
                if not one_way:
                    self._cuts.add((kind, y, x))
        self._refresh_all()

    def partition(
        self, a: str | Iterable[str], b: str | Iterable[str], *, one_way: bool = False
    ) -> None:
        """Cut traffic between regions ``a`` and ``b`` (each a region or a list of regions).

        ``one_way=True`` drops only a -> b. Traffic inside a region keeps flowing.
        """
        self._cut("region", a, b, one_way)

    def partition_nodes(
        self, a: str | Iterable[str], b: str | Iterable[str], *, one_way: bool = False
    ) -> None:
        """Cut traffic between nodes ``a`` and ``b`` (node names, or lists of them)."""
        self._cut("node", a, b, one_way)

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """Remove every partition, or only those between ``a`` and ``b`` (regions or nodes).

        Proxies' own switches (blackhole, refuse, delay) are left alone; ``reset()`` clears all.
        """
        if a is None and b is None:
            self._cuts.clear()
        else:
            pair = {a, b}
            self._cuts = {c for c in self._cuts if {c[1], c[2]} != pair}
        self._refresh_all()

    def set_link_delay(self, region_a: str, region_b: str, seconds: float) -> None:
        """One-way latency added between two regions, both directions (geo distance)."""
        self._link_delays[(region_a, region_b)] = seconds
        self._link_delays[(region_b, region_a)] = seconds

    def reset(self) -> None:
        """Heal everything and clear every proxy's faults and delays."""
        self._link_delays.clear()
        self._cuts.clear()
        for p in self.proxies:
            p.delay = p.jitter = 0.0
            p.blackholed = p.refusing = False
        self._refresh_all()

    def _refresh_all(self) -> None:
        def refresh() -> None:
            for p in self.proxies:
                p._refresh()

        self._call(refresh)

    def close(self) -> None:
        """Stop every proxy (resetting their connections) and the loop thread."""
        if self._closed:
            return

        async def shutdown() -> None:
            for p in self.proxies:
                p._close_now()
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for p in self.proxies:
                if p._server is not None:
                    await p._server.wait_closed()

        try:
            self._call(shutdown)
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._loop.is_running():
                self._loop.close()

    def __enter__(self) -> FaultNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
