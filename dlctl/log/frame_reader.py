"""Frames received in place: the parser of a client connection that is an ``asyncio.BufferedProtocol``.

``protocol.FrameDecoder`` is fed the bytes objects a transport hands over, so a large frame (a
READ_RANGE answer of megabytes, as a copy reads them) costs copies on top of the decryption: TLS
decrypts each 16 KiB record into a bytes object of its own, the event loop joins a read's
records into one, and the decoder joins those into the frame body. Here the transport (with TLS,
``SSLObject.read`` into a given buffer; without, the ``recv``) writes into buffers of ours: small
frames into one reused buffer, from which each is copied out once; a frame of at least
``LARGE_FRAME`` bytes straight into a ``bytearray`` of its body's size, so the bytes are written
once, where the frame's reader will find them.

A large body is handed over as that ``bytearray`` (or a writable memoryview of a buffer the
request's caller lent for it, ``body_for``), never touched again by the reader: the client turns
it into ``bytes`` (one copy, as before) unless the request's caller takes it as it is
(``AgentClient.read_range(..., in_place=True)``). A lent buffer saves the allocation: a fresh
one of megabytes costs page faults and zeroing, about as much as the decryption itself.
"""

from __future__ import annotations

from collections.abc import Callable

from . import protocol as p


class FrameReader:
    """``get_buffer`` / ``received`` for a ``BufferedProtocol``; each complete frame goes to
    ``on_frame`` as soon as its last byte arrives. A ``ProtocolError`` (fatal: a bad length or
    version) leaves the reader unusable, as it leaves ``FrameDecoder``."""

    __slots__ = ("on_frame", "body_for", "max_frame", "_buf", "_view", "_start", "_end", "_head", "_body", "_body_view", "_got")

    LARGE_FRAME = p.FrameDecoder.LARGE_FRAME  # frames of at least this many bytes get a buffer of their own
    BUFFER = 256 * 1024  # the small frames' buffer (a TLS read hands over at most 256 KiB)

    def __init__(
        self,
        on_frame: Callable[[p.Frame], None],
        max_frame: int = p.MAX_FRAME,
        body_for: Callable[[int, int], memoryview | None] | None = None,
    ) -> None:
        self.on_frame = on_frame
        # (request id, body size) -> where the large frame's body goes (a writable buffer of
        # exactly that size), or None for a new bytearray.
        self.body_for = body_for
        self.max_frame = max_frame
        self._buf = bytearray(self.BUFFER)
        self._view = memoryview(self._buf)
        self._start = 0  # the first byte not parsed yet
        self._end = 0  # the end of the bytes received
        self._head: tuple[int, int, int] | None = None  # (opcode, flags, request id) of the large frame being received
        self._body: bytearray | memoryview | None = None  # its body
        self._body_view: memoryview | None = None
        self._got = 0  # bytes of its body received

    @property
    def buffered(self) -> int:
        """Bytes received but not yet handed over as frames (non-zero: a frame is partly here)."""
        return self._end - self._start + (self._got + p.FRAME_HEADER_SIZE if self._body is not None else 0)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the transport writes what it receives next: the rest of a large frame's body
        (exactly: whatever follows it is read into the small buffer next), else the free end of
        the small buffer, made room at when little is left (what is unparsed then is part of one
        small frame, less than ``LARGE_FRAME`` bytes, moved to the front)."""
        if self._body_view is not None:
            return self._body_view[self._got :]
        start, end = self._start, self._end
        if len(self._buf) - end < self.LARGE_FRAME:
            self._buf[: end - start] = self._view[start:end]
            self._start, self._end = 0, end - start
            end -= start
        return self._view[end:]

    def received(self, n: int) -> None:
        """The transport wrote ``n`` bytes where ``get_buffer`` said: hand over what completed."""
        body = self._body
        if body is not None:
            self._got += n
            if self._got < len(body):
                return
            head = self._head
            assert head is not None
            self._head = self._body = self._body_view = None
            self._got = 0
            self.on_frame(p.Frame(head[0], head[1], head[2], body))  # type: ignore[arg-type]
            return
        self._end += n
        self._parse()

    def _parse(self) -> None:
        buf, view = self._buf, self._view
        while True:
            start, end = self._start, self._end
            avail = end - start
            total = p.frame_total(buf, start, avail, self.max_frame)
            if total is None:
                break
            if avail >= total:
                _, _, opcode, flags, request_id = p.FRAME_HEADER.unpack_from(buf, start)
                body = bytes(view[start + p.FRAME_HEADER_SIZE : start + total])
                self._start = start + total
                self.on_frame(p.Frame(opcode, flags, request_id, body))
                continue
            if total >= self.LARGE_FRAME and avail >= p.FRAME_HEADER_SIZE:
                # The rest of this frame goes straight into its own body; what is here already
                # is copied there now, and the small buffer is empty again.
                _, _, opcode, flags, request_id = p.FRAME_HEADER.unpack_from(buf, start)
                size = total - p.FRAME_HEADER_SIZE
                body = self.body_for(request_id, size) if self.body_for is not None else None
                if body is None:
                    body = bytearray(size)
                have = avail - p.FRAME_HEADER_SIZE
                body[:have] = view[start + p.FRAME_HEADER_SIZE : end]
                self._head, self._body, self._body_view, self._got = (opcode, flags, request_id), body, memoryview(body), have
                self._start = self._end = 0
                return
            break
        if self._start == self._end:
            self._start = self._end = 0


__all__ = ["FrameReader"]
