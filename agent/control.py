"""Node-level lifecycle: ``dlagent start|stop|status --config FILE``.

``dlctl agent …`` runs these on each node (over SSH, or locally for the sandbox) — the same
package on every node, as cassandra-medusa does. All three are idempotent and print one JSON
object (``-o json``) so the caller can aggregate per-node results.

Whether an agent runs is decided by the data dir's flock (held by the serving store for its
whole life), never by a pid file that a crash can leave stale; the pid written into the lock
file says which process holds it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlctl import __version__
from dlctl.errors import DlctlError

from .config import AgentConfig
from .storage.layout import DIR_MODE, FILE_MODE, DirLock

LOG_FILE = "dlagent.log"


@dataclass(frozen=True)
class AgentState:
    running: bool
    pid: int | None


def state(config: AgentConfig) -> AgentState:
    lock = DirLock(config.data_dir)
    if not config.data_dir.exists() or lock.acquire_shared_readonly():
        lock.release()
        return AgentState(False, None)
    holder = lock.holder()
    pid = int(holder.split()[-1]) if holder.startswith("pid ") else None
    return AgentState(True, pid)


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def start(config: AgentConfig, timeout: float = 30.0) -> dict[str, Any]:
    """Start ``dlagent serve`` detached (own session, output to the data dir's log file)."""
    current = state(config)
    if current.running:
        return {"node_id": config.node_id, "action": "start", "changed": False, "running": True, "pid": current.pid, "message": "already running"}
    config.data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)  # serve narrows an existing one, in its log
    log_path = config.data_dir / LOG_FILE
    argv = [sys.executable, "-m", "dlagent", "serve", "--config", str(config.path), "-v"]
    with open(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE), "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DlctlError(
                f"agent {config.node_id} exited with code {proc.returncode} while starting",
                hint=f"last lines of {log_path}:\n{_tail(log_path)}",
            )
        if _listening(config.host, config.port) and state(config).running:
            return {"node_id": config.node_id, "action": "start", "changed": True, "running": True, "pid": proc.pid, "message": f"started, listening on {config.advertise}"}
        time.sleep(0.05)
    proc.kill()
    raise DlctlError(f"agent {config.node_id} did not start listening on {config.advertise} within {timeout:g}s", hint=f"see {log_path}")


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (absent, or a zombie awaiting its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"Z"


def stop(config: AgentConfig, timeout: float = 20.0) -> dict[str, Any]:
    """SIGTERM and wait for a clean exit (the agent unregisters first, then releases its data
    directory, then the process ends: "stopped" means all three, so a script can start it again
    at once); SIGKILL after ``timeout``."""
    current = state(config)
    if not current.running or current.pid is None:
        return {"node_id": config.node_id, "action": "stop", "changed": False, "running": False, "pid": None, "message": "already stopped"}
    pid = current.pid
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not state(config).running and _gone(pid):
            return {"node_id": config.node_id, "action": "stop", "changed": True, "running": False, "pid": pid, "message": "stopped cleanly"}
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 10
    while state(config).running and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"node_id": config.node_id, "action": "stop", "changed": True, "running": state(config).running, "pid": pid, "message": f"killed after {timeout:g}s without a clean exit"}


def status(config: AgentConfig) -> dict[str, Any]:
    current = state(config)
    out: dict[str, Any] = {
        "node_id": config.node_id,
        "cluster": config.cluster,
        "region": config.region,
        "rack": config.rack,
        "address": config.advertise,
        "running": current.running,
        "pid": current.pid,
        "version": __version__,
        "data_dir": str(config.data_dir),
    }
    if config.data_dir.exists():
        usage = shutil.disk_usage(config.data_dir)
        out["disk_total_bytes"], out["disk_free_bytes"] = usage.total, usage.free
        segments = config.data_dir / "segments"
        out["segment_files"] = sum(1 for p in segments.rglob("*.log")) if segments.exists() else 0
        out["data_bytes"] = sum(p.stat().st_size for p in segments.rglob("*.log")) if segments.exists() else 0
    return out
