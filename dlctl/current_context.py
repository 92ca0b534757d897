"""The current context: the inventory commands use when neither ``--config`` nor
``$DLCTL_CONFIG`` names one (dlctl.config ranks it).

``dlctl sandbox up`` records its inventory here, as kind and minikube set kubectl's current
context, so every later command finds the sandbox; ``sandbox down`` clears it when it still
points at that sandbox. The file is ``current`` in the user config dir
(``$XDG_CONFIG_HOME/dlctl/current``, by default ``~/.config/dlctl/current``), mode 0600, and holds
one absolute path.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .secrets import write_secret_file

FILE_NAME = "current"

log = logging.getLogger(__name__)


def context_file(config_dir: Path) -> Path:
    return config_dir / FILE_NAME


def read(config_dir: Path) -> Path | None:
    """The inventory the context names, or None (no file, or an empty or unreadable one)."""
    try:
        text = context_file(config_dir).read_text().rstrip("\n")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("ignoring the current context %s: %s", context_file(config_dir), exc)
        return None
    return Path(text) if text else None


def set_current(config_dir: Path, inventory: Path) -> Path:
    """Make ``inventory`` the current context; returns the context file. 0600, replaced
    atomically (a command reading it meanwhile sees the old context or the new one)."""
    path = context_file(config_dir)
    write_secret_file(path, (str(inventory.absolute()) + "\n").encode())
    return path


def clear_if(config_dir: Path, inventory: Path) -> bool:
    """Remove the context if it names ``inventory`` (another sandbox's or a chosen one stays)."""
    current = read(config_dir)
    if current is None or current.absolute() != inventory.absolute():
        return False
    context_file(config_dir).unlink(missing_ok=True)
    return True
