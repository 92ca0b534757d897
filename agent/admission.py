"""Which connections the protocol server takes in, and which it closes to make room (issue 19).

Before authentication a connection is worth little and costs little: unauthenticated
connections have a budget of their own apart from the authenticated ones (so a flood of them
never takes a slot an authenticated client needs) and a smaller one per source address (a new
connection over it closes that address's oldest unauthenticated one, so a flooding address
mostly evicts itself), and every source address has a cap on all its connections. Refusals and
evictions are logged at most once a second per reason, with the number held back
(``dlctl.logthrottle``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlctl.log import protocol as p
from dlctl.log.errors import AgentUnavailableError
from dlctl.logthrottle import LogThrottle

from .limits import ServerLimits

if TYPE_CHECKING:
    from .connection import Connection


class Admission:
    """The server's connection slots. ``conns``: the server's set of open connections, which
    admission keeps (a connection is in it from its admission until it is forgotten);
    ``counters``: the server's, where refusals and evictions are counted."""

    def __init__(self, limits: ServerLimits, counters: dict[str, int], throttle: LogThrottle, conns: set[Connection]) -> None:
        self.limits = limits
        self.counters = counters
        self.throttle = throttle
        self.conns = conns
        # Authenticated connections are counted, unauthenticated ones kept in arrival order
        # (globally and per source address) so the oldest can be found; connections of each
        # source address are counted.
        self.authenticated = 0
        self.refusing = 0  # TLS handshakes under way only to tell a refused client why
        self.unauthenticated: dict[Connection, None] = {}
        self._peer_unauthenticated: dict[str, dict[Connection, None]] = {}
        self._peer_connections: dict[str, int] = {}

    def admit(self, conn: Connection) -> str | None:
        """Take a new connection in as unauthenticated, making room by closing an older
        unauthenticated one if a budget is full; the reason it is refused instead, if it is."""
        lim, ip = self.limits, conn.peer_ip
        if self.authenticated >= lim.max_connections:
            return self.full()
        if self._peer_connections.get(ip, 0) >= lim.max_connections_per_peer:
            return f"too many connections from {ip} (at most {lim.max_connections_per_peer} from one address)"
        mine = self._peer_unauthenticated.get(ip)
        if mine is not None and len(mine) >= lim.max_unauthenticated_per_peer:
            self._evict(next(iter(mine)), f"{ip} has {len(mine)} unauthenticated connections, at most {lim.max_unauthenticated_per_peer}")
        elif len(self.unauthenticated) >= lim.max_unauthenticated:
            busiest = max(self._peer_unauthenticated.values(), key=len)
            self._evict(next(iter(busiest)), f"{len(self.unauthenticated)} unauthenticated connections, at most {lim.max_unauthenticated}")
        conn.registered = True
        self.conns.add(conn)
        self.unauthenticated[conn] = None
        self._peer_unauthenticated.setdefault(ip, {})[conn] = None
        self._peer_connections[ip] = self._peer_connections.get(ip, 0) + 1
        return None

    def full(self) -> str:
        """Why a connection is refused when every authenticated slot is taken."""
        return f"too many connections ({self.authenticated} authenticated, at most {self.limits.max_connections})"

    def _evict(self, victim: Connection, why: str) -> None:
        self.counters["evicted_unauthenticated"] += 1
        self.throttle.warning(
            "unauthenticated connections closed to make room", "closing unauthenticated connection from %s to make room: %s", victim.peer, why
        )
        error = p.error_response(p.Op.HELLO, 0, AgentUnavailableError.status, "too many unauthenticated connections; closed to make room")
        victim.close("evicted", error=error)

    def refused(self, conn: Connection, why: str) -> None:
        self.counters["refused_connections"] += 1
        self.throttle.warning("refused connections", "refusing connection from %s: %s", conn.peer, why)

    def promote(self, conn: Connection) -> bool:
        """``conn`` proved the secret: move it to the authenticated connections, if one is free."""
        if self.authenticated >= self.limits.max_connections:
            return False
        self._drop_unauthenticated(conn)
        conn.authed = True
        self.authenticated += 1
        return True

    def _drop_unauthenticated(self, conn: Connection) -> None:
        self.unauthenticated.pop(conn, None)
        mine = self._peer_unauthenticated.get(conn.peer_ip)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self._peer_unauthenticated[conn.peer_ip]

    def forget(self, conn: Connection) -> None:
        """``conn`` is closing or closed: free its slots (once)."""
        if not conn.registered:
            return
        conn.registered = False
        self.conns.discard(conn)
        if conn.authed:
            self.authenticated -= 1
        else:
            self._drop_unauthenticated(conn)
        left = self._peer_connections.get(conn.peer_ip, 1) - 1
        if left > 0:
            self._peer_connections[conn.peer_ip] = left
        else:
            self._peer_connections.pop(conn.peer_ip, None)
