"""The least an encrypted copy does: the same files sent over mutual TLS on loopback, written, fsynced.

A bootstrap copy between clusters moves every byte over the agents' mutual TLS 1.3, so its rate
is bounded by what encrypting, sending, decrypting and writing alone cost on this machine — not
by a plain file copy, which does none of the first three. This baseline measures that bound in
the benchmark's own run, with the cluster's own TLS material and contexts (``dlctl.log.tls``,
hence the cipher the agents negotiate): ``streams`` pairs of threads, a sender that reads its
share of the files into 1 MiB buffers and ``sendall``s them, a receiver that ``recv_into``s
them and writes each file to a fresh directory, fsyncing it as ``plain_copy_rate`` does.
Blocking sockets: OpenSSL and the kernel do all the per-byte work, with the interpreter lock
released, so no framing, checksum, re-encoding, verification or bookkeeping is counted — what a
copy with none of those (and no event loop) could reach here.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
import threading
import time
from pathlib import Path

from dlctl.log.tls import TlsFiles

CHUNK = 1024 * 1024
TIMEOUT = 120.0  # seconds any one socket call may block: a failed thread fails the round, never hangs it
_COUNT = struct.Struct(">I")  # how many files a connection carries
_HEAD = struct.Struct(">IQ")  # each file's index and length


def _send(context: ssl.SSLContext, address: tuple[str, int], host: str, files: list[tuple[int, Path]]) -> None:
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with context.wrap_socket(socket.create_connection(address, timeout=TIMEOUT), server_hostname=host) as conn:
        conn.sendall(_COUNT.pack(len(files)))
        for index, path in files:
            with open(path, "rb", buffering=0) as f:
                conn.sendall(_HEAD.pack(index, os.fstat(f.fileno()).st_size))
                while n := f.readinto(buf):
                    conn.sendall(view[:n])
        conn.recv(1)  # the receiver's word that everything is durable (a close now would lose nothing)


def _recv_exactly(conn: ssl.SSLSocket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if not n:
            raise ConnectionError(f"TLS baseline: the sender closed after {got} of {len(view)} bytes")
        got += n


def _receive(conn: ssl.SSLSocket, out: Path, names: list[str]) -> None:
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    head = bytearray(_HEAD.size)
    with conn:
        _recv_exactly(conn, view[: _COUNT.size])
        (count,) = _COUNT.unpack_from(view)
        for _ in range(count):
            _recv_exactly(conn, memoryview(head))
            index, length = _HEAD.unpack(head)
            fd = os.open(out / names[index], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                while length:
                    n = min(length, CHUNK)
                    _recv_exactly(conn, view[:n])
                    os.write(fd, view[:n])
                    length -= n
                os.fsync(fd)
            finally:
                os.close(fd)
        conn.sendall(b"k")


def tls_copy_rate(files: list[Path], work: Path, tls: TlsFiles, host: str, streams: int = 0, rounds: int = 3) -> float:
    """Source bytes per second of copying ``files`` over mutual TLS on ``host`` (an address the
    certificate of ``tls`` names) into a fresh directory under ``work``, on ``streams``
    connections (0: one per core); the median of ``rounds``, each begun with nothing dirty."""
    streams = streams or os.cpu_count() or 1
    server_context, _ = tls.server()
    client_context = tls.client()
    total = sum(f.stat().st_size for f in files)
    names = [f.name for f in files]
    shares = [[(i, f) for i, f in enumerate(files) if i % streams == s] for s in range(streams)]
    shares = [share for share in shares if share]
    rates = []
    for _ in range(rounds):
        out = work / f"tls-copy-{time.monotonic_ns()}"
        out.mkdir()
        os.sync()
        failures: list[BaseException] = []

        def guarded(fn, *args) -> None:  # noqa: ANN001 - a thread's body; its failure fails the round
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - reported below, with the round
                failures.append(exc)

        with socket.create_server((host, 0)) as listener:
            listener.settimeout(TIMEOUT)
            address = listener.getsockname()[:2]
            started = time.monotonic()
            threads = [threading.Thread(target=guarded, args=(_send, client_context, address, host, share)) for share in shares]
            for t in threads:
                t.start()
            for _ in shares:  # connections arrive in any order: each says how many files it carries
                conn, _ = listener.accept()
                conn.settimeout(TIMEOUT)
                threads.append(threading.Thread(target=guarded, args=(_receive, server_context.wrap_socket(conn, server_side=True), out, names)))
                threads[-1].start()
            for t in threads:
                t.join()
        dfd = os.open(out, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        elapsed = time.monotonic() - started
        copied = sum(p.stat().st_size for p in out.iterdir())
        for p in out.iterdir():
            p.unlink()
        out.rmdir()
        if failures:
            raise RuntimeError(f"TLS baseline round failed: {failures[0]!r}")
        if copied != total:
            raise RuntimeError(f"TLS baseline copied {copied} of {total} bytes")
        rates.append(total / elapsed)
    return sorted(rates)[len(rates) // 2]
