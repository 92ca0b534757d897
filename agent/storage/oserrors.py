"""Which failed reads are evidence of damage and which are only want of a resource.

One classification for every reader of replica files (client reads in reads.py, the scrubber in
scrub.py), because the cost of a wrong answer is high both ways: a replica put in limbo stops
serving and voting until it is copied again from its peers, so an agent out of descriptors
(EMFILE, from a connection flood or a load spike) must never take it for corruption; while a
medium that returns EIO must not be read from as if nothing happened.

- **Resource** errors (``RESOURCE_ERRNOS``) say nothing about the data: the request fails with a
  retryable error (``AgentResourceError``) and the same read succeeds once the resource is back.
- **Damage** (``MEDIA_ERRNOS``, or the replica's file missing when it is opened) puts the replica
  in limbo, as a failed content check (CRC, structure) does.
- Anything else (EACCES after an operator's chmod, say) fails the read with an I/O error and is
  not taken as damage: the replica is left as it is and the read can be retried elsewhere.
"""

from __future__ import annotations

import errno

RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.EINTR, errno.ENOBUFS})
MEDIA_ERRNOS = frozenset({errno.EIO, errno.EBADMSG, errno.EUCLEAN})


def is_resource(exc: OSError) -> bool:
    """The call failed for want of a resource (descriptors, memory, buffers): retry later."""
    return exc.errno in RESOURCE_ERRNOS


def is_damage(exc: OSError, *, opening: bool = False) -> bool:
    """A read (``opening``: the open before it) failed in a way that means the replica is
    damaged or gone: put it in limbo."""
    return exc.errno in MEDIA_ERRNOS or (opening and exc.errno == errno.ENOENT)


__all__ = ["MEDIA_ERRNOS", "RESOURCE_ERRNOS", "is_damage", "is_resource"]
