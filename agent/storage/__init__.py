"""Durable segment replica storage (the agent's "bookie" role).

Layout, durability points and recovery rules: see ``store``, ``layout``, ``sync`` and
``recovery``.
"""

from .recovery import ScanResult, scan_file
from .store import SegmentStore, digest_of
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
