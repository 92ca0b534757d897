"""Compressed answers on the agent protocol (issue 23): the codec, and what a reader counts.

A reader that pays for bandwidth (a replication stream reading across a WAN) sets
FLAG_COMPRESS on its reads and long polls; an agent that knows the flag may answer the result
as one zstd frame and marks that response FLAG_COMPRESSED (``dlctl.log.protocol``). One frame
per answer, not per record: the records of an entry repeat their key shapes, header names and
payload structure, which is what zstd finds; a record alone is mostly too small to gain.

The agent compresses only what pays: bodies under ``MIN_BYTES`` go plain (the frame header and
the call cost more than they save), and so does a body that does not shrink by an eighth
(already compressed payloads: the reader would spend a decompression for nothing). Level 1:
the agent compresses on its event loop, so CPU matters more than the last few percent of ratio
(tests/benchmarks/bench_compression.py). The frame carries no zstd checksum: every entry inside
carries its writer's CRC-32C, which the reader verifies after decompressing (end to end).

Decoding never trusts the peer: a frame must state its decompressed size, and one that claims
more than the protocol's largest frame is refused before anything is allocated (zstd allocates
what the frame header claims: a few bytes could otherwise ask for GiBs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import zstandard

LEVEL = 1
MIN_BYTES = 512  # a smaller answer goes plain


class CorruptCompressed(ValueError):
    """A compressed answer that cannot be (or must not be) decompressed; the message says why."""


class Compressor:
    """The agent's side, one per connection: the zstd context (tables, buffers) is reused for
    every answer instead of allocated per answer. Not thread-safe (one event loop uses it)."""

    __slots__ = ("_zstd",)

    def __init__(self, level: int = LEVEL) -> None:
        self._zstd = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)

    def compress(self, body: bytes | bytearray | memoryview) -> bytes | None:
        """``body`` as one zstd frame (stating its size), or None when compressing it does not pay."""
        size = len(body)
        if size < MIN_BYTES:
            return None
        packed = self._zstd.compress(body)
        return packed if len(packed) <= size - size // 8 else None


class Decompressor:
    """The reader's side, one per agent client (its context reused likewise)."""

    __slots__ = ("_zstd",)

    def __init__(self) -> None:
        self._zstd = zstandard.ZstdDecompressor()

    def decompress(self, data: bytes | bytearray | memoryview, limit: int, what: str) -> bytes:
        """The body ``data`` holds (exactly one zstd frame); ``CorruptCompressed`` naming
        ``what`` when it is not a frame, does not state its size, claims more than ``limit``
        bytes, or does not decompress to what it claims."""
        try:
            size = zstandard.frame_content_size(data)
        except zstandard.ZstdError as exc:
            raise CorruptCompressed(f"{what}: not a zstd frame ({exc})") from None
        if size < 0:
            raise CorruptCompressed(f"{what}: the zstd frame does not state its decompressed size")
        if size > limit:
            raise CorruptCompressed(f"{what}: the zstd frame claims {size} bytes decompressed, more than the {limit}-byte maximum frame: refused")
        try:
            return self._zstd.decompress(data, allow_extra_data=False)
        except zstandard.ZstdError as exc:
            raise CorruptCompressed(f"{what}: corrupt zstd frame ({exc})") from None


NONE = "none"
ZSTD = "zstd"
LACKING = "none (source agent lacks zstd)"


@dataclass
class WireStats:
    """The answers to one reader's reads and long polls (a replication stream's log): their
    result bytes as they crossed the wire (``wire``) and as decoded (``payload``), and for each
    agent asked whether it compresses (False: it refused FLAG_COMPRESS, as an agent that
    predates it or has ``[server] compression = false`` does), as last found. ``ask`` False:
    count only, ask nothing (a stream with compression "none")."""

    ask: bool = True
    wire: int = 0
    payload: int = 0
    agents: dict[str, bool] = field(default_factory=dict)

    def count(self, wire: int, payload: int) -> None:
        self.wire += wire
        self.payload += payload

    def mode(self) -> str:
        """The compression in effect: "none", "zstd", "none (source agent lacks zstd)" when no
        agent asked compresses, or "zstd (plain from A, B)" when only some do."""
        if not self.ask:
            return NONE
        plain = sorted(a for a, compresses in self.agents.items() if not compresses)
        if not plain:
            return ZSTD
        if len(plain) == len(self.agents):
            return LACKING
        return f"{ZSTD} (plain from {', '.join(plain)}: they lack zstd)"
