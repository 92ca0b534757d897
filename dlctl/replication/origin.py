"""Where a replicated record came from, carried in record headers (reserved prefix ``dl.``).

    dl.origin.cluster   the location that first wrote the record (UTF-8 cluster name)
    dl.origin.dlsn      its DLSN in that location's log ("seq/entry/slot")
    dl.vt               its vector timestamp over the locations ("east=3,west=5", sorted)
    dl.src              "<cluster>@<dlsn>": the record's position in the log of the stream's
                        *source* that applied it here, when that differs from its origin (a
                        record relayed, e.g. around a cycle); absent, the source position is the
                        origin's. A worker resumes after the last one.

A record without ``dl.origin.*`` was written locally. Its vector timestamp is derived, not
stored: see ``dlctl.replication.causal``. Stable: the bootstrap copy uses the same headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..log.dlsn import DLSN
from ..names import validate_name

ORIGIN_CLUSTER = "dl.origin.cluster"
ORIGIN_DLSN = "dl.origin.dlsn"
VECTOR_TIME = "dl.vt"
SOURCE_POSITION = "dl.src"
RESERVED_PREFIX = "dl."

VectorTime = Mapping[str, int]


class OriginHeaderError(ValueError):
    """A ``dl.*`` header that does not parse; the record was written by something broken."""


def encode_vt(vt: VectorTime) -> bytes:
    return ",".join(f"{loc}={vt[loc]}" for loc in sorted(vt) if vt[loc] > 0).encode()


def decode_vt(raw: bytes) -> dict[str, int]:
    out: dict[str, int] = {}
    if not raw:
        return out
    try:
        for part in raw.decode().split(","):
            loc, _, count = part.partition("=")
            value = int(count)
            if value < 0:
                raise ValueError("negative counter")
            out[validate_name("location", loc)] = value
    except (ValueError, UnicodeDecodeError) as exc:
        raise OriginHeaderError(f"malformed {VECTOR_TIME} header {raw[:80]!r}: {exc}") from None
    return out


@dataclass(frozen=True)
class Origin:
    cluster: str
    dlsn: DLSN
    vt: dict[str, int]

    def headers(self) -> dict[str, bytes]:
        return {ORIGIN_CLUSTER: self.cluster.encode(), ORIGIN_DLSN: str(self.dlsn).encode(), VECTOR_TIME: encode_vt(self.vt)}

    @classmethod
    def from_headers(cls, headers: Mapping[str, bytes]) -> Origin | None:
        """The origin of a replicated record, or None for a record written locally."""
        cluster = headers.get(ORIGIN_CLUSTER)
        if cluster is None:
            return None
        try:
            name = validate_name("origin cluster", cluster.decode())
            dlsn = DLSN.parse(headers[ORIGIN_DLSN].decode())
        except (KeyError, ValueError, UnicodeDecodeError) as exc:
            raise OriginHeaderError(f"malformed origin headers: {exc}") from None
        return cls(name, dlsn, decode_vt(headers.get(VECTOR_TIME, b"")))


def encode_source_position(cluster: str, dlsn: DLSN) -> bytes:
    return f"{cluster}@{dlsn}".encode()


def decode_source_position(headers: Mapping[str, bytes]) -> tuple[str, DLSN] | None:
    """Where the stream that applied this record read it: ``dl.src``, else its origin."""
    raw = headers.get(SOURCE_POSITION)
    if raw is None:
        origin = Origin.from_headers(headers)
        return (origin.cluster, origin.dlsn) if origin is not None else None
    try:
        cluster, _, dlsn = raw.decode().partition("@")
        return validate_name("source cluster", cluster), DLSN.parse(dlsn)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OriginHeaderError(f"malformed {SOURCE_POSITION} header {raw[:80]!r}: {exc}") from None


def origin_event(headers: Mapping[str, bytes]) -> tuple[str, int] | None:
    """A replicated record's identity as an event of its origin: (origin location, the origin's
    own counter in its vector time). None for a record written locally (or without one)."""
    if ORIGIN_CLUSTER not in headers:
        return None
    origin = Origin.from_headers(headers)
    counter = origin.vt.get(origin.cluster, 0) if origin is not None else 0
    return (origin.cluster, counter) if origin is not None and counter > 0 else None


def applied_headers(headers: Mapping[str, bytes], origin: Origin | None, source: bytes, position: bytes, vt: VectorTime) -> dict[str, bytes]:
    """The headers a stream gives a record it applies at its sink: the application's, its origin
    (a record written at the source ``source``: its position there, ``position``, as
    ``str(dlsn).encode()``; a relayed one keeps its origin and says where the stream read it)
    and its vector time ``vt``. Every appender of replicated records builds them here."""
    out = {k: v for k, v in headers.items() if not k.startswith(RESERVED_PREFIX)} if headers else {}
    if origin is None:
        out[ORIGIN_CLUSTER] = source
        out[ORIGIN_DLSN] = position
    else:
        out[ORIGIN_CLUSTER] = headers[ORIGIN_CLUSTER]
        out[ORIGIN_DLSN] = headers[ORIGIN_DLSN]
        out[SOURCE_POSITION] = source + b"@" + position
    out[VECTOR_TIME] = encode_vt(vt)
    return out


def user_headers(headers: Mapping[str, bytes]) -> dict[str, bytes]:
    """The application's headers: everything outside the reserved ``dl.`` prefix."""
    return {k: v for k, v in headers.items() if not k.startswith(RESERVED_PREFIX)}
