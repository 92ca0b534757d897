"""Typed errors of the agent protocol, shared by the agent (which raises them from storage and
sends their status code) and the client (which turns a status code back into the same class)."""

from __future__ import annotations

from ..errors import DlctlError


class AgentError(DlctlError):
    """An agent refused or failed a request. ``status`` is the wire status code."""

    status = 255  # unknown / internal

    def __init__(self, message: str, *, hint: str | None = None, details: object = None) -> None:
        super().__init__(message, hint=hint, details=details)


class FencedError(AgentError):
    """The segment replica is fenced: a newer writer owns the log; normal adds are refused."""

    status = 1


class NoSuchEntryError(AgentError):
    status = 2


class NoSuchSegmentError(AgentError):
    status = 3


class LimboError(AgentError):
    """The replica found corruption before valid data; it neither serves nor votes until re-replicated."""

    status = 4


class UnauthorizedError(AgentError):
    status = 5


class BadRequestError(AgentError):
    """Malformed frame, bad CRC, invalid or out-of-range ids."""

    status = 6


class AgentIOError(AgentError):
    """A disk operation failed; after a failed fsync the agent stops serving altogether."""

    status = 7


class NotOwnerError(AgentError):
    """The agent does not own the log; ``owner`` is the address of the agent that does, if known."""

    status = 8

    def __init__(self, message: str, *, owner: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint, details={"owner": owner} if owner else None)
        self.owner = owner


class OrderBarrierError(AgentError):
    """An earlier APPEND of this connection to the log failed; later ones are refused until the
    client resends from the failed one (flag RESET_ORDER), so per-client order is kept."""

    status = 9


class NoSuchLogError(AgentError):
    """APPEND/RELEASE named a log that does not exist in the agent's cluster."""

    status = 10


class ProxyDisabledError(AgentError):
    """The agent does not act as a write proxy (``[proxy] enabled = false``)."""

    status = 11


class ReadOnlyLogError(AgentError):
    """The log's access mode refuses this writer (a standby replica or a read-only log): the
    records can never be appended here; a producer fails them at once instead of retrying."""

    status = 12


class ProducerFencedError(AgentError):
    """An idempotent APPEND from an older epoch of a producer id the owner has seen a newer
    epoch of: a zombie incarnation. Nothing was written; the producer must stop."""

    status = 14


class OutOfOrderSequenceError(AgentError):
    """An idempotent APPEND whose sequence number is not the next one the owner expects of its
    producer (a gap: an earlier request never arrived). Nothing was written."""

    status = 15


class UnknownProducerError(AgentError):
    """An idempotent APPEND (not a producer's first) from a producer id the owner holds no state
    for: idle longer than ``[proxy] producer_id_ttl``, evicted, or older than the log tail a new
    owner reads. The owner cannot tell a resend from a new request, so it writes nothing; a
    producer whose request was never ambiguous starts a new epoch, otherwise it reports the
    records as possibly appended."""

    status = 16


class DuplicateTooOldError(AgentError):
    """An idempotent APPEND that repeats a request older than the few the owner remembers per
    producer: it was applied (its records are in the log), but their positions are no longer
    known. It is not written again."""

    status = 17


class PullRefusedError(AgentError):
    """PULL_SEGMENT: this agent does not read the named cluster (it is not declared as a source
    here, has no ZooKeeper connect string, or this agent runs no replication workers). Nothing
    was stored; the copier relays the segment instead."""

    status = 18


class AgentUnavailableError(AgentError):
    """Client side: the agent could not be reached, the connection dropped, or a request timed out."""

    status = 254


class AgentResourceError(AgentUnavailableError):
    """The agent ran short of a resource (file descriptors, memory, kernel buffers) and failed
    this request. Nothing is wrong with its data: retry later, or ask another replica. An agent
    never puts a replica in limbo for this (only a failed content check or a media error does)."""

    status = 13


ERRORS_BY_STATUS: dict[int, type[AgentError]] = {
    cls.status: cls
    for cls in (
        FencedError,
        NoSuchEntryError,
        NoSuchSegmentError,
        LimboError,
        UnauthorizedError,
        BadRequestError,
        AgentIOError,
        NotOwnerError,
        OrderBarrierError,
        NoSuchLogError,
        ProxyDisabledError,
        ReadOnlyLogError,
        ProducerFencedError,
        OutOfOrderSequenceError,
        UnknownProducerError,
        DuplicateTooOldError,
        PullRefusedError,
        AgentResourceError,
        AgentUnavailableError,
    )
}


def error_for_status(status: int, message: str) -> AgentError:
    cls = ERRORS_BY_STATUS.get(status, AgentError)
    return cls(message)
