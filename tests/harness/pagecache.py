"""Which pages of a file are in the kernel's page cache: ``mincore`` on an untouched mapping."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
_MAP_FAILED = ctypes.c_void_p(-1).value


def pages(length: int) -> int:
    return (length + PAGE - 1) // PAGE


def resident_pages(path: Path, length: int) -> int:
    """How many pages of the first ``length`` bytes of ``path`` are in the page cache. The shared
    read-only mapping is never touched, so asking brings no page in."""
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = (ctypes.c_ubyte * pages(length))()
            if _libc.mincore(addr, length, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(v & 1 for v in vec)
        finally:
            _libc.munmap(addr, length)
    finally:
        os.close(fd)
