"""The CLI conventions every command inherits: exit codes, stdout/stderr split, -o, --dry-run."""

from __future__ import annotations

import json

import click
import pytest
import yaml

from dlctl import __version__
from dlctl.cli.context import AppContext, mutating, pass_app
from dlctl.cli.main import cli, main
from dlctl.errors import ConflictError, DlctlError, ExitCode, PartialFailure, RefusedError, UsageError
from dlctl.plan import Plan, Step


@pytest.fixture
def extra_command():
    """Temporarily plug commands into the real group, as later modules do."""
    added: list[str] = []

    def add(command: click.Command) -> None:
        cli.add_command(command)
        added.append(command.name)

    yield add
    for name in added:
        cli.commands.pop(name, None)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_commands_and_documents_exit_codes(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "version" in out and "completion" in out
    for line in ("0    ok", "2    usage", "3    partial", "4    refused", "130  interrupted"):
        assert line in out


def test_json_version_is_valid_json_on_stdout_only(capsys):
    code, out, err = run(capsys, "-o", "json", "version")
    assert code == 0
    data = json.loads(out)
    assert data["dlctl"] == __version__
    assert err == ""


def test_output_option_after_the_command_name(capsys):
    code, out, _ = run(capsys, "version", "-o", "yaml")
    assert code == 0
    assert yaml.safe_load(out)["dlctl"] == __version__


def test_unknown_command_is_a_usage_error(capsys):
    code, out, err = run(capsys, "no-such-verb")
    assert code == ExitCode.USAGE
    assert out == ""
    assert "No such command" in err


@pytest.mark.parametrize("shell,marker", [("bash", "complete -o"), ("zsh", "#compdef dlctl"), ("fish", "complete --no-files")])
def test_completion_scripts(capsys, shell, marker):
    code, out, _ = run(capsys, "completion", shell)
    assert code == 0
    assert marker in out
    assert "_DLCTL_COMPLETE" in out


@pytest.mark.parametrize(
    "error,expected",
    [
        (DlctlError("boom"), ExitCode.FAILED),
        (UsageError("bad"), ExitCode.USAGE),
        (PartialFailure("some hosts failed", details=[{"host": "a", "ok": False}]), ExitCode.PARTIAL),
        (RefusedError("unsafe"), ExitCode.REFUSED),
        (ConflictError("changed concurrently"), ExitCode.FAILED),
        (KeyboardInterrupt(), ExitCode.INTERRUPTED),
        (RuntimeError("unexpected"), ExitCode.FAILED),
    ],
)
def test_errors_map_to_documented_exit_codes(capsys, extra_command, error, expected):
    @click.command("raise-it")
    def raise_it():
        raise error

    extra_command(raise_it)
    code, out, err = run(capsys, "-o", "json", "raise-it")
    assert code == expected
    if isinstance(error, DlctlError):
        assert error.message in err
    if isinstance(error, PartialFailure):
        # Per-host detail is data: stdout, in the chosen format.
        assert json.loads(out) == [{"host": "a", "ok": False}]
    else:
        assert out == ""


def test_hint_is_printed_after_the_error(capsys, extra_command):
    @click.command("raise-it")
    def raise_it():
        raise DlctlError("log x not found", hint="list logs with `dlctl log list`")

    extra_command(raise_it)
    code, _, err = run(capsys, "raise-it")
    assert code == ExitCode.FAILED
    assert err.index("log x not found") < err.index("dlctl log list")


def test_no_color_is_respected(capsys, extra_command, monkeypatch):
    @click.command("raise-it")
    def raise_it():
        raise DlctlError("boom")

    extra_command(raise_it)
    monkeypatch.setenv("FORCE_COLOR", "1")
    _, _, colored = run(capsys, "raise-it")
    assert "\x1b[" in colored and "31m" in colored  # red, when colour is allowed
    monkeypatch.setenv("NO_COLOR", "1")
    _, _, plain = run(capsys, "raise-it")
    assert "31m" not in plain


@pytest.fixture
def plan_command(extra_command):
    """A mutating verb whose steps record what they did, and optionally fail at step 2."""
    applied: list[str] = []

    @click.command("touch")
    @click.argument("names", nargs=-1)
    @click.option("--fail-at", type=int, default=None)
    @mutating()
    def touch(app: AppContext, names: tuple[str, ...], fail_at: int | None) -> Plan:
        def make(i: int, name: str):
            def run_step():
                if i == fail_at:
                    raise OSError(f"disk full writing {name}")
                applied.append(name)
                return {"created": name}

            return run_step

        return Plan.of("touch", [Step("create", n, f"create {n}", run=make(i, n)) for i, n in enumerate(names)])

    extra_command(touch)
    return applied


def test_dry_run_prints_the_plan_and_changes_nothing(capsys, plan_command):
    code, out, _ = run(capsys, "-o", "json", "touch", "a", "b", "--dry-run")
    assert code == 0
    plan = json.loads(out)
    assert plan["dry_run"] is True
    assert [s["target"] for s in plan["steps"]] == ["a", "b"]
    assert plan_command == []


def test_apply_without_a_terminal_needs_yes(capsys, plan_command):
    code, out, err = run(capsys, "touch", "a")
    assert code == ExitCode.REFUSED
    assert "--yes" in err
    assert plan_command == []


def test_apply_runs_exactly_the_planned_steps(capsys, plan_command):
    code, out, _ = run(capsys, "-o", "json", "--yes", "touch", "a", "b")
    assert code == 0
    result = json.loads(out)
    assert result["ok"] is True
    assert [s["target"] for s in result["steps"]] == ["a", "b"]
    assert plan_command == ["a", "b"]


def test_command_level_yes_and_output(capsys, plan_command):
    code, out, _ = run(capsys, "touch", "a", "--yes", "-o", "json")
    assert code == 0
    assert json.loads(out)["ok"] is True


def test_failed_step_after_applied_steps_is_partial_and_says_what_ran(capsys, plan_command):
    code, out, err = run(capsys, "-o", "json", "--yes", "touch", "a", "b", "c", "--fail-at", "1")
    assert code == ExitCode.PARTIAL
    detail = json.loads(out)
    assert [s["status"] for s in detail["steps"]] == ["done", "failed", "not-run"]
    assert "disk full writing b" in err
    assert plan_command == ["a"]


def test_failed_first_step_is_a_plain_failure(capsys, plan_command):
    code, _, err = run(capsys, "--yes", "touch", "a", "--fail-at", "0")
    assert code == ExitCode.FAILED
    assert "nothing was changed" in err


def test_quiet_and_verbose_set_verbosity(extra_command, capsys):
    seen = {}

    @click.command("probe")
    @pass_app
    def probe(app: AppContext):
        seen["v"] = app.verbosity

    extra_command(probe)
    main(["-q", "probe"])
    assert seen["v"] == -1
    main(["-vv", "probe"])
    assert seen["v"] == 2


def test_logging_is_restored_after_the_command(capsys):
    import logging

    before = list(logging.getLogger().handlers)
    main(["-v", "version"])
    assert logging.getLogger().handlers == before
