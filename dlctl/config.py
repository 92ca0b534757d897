"""Where the configuration (inventory) file is found.

Precedence: ``--config`` > ``$DLCTL_CONFIG`` > the current context (the inventory
``sandbox up`` recorded: dlctl.current_context) > the user config dir > ``/etc/dlctl/``.
The cluster context: ``--cluster`` > ``$DLCTL_CLUSTER`` > the file's default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import click

from . import current_context

CONFIG_NAME = "config.toml"
SYSTEM_CONFIG_DIR = Path("/etc/dlctl")


@dataclass(frozen=True)
class ConfigLocation:
    path: Path | None
    source: str  # "--config", "DLCTL_CONFIG", "current-context", "user", "system" or "none"


def user_config_dir() -> Path:
    # click follows XDG_CONFIG_HOME on Linux and the platform's convention elsewhere.
    return Path(click.get_app_dir("dlctl"))


def locate_config(explicit: str | os.PathLike[str] | None, env: dict[str, str] | None = None) -> ConfigLocation:
    """Pick the configuration file by precedence; an explicit, env or current-context path is
    used even if missing (so the loader can say it does not exist, rather than a command falling
    through to another inventory than the one meant), the defaults only when present."""
    env = os.environ if env is None else env
    if explicit:
        return ConfigLocation(Path(explicit), "--config")
    if env.get("DLCTL_CONFIG"):
        return ConfigLocation(Path(env["DLCTL_CONFIG"]), "DLCTL_CONFIG")
    current = current_context.read(user_config_dir())
    if current is not None:
        return ConfigLocation(current, "current-context")
    for source, directory in (("user", user_config_dir()), ("system", SYSTEM_CONFIG_DIR)):
        candidate = directory / CONFIG_NAME
        if candidate.is_file():
            return ConfigLocation(candidate, source)
    return ConfigLocation(None, "none")


def select_cluster(explicit: str | None, env: dict[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    return explicit or env.get("DLCTL_CLUSTER") or None
