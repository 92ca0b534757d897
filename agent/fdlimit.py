"""The agent's file descriptors: raise the soft limit to the hard one at start, and report how
many are open against the limit (``stat``: ``fds_open``, ``fds_limit``, ``fds_headroom``).

Every connection and every open replica file costs a descriptor. Many systems still start
services with a soft limit of 1,024 (and a hard one far above it): at that limit the default
connection limits alone (1,024 authenticated + 256 unauthenticated, limits.py) and the store's
cache of open replica files (512) cannot all fit, and a busy agent fails reads with EMFILE — a
retryable error since issue 19, but a needless one. The hard limit is the operator's to set
(systemd ``LimitNOFILE=``, limits.conf); the soft one is ours to raise up to it.
"""

from __future__ import annotations

import errno
import logging
import os
import resource

log = logging.getLogger(__name__)

_NR_OPEN = "/proc/sys/fs/nr_open"  # the kernel's ceiling when the hard limit is "unlimited"


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the (soft, hard) limits in force after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open(_NR_OPEN) as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
        else:
            log.info("open-files limit raised from %d to %d (the hard limit)", soft, target)
            soft = target
    return soft, hard


def check_headroom(needed: int) -> None:
    """Warn when the descriptor limit is below what the configured limits may use at once."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "the open-files limit (%d) is below what the configured limits may use (about %d: connections, "
            "unauthenticated connections, open replica files and a reserve); under load reads fail with EMFILE "
            "(retryable, never limbo) — raise the hard limit (systemd LimitNOFILE=, /etc/security/limits.conf) "
            "or lower [server] max_connections",
            soft, needed,
        )


def descriptor_usage() -> dict[str, int | None]:
    """Open descriptors against the soft limit. When the count itself fails for want of a
    descriptor (listing /proc/self/fd needs one), every descriptor is in use: headroom 0."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = None if soft == resource.RLIM_INFINITY else soft
    try:
        # listdir's own descriptor is in the listing, and closed again by the time it returns.
        open_fds: int | None = len(os.listdir("/proc/self/fd")) - 1
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):  # none left: of ours, or of the system's
            return {"fds_open": limit if exc.errno == errno.EMFILE else None, "fds_limit": limit, "fds_headroom": 0}
        open_fds = None
    headroom = None if open_fds is None or limit is None else max(0, limit - open_fds)
    return {"fds_open": open_fds, "fds_limit": limit, "fds_headroom": headroom}


__all__ = ["check_headroom", "descriptor_usage", "raise_nofile_limit"]
