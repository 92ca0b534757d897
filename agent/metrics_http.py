"""The agent's metrics endpoint: its ``AgentMetrics`` registry over plain HTTP (GET /metrics;
prometheus_client's WSGI app, which also answers OpenMetrics to a scraper that asks for it).

It runs on threads of its own, so a scrape never waits for the event loop except for the
snapshot the collectors take there (``dlagent.metrics``). It binds when the agent starts, before
the agent registers, so the address it publishes (port 0 resolved) is the one that serves; an
address that cannot be bound fails the start naming ``[metrics] listen``.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import socketserver
import threading
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

from dlctl.errors import ConfigError

log = logging.getLogger("dlagent.metrics")


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # a scrape every few seconds would drown the agent's log


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scraper that hangs must not keep a stopping agent alive

    def server_bind(self) -> None:
        # HTTPServer.server_bind asks for the host's fully qualified name (a reverse DNS lookup,
        # which can stall a start for seconds where DNS is slow or absent); WSGI needs the port.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), port
        self.setup_environ()


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


class MetricsEndpoint:
    """Serving ``registry`` on ``host:port``; ``address`` is what scrapers should use."""

    def __init__(self, server: _Server, advertise_host: str) -> None:
        self._server = server
        host, port = server.server_address[:2]
        # Bound to every interface: scrapers reach it where clients reach the agent.
        self.address = format_address(advertise_host if _is_wildcard(str(host)) else str(host), port)
        # A short poll: a stopping agent waits for it (close) and should not wait long.
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="metrics-http", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, registry: CollectorRegistry, host: str, port: int, *, advertise_host: str, config_path: Path) -> MetricsEndpoint:
        where = f"{config_path}: [metrics] listen = {format_address(host, port)!r}"
        try:
            families = {info[0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)}
            # A name with both (localhost): IPv4, where clients resolving it look first.
            family = socket.AF_INET if socket.AF_INET in families else families.pop()
        except socket.gaierror as exc:
            raise ConfigError(f"{where}: cannot resolve {host!r}: {exc.strerror}", hint='use an address of this host, "HOST:0" for any free port, or "off"') from None
        server_class = type("_MetricsServer", (_Server,), {"address_family": family})
        try:
            server = server_class((host, port), _QuietHandler)
        except OSError as exc:
            why = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise ConfigError(
                f"{where}: cannot serve metrics there: {why}",
                hint='another process (another agent on this host?) may hold the port: choose another, "HOST:0" for any free one, or "off"',
            ) from None
        server.set_app(make_wsgi_app(registry))
        endpoint = cls(server, advertise_host)
        log.info("metrics served on http://%s/metrics", endpoint.address)
        return endpoint

    def close(self) -> None:
        """Stop serving (blocks for up to the poll interval)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)
