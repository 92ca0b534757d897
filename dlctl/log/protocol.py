# Over ~600 lines (about 1,110), deliberately: its docstring (165 lines) is the wire protocol's
# specification and the codec follows it op by op, so the spec and the code that implements it
# are read and changed together; the codec is pure functions over bytes, one small pair per op.
"""The agent wire protocol: a binary frame codec (pure functions, no I/O). This docstring is the spec.

Transport: one TCP (optionally TLS) connection carries a stream of frames in both directions.
Requests are pipelined; the agent may answer them in any order and the client matches each
response to its request by the request id. All integers are big-endian.

Frame (every frame, both directions)::

    offset size field
    0      4    length       u32: bytes after this field (16-byte header minus 4, plus body);
                             12 <= length <= MAX_FRAME - 4, otherwise the stream is unusable
    4      1    version      PROTOCOL_VERSION (1); anything else closes the connection
    5      1    opcode       Op value; bit 7 (RESPONSE) is set on responses
    6      2    flags        requests: per-op bits (below), unknown bits are a bad request;
                             responses: 0, or COMPRESSED (0x8) on the answer to a request that
                             set COMPRESS (below)
    8      8    request id   u64 chosen by the client, echoed in the response; 0 for HELLO
    16     ...  body

Response body (every response)::

    0      1    status       0 = ok, else the typed error's status (dlctl.log.errors)
    1      2    msg length   u16
    3      n    message      UTF-8, empty when ok
    3+n    ...  result       op-specific (below) when ok; for NOT_OWNER the owner's address (UTF-8),
                             otherwise empty on error

Handshake (mutual challenge/response, see dlctl.log.auth). Before it completes any other request
is answered UNAUTHORIZED and the connection is closed::

    agent -> client  HELLO response (opcode 0x80, request id 0): result = server nonce (32 bytes)
    client -> agent  AUTH request: body = client nonce (32) | client proof (32)
    agent -> client  AUTH response: result = server proof (32); on a wrong proof UNAUTHORIZED, then close

Operations (request body -> result on success)::

    op  name            flags                      request body            result
    1   AUTH            -                          nonce 32, proof 32      server proof 32
    2   ADD_ENTRY       RECOVERY (0x1),            encoded entry           -
                        UNCACHED (0x2)
    3   READ_ENTRY      FENCE (0x1): fence first   log u64, seg u64,       encoded entry
                        (recovery read);           entry i64, [SEEN]
                        SKIP_SEEN (0x2): SEEN
                        follows; SUMMARY (0x4):
                        data records as stubs;
                        COMPRESS (0x8): the
                        result may come zstd-
                        compressed (not with
                        FENCE)
    4   READ_LAC        -                          log u64, seg u64        LAC i64
    5   LONG_POLL       SKIP_SEEN (0x2): SEEN      log u64, seg u64,       LAC i64, then the encoded
                        follows; COMPRESS (0x8):   previous LAC i64,       entry previous+1 when LAC >
                        as for READ_ENTRY          timeout ms u32, [SEEN]  previous and this replica has it
    6   FENCE           -                          log u64, seg u64        last entry id i64, LAC i64
    7   DIGEST          -                          log u64, seg u64,       log u64, seg u64, entries u64,
                                                   first i64, last i64     first i64, last i64, LAC i64,
                                                   (last < 0: to the end)  bytes u64, digest (ASCII, rest)
    8   LIST_SEGMENTS   -                          -                       JSON array of objects with the
                                                                           SegmentInfo fields
    9   DELETE_SEGMENT  -                          log u64, seg u64        deleted u8 (0/1)
    10  STAT            -                          -                       JSON object
    11  APPEND          RESET_ORDER (0x1): the     name u16+UTF-8,         count u32, then per record
                        producer resends from its  producer u64,           segment u64, entry i64,
                        oldest failed append;      [epoch u32, seq u64     slot u32 (its DLSN)
                        IDEMPOTENT (0x2): epoch    when IDEMPOTENT],
                        and sequence follow the    count u32, records
                        producer id; RETRY (0x4):  (dlctl.log.records
                        an earlier attempt may     layout; txid ignored)
                        have been written;
                        FORWARD (0x8): forward
                        to the owner
    12  RELEASE         -                          name u16+UTF-8          released u8 (0: not owner)
    13  READ_RANGE      -                          log u64, seg u64,       the encoded entries first,
                                                   first i64, last i64,    first+1, ... back to back: up
                                                   max bytes u32           to last, up to the first one
                                                                           this replica lacks, and no more
                                                                           than max bytes (but always
                                                                           first); NO_SUCH_ENTRY when it
                                                                           lacks first
    14  ADD_BATCH       RECOVERY (0x1),            encoded entries back    entries u32: how many the
                        UNCACHED (0x2)             to back (one segment,   batch held (all now durable)
                                                   ids increasing)
    15  PULL_RANGE      UNCACHED (0x2)             log u64, seg u64,       entries u32, bytes u64,
                                                   first i64, last i64,    reason u16+UTF-8 (empty: all
                                                   max bytes u32, source   of first..last), then each
                                                   u16+UTF-8 (a node id)   stored entry's CRC-32C u32
    16  PULL_SEGMENT    UNCACHED (0x2)             a JSON object (dlctl.   a JSON object: the copy's
                                                   spark.segment_pull.     content figures and what
                                                   PullRequest)            this agent now stores

SEEN (FLAG_SKIP_SEEN: a replication stream's sink) is a location u16+UTF-8, a count u16, then count
times a location u16+UTF-8 and a counter u64 (its version vector). The entry comes back with the
records in that causal past as stubs (key and payload left out, ``dl.seen``;
dlctl.replication.seen), so they do not cross the WAN.

COMPRESS (a replication stream reading across a WAN, issue 23) lets the agent answer the result
as one zstd frame that states its decompressed size (dlctl.log.compression): the response then
carries COMPRESSED (0x8) in its flags, and its body is the usual status and message followed
by that frame in place of the result. The agent decides per answer (small or incompressible
results go plain, unflagged); errors are never compressed. The reader refuses a frame that
claims more than MAX_FRAME bytes, or does not decompress to what it claims, and then verifies
the entries inside as for any read. An agent that predates COMPRESS (or runs with
``[server] compression = false``) refuses the request as a BAD_REQUEST naming the unknown flags,
like any unknown bit: the client asks again without it, and no more on that connection.

READ_RANGE is the bulk read of a copy (the bootstrap reads whole segments): one request and one
disk read for many consecutive entries. The agent verifies every entry's CRC as READ_ENTRY does,
caps the answer at MAX_RANGE_BYTES whatever max bytes says, and the client checks each entry
again (CRC and ids) when it splits the answer.

ADD_BATCH is the bulk write of a copy (re-replication, repair): one request, one answer and one
queueing for many entries, each exactly as ADD_ENTRY with the same flags would store it. Its
body is one or more encoded entries back to back (the layout of a READ_RANGE answer, which a
copy forwards as it is), at most MAX_BATCH_BYTES in all (a larger entry travels by ADD_ENTRY),
all of one segment of one log, entry ids strictly increasing (consecutive or not: a striped
replica's entries are not). All or nothing: the agent checks every entry as ADD_ENTRY does
(header, ids, CRC-32C, the fenced rule unless RECOVERY, limbo, an id already stored with other
bytes) before it queues any, so a batch with one bad entry is refused whole, the error naming
the entry by position and id, and nothing of it is stored. Entries the replica already holds
with identical bytes count as stored (idempotent, as a single add). The answer comes once every
entry is durable (the same group commit and fdatasync as single adds); a failed write fails the
batch as it fails a single add: nothing of it is acknowledged, and resending identical bytes is
idempotent. A batch counts as one request, of its whole size, in the agent's in-flight limits.

PULL_RANGE is a copy with one network leg instead of two: the agent asked reads entries
first..last of the segment from the agent ``source`` (a node id of its own cluster, resolved in
the cluster's availability records: never an address from the request) with READ_RANGE, checks
each as a client does, and stores them as recovery ADD_BATCHes, reading ahead while it syncs. It
stops after about max bytes (always at least first), at last, or at the first entry the source
cannot serve; the answer then says how many consecutive entries from first are now durable here,
their bytes and CRCs, and in ``reason`` why it stopped short (the source's error, a gap), so the
copier carries on from another replica. An error response means the agent itself could not
store (its disk, a limbo replica, a bad request): nothing beyond the entries of earlier answers
is acknowledged. The copier verifies the result with DIGEST, as after ADD_BATCHes.

PULL_SEGMENT is the bootstrap's copy with one network leg (dlctl.spark.segment_pull): the sink
agent asked reads a segment of a log of *another* cluster — only one declared as a source on this
agent (dlagent.replication_config), reached through that cluster's own availability records,
never an address from the request — re-encodes every entry as the relayed copy does and stores
those of its own write sets of the named sink ensemble, durably, before it answers. An agent
that cannot read the cluster (not declared, no ZooKeeper connect string for it, replication
workers disabled) answers PULL_REFUSED before it stores anything, and the copier relays the
segment instead; any other error leaves what it stored to the copier, which clears the sink
segment before it tries again. The copier verifies the result with DIGEST.

APPEND and RELEASE are the write-proxy ops (DESIGN.md §5): the agent that owns the log batches
the records of all its clients into entries and answers with each record's DLSN once it is
acknowledged by the ack quorum; an agent that does not own it claims it, or answers NOT_OWNER
with the owner's address. Per connection, producer id and log, once an APPEND fails every later
APPEND fails with ORDER_BARRIER until one carries RESET_ORDER: a producer that resends its
failed appends in order can therefore never see a later append land before an earlier one.

An IDEMPOTENT APPEND is deduplicated by the owner (dlctl.log.idempotence): a request it applied
before is answered with the DLSNs its records got then, and nothing is written again; an older
epoch, a gap in the sequence, a producer it no longer knows (after sequence 1) or a repeat
older than the few it remembers are refused (PRODUCER_FENCED, OUT_OF_ORDER_SEQUENCE,
UNKNOWN_PRODUCER, DUPLICATE_TOO_OLD), with nothing written. RETRY marks a resend whose earlier
attempt failed ambiguously: from a producer the owner does not know, even request 1 is then
refused (it may be in the log beyond what the owner knows), never written twice.

FORWARD is for a client that cannot reach the owner although it is alive (a gray partition):
an agent that neither owns nor is claiming the log sends the request on to the owner over its
own connection, in arrival order, and relays the answer (errors included); when the log has no
other owner it claims it as for any APPEND. An idempotent request keeps its guarantee: the
owner deduplicates it whichever way it came.

Entries travel in the dlctl.log.format encoding, CRC-32C included, so the checksum the writer
computed is verified by the agent on add and by the client on read (end to end).

Connection-level errors: a response with request id 0 and an error status (HELLO refused
because the agent is at its connection limit, a frame that could not be delimited, a handshake
or partial frame that timed out) is the agent's last frame before it closes the connection.

Decoding never trusts the network: every length is bounds-checked and every failure raises
``ProtocolError``. ``ProtocolError.fatal`` is true when the byte stream itself can no longer be
framed (bad length or version): the connection must be closed. Otherwise the frame was well
delimited and only its content was bad, so a BAD_REQUEST response keeps the connection usable.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from .auth import NONCE_SIZE, PROOF_SIZE
from .errors import AgentError, BadRequestError, NotOwnerError, error_for_status
from .format import HEADER_SIZE as ENTRY_HEADER_SIZE
from .format import MAX_PAYLOAD

PROTOCOL_VERSION = 1
RESPONSE = 0x80

FRAME_HEADER = struct.Struct(">IBBHQ")  # length, version, opcode, flags, request id
FRAME_HEADER_SIZE = FRAME_HEADER.size  # 16
_LENGTH = struct.Struct(">I")
# The largest request is an ADD of a maximal entry; 64 KiB of room covers every fixed body and
# the response preamble, and stays small enough that a hostile length cannot make us buffer much.
MAX_FRAME = FRAME_HEADER_SIZE + ENTRY_HEADER_SIZE + MAX_PAYLOAD + 64 * 1024
MAX_MESSAGE = 4096  # error messages are truncated to this many bytes on the wire

FLAG_RECOVERY = 0x1  # ADD_ENTRY: recovery add from the fencing writer; accepted on a fenced replica
# ADD_ENTRY: a bulk copy's write (bootstrap, re-replication) that nobody reads back soon: the agent
# drops it from the page cache once durable instead of filling memory with it (see GroupCommitter).
FLAG_UNCACHED = 0x2
FLAG_FENCE = 0x1  # READ_ENTRY: fence the replica (durably) before reading
# READ_ENTRY, LONG_POLL: a replication stream's sink holds these events (a location and a
# version vector follow the request): records in its causal past come back as stubs, their
# payload left behind (dlctl.replication.seen), so they never cross the WAN.
FLAG_SKIP_SEEN = 0x2
# READ_ENTRY: the caller counts records and reads totals (a stream's lag, a log's end): every
# record but control records comes back without key and payload (dlctl.replication.seen).
FLAG_SUMMARY = 0x4
# READ_ENTRY, LONG_POLL: the reader pays for bandwidth (a replication stream across a WAN): the
# agent may answer the result zstd-compressed (dlctl.log.compression). The next free bit of both
# ops; an agent that predates it refuses it as an unknown flag, which the client falls back on.
FLAG_COMPRESS = 0x8
# Responses: the result is one zstd frame (the answer to a FLAG_COMPRESS request).
FLAG_COMPRESSED = 0x8
FLAG_RESET_ORDER = 0x1  # APPEND: the client has seen its failures and resends from the oldest
FLAG_IDEMPOTENT = 0x2  # APPEND: the producer's epoch and the request's sequence number follow its id
FLAG_RETRY = 0x4  # APPEND (idempotent): an earlier attempt of this request may have been written
FLAG_FORWARD = 0x8  # APPEND: the client cannot reach the owner: a non-owner forwards it there
MAX_LOG_NAME = 255  # bytes of a log name on the wire (names are validated by dlctl.names)
MAX_RANGE_BYTES = 8 * 1024 * 1024  # the most a READ_RANGE answers beyond its first entry
MAX_BATCH_BYTES = MAX_RANGE_BYTES  # the most an ADD_BATCH body holds (a READ_RANGE answer of up to this fits)
MAX_PULL_SEGMENT_BODY = 1024 * 1024  # a PULL_SEGMENT request (its JSON: a segment record and the copy's settings)

STATUS_OK = 0
STATUS_INTERNAL = 255


class Op(IntEnum):
    HELLO = 0  # server -> client only, as a response with request id 0
    AUTH = 1
    ADD_ENTRY = 2
    READ_ENTRY = 3
    READ_LAC = 4
    LONG_POLL = 5
    FENCE = 6
    DIGEST = 7
    LIST_SEGMENTS = 8
    DELETE_SEGMENT = 9
    STAT = 10
    APPEND = 11
    RELEASE = 12
    READ_RANGE = 13
    ADD_BATCH = 14
    PULL_RANGE = 15
    PULL_SEGMENT = 16


_ALLOWED_FLAGS: dict[int, int] = {int(op): 0 for op in Op}
_ALLOWED_FLAGS[Op.ADD_ENTRY] = FLAG_RECOVERY | FLAG_UNCACHED
_ALLOWED_FLAGS[Op.ADD_BATCH] = FLAG_RECOVERY | FLAG_UNCACHED
_ALLOWED_FLAGS[Op.PULL_RANGE] = FLAG_UNCACHED
_ALLOWED_FLAGS[Op.PULL_SEGMENT] = FLAG_UNCACHED
_ALLOWED_FLAGS[Op.READ_ENTRY] = FLAG_FENCE | FLAG_SKIP_SEEN | FLAG_SUMMARY | FLAG_COMPRESS
_ALLOWED_FLAGS[Op.LONG_POLL] = FLAG_SKIP_SEEN | FLAG_COMPRESS
_ALLOWED_FLAGS[Op.APPEND] = FLAG_RESET_ORDER | FLAG_IDEMPOTENT | FLAG_RETRY | FLAG_FORWARD


class ProtocolError(BadRequestError):
    """Bytes that do not form a valid frame or body. ``fatal``: the stream cannot be re-synchronized."""

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


class Frame(NamedTuple):
    opcode: int  # with the RESPONSE bit
    flags: int
    request_id: int
    body: bytes

    @property
    def is_response(self) -> bool:
        return bool(self.opcode & RESPONSE)

    @property
    def op(self) -> int:
        return self.opcode & ~RESPONSE


# --------------------------------------------------------------------------------------------
# Framing


Buffer = bytes | bytearray | memoryview

# A frame as the connections queue it: ``bytes``, or ``(head, body...)`` for a body of at least
# SPLIT_BYTES, which the connection hands to the transport as separate buffers instead of
# joining them: one copy less of every large frame (entries added, entries read, a batch of
# entries forwarded from READ_RANGE answers; uvloop writes them with one writev, asyncio's
# selector loop joins them as it did before).
Outgoing = bytes | tuple[Buffer, ...]
SPLIT_BYTES = 64 * 1024


def encode_frame(opcode: int, flags: int, request_id: int, body: Buffer = b"") -> bytes:
    header = _frame_head(opcode, flags, request_id, len(body))
    return header + body if body else header


def _frame_head(opcode: int, flags: int, request_id: int, body_len: int) -> bytes:
    length = FRAME_HEADER_SIZE - 4 + body_len
    if length + 4 > MAX_FRAME:
        raise ValueError(f"frame of {length + 4} bytes exceeds the {MAX_FRAME}-byte maximum")
    return FRAME_HEADER.pack(length, PROTOCOL_VERSION, opcode, flags, request_id)


def _outgoing(head: bytes, body: Buffer) -> Outgoing:
    return (head, body) if len(body) >= SPLIT_BYTES else head + body


TLS_WRITE_PIECE = 256 * 1024  # a large body goes to a TLS transport in pieces of this size (``OutQueue``)


class OutQueue:
    """The frames a connection queued in this loop turn, written with one call: a lone buffer
    as it is; several joined, unless one of them is a large body (a split ``Outgoing``), when
    the transport gets them as they are (uvloop: one writev, no copy) — under TLS in pieces of
    ``TLS_WRITE_PIECE`` bytes, so the first is on the wire before the rest is encrypted."""

    __slots__ = ("_frames", "_split")

    def __init__(self) -> None:
        self._frames: list[Buffer] = []
        self._split = False

    def __bool__(self) -> bool:
        return bool(self._frames)

    def push(self, frame: Outgoing) -> bool:
        """Queue ``frame``; True when it is the first of the turn (schedule the write then)."""
        first = not self._frames
        if type(frame) is tuple:
            self._frames.extend(frame)
            self._split = True
        else:
            self._frames.append(frame)  # type: ignore[arg-type]
        return first

    def clear(self) -> None:
        self._frames, self._split = [], False

    def write(self, transport: Any | None) -> None:
        """Write everything queued to ``transport`` (None: drop it) and start a new turn."""
        frames, split = self._frames, self._split
        self.clear()
        if transport is None or not frames:
            return
        if split and transport.get_extra_info("ssl_object") is not None:
            # TLS encrypts what one call hands over before any of it goes out: in pieces, the
            # peer is decrypting the first while the next are encrypted.
            for frame in frames:
                if len(frame) <= TLS_WRITE_PIECE:
                    transport.write(frame)
                    continue
                with memoryview(frame) as view:
                    for at in range(0, len(view), TLS_WRITE_PIECE):
                        transport.write(view[at : at + TLS_WRITE_PIECE])
        elif len(frames) == 1:
            transport.write(frames[0])
        elif split:
            transport.writelines(frames)
        else:
            transport.write(b"".join(frames))


def outgoing_bytes(frame: Outgoing) -> bytes:
    """The frame as one ``bytes`` (for tests and raw sockets)."""
    return frame if isinstance(frame, bytes) else b"".join(frame)


def frame_total(buf: Buffer, pos: int, avail: int, max_frame: int) -> int | None:
    """The size (length prefix included) of the frame starting at ``pos`` of ``buf``, of which
    ``avail`` bytes are there; None until its length and version are; a fatal
    ``ProtocolError`` for a length outside the limits or another protocol version."""
    if avail < 4:
        return None
    (length,) = _LENGTH.unpack_from(buf, pos)
    if length < FRAME_HEADER_SIZE - 4 or length + 4 > max_frame:
        raise ProtocolError(f"frame length {length} outside {FRAME_HEADER_SIZE - 4}..{max_frame - 4}", fatal=True)
    if avail < 5:
        return None
    version = buf[pos + 4]
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (expected {PROTOCOL_VERSION})", fatal=True)
    return 4 + length


class FrameDecoder:
    """Incremental frame parser: ``feed`` bytes as they arrive, take frames with ``next_frame``.

    Frames are pulled one at a time so a server can stop parsing (back-pressure) while keeping
    the unparsed bytes. A fatal ``ProtocolError`` leaves the decoder unusable.

    Small frames are assembled in one buffer and copied out of it. A frame of at least
    ``LARGE_FRAME`` bytes that is still arriving (entries added, ranges read) is collected as
    the chunks the transport hands over and joined once when complete: each of its bytes is
    copied once instead of twice (into the buffer, then out of it), and the buffer does not
    grow to the frame's size.
    """

    __slots__ = ("_buf", "_pos", "max_frame", "_head", "_chunks", "_want", "_have")

    LARGE_FRAME = 64 * 1024

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.max_frame = max_frame
        self._head: tuple[int, int, int] | None = None  # (opcode, flags, request id) of the large frame being collected
        self._chunks: list[bytes | memoryview] = []  # its body so far (views of immutable chunks)
        self._want = 0  # bytes of that frame still to come
        self._have = 0  # bytes of its body collected

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        want = self._want
        if want:
            if type(data) is not bytes:
                data = bytes(data)  # only immutable chunks are kept (a caller may reuse its buffer)
            n = len(data)
            if n <= want:
                self._chunks.append(data)
                self._want = want - n
                self._have += n
                return
            view = memoryview(data)
            self._chunks.append(view[:want])
            self._want = 0
            self._have += want
            data = view[want:]  # what follows the frame: into the buffer below
        if self._pos and self._pos >= len(self._buf) // 2:
            # Compact only when the consumed prefix dominates, so each byte is moved O(1) times.
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames (non-zero: a frame is partially read)."""
        return len(self._buf) - self._pos + self._have + (FRAME_HEADER_SIZE if self._head else 0)

    def next_frame(self) -> Frame | None:
        if self._head is not None:
            if self._want:
                return None
            (opcode, flags, request_id), chunks = self._head, self._chunks
            self._head, self._chunks, self._have = None, [], 0
            body = chunks[0] if len(chunks) == 1 and type(chunks[0]) is bytes else b"".join(chunks)
            return Frame(opcode, flags, request_id, body)  # type: ignore[arg-type]
        buf, pos = self._buf, self._pos
        avail = len(buf) - pos
        total = frame_total(buf, pos, avail, self.max_frame)
        if total is None:
            return None
        end = pos + total
        if len(buf) < end:
            if total >= self.LARGE_FRAME and avail >= FRAME_HEADER_SIZE:
                self._collect(end)
            return None
        _, _, opcode, flags, request_id = FRAME_HEADER.unpack_from(buf, pos)
        with memoryview(buf) as view:  # one copy out of the buffer (a bytearray slice would be two)
            body = bytes(view[pos + FRAME_HEADER_SIZE : end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = end
        return Frame(opcode, flags, request_id, body)

    def _collect(self, end: int) -> None:
        """Start collecting the large frame that begins at ``_pos`` and ends at ``end``, past
        what is buffered (so everything buffered from ``_pos`` on belongs to it)."""
        buf, pos = self._buf, self._pos
        _, _, opcode, flags, request_id = FRAME_HEADER.unpack_from(buf, pos)
        with memoryview(buf) as view:
            first = bytes(view[pos + FRAME_HEADER_SIZE :])
        self._head = (opcode, flags, request_id)
        self._chunks = [first] if first else []
        self._have = len(first)
        self._want = end - len(buf)
        buf.clear()
        self._pos = 0


def decode_frames(data: bytes) -> list[Frame]:
    """Every complete frame in ``data`` (a convenience for tests and tools)."""
    decoder = FrameDecoder()
    decoder.feed(data)
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    return frames


# --------------------------------------------------------------------------------------------
# Requests

_SEG = struct.Struct(">QQ")
_ENTRY_REF = struct.Struct(">QQq")
_LONG_POLL = struct.Struct(">QQqI")
_DIGEST_REQ = struct.Struct(">QQqq")
_RANGE_REQ = struct.Struct(">QQqqI")
_I64 = struct.Struct(">q")
_FENCE_RES = struct.Struct(">qq")
_DIGEST_RES = struct.Struct(">QQQqqqQ")
_ERR = struct.Struct(">BH")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_DLSN = struct.Struct(">QqI")
_OK_PREAMBLE = _ERR.pack(STATUS_OK, 0)
OK_PREAMBLE = _OK_PREAMBLE  # a successful response's body starts with it ...
OK_RESULT_OFFSET = len(_OK_PREAMBLE)  # ... and its result follows
MAX_LONG_POLL_MS = 2**32 - 1


def _pack(st: struct.Struct, *values: int) -> bytes:
    try:
        return st.pack(*values)
    except struct.error:
        raise ValueError(f"ids {values} do not fit the wire format (u64 log/segment, i64 entry/LAC)") from None


def auth_request(request_id: int, client_nonce: bytes, proof: bytes) -> bytes:
    if len(client_nonce) != NONCE_SIZE or len(proof) != PROOF_SIZE:
        raise ValueError(f"AUTH needs a {NONCE_SIZE}-byte nonce and a {PROOF_SIZE}-byte proof")
    return encode_frame(Op.AUTH, 0, request_id, client_nonce + proof)


def _add_flags(recovery: bool, uncached: bool) -> int:
    return (FLAG_RECOVERY if recovery else 0) | (FLAG_UNCACHED if uncached else 0)


def add_entry_request(request_id: int, entry: Buffer, recovery: bool = False, uncached: bool = False) -> bytes:
    return encode_frame(Op.ADD_ENTRY, _add_flags(recovery, uncached), request_id, entry)


def add_entry_request_parts(request_id: int, entry: Buffer, recovery: bool = False, uncached: bool = False) -> Outgoing:
    """``add_entry_request`` as the connection sends it: a large entry is not copied into the frame."""
    return _outgoing(_frame_head(Op.ADD_ENTRY, _add_flags(recovery, uncached), request_id, len(entry)), entry)


def add_batch_request_parts(request_id: int, entries: Sequence[Buffer], recovery: bool = False, uncached: bool = False) -> Outgoing:
    """An ADD_BATCH of ``entries`` (encoded entries, or runs of them back to back, e.g. slices of
    a READ_RANGE answer), in order; a large batch is not copied into the frame. Raises
    ``ValueError`` for an empty batch or one over MAX_BATCH_BYTES (not sent)."""
    size = sum(map(len, entries))
    if not 0 < size <= MAX_BATCH_BYTES:
        raise ValueError(f"an ADD_BATCH body of {size} bytes: must be 1..{MAX_BATCH_BYTES} (a larger entry travels by ADD_ENTRY)")
    head = _frame_head(Op.ADD_BATCH, _add_flags(recovery, uncached), request_id, size)
    if size >= SPLIT_BYTES:
        return (head, *entries)
    return b"".join((head, *entries))


def add_batch_request(request_id: int, entries: Sequence[Buffer], recovery: bool = False, uncached: bool = False) -> bytes:
    return outgoing_bytes(add_batch_request_parts(request_id, entries, recovery, uncached))


Seen = tuple[str, dict[str, int]]  # (the sink location, the version vector of what it holds)
MAX_SEEN_LOCATIONS = 1024


def encode_seen(seen: Seen) -> bytes:
    """FLAG_SKIP_SEEN's field: the location (a name), u16 count, then (name, u64 counter) pairs."""
    here, vv = seen
    if len(vv) > MAX_SEEN_LOCATIONS:
        raise ValueError(f"a version vector of {len(vv)} locations (at most {MAX_SEEN_LOCATIONS})")
    parts = [_text_field(here, "location"), _U16.pack(len(vv))]
    for loc, count in sorted(vv.items()):
        parts += (_text_field(loc, "location"), _U64.pack(count))
    return b"".join(parts)


def _take_seen(body: bytes, pos: int, op: str) -> Seen:
    """``encode_seen``'s field at ``pos``, which must end the body."""
    here, pos = _take_text(body, pos, op, "location")
    if len(body) < pos + _U16.size:
        raise ProtocolError(f"{op} body has no version vector size")
    (count,) = _U16.unpack_from(body, pos)
    pos += _U16.size
    if count > MAX_SEEN_LOCATIONS:
        raise ProtocolError(f"{op} version vector of {count} locations (at most {MAX_SEEN_LOCATIONS})")
    vv: dict[str, int] = {}
    for _ in range(count):
        loc, pos = _take_text(body, pos, op, "location")
        if len(body) < pos + _U64.size:
            raise ProtocolError(f"{op} version vector overruns the body")
        (vv[loc],) = _U64.unpack_from(body, pos)
        pos += _U64.size
    if pos != len(body):
        raise ProtocolError(f"{op} body has {len(body) - pos} bytes after the version vector")
    return here, vv


def read_entry_request(
    request_id: int, log_id: int, segment_seq: int, entry_id: int, fence: bool = False, seen: Seen | None = None, summary: bool = False,
    compress: bool = False,
) -> bytes:
    """``seen``: answer records in that location's causal past as stubs (FLAG_SKIP_SEEN);
    ``summary``: every data record as a stub (FLAG_SUMMARY); ``compress``: the answer may come
    zstd-compressed (FLAG_COMPRESS)."""
    body = _pack(_ENTRY_REF, log_id, segment_seq, entry_id)
    if fence and (seen is not None or summary or compress):
        raise ValueError("a fencing read returns entries whole and plain: no FLAG_SKIP_SEEN, FLAG_SUMMARY or FLAG_COMPRESS")
    flags = (FLAG_FENCE if fence else 0) | (FLAG_SUMMARY if summary else 0) | (FLAG_COMPRESS if compress else 0)
    if seen is not None:
        return encode_frame(Op.READ_ENTRY, flags | FLAG_SKIP_SEEN, request_id, body + encode_seen(seen))
    return encode_frame(Op.READ_ENTRY, flags, request_id, body)


def read_range_request(request_id: int, log_id: int, segment_seq: int, first: int, last: int, max_bytes: int) -> bytes:
    if last < first or max_bytes < 1:
        raise ValueError(f"READ_RANGE of entries {first}..{last} with max bytes {max_bytes}: needs first <= last and max bytes >= 1")
    return encode_frame(Op.READ_RANGE, 0, request_id, _pack(_RANGE_REQ, log_id, segment_seq, first, last, min(max_bytes, 2**32 - 1)))


def pull_range_request(request_id: int, log_id: int, segment_seq: int, first: int, last: int, max_bytes: int, source: str, uncached: bool = True) -> bytes:
    if last < first or max_bytes < 1:
        raise ValueError(f"PULL_RANGE of entries {first}..{last} with max bytes {max_bytes}: needs first <= last and max bytes >= 1")
    body = _pack(_RANGE_REQ, log_id, segment_seq, first, last, min(max_bytes, 2**32 - 1)) + _text_field(source, "source node id")
    return encode_frame(Op.PULL_RANGE, FLAG_UNCACHED if uncached else 0, request_id, body)


def pull_segment_request(request_id: int, body: bytes, uncached: bool = True) -> bytes:
    """``body``: a ``PullRequest``'s JSON (checked field by field by the agent)."""
    if not 0 < len(body) <= MAX_PULL_SEGMENT_BODY:
        raise ValueError(f"PULL_SEGMENT body of {len(body)} bytes: must be 1..{MAX_PULL_SEGMENT_BODY}")
    return encode_frame(Op.PULL_SEGMENT, FLAG_UNCACHED if uncached else 0, request_id, body)


def read_lac_request(request_id: int, log_id: int, segment_seq: int) -> bytes:
    return encode_frame(Op.READ_LAC, 0, request_id, _pack(_SEG, log_id, segment_seq))


def long_poll_request(
    request_id: int, log_id: int, segment_seq: int, previous_lac: int, timeout_ms: int, seen: Seen | None = None, compress: bool = False,
) -> bytes:
    timeout_ms = max(0, min(int(timeout_ms), MAX_LONG_POLL_MS))
    body = _pack(_LONG_POLL, log_id, segment_seq, previous_lac, timeout_ms)
    flags = FLAG_COMPRESS if compress else 0
    if seen is not None:
        return encode_frame(Op.LONG_POLL, flags | FLAG_SKIP_SEEN, request_id, body + encode_seen(seen))
    return encode_frame(Op.LONG_POLL, flags, request_id, body)


def fence_request(request_id: int, log_id: int, segment_seq: int) -> bytes:
    return encode_frame(Op.FENCE, 0, request_id, _pack(_SEG, log_id, segment_seq))


def digest_request(request_id: int, log_id: int, segment_seq: int, first: int = 0, last: int | None = None) -> bytes:
    return encode_frame(Op.DIGEST, 0, request_id, _pack(_DIGEST_REQ, log_id, segment_seq, first, -1 if last is None else last))


def list_segments_request(request_id: int) -> bytes:
    return encode_frame(Op.LIST_SEGMENTS, 0, request_id)


def delete_segment_request(request_id: int, log_id: int, segment_seq: int) -> bytes:
    return encode_frame(Op.DELETE_SEGMENT, 0, request_id, _pack(_SEG, log_id, segment_seq))


def stat_request(request_id: int) -> bytes:
    return encode_frame(Op.STAT, 0, request_id)


def _text_field(text: str, what: str) -> bytes:
    """A name on the wire: u16 length, then 1..MAX_LOG_NAME bytes of UTF-8."""
    raw = text.encode("utf-8")
    if not 0 < len(raw) <= MAX_LOG_NAME:
        raise ValueError(f"{what} of {len(raw)} bytes: must be 1..{MAX_LOG_NAME}")
    return _U16.pack(len(raw)) + raw


def _name_field(name: str) -> bytes:
    return _text_field(name, "log name")


_IDEMPOTENCE = struct.Struct(">IQ")  # APPEND: epoch, sequence


def append_request(
    request_id: int, name: str, producer: int, count: int, records: bytes | memoryview, reset_order: bool = False, *,
    epoch: int | None = None, seq: int | None = None, retry: bool = False, forward: bool = False,
) -> bytes:
    """``records``: ``count`` records in the dlctl.log.records layout (their txids are ignored:
    the owner assigns them). ``producer``: the sender's u64 id, which scopes the order barrier;
    with ``epoch`` and ``seq`` the request is idempotent (deduplicated by the owner)."""
    flags = (FLAG_RESET_ORDER if reset_order else 0) | (FLAG_FORWARD if forward else 0)
    head = _name_field(name) + _U64.pack(producer)
    if seq is not None:
        if epoch is None or seq < 1:
            raise ValueError(f"an idempotent APPEND needs an epoch and a sequence >= 1 (got {epoch}, {seq})")
        flags |= FLAG_IDEMPOTENT | (FLAG_RETRY if retry else 0)
        head += _pack(_IDEMPOTENCE, epoch, seq)
    return encode_frame(Op.APPEND, flags, request_id, head + _U32.pack(count) + bytes(records))


def release_request(request_id: int, name: str) -> bytes:
    return encode_frame(Op.RELEASE, 0, request_id, _name_field(name))


def _take_text(body: bytes, pos: int, op: str, field: str) -> tuple[str, int]:
    """The name field ``field`` of an ``op`` body at ``pos`` (``_text_field``'s layout) and
    where the body goes on."""
    if len(body) < pos + _U16.size:
        raise ProtocolError(f"{op} body of {len(body)} bytes has no {field}")
    (size,) = _U16.unpack_from(body, pos)
    end = pos + _U16.size + size
    if not 0 < size <= MAX_LOG_NAME or len(body) < end:
        raise ProtocolError(f"{op} {field} of {size} bytes overruns the body or is out of range 1..{MAX_LOG_NAME}")
    try:
        return body[pos + _U16.size : end].decode("utf-8"), end
    except UnicodeDecodeError:
        raise ProtocolError(f"{op} {field} is not UTF-8") from None


def _take_name(body: bytes, what: str) -> tuple[str, int]:
    return _take_text(body, 0, what, "log name")


class Request(NamedTuple):
    """A decoded request; ``args`` are the op's fields in request-body order (see the table)."""

    op: Op
    flags: int
    request_id: int
    args: tuple[Any, ...]


def _unpack_exact(st: struct.Struct, body: bytes, what: str) -> tuple[Any, ...]:
    if len(body) != st.size:
        raise ProtocolError(f"{what} body is {len(body)} bytes, expected {st.size}")
    return st.unpack(body)


def _with_seen(st: struct.Struct, body: bytes, flags: int, what: str) -> tuple[Any, ...]:
    """The fixed fields, then (FLAG_SKIP_SEEN) the ``Seen`` field as one more argument."""
    if not flags & FLAG_SKIP_SEEN:
        return _unpack_exact(st, body, what)
    if len(body) < st.size:
        raise ProtocolError(f"{what} body is {len(body)} bytes, shorter than {st.size}")
    return (*st.unpack_from(body, 0), _take_seen(body, st.size, what))


def decode_request(frame: Frame, refuse: int = 0) -> Request:
    """Validate a request frame's opcode, flags and body layout (not the id ranges: see format.validate_ids).
    ``refuse``: flags to treat as unknown (an agent with compression switched off refuses
    FLAG_COMPRESS exactly as an agent that predates it does)."""
    opcode, flags, request_id, body = frame
    if opcode & RESPONSE:
        raise ProtocolError(f"request {request_id} has the response bit set (opcode {opcode:#x})")
    try:
        op = Op(opcode)
    except ValueError:
        raise ProtocolError(f"unknown opcode {opcode} in request {request_id}") from None
    if op is Op.HELLO:
        raise ProtocolError(f"HELLO is sent by the agent, not a request (request {request_id})")
    if flags & ~(_ALLOWED_FLAGS[op] & ~refuse):
        raise ProtocolError(f"unknown flags {flags:#x} for {op.name} in request {request_id}")
    args: tuple[Any, ...]
    if op is Op.ADD_ENTRY:
        if len(body) < ENTRY_HEADER_SIZE:
            raise ProtocolError(f"ADD_ENTRY body of {len(body)} bytes is shorter than an entry header")
        args = (body,)
    elif op is Op.ADD_BATCH:
        if not ENTRY_HEADER_SIZE <= len(body) <= MAX_BATCH_BYTES:
            raise ProtocolError(
                f"ADD_BATCH request {request_id}: a body of {len(body)} bytes, must be {ENTRY_HEADER_SIZE}..{MAX_BATCH_BYTES} "
                "(at least one entry; a larger entry travels by ADD_ENTRY); nothing stored"
            )
        try:
            spans = split_entries(body, "ADD_BATCH body")
        except ProtocolError as exc:
            raise ProtocolError(f"ADD_BATCH request {request_id}: {exc}; nothing stored") from None
        args = (body, spans)
    elif op is Op.READ_ENTRY:
        args = _with_seen(_ENTRY_REF, body, flags, op.name)
        if flags & (FLAG_SKIP_SEEN | FLAG_SUMMARY | FLAG_COMPRESS) and flags & FLAG_FENCE:
            raise ProtocolError(f"READ_ENTRY request {request_id}: FENCE with SKIP_SEEN, SUMMARY or COMPRESS (a fencing read returns entries whole and plain)")
    elif op is Op.READ_RANGE:
        args = _unpack_exact(_RANGE_REQ, body, op.name)
        if args[3] < args[2]:
            raise ProtocolError(f"READ_RANGE request {request_id}: last entry {args[3]} is before first entry {args[2]}")
        if args[4] < 1:
            raise ProtocolError(f"READ_RANGE request {request_id}: max bytes must be at least 1")
    elif op is Op.PULL_RANGE:
        if len(body) < _RANGE_REQ.size:
            raise ProtocolError(f"PULL_RANGE body of {len(body)} bytes is shorter than {_RANGE_REQ.size}")
        log_id, seg, first, last, max_bytes = _RANGE_REQ.unpack_from(body, 0)
        source, end = _take_text(body, _RANGE_REQ.size, "PULL_RANGE", "source node id")
        if end != len(body):
            raise ProtocolError(f"PULL_RANGE body has {len(body) - end} bytes after the source node id")
        if last < first or first < 0:
            raise ProtocolError(f"PULL_RANGE request {request_id}: entries {first}..{last} (needs 0 <= first <= last)")
        if max_bytes < 1:
            raise ProtocolError(f"PULL_RANGE request {request_id}: max bytes must be at least 1")
        args = (log_id, seg, first, last, max_bytes, source)
    elif op is Op.PULL_SEGMENT:
        if not 0 < len(body) <= MAX_PULL_SEGMENT_BODY:
            raise ProtocolError(f"PULL_SEGMENT request {request_id}: a body of {len(body)} bytes, must be 1..{MAX_PULL_SEGMENT_BODY}")
        args = (bytes(body),)
    elif op in (Op.READ_LAC, Op.FENCE, Op.DELETE_SEGMENT):
        args = _unpack_exact(_SEG, body, op.name)
    elif op is Op.LONG_POLL:
        args = _with_seen(_LONG_POLL, body, flags, op.name)
    elif op is Op.DIGEST:
        log_id, seg, first, last = _unpack_exact(_DIGEST_REQ, body, op.name)
        args = (log_id, seg, first, None if last < 0 else last)
    elif op is Op.APPEND:
        name, pos = _take_name(body, op.name)
        idempotent = bool(flags & FLAG_IDEMPOTENT)
        if flags & FLAG_RETRY and not idempotent:
            raise ProtocolError(f"APPEND request {request_id}: RETRY without IDEMPOTENT")
        fixed = _U64.size + (_IDEMPOTENCE.size if idempotent else 0) + _U32.size
        if len(body) < pos + fixed:
            what = "producer id, epoch, sequence" if idempotent else "producer id"
            raise ProtocolError(f"APPEND body of {len(body)} bytes has no {what} and record count")
        (producer,) = _U64.unpack_from(body, pos)
        pos += _U64.size
        epoch = seq = None
        if idempotent:
            epoch, seq = _IDEMPOTENCE.unpack_from(body, pos)
            pos += _IDEMPOTENCE.size
            if seq < 1:
                raise ProtocolError(f"APPEND request {request_id}: sequence {seq} (an idempotent request's starts at 1)")
        (count,) = _U32.unpack_from(body, pos)
        if count == 0:
            raise ProtocolError("APPEND carries no records")
        args = (name, producer, count, memoryview(body)[pos + _U32.size :], epoch, seq)
    elif op is Op.RELEASE:
        name, pos = _take_name(body, op.name)
        if pos != len(body):
            raise ProtocolError(f"RELEASE body has {len(body) - pos} bytes after the log name")
        args = (name,)
    elif op is Op.AUTH:
        if len(body) != NONCE_SIZE + PROOF_SIZE:
            raise ProtocolError(f"AUTH body is {len(body)} bytes, expected {NONCE_SIZE + PROOF_SIZE}")
        args = (body[:NONCE_SIZE], body[NONCE_SIZE:])
    else:  # LIST_SEGMENTS, STAT
        if body:
            raise ProtocolError(f"{op.name} takes no body, got {len(body)} bytes")
        args = ()
    return Request(op, flags, request_id, args)


# --------------------------------------------------------------------------------------------
# Responses


def ok_response(op: int, request_id: int, result: Buffer = b"") -> bytes:
    head = _frame_head(op | RESPONSE, 0, request_id, len(_OK_PREAMBLE) + len(result)) + _OK_PREAMBLE
    return head + result if result else head


def ok_response_parts(op: int, request_id: int, result: Buffer = b"", flags: int = 0) -> Outgoing:
    """``ok_response`` as the connection sends it: a large result (entries read) is not copied
    into the frame. ``flags``: FLAG_COMPRESSED for a compressed result."""
    return _outgoing(_frame_head(op | RESPONSE, flags, request_id, len(_OK_PREAMBLE) + len(result)) + _OK_PREAMBLE, result)


def add_ok_response(request_id: int) -> bytes:
    """The hottest response, packed without intermediate objects."""
    return FRAME_HEADER.pack(FRAME_HEADER_SIZE - 4 + 3, PROTOCOL_VERSION, Op.ADD_ENTRY | RESPONSE, 0, request_id) + _OK_PREAMBLE


def error_response(op: int, request_id: int, status: int, message: str, owner: str | None = None) -> bytes:
    if not 0 < status <= 255:
        raise ValueError(f"error status {status} out of range 1..255")
    msg = message.encode("utf-8", "replace")[:MAX_MESSAGE]
    extra = owner.encode("utf-8", "replace")[:MAX_MESSAGE] if owner else b""
    return encode_frame(op | RESPONSE, 0, request_id, _ERR.pack(status, len(msg)) + msg + extra)


def response_for_error(op: int, request_id: int, exc: AgentError) -> bytes:
    owner = exc.owner if isinstance(exc, NotOwnerError) else None
    return error_response(op, request_id, exc.status, exc.message, owner)


def hello_frame(server_nonce: bytes) -> bytes:
    return ok_response(Op.HELLO, 0, server_nonce)


def decode_response(frame: Frame) -> bytes:
    """The op-specific result of a successful response; raises the typed error of a failed one."""
    body = frame.body
    if len(body) < 3:
        raise ProtocolError(f"response {frame.request_id} body of {len(body)} bytes is shorter than its status")
    status, msg_len = _ERR.unpack_from(body, 0)
    if status == STATUS_OK:
        if msg_len:
            raise ProtocolError(f"ok response {frame.request_id} carries a message")
        return body[3:]
    end = 3 + msg_len
    if len(body) < end:
        raise ProtocolError(f"response {frame.request_id} message of {msg_len} bytes overruns the frame")
    message = body[3:end].decode("utf-8", "replace")
    if status == NotOwnerError.status:
        raise NotOwnerError(message, owner=body[end:].decode("utf-8", "replace") or None)
    raise error_for_status(status, message)


# Result bodies -------------------------------------------------------------------------------


def split_entries(result: bytes | bytearray | memoryview, what: str = "READ_RANGE result") -> list[tuple[int, int]]:
    """(start, end) of each encoded entry in a READ_RANGE result (or an ADD_BATCH body), by their
    headers' lengths (not verified: the caller checks each entry); raises ``ProtocolError`` when
    they do not tile it, naming the entry by its position and offset."""
    out = []
    pos, end = 0, len(result)
    unpack = _U32.unpack_from
    while pos < end:
        if end - pos < ENTRY_HEADER_SIZE:
            raise ProtocolError(f"{what}: {end - pos} bytes at offset {pos} are too few for an entry header (entry {len(out)} of the body)")
        (length,) = unpack(result, pos + ENTRY_HEADER_SIZE - 8)
        stop = pos + ENTRY_HEADER_SIZE + length
        if stop > end:
            raise ProtocolError(
                f"{what}: the entry at offset {pos} claims {length} payload bytes, {end - pos - ENTRY_HEADER_SIZE} remain (entry {len(out)} of the body)"
            )
        out.append((pos, stop))
        pos = stop
    return out


def encode_added(count: int) -> bytes:
    """ADD_BATCH result: how many entries the batch held (every one of them durable)."""
    return _U32.pack(count)


def decode_added(result: bytes) -> int:
    return _unpack_exact(_U32, result, "ADD_BATCH result")[0]


@dataclass(frozen=True, slots=True)
class SegmentDigest:
    """A replica's summary of a range of a segment, for comparing replicas (also what the store returns)."""

    log_id: int
    segment_seq: int
    entries: int
    first_entry_id: int
    last_entry_id: int
    lac: int
    bytes: int
    digest: str


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment replica held by an agent (also what the store returns)."""

    log_id: int
    segment_seq: int
    entries: int
    last_entry_id: int
    lac: int
    fenced: bool
    limbo: bool
    size_bytes: int


class FenceResult(NamedTuple):
    last_entry_id: int
    lac: int


def encode_lac(lac: int) -> bytes:
    return _I64.pack(lac)


def decode_lac(result: bytes) -> int:
    return _unpack_exact(_I64, result, "READ_LAC result")[0]


def encode_long_poll_result(lac: int, entry: bytes | None) -> bytes:
    return _I64.pack(lac) + entry if entry else _I64.pack(lac)


def decode_long_poll_result(result: bytes) -> tuple[int, bytes | None]:
    if len(result) < _I64.size:
        raise ProtocolError(f"LONG_POLL result of {len(result)} bytes is shorter than a LAC")
    (lac,) = _I64.unpack_from(result, 0)
    return lac, (result[_I64.size :] or None)


def encode_fence_result(last_entry_id: int, lac: int) -> bytes:
    return _FENCE_RES.pack(last_entry_id, lac)


def decode_fence_result(result: bytes) -> FenceResult:
    return FenceResult(*_unpack_exact(_FENCE_RES, result, "FENCE result"))


def encode_digest(d: Any) -> bytes:
    """Accepts anything with SegmentDigest's attributes (storage's Digest included)."""
    digest = str(d.digest).encode("ascii")
    return _DIGEST_RES.pack(d.log_id, d.segment_seq, d.entries, d.first_entry_id, d.last_entry_id, d.lac, d.bytes) + digest


def decode_digest(result: bytes) -> SegmentDigest:
    if len(result) < _DIGEST_RES.size:
        raise ProtocolError(f"DIGEST result of {len(result)} bytes is shorter than {_DIGEST_RES.size}")
    fields = _DIGEST_RES.unpack_from(result, 0)
    try:
        digest = result[_DIGEST_RES.size :].decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("DIGEST result digest is not ASCII") from None
    return SegmentDigest(*fields, digest)


def encode_deleted(deleted: bool) -> bytes:
    return b"\x01" if deleted else b"\x00"


def decode_deleted(result: bytes) -> bool:
    if result not in (b"\x00", b"\x01"):
        raise ProtocolError(f"DELETE_SEGMENT result {result[:8]!r} is not a 0/1 byte")
    return result == b"\x01"


def _json_dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), default=str).encode("utf-8")


def _json_loads(result: bytes, what: str) -> Any:
    try:
        return json.loads(result)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"{what} result is not valid JSON: {exc}") from None


_SEGMENT_INFO_TYPES: dict[str, type] = {
    "log_id": int,
    "segment_seq": int,
    "entries": int,
    "last_entry_id": int,
    "lac": int,
    "fenced": bool,
    "limbo": bool,
    "size_bytes": int,
}


def encode_segments(segments: list[Any]) -> bytes:
    """Accepts SegmentInfo-like objects (storage's SegmentInfo included)."""
    return _json_dumps([{name: getattr(s, name) for name in _SEGMENT_INFO_TYPES} for s in segments])


def decode_segments(result: bytes) -> list[SegmentInfo]:
    data = _json_loads(result, "LIST_SEGMENTS")
    if not isinstance(data, list):
        raise ProtocolError("LIST_SEGMENTS result is not a JSON array")
    out = []
    for item in data:
        if not isinstance(item, dict):
            raise ProtocolError("LIST_SEGMENTS item is not a JSON object")
        try:
            values = {name: item[name] for name in _SEGMENT_INFO_TYPES}
        except KeyError as exc:
            raise ProtocolError(f"LIST_SEGMENTS item lacks {exc}") from None
        for name, typ in _SEGMENT_INFO_TYPES.items():
            # bool is an int subclass; keep the two apart so a fenced flag cannot pass as a count
            if type(values[name]) is not typ:
                raise ProtocolError(f"LIST_SEGMENTS item field {name} is not {typ.__name__}")
        out.append(SegmentInfo(**values))
    return out


def encode_dlsns(positions: list[Any]) -> bytes:
    """APPEND result: DLSN-like objects (segment_seq, entry_id, slot), one per record."""
    return _U32.pack(len(positions)) + b"".join(_DLSN.pack(d.segment_seq, d.entry_id, d.slot) for d in positions)


def decode_dlsns(result: bytes) -> list[tuple[int, int, int]]:
    if len(result) < _U32.size:
        raise ProtocolError("APPEND result has no count")
    (count,) = _U32.unpack_from(result, 0)
    if len(result) != _U32.size + count * _DLSN.size:
        raise ProtocolError(f"APPEND result of {len(result)} bytes does not hold {count} positions")
    return [_DLSN.unpack_from(result, _U32.size + i * _DLSN.size) for i in range(count)]


class PullResult(NamedTuple):
    """PULL_RANGE's answer: ``entries`` consecutive entries from the first asked for are durable
    on the agent, ``bytes`` in all, with these CRC-32Cs; ``reason`` why it stopped before the
    last asked for (empty when it did not)."""

    entries: int
    bytes: int
    reason: str
    crcs: tuple[int, ...]


_PULL_RES = struct.Struct(">IQ")


def encode_pulled(entries: int, nbytes: int, reason: str, crcs: Sequence[int]) -> bytes:
    if len(crcs) != entries:
        raise ValueError(f"PULL_RANGE result: {len(crcs)} CRCs for {entries} entries")
    text = reason.encode("utf-8", "replace")[:MAX_MESSAGE]
    return _PULL_RES.pack(entries, nbytes) + _U16.pack(len(text)) + text + struct.pack(f">{entries}I", *crcs)


def decode_pulled(result: bytes) -> PullResult:
    if len(result) < _PULL_RES.size + _U16.size:
        raise ProtocolError(f"PULL_RANGE result of {len(result)} bytes is shorter than {_PULL_RES.size + _U16.size}")
    entries, nbytes = _PULL_RES.unpack_from(result, 0)
    (size,) = _U16.unpack_from(result, _PULL_RES.size)
    start = _PULL_RES.size + _U16.size
    if len(result) != start + size + 4 * entries:
        raise ProtocolError(f"PULL_RANGE result of {len(result)} bytes does not hold a {size}-byte reason and {entries} CRCs")
    reason = result[start : start + size].decode("utf-8", "replace")
    return PullResult(entries, nbytes, reason, struct.unpack_from(f">{entries}I", result, start + size))


def decode_pulled_segment(result: bytes) -> dict[str, Any]:
    data = _json_loads(result, "PULL_SEGMENT")
    if not isinstance(data, dict):
        raise ProtocolError("PULL_SEGMENT result is not a JSON object")
    return data


def decode_released(result: bytes) -> bool:
    if result not in (b"\x00", b"\x01"):
        raise ProtocolError(f"RELEASE result {result[:8]!r} is not a 0/1 byte")
    return result == b"\x01"


def encode_stat(stat: dict[str, Any]) -> bytes:
    return _json_dumps(stat)


def decode_stat(result: bytes) -> dict[str, Any]:
    data = _json_loads(result, "STAT")
    if not isinstance(data, dict):
        raise ProtocolError("STAT result is not a JSON object")
    return data
