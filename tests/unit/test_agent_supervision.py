"""Agent supervision without a running systemd: ``[log]`` settings, reading rotated logs newest
last, finding a node's unit, the systemctl/journalctl argv, the node verbs' choice between a unit
and a detached process, and ``agent install``'s decision (dlctl.ops.supervision) over a transport."""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path

import pytest
from harness.agenttoml import load as load_agent_toml

from dlagent import control, supervisor
from dlagent.logconfig import LogSettings, log_files, tail
from dlctl.errors import ConfigError, DlctlError
from dlctl.inventory import Cluster, Node
from dlctl.ops import supervision
from dlctl.remote.transport import CommandResult

# -- [log] ----------------------------------------------------------------------------------------


def test_log_settings_default_and_units(tmp_path):
    assert load_agent_toml(tmp_path).log == LogSettings(10 << 20, 5)
    assert load_agent_toml(tmp_path, '\n[log]\nmax_bytes = "2MiB"\nbackups = 1\n').log == LogSettings(2 << 20, 1)


@pytest.mark.parametrize("body", ["max_bytes = 10", "max_bytes = true", 'max_bytes = "lots"', "backups = 0", "backups = 101", "backups = 1.5", "rotate = 1"])
def test_bad_log_settings_are_refused_naming_the_key(tmp_path, body):
    with pytest.raises(ConfigError, match=r"\[log\]"):
        load_agent_toml(tmp_path, f"\n[log]\n{body}\n")


def test_tail_reads_the_rotated_files_newest_last(tmp_path):
    (tmp_path / "dlagent.log.2").write_text("a1\na2\n")
    (tmp_path / "dlagent.log.1").write_text("b1\nb2\n")
    (tmp_path / "dlagent.log").write_text("c1\nc2 half")  # a line being written
    (tmp_path / "dlagent.log.old").write_text("not a rotation\n")
    assert [p.name for p in log_files(tmp_path)] == ["dlagent.log.2", "dlagent.log.1", "dlagent.log"]
    assert tail(tmp_path, 3) == "b2\nc1\nc2 half\n"
    assert tail(tmp_path, 100) == "a1\na2\nb1\nb2\nc1\nc2 half\n"
    assert tail(tmp_path / "missing", 5) == ""


def test_tail_reads_only_the_end_of_a_large_file(tmp_path):
    lines = [f"line {i:06d} " + "x" * 100 + "\n" for i in range(20_000)]  # ~2 MiB, many chunks
    (tmp_path / "dlagent.log").write_text("".join(lines))
    assert tail(tmp_path, 5) == "".join(lines[-5:])
    assert tail(tmp_path, 1000) == "".join(lines[-1000:])


# -- the node's unit -------------------------------------------------------------------------------


def systemd_root(tmp_path: Path, node_id: str = "r1-n1", *, running: bool = True, unit: bool = True) -> dict[str, Path]:
    run, units = tmp_path / "run-systemd", tmp_path / "units"
    units.mkdir(parents=True)
    if running:
        run.mkdir()
    if unit:
        (units / f"dlagent-{node_id}.service").write_text("[Service]\n")
    return {"running": run, "unit_dir": units}


def test_a_unit_is_used_only_where_systemd_runs_and_install_wrote_one(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert supervisor.find("r1-n1", **systemd_root(tmp_path / "a")) == supervisor.SystemdUnit("dlagent-r1-n1.service", "/usr/bin/systemctl", "/usr/bin/journalctl")
    assert supervisor.find("r1-n1", **systemd_root(tmp_path / "b", running=False)) is None  # a container
    assert supervisor.find("r1-n1", **systemd_root(tmp_path / "c", unit=False)) is None  # a detached install
    assert supervisor.find("r1-n2", **systemd_root(tmp_path / "d")) is None  # another node's unit
    monkeypatch.setattr(supervisor.shutil, "which", lambda name: None)
    assert supervisor.find("r1-n1", **systemd_root(tmp_path / "e")) is None


def fake_tool(tmp_path: Path, name: str, stdout: str = "", code: int = 0) -> tuple[Path, Path]:
    """An executable that records its argv (one JSON list a line) and prints ``stdout``."""
    calls = tmp_path / f"{name}.calls"
    tool = tmp_path / name
    tool.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"sys.stdout.write({stdout!r})\nsys.exit({code})\n"
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool, calls


def calls(path: Path) -> list[list[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_unit_is_driven_with_systemctl_and_read_with_journalctl(tmp_path):
    systemctl, sc_calls = fake_tool(tmp_path, "systemctl", "active\n")
    journalctl, j_calls = fake_tool(tmp_path, "journalctl", "2026-01-01T00:00:00 node dlagent: ready\n")
    unit = supervisor.SystemdUnit("dlagent-n1.service", str(systemctl), str(journalctl))
    unit.start()
    unit.stop(10)
    assert unit.state() == "active"
    assert unit.journal(7) == "2026-01-01T00:00:00 node dlagent: ready\n"
    assert calls(sc_calls) == [
        ["reset-failed", "dlagent-n1.service"],  # an operator's start is tried even after the start limit
        ["start", "--no-block", "dlagent-n1.service"],
        ["stop", "dlagent-n1.service"],
        ["is-active", "dlagent-n1.service"],
    ]
    assert calls(j_calls) == [["--unit", "dlagent-n1.service", "--lines", "7", "--no-pager", "--output", "short-iso"]]


def test_a_failing_systemctl_names_the_unit_and_the_journal(tmp_path):
    systemctl, _ = fake_tool(tmp_path, "systemctl", code=5)
    with pytest.raises(DlctlError, match="systemctl stop dlagent-n1.service. failed .exit 5") as info:
        supervisor.SystemdUnit("dlagent-n1.service", str(systemctl), None).stop(10)
    assert info.value.hint == "see `journalctl -u dlagent-n1.service`"


class FakeUnit:
    name = "dlagent-r1-n1.service"

    def __init__(self, state: str) -> None:
        self._state, self.actions = state, []

    def start(self) -> None:
        self.actions.append("start")

    def stop(self, timeout: float) -> None:
        self.actions.append("stop")
        self._state = "inactive"

    def state(self) -> str:
        return self._state

    def result(self) -> str:
        return "success"

    def journal(self, lines: int) -> str:
        return f"journal, {lines} lines\n"


def test_node_verbs_go_through_the_unit_when_there_is_one(tmp_path, monkeypatch):
    config = load_agent_toml(tmp_path)
    unit = FakeUnit("active")
    monkeypatch.setattr(supervisor, "find", lambda node_id: unit)
    assert control.logs(config, 9) == "journal, 9 lines\n"
    status = control.status(config)
    assert (status["supervisor"], status["unit"], status["unit_state"]) == ("systemd", unit.name, "active")
    # A unit waiting to restart holds no lock, yet must be stopped so systemd does not revive it.
    stopped = control.stop(config)
    assert unit.actions == ["stop"] and stopped["message"] == "stopped cleanly" and stopped["supervisor"] == "systemd"
    failed = FakeUnit("failed")
    monkeypatch.setattr(supervisor, "find", lambda node_id: failed)
    began = time.monotonic()
    with pytest.raises(DlctlError, match="did not start") as info:
        control.start(config, timeout=30)
    assert failed.actions == ["start"] and "journal, 15 lines" in info.value.hint
    assert time.monotonic() - began < 10, "a failed unit is reported at once, not after the whole timeout"


def test_without_a_unit_the_verbs_keep_the_detached_process(tmp_path, monkeypatch):
    config = load_agent_toml(tmp_path)
    monkeypatch.setattr(supervisor, "find", lambda node_id: None)
    assert control.status(config)["supervisor"] == "process"
    assert control.stop(config)["message"] == "already stopped"
    config.data_dir.mkdir()
    (config.data_dir / "dlagent.log").write_text("one\ntwo\n")
    assert control.logs(config, 1) == "two\n"


# -- agent install's choice ------------------------------------------------------------------------


class FakeNode:
    """A transport to a node with or without systemd, logged in as ``uid``; records what ran."""

    def __init__(self, *, systemd: bool, uid: int, users: tuple[str, ...] = ()) -> None:
        self.host, self.systemd, self.uid, self.users = "n1", systemd, uid, users
        self.ran: list[list[str]] = []
        self.files: dict[str, tuple[str, int]] = {}

    def run(self, argv, *, stdin=None, timeout, env=None) -> CommandResult:
        argv = list(argv)
        self.ran.append(argv)
        code, out = 0, b""
        if argv[:2] == ["test", "-d"]:
            code = 0 if self.systemd else 1
        elif argv[0] == "systemctl":
            code = 0 if self.systemd else 127
        elif argv == ["id", "-u"]:
            out = f"{self.uid}\n".encode()
        elif argv[:2] == ["id", "-u"]:
            code = 0 if argv[2] in self.users else 1
        return CommandResult(self.host, tuple(argv), code, out, b"", 0.0)

    def put(self, local_path, remote_path, mode=0o644, *, timeout=600.0) -> None:
        self.files[remote_path] = (Path(local_path).read_text(), mode)


def node(**overrides) -> Node:
    settings = dict(id="n1", cluster="c1", region="r1", rack="a", host="10.0.0.1", listen="10.0.0.1:3181", ssh_user="root", ssh_port=22, identity_file=None, data_dir="/var/lib/dlagent", python=None, home="/opt/dlagent")
    return Node(**{**settings, **overrides})


CLUSTER = Cluster("c1", "zk:2181", None, None)


def install(t: FakeNode, n: Node) -> dict:
    return supervision.install_unit(t, CLUSTER, n, lambda: 10.0)


def test_root_on_systemd_gets_an_enabled_system_unit():
    t = FakeNode(systemd=True, uid=0)
    result = install(t, node())
    assert result == {"kind": "systemd", "why": "systemd runs and the SSH user is root: a system unit", "unit": "dlagent-n1.service", "user": "root"}
    text, mode = t.files["/etc/systemd/system/dlagent-n1.service"]
    assert mode == 0o644 and 'ExecStart="/opt/dlagent/venv/bin/python" -m dlagent serve --config "/opt/dlagent/agent.toml" -v' in text
    assert t.ran[-2:] == [["systemctl", "daemon-reload"], ["systemctl", "enable", "dlagent-n1.service"]]


def test_no_systemd_or_no_root_keeps_the_detached_process():
    for t, why in ((FakeNode(systemd=False, uid=0), "no systemd"), (FakeNode(systemd=True, uid=1000), "is not root")):
        result = install(t, node())
        assert result["kind"] == "process" and why in result["why"]
        assert t.files == {} and not any(a[:2] == ["systemctl", "enable"] for a in t.ran)


def test_agent_user_runs_the_unit_as_that_user_and_owns_its_files():
    t = FakeNode(systemd=True, uid=0, users=("dlagent",))
    assert install(t, node(agent_user="dlagent"))["user"] == "dlagent"
    assert ["chown", "-R", "--", "dlagent", "/opt/dlagent", "/var/lib/dlagent"] in t.ran
    assert "\nUser=dlagent\n" in t.files["/etc/systemd/system/dlagent-n1.service"][0]


def test_agent_user_is_refused_without_a_unit_or_on_a_node_that_lacks_it():
    with pytest.raises(ConfigError, match="needs a systemd unit"):
        install(FakeNode(systemd=False, uid=0), node(agent_user="dlagent"))
    t = FakeNode(systemd=True, uid=0)
    with pytest.raises(DlctlError, match="does not exist on the node"):
        install(t, node(agent_user="dlagent"))
    assert t.files == {}, "nothing written for a user that is missing"


def test_a_path_systemd_cannot_hold_is_refused_before_anything_is_written():
    t = FakeNode(systemd=True, uid=0)
    with pytest.raises(ConfigError, match="systemd"):
        install(t, node(home="/opt/dl'agent"))
    assert t.files == {}
