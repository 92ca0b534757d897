"""Keep large buffers on the heap instead of mapping fresh memory for each one (glibc).

Every entry added and every range read passes through buffers of 64 KiB to 16 MiB. glibc
serves an allocation above its mmap threshold (128 KiB at start, adapting upwards) with a
fresh mapping, and gives the heap's free top back to the kernel past its trim threshold, so
buffer after buffer lands on pages the kernel must fault in and zero again. On the 2-core
sandbox VM that was about a fifth of the bootstrap copy's CPU (``bytes.join`` of a 2 MiB range
read ran at 2 GB/s instead of 7; ``tests/benchmarks/profile_bootstrap.py``). A fixed mmap
threshold at glibc's maximum, above the largest frame, and a trim threshold that keeps a few
tens of MiB of freed heap let each buffer reuse pages the previous one warmed.

The cost is memory kept: up to ``trim_threshold`` bytes of freed heap stay with the process.
Other C libraries (musl) or platforms without ``mallopt`` leave the allocator as it is.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's upper limit on 64-bit; above protocol.MAX_FRAME
TRIM_THRESHOLD = 64 * 1024 * 1024

_done = False


def keep_large_buffers(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Tune this process's allocator once (see the module docstring); True if it took."""
    global _done
    if _done:
        return True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 and mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1
    if not ok:
        log.debug("mallopt refused the buffer settings; the allocator keeps its defaults")
    _done = ok
    return ok


__all__ = ["keep_large_buffers"]
