"""A ``dlctl sandbox`` for tests that drive the real command line as an operator does (one
subprocess per command), and a library session on the same cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from dlctl import inventory
from dlctl.config import ConfigLocation
from dlctl.session import ClusterSession


def dlctl(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dlctl.cli", *argv], capture_output=True, text=True, timeout=180, env={**os.environ, **env})


def sandbox_up(base: Path, *argv: str) -> Iterator[dict[str, str]]:
    """``sandbox up`` (one region of three nodes, or ``argv``) under ``base``; yields the
    environment that points the command line at it; ``sandbox down --purge`` after."""
    env = {"DLCTL_SANDBOX_DIR": str(base), "DLCTL_CONFIG": str(base / "config.toml")}
    up = dlctl(env, "--yes", "sandbox", "up", *(argv or ("--regions", "1", "--nodes-per-region", "3")))
    assert up.returncode == 0, up.stderr
    yield env
    dlctl(env, "--yes", "sandbox", "down", "--purge")


def session_for(env: dict[str, str]) -> ClusterSession:
    return ClusterSession(inventory.load(ConfigLocation(Path(env["DLCTL_CONFIG"]), "test")).cluster(None))
