"""Durable segment replica storage (the agent's "bookie" role).

Layout, durability points and recovery rules: see ``store``, ``layout``, ``sync``, ``files`` and
``recovery``.
"""

from .entries import digest_of
from .recovery import ScanResult, scan_file
from .store import SegmentStore
from .types import Digest, FenceResult, LimboRecord, RecoveryReport, SegmentInfo, SyncPolicy, TailCut

__all__ = [
    "Digest",
    "FenceResult",
    "LimboRecord",
    "RecoveryReport",
    "ScanResult",
    "SegmentInfo",
    "SegmentStore",
    "SyncPolicy",
    "TailCut",
    "digest_of",
    "scan_file",
]
