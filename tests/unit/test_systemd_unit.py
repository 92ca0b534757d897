"""The agent's systemd unit (dlctl.systemd): every directive, quoting of awkward paths, values
validated, and the file checked by systemd's own parser (``systemd-analyze verify``, offline)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlctl.errors import ConfigError
from dlctl.systemd import AgentUnit, protect_home, render_unit, unit_name, unit_path

BASE = AgentUnit("use-1", "east", "/opt/dlagent/venv/bin/python", "/opt/dlagent/agent.toml", "/var/lib/dlagent", "/opt/dlagent")


def directives(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert key not in out, f"{key} set twice"
            out[key] = value
    return out


def test_every_directive_is_present():
    d = directives(render_unit(AgentUnit(**{**BASE.__dict__, "user": "dlagent"})))
    assert d == {
        "Description": "dlctl agent use-1 of cluster east",
        "After": "network-online.target",
        "Wants": "network-online.target",
        "StartLimitIntervalSec": "300",
        "StartLimitBurst": "5",
        "Type": "simple",
        "ExecStart": '"/opt/dlagent/venv/bin/python" -m dlagent serve --config "/opt/dlagent/agent.toml" -v',
        "Restart": "on-failure",
        "RestartSec": "5",
        "RestartPreventExitStatus": "2 4",
        "TimeoutStopSec": "20",
        "LimitNOFILE": "65536",
        "UMask": "0077",
        "User": "dlagent",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ReadWritePaths": '"/var/lib/dlagent"',
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "WantedBy": "multi-user.target",
    }
    assert "User" not in directives(render_unit(BASE))  # no agent_user: root, who installed it


def test_an_install_under_a_home_keeps_it_readable_and_the_data_dir_writable():
    home = AgentUnit("n1", "c1", "/home/ops/dlagent/venv/bin/python", "/home/ops/dlagent/agent.toml", "/home/ops/dlagent/data", "/home/ops/dlagent")
    assert protect_home(home) == "read-only"
    assert directives(render_unit(home))["ReadWritePaths"] == '"/home/ops/dlagent/data"'
    assert protect_home(AgentUnit(**{**BASE.__dict__, "python": "/root/venv/bin/python"})) == "read-only"
    assert protect_home(BASE) == "yes"
    assert protect_home(AgentUnit(**{**BASE.__dict__, "home": "/homes/x"})) == "yes"  # not /home


def test_spaces_percent_and_dollar_are_quoted_and_escaped():
    unit = AgentUnit("n1", "c1", "/srv/my agent/%h$x/python", "/srv/my agent/%h$x/agent.toml", "/srv/my data/%i", "/srv/my agent")
    d = directives(render_unit(unit))
    # The executable: quoted, % doubled, $ literal (systemd expands no variable there).
    assert d["ExecStart"] == '"/srv/my agent/%%h$x/python" -m dlagent serve --config "/srv/my agent/%%h$$x/agent.toml" -v'
    assert d["ReadWritePaths"] == '"/srv/my data/%%i"'


@pytest.mark.parametrize("bad", ['/srv/a"b', "/srv/a'b", "/srv/a\\b", "/srv/a\nb", "/srv/a\tb", "relative/path", ""])
def test_paths_systemd_cannot_hold_are_refused(bad):
    for field in ("python", "config", "data_dir", "home"):
        with pytest.raises(ConfigError, match="systemd unit"):
            render_unit(AgentUnit(**{**BASE.__dict__, field: bad}))


@pytest.mark.parametrize("field,value", [("user", "root"), ("user", "Bad User"), ("user", "-x"), ("user", "a" * 33), ("restart_sec", 0), ("restart_sec", True), ("limit_nofile", 10), ("limit_nofile", "65536"), ("node_id", "a/b"), ("cluster", "x y")])
def test_bad_values_are_refused(field, value):
    with pytest.raises(ConfigError):
        render_unit(AgentUnit(**{**BASE.__dict__, field: value}))


def test_unit_name_is_per_node():
    assert unit_name("use-1") == "dlagent-use-1.service"
    assert unit_path("use-1") == "/etc/systemd/system/dlagent-use-1.service"
    with pytest.raises(ConfigError):
        unit_name("../x")


def _analyze() -> str:
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is missing: apt-get install systemd (.ci/run does)"
    return tool


@pytest.fixture
def awkward_install(tmp_path: Path) -> AgentUnit:
    """An install whose paths hold a space, '%' and '$', with a real interpreter at its python."""
    home = tmp_path / "dl agent%h$x"
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "venv" / "bin" / "python").symlink_to(sys.executable)
    return AgentUnit("n1", "c1", str(home / "venv" / "bin" / "python"), str(home / "agent.toml"), str(tmp_path / "data 100%"), str(home), user="dlagent")


def test_systemd_analyze_verify_accepts_the_unit(tmp_path, awkward_install):
    path = tmp_path / unit_name("n1")
    path.write_text(render_unit(awkward_install))
    result = subprocess.run([_analyze(), "verify", str(path)], capture_output=True, text=True, timeout=60, env={**os.environ, "SYSTEMD_LOG_COLOR": "0"})
    # It names the executable it could not find (a quoting mistake) and every setting it ignored.
    complaints = [line for line in result.stderr.splitlines() if path.name in line or "dlagent" in line]
    assert result.returncode == 0 and complaints == [], result.stderr


def test_systemd_analyze_verify_catches_a_misquoted_path(tmp_path, awkward_install):
    """The check above can fail: the same unit with its executable unquoted is refused."""
    path = tmp_path / unit_name("n1")
    text = render_unit(awkward_install).replace(f'ExecStart="{awkward_install.python.replace("%", "%%")}"', f'ExecStart={awkward_install.python}')
    path.write_text(text)
    result = subprocess.run([_analyze(), "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0


def test_systemd_sees_the_hardening(tmp_path, awkward_install):
    path = tmp_path / unit_name("n1")
    path.write_text(render_unit(awkward_install))
    result = subprocess.run([_analyze(), "security", "--offline=true", "--json=short", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    checks = {c["name"]: c["set"] for c in json.loads(result.stdout)}
    for name in ("NoNewPrivileges=", "ProtectSystem=", "PrivateTmp=", "ProtectHome=", "User=/DynamicUser=", "ProtectKernelTunables=", "ProtectKernelModules=", "ProtectControlGroups=", "RestrictSUIDSGID="):
        assert checks[name] is True, name
