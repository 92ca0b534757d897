"""The systemd unit of an agent, as text: a pure function of the node's settings.

``dlctl agent install`` writes it on nodes that run systemd when it logs in as root
(``dlctl.ops.supervision`` decides); ``dlagent start|stop|status|logs`` find it by its name
(``unit_name``) and drive ``systemctl``/``journalctl`` instead of a detached process.

Quoting follows systemd.service(5) and systemd.syntax(7), checked against
``systemd-analyze verify`` (tests/unit/test_systemd_unit.py): every path is written in double
quotes (spaces), ``%`` is doubled (a specifier otherwise) and, in ``ExecStart=`` arguments,
``$`` is doubled (an environment variable otherwise; the executable itself is not expanded).
systemd refuses ``"``, ``'``, ``\\`` and control characters in an executable name, so a path
holding one is refused here, with the reason, rather than written into a unit that never starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError
from .names import validate_name

UNIT_DIR = "/etc/systemd/system"  # where install writes system units (the admin's, not the package's)
SYSTEMD_RUNNING = "/run/systemd/system"  # exists only when systemd is PID 1 (sd_booted(3))

RESTART_SEC = 5
LIMIT_NOFILE = 65536
STOP_TIMEOUT_SEC = 20  # as the detached `dlagent stop`: SIGTERM, 20 s for a clean exit, SIGKILL
# A unit that keeps failing (a broken disk: the agent exits 1 on a failed fsync) stops being
# restarted after this many starts in the interval; `dlagent start` resets the count.
START_LIMIT_BURST = 5
START_LIMIT_INTERVAL_SEC = 300
# Exits that restarting cannot help: a bad agent.toml (ExitCode.USAGE), a refusal for safety
# such as another node's data dir (ExitCode.REFUSED). A failed fsync (1) is restarted: the
# agent recovers its files at start, as after a crash.
NO_RESTART_EXITS = (2, 4)

# POSIX user names as useradd(8) accepts them by default; systemd's User= takes the same.
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# Refused in unit paths: systemd rejects them in an executable's name (tests show it), and a
# path that could not be the executable could not be ReadWritePaths= either without a second rule.
_UNSAFE_PATH_CHARS = re.compile(r"[\"'\\\x00-\x1f\x7f]")
_HOME_DIRS = ("/home", "/root", "/run/user")


@dataclass(frozen=True)
class AgentUnit:
    """What an agent's unit says; ``render_unit`` turns it into the file."""

    node_id: str
    cluster: str
    python: str  # the interpreter that runs dlagent (the node's venv, or the inventory's python)
    config: str  # agent.toml
    data_dir: str
    home: str
    user: str | None = None  # None: the unit runs as root (the SSH user that installed it)
    restart_sec: int = RESTART_SEC
    limit_nofile: int = LIMIT_NOFILE


def unit_name(node_id: str) -> str:
    """``dlagent-<node>.service``: one unit per node, so nodes sharing a host do not collide.
    Node names (dlctl.names) are made of characters unit names allow, so no escaping is needed."""
    try:
        validate_name("node", node_id)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return f"dlagent-{node_id}.service"


def unit_path(node_id: str) -> str:
    return f"{UNIT_DIR}/{unit_name(node_id)}"


def validate_user(user: object, where: str = "agent_user") -> str:
    if not isinstance(user, str) or not _USER.fullmatch(user) or user == "root":
        raise ConfigError(
            f"{where} must be a system user name (lowercase letters, digits, '_', '-'; at most 32; not root), got {user!r}",
            hint="create it on the nodes first, e.g. useradd --system --shell /usr/sbin/nologin dlagent",
        )
    return user


def _check_path(path: str, what: str) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError(f"systemd unit: {what} must be an absolute path, got {path!r}")
    bad = _UNSAFE_PATH_CHARS.search(path)
    if bad:
        raise ConfigError(
            f"systemd unit: {what} {path!r} contains {bad.group()!r}, which systemd does not accept in a unit's paths",
            hint="use a path without quotes, backslashes or control characters",
        )
    return path


def quote_path(path: str) -> str:
    """A path as one quoted word of a unit setting (``ReadWritePaths=``): ``%`` doubled."""
    return '"' + path.replace("%", "%%") + '"'


def quote_exec_arg(word: str) -> str:
    """An ``ExecStart=`` argument: quoted, ``%`` and ``$`` doubled (specifier, variable)."""
    return '"' + word.replace("%", "%%").replace("$", "$$") + '"'


def quote_executable(path: str) -> str:
    """``ExecStart=``'s first word: quoted, ``%`` doubled; systemd expands no ``$`` there."""
    return quote_path(path)


def under_home(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in _HOME_DIRS)


def protect_home(unit: AgentUnit) -> str:
    """``yes`` hides /home, /root and /run/user from the agent; but an install under a home
    (the venv of `agent install` lives in the node's home directory, which operators often put
    in the SSH user's home) must stay readable there: ``read-only`` keeps the interpreter and
    agent.toml readable, and ``ReadWritePaths=`` re-opens the data dir for writing."""
    return "read-only" if any(under_home(p) for p in (unit.python, unit.config, unit.data_dir, unit.home)) else "yes"


def render_unit(unit: AgentUnit) -> str:
    """The unit file's text. Raises ``ConfigError`` naming the value systemd would not accept."""
    unit_name(unit.node_id)
    try:
        validate_name("cluster", unit.cluster)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    python = _check_path(unit.python, "python")
    config = _check_path(unit.config, "agent.toml")
    data_dir = _check_path(unit.data_dir, "data_dir")
    _check_path(unit.home, "home")
    if unit.user is not None:
        validate_user(unit.user)
    for name, value, low, high in (("restart_sec", unit.restart_sec, 1, 3600), ("limit_nofile", unit.limit_nofile, 1024, 1 << 20)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(f"systemd unit: {name} must be an integer in {low}..{high}, got {value!r}")
    lines = [
        "# Written by `dlctl agent install`; rewritten by the next install (edits here are lost:",
        "# use `systemctl edit` for a drop-in instead).",
        "[Unit]",
        f"Description=dlctl agent {unit.node_id} of cluster {unit.cluster}",
        "After=network-online.target",
        "Wants=network-online.target",
        f"StartLimitIntervalSec={START_LIMIT_INTERVAL_SEC}",
        f"StartLimitBurst={START_LIMIT_BURST}",
        "",
        "[Service]",
        "Type=simple",
        # No --log-file: the agent logs to stderr and journald keeps it (`dlagent logs` reads it).
        f"ExecStart={quote_executable(python)} -m dlagent serve --config {quote_exec_arg(config)} -v",
        "Restart=on-failure",
        f"RestartSec={unit.restart_sec}",
        f"RestartPreventExitStatus={' '.join(map(str, NO_RESTART_EXITS))}",
        f"TimeoutStopSec={STOP_TIMEOUT_SEC}",
        # The agent raises its soft open-files limit to the hard one at start (dlagent.fdlimit).
        f"LimitNOFILE={unit.limit_nofile}",
        "UMask=0077",
        *([f"User={unit.user}"] if unit.user is not None else []),
        # Hardening: the agent writes only its data dir (its log is journald's); it never
        # needs new privileges, other users' temporary files, kernel knobs or cgroups.
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ReadWritePaths={quote_path(data_dir)}",
        "PrivateTmp=yes",
        f"ProtectHome={protect_home(unit)}",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)
