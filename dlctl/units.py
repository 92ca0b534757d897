"""Durations, points in time and sizes as operators write them (``90s``, ``7d``, ``500MB``,
``10GiB``, ISO 8601): the command line's and the agent configuration's units."""

from __future__ import annotations

_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_BYTES = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w`` (or combinations like ``1d12h``) -> seconds."""
    import re

    raw = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", raw):
        value = float(raw)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw])", raw)
        if not parts or "".join(n + u for n, u in parts) != raw:
            raise ValueError(f"invalid duration {text!r}: use a number of seconds or e.g. 90s, 15m, 12h, 7d, 2w")
        value = sum(float(n) * _SECONDS[u] for n, u in parts)
    if value <= 0:
        raise ValueError(f"invalid duration {text!r}: must be more than zero")
    return value


def parse_time(text: str, now: float) -> float:
    """A point in time -> seconds since the epoch: ISO 8601 (``2026-11-26T10:00Z``, an offset;
    no zone: UTC) or a duration before ``now`` (``15m``, ``2h``)."""
    from datetime import datetime, timezone

    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"invalid time {text!r}: use ISO 8601 (2026-11-26T10:00Z; no zone: UTC) or a duration ago (15m, 2h)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def parse_size(text: str) -> int:
    """``1048576``, ``500MB``, ``10GiB`` -> bytes."""
    import re

    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip().lower())
    if not match or match.group(2) not in _BYTES:
        raise ValueError(f"invalid size {text!r}: use bytes or e.g. 500MB, 10GiB")
    value = int(float(match.group(1)) * _BYTES[match.group(2)])
    if value <= 0:
        raise ValueError(f"invalid size {text!r}: must be more than zero")
    return value
