"""Validation of names that end up in ZooKeeper paths, file names or remote commands.

Cluster, node, region, rack, log and stream names come from operators, inventories and the
network; they must never be able to escape a znode or a data directory.
"""

from __future__ import annotations

import re

from .errors import UsageError


class InvalidName(UsageError, ValueError):
    """A name that could escape a znode, a file name or a command line. A usage error to the
    command line (exit 2, the message says what is allowed); still a ``ValueError`` to the code
    that turns bad names from the network or from files into its own answers."""


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def validate_name(kind: str, value: object) -> str:
    """Return ``value`` if it is a safe name, else raise ``InvalidName`` saying what is allowed."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or value in {".", ".."} or ".." in value:
        raise InvalidName(
            f"invalid {kind} name {value!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no '..', no '/')"
        )
    return value
