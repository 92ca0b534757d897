"""TOML text that ``tomllib`` reads back as the very values written: for every TOML file dlctl
generates (agent.toml, the sandbox's inventory, the test harness's agent configs).

Why not ``f'key = "{value}"'`` or ``json.dumps``: a quote, a backslash or a newline in a path
ends the string early or breaks the file, and ``json.dumps`` writes an emoji as a UTF-16
surrogate pair (``\\ud83d\\ude00``), which TOML forbids, so an agent whose data_dir held an emoji
could not read its own configuration (issue 19). A TOML basic string carries any Unicode
character as is, except ``"``, ``\\`` and the control characters (DEL included), escaped here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from os import PathLike

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}

Value = str | PathLike[str] | bool | int | float | Sequence["Value"]


def string(text: str) -> str:
    """``text`` as a TOML basic string (quotes included)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            # Python keeps undecodable bytes of file names as lone surrogates; UTF-8 has no
            # encoding for them, so no TOML file can hold this value.
            raise ValueError(f"cannot write {text!r} as TOML: U+{code:04X} is not a character (a name that is not valid UTF-8?); rename it")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def key(name: str) -> str:
    """A key: bare when it may be, quoted otherwise."""
    return name if _BARE_KEY.fullmatch(name) else string(name)


def value(v: Value) -> str:
    if isinstance(v, bool):  # before int: bool is an int
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return string(v)
    if isinstance(v, PathLike):
        return string(str(v))
    if isinstance(v, Sequence):
        return "[" + ", ".join(value(item) for item in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__} {v!r}")


def line(name: str, v: Value) -> str:
    """``key = value``, one line."""
    return f"{key(name)} = {value(v)}"


def table(*names: str, array: bool = False) -> str:
    """A table header, ``[a.b]`` (``[[a.b]]`` for an array of tables), each part quoted as needed."""
    dotted = ".".join(key(n) for n in names)
    return f"[[{dotted}]]" if array else f"[{dotted}]"
