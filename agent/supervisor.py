"""Whether this node's agent runs under systemd, and driving its unit (systemctl, journalctl).

``dlctl agent install`` writes ``/etc/systemd/system/dlagent-<node>.service`` (dlctl.systemd)
where the node runs systemd and the install logs in as root. ``dlagent start|stop|status|logs``
then go through that unit: systemd restarts the agent when it fails and journald keeps its log.
Where there is no such unit (no systemd: the sandbox, containers; a non-root install) the verbs
keep the detached process of ``dlagent.control``.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dlctl.errors import DlctlError
from dlctl.systemd import SYSTEMD_RUNNING, UNIT_DIR, unit_name

# States `systemctl is-active` prints for a unit that runs, or will run again by itself.
LIVE_STATES = ("active", "activating", "reloading", "deactivating")


@dataclass(frozen=True)
class SystemdUnit:
    name: str
    systemctl: str
    journalctl: str | None

    def _run(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([self.systemctl, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise DlctlError(f"`systemctl {' '.join(args)}` did not finish within {timeout:g}s") from None

    def _checked(self, *args: str, timeout: float = 30.0) -> str:
        result = self._run(*args, timeout=timeout)
        if result.returncode != 0:
            raise DlctlError(f"`systemctl {' '.join(args)}` failed (exit {result.returncode}): {result.stderr.strip()}", hint=f"see `journalctl -u {self.name}`")
        return result.stdout

    def start(self) -> None:
        # An operator's start always tries: forget a start limit hit by earlier failures.
        self._run("reset-failed", self.name)
        self._checked("start", "--no-block", self.name)

    def stop(self, timeout: float) -> None:
        """Blocks while systemd stops it: SIGTERM, then SIGKILL after the unit's TimeoutStopSec."""
        self._checked("stop", self.name, timeout=timeout)

    def state(self) -> str:
        """``active``, ``activating`` (starting, or waiting to restart), ``failed``, ``inactive``…"""
        return self._run("is-active", self.name).stdout.strip() or "unknown"

    def result(self) -> str:
        """How the last run ended: ``success``, ``timeout`` (killed after TimeoutStopSec), …"""
        return self._run("show", "--property=Result", "--value", self.name).stdout.strip() or "unknown"

    def journal(self, lines: int) -> str:
        if self.journalctl is None:
            raise DlctlError(f"unit {self.name} logs to journald, but journalctl is not on PATH")
        argv = [self.journalctl, "--unit", self.name, "--lines", str(lines), "--no-pager", "--output", "short-iso"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise DlctlError(f"`journalctl --unit {self.name}` failed (exit {result.returncode}): {result.stderr.strip()}")
        return result.stdout


def find(node_id: str, *, running: Path = Path(SYSTEMD_RUNNING), unit_dir: Path = Path(UNIT_DIR)) -> SystemdUnit | None:
    """This node's unit when systemd runs here and ``agent install`` wrote one; else None."""
    name = unit_name(node_id)
    systemctl = shutil.which("systemctl")
    if not running.is_dir() or systemctl is None or not (unit_dir / name).is_file():
        return None
    return SystemdUnit(name, systemctl, shutil.which("journalctl"))
