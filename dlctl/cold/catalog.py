"""What a cold store holds of a log: its incarnations (log ids) and the manifests of their
copies, in segment order, and whether a run of copies has a hole."""

from __future__ import annotations

from ..errors import NotFoundError, RefusedError
from ..names import validate_name
from .manifest import SegmentManifest, log_prefix
from .store import ColdStore


def incarnations(store: ColdStore, name: str) -> list[int]:
    """The log ids the store holds copies of for log ``name`` (a log deleted and created
    again is another incarnation), oldest first."""
    keys = store.list(f"logs/{validate_name('log', name)}")
    return sorted({int(k.split("/")[2]) for k in keys if k.split("/")[2].isdigit()})


def manifests(store: ColdStore, name: str, log_id: int) -> list[SegmentManifest]:
    """The manifests of one incarnation, in segment order (``check_contiguous`` says whether a
    segment is missing between two of those used: an incomplete backup must not pass for a
    whole log)."""
    keys = [k for k in store.list(log_prefix(name, log_id)) if k.endswith(".manifest.json")]
    found = sorted((SegmentManifest.from_json(store.get(k), f"{store.describe()}: {k}") for k in keys), key=lambda m: m.segment.seq)
    if not found:
        raise NotFoundError(f"{store.describe()} holds no copy of log {name!r} (log id {log_id})", hint="`dlctl log backup LOG` makes them")
    return found


def check_contiguous(store: ColdStore, name: str, log_id: int, copies: list[SegmentManifest]) -> None:
    """Raise when a segment is missing between two of ``copies``."""
    seqs = [m.segment.seq for m in copies]
    missing = sorted(set(range(seqs[0], seqs[-1] + 1)) - set(seqs)) if seqs else []
    if missing:
        raise RefusedError(
            f"{store.describe()}: the copies of log {name!r} (log id {log_id}) lack segment(s) {', '.join(map(str, missing))} "
            f"between {seqs[0]} and {seqs[-1]}",
            hint="run `dlctl log backup` while those segments still exist; nothing was restored",
        )
