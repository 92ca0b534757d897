"""DLSN: a record's position in a log, ``segment_seq/entry_id/slot``; total order within a log."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

_TEXT = re.compile(r"(\d{1,19})/(\d{1,19})/(\d{1,9})")


@total_ordering
@dataclass(frozen=True, slots=True)
class DLSN:
    segment_seq: int
    entry_id: int
    slot: int = 0

    def __post_init__(self) -> None:
        if self.segment_seq < 0 or self.entry_id < 0 or self.slot < 0:
            raise ValueError(f"invalid DLSN {self.segment_seq}/{self.entry_id}/{self.slot}: parts must be >= 0")

    def _key(self) -> tuple[int, int, int]:
        return (self.segment_seq, self.entry_id, self.slot)

    def __lt__(self, other: DLSN) -> bool:
        if not isinstance(other, DLSN):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        return f"{self.segment_seq}/{self.entry_id}/{self.slot}"

    @classmethod
    def parse(cls, text: str) -> DLSN:
        match = _TEXT.fullmatch(text.strip())
        if not match:
            raise ValueError(f"invalid DLSN {text!r}: expected SEGMENT/ENTRY/SLOT, e.g. 3/120/0")
        return cls(*(int(part) for part in match.groups()))

    def to_dict(self) -> str:  # rendered as its text form in JSON/YAML
        return str(self)


INITIAL = DLSN(1, 0, 0)  # the first position any log can have
