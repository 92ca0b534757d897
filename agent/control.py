"""Node-level lifecycle: ``dlagent start|stop|status --config FILE``.

``dlctl agent …`` runs these on each node (over SSH, or locally for the sandbox) — the same
package on every node, as cassandra-medusa does. All three are idempotent and print one JSON
object (``-o json``) so the caller can aggregate per-node results.

Whether an agent runs is decided by the data dir's flock (held by the serving store for its
whole life), never by a pid file that a crash can leave stale; the pid written into the lock
file says which process holds it.

Where ``agent install`` wrote a systemd unit for the node (dlagent.supervisor), start and stop
go through ``systemctl`` and systemd supervises the agent; elsewhere ``start`` runs a detached
process that logs into a rotated file (dlagent.logconfig).
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

from . import supervisor
from .config import AgentConfig
from .logconfig import LOG_FILE, tail
from .storage.layout import DIR_MODE, FILE_MODE, DirLock

# What the detached process prints outside logging (a bad agent.toml, a crash); the previous
# start's is kept as dlagent.out.1, so each is bounded by one run.
OUT_FILE = "dlagent.out"


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


def _last_words(config: AgentConfig) -> str:
    """What a detached agent said before it died: its stderr, then its log's last lines."""
    out, log = config.data_dir / OUT_FILE, config.data_dir / LOG_FILE
    return "\n".join(f"last lines of {p}:\n{text}" for p, text in ((out, _tail(out)), (log, _tail(log))) if text)


def start(config: AgentConfig, timeout: float = 30.0) -> dict[str, Any]:
    """Start the agent: through its systemd unit when it has one, else ``dlagent serve``
    detached (own session, logging into the data dir's rotated log file)."""
    current = state(config)
    unit = supervisor.find(config.node_id)
    how = {"supervisor": "systemd", "unit": unit.name} if unit else {"supervisor": "process"}
    if current.running:
        return {"node_id": config.node_id, "action": "start", "changed": False, "running": True, "pid": current.pid, "message": "already running", **how}
    if unit is not None:
        return _start_unit(config, unit, timeout)
    config.data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)  # serve narrows an existing one, in its log
    out_path = config.data_dir / OUT_FILE
    if out_path.exists():
        os.replace(out_path, out_path.with_name(OUT_FILE + ".1"))
    argv = [sys.executable, "-m", "dlagent", "serve", "--config", str(config.path), "-v", "--log-file", str(config.data_dir / LOG_FILE)]
    with open(os.open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE), "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DlctlError(f"agent {config.node_id} exited with code {proc.returncode} while starting", hint=_last_words(config))
        if _listening(config.host, config.port) and state(config).running:
            return {"node_id": config.node_id, "action": "start", "changed": True, "running": True, "pid": proc.pid, "message": f"started, listening on {config.advertise}", **how}
        time.sleep(0.05)
    proc.kill()
    raise DlctlError(f"agent {config.node_id} did not start listening on {config.advertise} within {timeout:g}s", hint=_last_words(config) or f"see {config.data_dir / LOG_FILE}")


def _start_unit(config: AgentConfig, unit: supervisor.SystemdUnit, timeout: float) -> dict[str, Any]:
    unit.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _listening(config.host, config.port) and (now := state(config)).running:
            return {"node_id": config.node_id, "action": "start", "changed": True, "running": True, "pid": now.pid, "message": f"started by systemd ({unit.name}), listening on {config.advertise}", "supervisor": "systemd", "unit": unit.name}
        if unit.state() == "failed":  # a bad config or a refusal (not restarted), or the start limit hit
            break
        time.sleep(0.05)
    raise DlctlError(
        f"agent {config.node_id} did not start listening on {config.advertise} within {timeout:g}s (unit {unit.name}: {unit.state()})",
        hint=f"its journal:\n{_journal_tail(unit)}",
    )


def _journal_tail(unit: supervisor.SystemdUnit, lines: int = 15) -> str:
    try:
        return unit.journal(lines)
    except DlctlError as exc:
        return exc.message


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
    at once); SIGKILL after ``timeout``. A systemd unit is stopped through systemctl (so systemd
    does not restart it); a detached agent left from before the unit existed is then stopped
    as one."""
    unit = supervisor.find(config.node_id)
    if unit is not None and unit.state() in supervisor.LIVE_STATES:
        pid = state(config).pid
        unit.stop(timeout + 30)  # systemd itself gives it the unit's TimeoutStopSec, then SIGKILLs
        if not state(config).running:
            result = unit.result()
            message = "stopped cleanly" if result == "success" else f"stopped by systemd (result: {result})"
            return {"node_id": config.node_id, "action": "stop", "changed": True, "running": False, "pid": pid, "message": message, "supervisor": "systemd", "unit": unit.name}
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
    unit = supervisor.find(config.node_id)
    out["supervisor"] = "systemd" if unit else "process"
    if unit is not None:
        out["unit"], out["unit_state"] = unit.name, unit.state()
    if config.data_dir.exists():
        usage = shutil.disk_usage(config.data_dir)
        out["disk_total_bytes"], out["disk_free_bytes"] = usage.total, usage.free
        segments = config.data_dir / "segments"
        out["segment_files"] = sum(1 for p in segments.rglob("*.log")) if segments.exists() else 0
        out["data_bytes"] = sum(p.stat().st_size for p in segments.rglob("*.log")) if segments.exists() else 0
    return out


def logs(config: AgentConfig, lines: int) -> str:
    """The agent's last ``lines`` log lines, newest last: its unit's journal, or its rotated files."""
    unit = supervisor.find(config.node_id)
    if unit is not None:
        return unit.journal(lines)
    return tail(config.data_dir, lines)
