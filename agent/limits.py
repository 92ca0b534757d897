"""The protocol server's limits (agent.toml's [server] table, see dlagent.config): how many
connections, how big a frame before and after authentication, how much in flight and queued per
connection, and how long a handshake, a frame or an idle connection may take. A module of its
own so reading the configuration does not load the server."""

from __future__ import annotations

from dataclasses import dataclass, fields

from dlctl.log import protocol as p

MIN_UNAUTHENTICATED_FRAME = 256  # an AUTH frame is about 100 bytes


@dataclass(frozen=True)
class ServerLimits:
    """The protocol server's limits; agent.toml's [server] table sets them (dlagent.config)."""

    max_connections: int = 1024  # authenticated connections at once
    # All connections from one source address, authenticated or not: no one host takes every slot.
    max_connections_per_peer: int = 512
    # Connections still in the handshake: a budget apart from max_connections. Over it, a new
    # connection closes the oldest unauthenticated one of the address that holds the most.
    max_unauthenticated: int = 256
    # Of those, from one source address; a new one over it closes that address's oldest.
    max_unauthenticated_per_peer: int = 128
    max_unauthenticated_frame: int = 4096  # bytes of a frame before AUTH succeeds; a larger one closes the connection unread
    # Requests per connection being handled at once, and their bytes: an ADD_BATCH counts as one
    # request of its whole body (up to MAX_BATCH_BYTES) until every entry of it is durable.
    max_in_flight: int = 256
    max_in_flight_bytes: int = 64 * 1024 * 1024
    # Long polls waiting for a LAC count apart (a reader polling entries ahead keeps many
    # waiting: they hold no more than a future, and must not hold reads back): at most this many
    # per connection.
    max_long_polls: int = 4096
    # Answers per connection not yet taken by the client (queued here or in the transport): at
    # this many bytes the connection is not read from until they drain. One answer may pass
    # it (a READ_RANGE answers up to 8 MiB beyond a first entry of up to 16 MiB).
    max_response_bytes: int = 16 * 1024 * 1024
    handshake_timeout: float = 10.0  # from accept to a verified AUTH
    idle_timeout: float = 600.0  # no bytes received and nothing in flight
    frame_timeout: float = 60.0  # a frame whose first bytes arrived must complete within this (slowloris)
    max_long_poll: float = 120.0  # longer long-poll timeouts are cut to this
    # Answer reads that ask for it (FLAG_COMPRESS: replication streams) zstd-compressed. False:
    # refuse the flag as an agent that predates it does (its readers then read plain).
    compression: bool = True
    max_frame: int = p.MAX_FRAME

    def __post_init__(self) -> None:
        for name in (
            "max_connections", "max_connections_per_peer", "max_unauthenticated", "max_unauthenticated_per_peer",
            "max_in_flight", "max_in_flight_bytes", "max_response_bytes", "max_long_polls",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1, got {value!r}")
        for name in ("handshake_timeout", "idle_timeout", "frame_timeout", "max_long_poll"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(self.compression, bool):
            raise ValueError(f"compression must be true or false, got {self.compression!r}")
        if not p.FRAME_HEADER_SIZE < self.max_frame <= p.MAX_FRAME:
            raise ValueError(f"max_frame must be in {p.FRAME_HEADER_SIZE + 1}..{p.MAX_FRAME}")
        if not MIN_UNAUTHENTICATED_FRAME <= self.max_unauthenticated_frame <= self.max_frame:
            raise ValueError(f"max_unauthenticated_frame must be in {MIN_UNAUTHENTICATED_FRAME}..{self.max_frame}")
        if self.max_unauthenticated_per_peer > self.max_unauthenticated:
            raise ValueError("max_unauthenticated_per_peer must not exceed max_unauthenticated")
        if self.max_unauthenticated_per_peer > self.max_connections_per_peer:
            raise ValueError("max_unauthenticated_per_peer must not exceed max_connections_per_peer")

    def descriptors(self) -> int:
        """About how many descriptors the connections may hold at once."""
        return self.max_connections + self.max_unauthenticated


# The keys of agent.toml's [server] table: every limit but max_frame (the protocol's own bound).
CONFIG_KEYS = tuple(f.name for f in fields(ServerLimits) if f.name != "max_frame")
