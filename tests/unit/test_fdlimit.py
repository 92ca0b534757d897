"""dlagent.fdlimit: the agent's descriptor headroom, also when no descriptor is left to count
them with (the agent raising its own limit is tested on a real agent under prlimit, in
tests/integration/test_agent_limits.py)."""

from __future__ import annotations

import os
import resource

from dlagent.fdlimit import descriptor_usage


def test_headroom_is_the_limit_less_the_descriptors_open():
    before = descriptor_usage()
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(10)]
    try:
        during = descriptor_usage()
    finally:
        for fd in fds:
            os.close(fd)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert during["fds_limit"] == soft
    assert during["fds_open"] - before["fds_open"] == 10
    assert during["fds_headroom"] == soft - during["fds_open"]


def test_with_no_descriptor_left_the_headroom_is_zero():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        usage = descriptor_usage()  # listing /proc/self/fd needs a descriptor: EMFILE
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert usage == {"fds_open": lowest_free, "fds_limit": lowest_free, "fds_headroom": 0}
