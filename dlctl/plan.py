"""Plans: what a mutating operation will do, as data.

Every mutating verb first builds a ``Plan`` (an ordered list of ``Step``s). ``--dry-run``
renders it; apply executes the very same steps, so what is printed and what is done
cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

from .errors import DlctlError, ExitCode


class StepStatus(str, Enum):
    PLANNED = "planned"
    DONE = "done"
    FAILED = "failed"
    NOT_RUN = "not-run"


@dataclasses.dataclass(frozen=True)
class Step:
    """One side effect: ``action`` on ``target``, described for a human in ``description``.
    ``piecewise``: the step does its work in pieces (logs, segments, streams, records), so a
    failure can leave some of them done; a failed first step then never says "nothing was changed"."""

    action: str
    target: str
    description: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    run: Callable[[], Any] | None = dataclasses.field(default=None, compare=False, repr=False)
    piecewise: bool = dataclasses.field(default=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = {"action": self.action, "target": self.target, "description": self.description}
        if self.params:
            out["params"] = self.params
        return out


@dataclasses.dataclass
class StepOutcome:
    step: Step
    status: StepStatus
    result: Any = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = self.step.to_dict()
        out["status"] = self.status.value
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclasses.dataclass(frozen=True)
class Plan:
    operation: str
    steps: tuple[Step, ...]
    # What the operator should know before confirming (data at risk, decisions taken and why).
    notes: tuple[str, ...] = ()
    # Run by ``apply`` when it ends, however it ends: releases what the steps share (e.g. the one
    # Spark context of an init-replication's bootstrap copies). Not part of the printed plan.
    cleanup: tuple[Callable[[], None], ...] = dataclasses.field(default=(), compare=False, repr=False)

    @classmethod
    def of(cls, operation: str, steps: Iterable[Step], notes: Iterable[str] = (), cleanup: Iterable[Callable[[], None]] = ()) -> Plan:
        return cls(operation, tuple(steps), tuple(notes), tuple(cleanup))

    @property
    def empty(self) -> bool:
        return not self.steps

    def to_table(self) -> Any:
        from .output import Table

        rows = [{"step": i + 1, "action": s.action, "target": s.target, "description": s.description} for i, s in enumerate(self.steps)]
        notes = "\n".join(f"note: {n}" for n in self.notes) or None
        title = f"{self.operation}: plan (dry run)" if self.steps else f"{self.operation}: nothing to do"
        return Table(rows, ["step", "action", "target", "description"], title=title, caption=notes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "dry_run": True,
            "notes": list(self.notes),
            "steps": [dict(s.to_dict(), status=StepStatus.PLANNED.value) for s in self.steps],
        }


@dataclasses.dataclass
class PlanResult:
    operation: str
    outcomes: list[StepOutcome]

    @property
    def ok(self) -> bool:
        return all(o.status is StepStatus.DONE for o in self.outcomes)

    def to_table(self) -> Any:
        from .output import Table

        rows = [{"step": i + 1, "action": o.step.action, "target": o.step.target, "status": o.status.value, "detail": o.error or _summary(o.result)} for i, o in enumerate(self.outcomes)]
        return Table(rows, ["step", "action", "target", "status", "detail"], title=f"{self.operation}: {'done' if self.ok else 'FAILED'}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "dry_run": False,
            "ok": self.ok,
            "steps": [o.to_dict() for o in self.outcomes],
        }


def _summary(result: Any) -> Any:
    """A step result short enough for a table cell (the full result is in -o json)."""
    if isinstance(result, dict) and len(str(result)) > 120:
        return ", ".join(f"{k}={v}" for k, v in result.items() if not isinstance(v, (dict, list)))[:120] or "ok"
    if isinstance(result, list) and len(str(result)) > 120:
        return f"{len(result)} item(s)"
    return result


class PlanFailed(DlctlError):
    """A step failed; steps before it were applied, steps after it were not run."""

    def __init__(self, result: PlanResult, failed: StepOutcome, cause: BaseException) -> None:
        done = sum(1 for o in result.outcomes if o.status is StepStatus.DONE)
        cause_code = getattr(cause, "exit_code", ExitCode.FAILED)
        if done:
            progress = f"{done} step(s) were applied before it; re-running the command continues from here"
        elif cause_code == ExitCode.PARTIAL:
            progress = ""  # the step failed part-way and says itself what it did
        elif failed.step.piecewise:
            progress = "part of this step's work may be done"
        else:
            progress = "nothing was changed"
        cause_hint = getattr(cause, "hint", None)
        hint = f"{cause_hint} ({progress})" if cause_hint and progress else cause_hint or progress or None
        super().__init__(
            f"{result.operation}: step {failed.step.action} on {failed.step.target} failed: {failed.error}",
            hint=hint,
            details=result.to_dict(),
        )
        self.result = result
        # A failure after some steps were applied leaves partial work: report it as such — unless
        # the step refused for safety, which a script must be able to tell from a half-done job.
        self.exit_code = ExitCode.PARTIAL if done and cause_code != ExitCode.REFUSED else cause_code


def apply(plan: Plan, on_step: Callable[[int, Step], None] | None = None) -> PlanResult:
    """Run the plan's steps in order; stop at the first failure and raise ``PlanFailed``.
    The plan's ``cleanup`` runs at the end either way."""
    try:
        return _apply(plan, on_step)
    finally:
        for release in plan.cleanup:
            try:
                release()
            except Exception:  # noqa: BLE001 - a failed release must not hide the steps' outcome
                logging.getLogger(__name__).warning("%s: releasing %r failed", plan.operation, release, exc_info=True)


def _apply(plan: Plan, on_step: Callable[[int, Step], None] | None) -> PlanResult:
    result = PlanResult(plan.operation, [])
    for index, step in enumerate(plan.steps):
        if on_step is not None:
            on_step(index, step)
        try:
            value = step.run() if step.run is not None else None
        except Exception as exc:  # noqa: BLE001 - every failure is reported with its step
            # Keep the cause's structured detail (per-host results of a fan-out) with the step.
            failed = StepOutcome(step, StepStatus.FAILED, result=getattr(exc, "details", None), error=str(exc) or type(exc).__name__)
            result.outcomes.append(failed)
            result.outcomes.extend(StepOutcome(s, StepStatus.NOT_RUN) for s in plan.steps[index + 1 :])
            raise PlanFailed(result, failed, exc) from exc
        result.outcomes.append(StepOutcome(step, StepStatus.DONE, result=value))
    return result
