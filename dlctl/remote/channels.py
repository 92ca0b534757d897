"""Socket and channel plumbing under the SSH transport: TCP connects with a bounded time, a socket
that acks promptly, a watchdog that fires at a deadline, feeding stdin and collecting
stdout/stderr of a channel, an SFTP file created with its mode from the first instant."""

from __future__ import annotations

import re
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import paramiko


READ_CHUNK = 1 << 16


# -- sockets and channel plumbing ---------------------------------------------------------------


class QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges every segment at once.

    sshd leaves Nagle on for sessions without a terminal, so a reply it writes while an earlier
    packet is unacknowledged waits for our ACK, which Linux delays by up to 40 ms. That happens
    on every new connection (sshd's ``hostkeys-00`` notice, then our channel-open reply): 40 of
    the ~75 ms of a cold command. Re-arming TCP_QUICKACK after each read sends ACKs at once.
    """

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if _TCP_QUICKACK is not None:
            try:
                self.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
            except OSError:
                pass
        return data


_TCP_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def connect_tcp(host: str, port: int, timeout: float) -> socket.socket:
    """``socket.create_connection`` with our socket class, NODELAY and QUICKACK."""
    error: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = QuickAckSocket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            # SSH is many small packets (channel opens, requests): send each at once.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError(f"no address for {host}")


# Every command runs as `sh -c WRAPPER dlctl ARGV...`: the wrapper reports its process group
# on stderr (stripped again before the caller sees stderr) so a timeout can kill the whole
# group, then execs ARGV unchanged ("$@" keeps every word literal). /proc gives the group;
# without /proc the pid is the best guess (the command keeps it across exec).
WRAPPER = 'p=$$; { read -r _ _ _ _ p _ < /proc/$$/stat; } 2>/dev/null; printf "dlctl-pgid:%s\\n" "$p" >&2; exec "$@"'
PGID_LINE = re.compile(rb"(?:^|(?<=\n))dlctl-pgid:(\d+)\n")


@dataclass
class RunState:
    pgid: int | None = None


def exec_quietly(client: paramiko.SSHClient, words: Sequence[str], timeout: float) -> None:
    """Run a tiny helper command (the kill) with a hard bound, ignoring its output."""
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        return
    chan = transport.open_session(timeout=timeout)
    # exec_command waits for the server's reply without a timeout of its own.
    timer = threading.Timer(timeout, chan.close)
    timer.daemon = True
    timer.start()
    try:
        chan.exec_command(shlex.join(words))
        chan.shutdown_write()
        chan.status_event.wait(timeout)
    finally:
        timer.cancel()
        chan.close()


class Watchdog(threading.Thread):
    """Calls ``fire`` at the deadline unless stopped first.

    A thread rather than timeouts on each call because paramiko's ``exec_command`` and
    ``sendall`` can block with no timeout of their own on a hung node; closing the channel
    (what ``fire`` ends with) is what wakes them.
    """

    def __init__(self, deadline: float, fire: Callable[[], None]) -> None:
        super().__init__(name="ssh-watchdog", daemon=True)
        self._deadline = deadline
        self._fire = fire
        self._done = threading.Event()
        self._state_lock = threading.Lock()
        self.fired = False

    def run(self) -> None:
        if self._done.wait(max(0.0, self._deadline - time.monotonic())):
            return
        with self._state_lock:
            if self._done.is_set():
                return
            self.fired = True
        self._fire()

    def stop(self) -> bool:
        """Disarm; True if the deadline had already fired (the caller must report a timeout)."""
        with self._state_lock:
            self._done.set()
            fired = self.fired
        if fired and threading.current_thread() is not self:
            # Let the kill finish before the caller reports: "it was killed" must be true.
            self.join(30.0)
        return fired


def feed(chan: paramiko.Channel, data: bytes) -> None:
    """Write stdin and send EOF. A command that exits without reading all of it is not an
    error here (like EPIPE for a local pipe); its exit status tells."""
    try:
        if data:
            chan.sendall(data)
        chan.shutdown_write()
    except (OSError, paramiko.SSHException, EOFError):
        pass


def collect(chan: paramiko.Channel, state: RunState) -> tuple[bytearray, bytearray]:
    """Read stdout and stderr until EOF and the exit status (or the channel closing); pick
    the wrapper's process group line out of stderr."""
    out, err = bytearray(), bytearray()
    fd = chan.fileno()  # readable when either stream has data, and forever after EOF/close

    def drain() -> None:
        while chan.recv_ready():
            out.extend(chan.recv(READ_CHUNK))
        while chan.recv_stderr_ready():
            err.extend(chan.recv_stderr(READ_CHUNK))
        if state.pgid is None:
            m = PGID_LINE.search(err)
            if m:
                state.pgid = int(m.group(1))
                del err[m.start() : m.end()]

    while not (chan.eof_received or chan.closed):
        select.select([fd], [], [], 1.0)
        drain()
    # EOF comes after all data; the exit status follows it (or the close does).
    while not chan.status_event.wait(1.0):
        if chan.closed:
            break
    drain()
    return out, err


def create_remote(sftp: paramiko.SFTPClient, path: str, mode: int) -> paramiko.SFTPFile:
    """Create ``path`` for writing, new (``O_EXCL``: never an existing file or a planted
    symlink) and with ``mode`` from its first instant.

    ``SFTPClient.open`` sends an empty attribute block, so the server creates the file with its
    own default (0644 under the usual umask) and a chmod can only follow: a local user who
    opens the file in between keeps that descriptor and reads the secret once it is written
    (issue 19). The SSH_FXP_OPEN request carries the permissions instead; OpenSSH's sftp-server
    passes them to open(2), so the server's umask can only narrow them. The fchmod on the
    handle, before the first byte, then sets exactly ``mode`` (a narrower umask, or a server
    that ignores open attributes)."""
    attrs = paramiko.SFTPAttributes()
    attrs.st_mode = mode
    flags = paramiko.sftp.SFTP_FLAG_WRITE | paramiko.sftp.SFTP_FLAG_CREATE | paramiko.sftp.SFTP_FLAG_TRUNC | paramiko.sftp.SFTP_FLAG_EXCL
    kind, msg = sftp._request(paramiko.sftp.CMD_OPEN, path, flags, attrs)  # noqa: SLF001 - open() cannot pass attributes
    if kind != paramiko.sftp.CMD_HANDLE:
        raise paramiko.SFTPError(f"expected a handle opening {path}, got message type {kind}")
    fout = paramiko.SFTPFile(sftp, msg.get_binary(), "wb")
    try:
        fout.chmod(mode)
    except BaseException:
        fout.close()
        raise
    return fout


