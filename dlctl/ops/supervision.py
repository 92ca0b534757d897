"""How ``agent install`` sets up supervision of a node's agent: a systemd unit, or none.

The choice, made on the node over the install's own transport:

* systemd runs (``/run/systemd/system`` exists and ``systemctl`` answers) and the install logs
  in as root: a **system unit** ``dlagent-<node>.service`` (dlctl.systemd), enabled at boot.
  ``dlagent start|stop|status|logs`` find it and go through systemctl and journald.
* otherwise — no systemd (the sandbox, containers), or a non-root SSH user — the **detached
  process** of ``dlagent start``, as before. dlctl never escalates with sudo on its own, and a
  user unit (``systemctl --user``) is not used: it needs lingering enabled by an administrator,
  a user bus in the SSH session, and unprivileged user namespaces for the hardening settings,
  any of which missing would leave an agent that does not start.

``agent_user`` in the inventory (User= of the unit) needs the unit; without one it is refused
rather than silently running the agent as the SSH user.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DlctlError
from ..inventory import Cluster, Node
from ..remote.transport import Transport
from ..systemd import SYSTEMD_RUNNING, AgentUnit, render_unit, unit_name, unit_path


@dataclass(frozen=True)
class Supervision:
    kind: str  # "systemd" or "process"
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "why": self.why}


def detect(t: Transport, remaining: Callable[[], float]) -> Supervision:
    if not t.run(["test", "-d", SYSTEMD_RUNNING], timeout=remaining()).ok:
        return Supervision("process", f"no systemd on the node ({SYSTEMD_RUNNING} is absent): a detached process")
    if not t.run(["systemctl", "--version"], timeout=remaining()).ok:
        return Supervision("process", "systemd runs but systemctl does not answer: a detached process")
    uid = t.run(["id", "-u"], timeout=remaining()).check().text.strip()
    if uid != "0":
        return Supervision("process", f"systemd runs, but the SSH user (uid {uid}) is not root and system units need root: a detached process")
    return Supervision("systemd", "systemd runs and the SSH user is root: a system unit")


def unit_for(cluster: Cluster, node: Node) -> AgentUnit:
    return AgentUnit(node.id, cluster.name, node.agent_python, node.agent_config, node.data_dir, node.home, user=node.agent_user)


def install_unit(t: Transport, cluster: Cluster, node: Node, remaining: Callable[[], float]) -> dict[str, Any]:
    """Decide, and write and enable the unit where systemd supervises; the install's result."""
    how = detect(t, remaining)
    if how.kind != "systemd":
        if node.agent_user is not None:
            raise ConfigError(
                f"{node.id}: agent_user = {node.agent_user!r} needs a systemd unit, and this node gets none: {how.why}",
                hint="log in as root on a node that runs systemd (ssh_user = \"root\"), or remove agent_user",
            )
        return how.to_dict()
    text = render_unit(unit_for(cluster, node))  # before changing anything: a bad path is refused here
    if node.agent_user is not None:
        if not t.run(["id", "-u", node.agent_user], timeout=remaining()).ok:
            raise DlctlError(
                f"{node.id}: agent_user {node.agent_user!r} does not exist on the node",
                hint=f"create it first, e.g. useradd --system --home-dir {node.home} --shell /usr/sbin/nologin {node.agent_user}",
            )
        # The agent reads its config and secrets (0600) and owns its data: hand them over.
        t.run(["chown", "-R", "--", node.agent_user, node.home, node.data_dir], timeout=remaining()).check()
    with tempfile.TemporaryDirectory(prefix="dlctl-unit-") as scratch:
        local = Path(scratch) / unit_name(node.id)
        local.write_text(text)
        t.put(local, unit_path(node.id), 0o644, timeout=remaining())
    t.run(["systemctl", "daemon-reload"], timeout=remaining()).check()
    t.run(["systemctl", "enable", unit_name(node.id)], timeout=remaining()).check()  # started at boot
    return {**how.to_dict(), "unit": unit_name(node.id), "user": node.agent_user or "root"}
