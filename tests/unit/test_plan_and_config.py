"""Plans apply exactly their steps; configuration is located by documented precedence."""

from __future__ import annotations

import pytest

from dlctl.config import locate_config, select_cluster
from dlctl.errors import DlctlError, ExitCode, PartialFailure, RefusedError
from dlctl.plan import Plan, PlanFailed, Step, StepStatus, apply


def test_apply_runs_steps_in_order_and_reports_results():
    calls = []
    plan = Plan.of("op", [Step("a", "x", "do x", run=lambda: calls.append("x") or 1), Step("b", "y", "do y", run=lambda: calls.append("y"))])
    result = apply(plan)
    assert calls == ["x", "y"]
    assert result.ok and [o.result for o in result.outcomes] == [1, None]


def test_apply_stops_at_the_first_failure_and_keeps_the_cause_exit_code():
    def refuse():
        raise RefusedError("would lose data")

    plan = Plan.of("op", [Step("a", "x", "x", run=refuse), Step("b", "y", "y", run=lambda: None)])
    with pytest.raises(PlanFailed) as info:
        apply(plan)
    assert info.value.exit_code == ExitCode.REFUSED
    assert [o.status for o in info.value.result.outcomes] == [StepStatus.FAILED, StepStatus.NOT_RUN]


def test_a_failed_first_step_says_nothing_was_changed_only_when_it_is_done_in_one_piece():
    def fail():
        raise DlctlError("disk full", hint="free some space")

    def fail_part_way():
        raise PartialFailure("3 of 5 records appended", hint="look first")

    def hint_of(step: Step) -> str:
        with pytest.raises(PlanFailed) as info:
            apply(Plan.of("op", [step]))
        return info.value.hint or ""

    assert hint_of(Step("a", "x", "x", run=fail)) == "free some space (nothing was changed)"
    # A step over several logs or segments may have done some before it failed.
    assert hint_of(Step("copy", "x", "x", run=fail, piecewise=True)) == "free some space (part of this step's work may be done)"
    # One that failed part-way says itself what it did (exit 3).
    assert hint_of(Step("append", "x", "x", run=fail_part_way)) == "look first"


def test_plan_rendering_is_the_same_steps():
    plan = Plan.of("op", [Step("create", "log/a", "create log a", params={"e": 3})], notes=["careful"])
    data = plan.to_dict()
    assert data["steps"] == [{"action": "create", "target": "log/a", "description": "create log a", "params": {"e": 3}, "status": "planned"}]
    assert data["notes"] == ["careful"]


def test_config_precedence(tmp_path, monkeypatch):
    user = tmp_path / "user"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user))
    assert locate_config(None, env={}).source in {"none", "system"}
    (user / "dlctl").mkdir(parents=True)
    (user / "dlctl" / "config.toml").write_text("")
    assert locate_config(None, env={}).source == "user"
    assert locate_config(None, env={"DLCTL_CONFIG": "/x.toml"}).path.as_posix() == "/x.toml"
    found = locate_config("/explicit.toml", env={"DLCTL_CONFIG": "/x.toml"})
    assert (found.path.as_posix(), found.source) == ("/explicit.toml", "--config")


def test_cluster_selection():
    assert select_cluster("a", env={"DLCTL_CLUSTER": "b"}) == "a"
    assert select_cluster(None, env={"DLCTL_CLUSTER": "b"}) == "b"
    assert select_cluster(None, env={}) is None
