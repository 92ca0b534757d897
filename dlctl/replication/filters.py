"""Replication filters: which records a stream carries (issue 21, Eventuate #314).

``init-replication --filter CLAUSE`` (repeatable; a record passes when it matches every clause):

- ``key=PATTERN``: the record key (UTF-8; undecodable bytes never match a pattern with letters)
  matches the shell pattern (``fnmatch``, case-sensitive);
- ``header.NAME=PATTERN``: the record has header NAME and its value matches the pattern.

Where filters may sit is the network's business (``dlctl.ops.network_rules.check_connection``):
a filter drops part of an origin's events at the sink, and the sink's owner takes an origin's
earlier events for held once a later one arrived. So a second path into that sink without the
same filter, or a cycle through the filtered connection, would deliver an origin's events out
of their order and lose the late ones; and a filter once widened or removed would never bring
what it held back. A filter is accepted only on a connection that never was on a cycle, into a
*terminal* location (one that passes nothing on, now or before: its holes would otherwise reach
a third location ahead of what another path brings), and every feed of that location, then and
later, carries the same filter: #314's redundant filtered connections (two feeds at once) and
fail-over (another feed once the first is lost), reduced to terminal locations, where #314's
write-time CVV check has nothing to check (a terminal location sends nothing back). The unit
model (``tests/unit/test_replication_network_model.py``) runs the rule itself and loses records
without it. #314's recovery over filtered connections (only for terminal locations, the filter
OR-ed with "originated at the recovered location") then needs nothing more: such a location is
terminal, and its own events are nowhere else.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..names import validate_name


@dataclass(frozen=True)
class Clause:
    field: str  # "key", or "header.NAME"
    pattern: str

    def matches(self, key: bytes, headers: Mapping[str, bytes] | None) -> bool:
        if self.field == "key":
            value = key
        else:
            found = (headers or {}).get(self.field[len("header."):])
            if found is None:
                return False
            value = found
        return fnmatch.fnmatchcase(value.decode("utf-8", "surrogateescape"), self.pattern)


@dataclass(frozen=True)
class RecordFilter:
    clauses: tuple[Clause, ...]

    @classmethod
    def parse(cls, text: str | Sequence[str]) -> RecordFilter:
        """From ``key=P;header.N=P`` (or a list of clauses); ValueError naming a bad clause."""
        parts = [p.strip() for p in (text.split(";") if isinstance(text, str) else [c for t in text for c in t.split(";")])]
        clauses = []
        for part in (p for p in parts if p):
            name, sep, pattern = part.partition("=")
            if not sep or not pattern:
                raise ValueError(f"filter clause {part!r}: expected key=PATTERN or header.NAME=PATTERN")
            name = name.strip()
            if name != "key":
                if not name.startswith("header.") or not name[len("header."):]:
                    raise ValueError(f"filter clause {part!r}: the field is 'key' or 'header.NAME', not {name!r}")
                validate_name("header", name[len("header."):])
            clauses.append(Clause(name, pattern))
        if not clauses:
            raise ValueError("an empty filter: give at least one clause key=PATTERN or header.NAME=PATTERN")
        return cls(tuple(clauses))

    def admits(self, key: bytes, headers: Mapping[str, bytes] | None) -> bool:
        return all(c.matches(key, headers) for c in self.clauses)

    def canonical(self) -> str:
        return ";".join(f"{c.field}={c.pattern}" for c in self.clauses)
