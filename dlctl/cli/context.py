"""Per-invocation state shared by every command, and the decorators commands plug in with."""

from __future__ import annotations

import errno
import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import click
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from .. import inventory, output
from ..config import ConfigLocation, locate_config, select_cluster
from ..errors import RefusedError
from ..inventory import Inventory
from ..session import ClusterSession
from ..plan import Plan, PlanResult, Step, apply


@dataclass
class AppContext:
    config_option: str | None = None
    cluster_option: str | None = None
    output: str = "table"
    verbosity: int = 0  # -1 quiet, 0 default, 1 info, 2 debug
    assume_yes: bool = False
    stdout: Console = field(default_factory=lambda: _stdout_console())
    stderr: Console = field(default_factory=lambda: Console(file=sys.stderr, stderr=True))
    _session: ClusterSession | None = field(default=None, repr=False)
    _saved_logging: tuple[list[logging.Handler], int, int] | None = field(default=None, repr=False)  # root's handlers and level, kazoo's level
    _config: ConfigLocation | None = field(default=None, repr=False)

    @property
    def config(self) -> ConfigLocation:
        """Located once per command (``--config`` > DLCTL_CONFIG > current context > defaults);
        -vv says which file it is and why."""
        if self._config is None:
            self._config = locate_config(self.config_option)
            logging.getLogger("dlctl.config").debug("configuration: %s (from %s)", self._config.path or "none found", self._config.source)
        return self._config

    @property
    def cluster(self) -> str | None:
        return select_cluster(self.cluster_option)

    def inventory(self) -> Inventory:
        return inventory.load(self.config)

    def session(self) -> ClusterSession:
        """The selected cluster's session, opened once per command and closed when it ends."""
        if self._session is None:
            self._session = ClusterSession(self.inventory().cluster(self.cluster))
            click.get_current_context().call_on_close(self._close_session)
        return self._session

    def _close_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def render(self, data: Any) -> None:
        output.render(data, self.output, console=self.stdout, stream=self.stdout.file)

    def configure_logging(self) -> None:
        """Route log records to stderr for this invocation; ``restore_logging`` undoes it."""
        level = {-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}.get(self.verbosity, logging.DEBUG)
        root = logging.getLogger()
        kazoo = logging.getLogger("kazoo")
        if self._saved_logging is None:
            self._saved_logging = (list(root.handlers), root.level, kazoo.level)
        root.handlers[:] = [RichHandler(console=self.stderr, show_path=False, rich_tracebacks=self.verbosity >= 2)]
        root.setLevel(level)
        # kazoo warns at each failed connection attempt ("Connection dropped: ... refused", a
        # dozen lines before the one error that says ZooKeeper is out of reach); the command's
        # own error says what matters. -v shows them.
        kazoo.setLevel(logging.ERROR if self.verbosity <= 0 else logging.NOTSET)

    def restore_logging(self) -> None:
        # Background threads (kazoo's) may log after the command returns; they must not write
        # to a console whose stream the caller has closed (embedding, tests).
        if self._saved_logging is not None:
            root = logging.getLogger()
            root.handlers[:], level, kazoo_level = self._saved_logging
            root.setLevel(level)
            logging.getLogger("kazoo").setLevel(kazoo_level)
            self._saved_logging = None

    @contextmanager
    def progress(self, transient: bool = True) -> Iterator[Progress]:
        """A rich progress display on stderr; silent with -q or when stderr is not a terminal."""
        disable = self.verbosity < 0 or not self.stderr.is_terminal
        with Progress(
            SpinnerColumn(),
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.stderr,
            transient=transient,
            disable=disable,
        ) as bar:
            yield bar

    def confirm(self, plan: Plan) -> None:
        """Ask before applying; without a terminal, ``--yes`` is required."""
        if self.assume_yes:
            return
        if not sys.stdin.isatty():
            raise RefusedError(
                f"{plan.operation}: not confirmed (standard input is not a terminal)",
                hint="review it with --dry-run, then pass --yes to apply",
            )
        for step in plan.steps:
            self.stderr.print(f"  • {step.description}", markup=False, highlight=False)
        for note in plan.notes:
            self.stderr.print(f"  ! {note}", markup=False, highlight=False)
        if not click.confirm(f"Apply {plan.operation} ({len(plan.steps)} step(s))?", err=True):
            raise RefusedError(f"{plan.operation}: not confirmed; nothing was changed")

    def confirm_typed(self, plan: Plan, expected: str, given: str | None, what: str) -> None:
        """For steps that cannot be undone (promote a cluster, discard records): the operator
        types the cluster's name, at the terminal or with ``--confirm NAME``; ``--yes`` is not
        enough."""
        if given is not None:
            if given != expected:
                raise RefusedError(f"{plan.operation}: --confirm {given!r} does not name {expected!r}; nothing was changed")
            return
        if not sys.stdin.isatty():
            raise RefusedError(
                f"{plan.operation}: {what} needs the cluster name typed (standard input is not a terminal)",
                hint=f"review it with --dry-run, then pass --confirm {expected}",
            )
        for step in plan.steps:
            self.stderr.print(f"  • {step.description}", markup=False, highlight=False)
        for note in plan.notes:
            self.stderr.print(f"  ! {note}", markup=False, highlight=False)
        typed = click.prompt(f"Type {expected!r} to {what}", err=True, default="", show_default=False)
        if typed.strip() != expected:
            raise RefusedError(f"{plan.operation}: not confirmed; nothing was changed")

    def run_plan(self, plan: Plan) -> PlanResult:
        log = logging.getLogger("dlctl.plan")
        with self.progress() as bar:
            task = bar.add_task(plan.operation, total=len(plan.steps))

            def on_step(index: int, step: Step) -> None:
                bar.update(task, description=step.description, completed=index)
                log.info("%s: %s", plan.operation, step.description)

            result = apply(plan, on_step=on_step)
            bar.update(task, completed=len(plan.steps))
            return result


class _StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        # rich's own exits 1 at once; dlctl's group tells a closed stdout (exit 141) from a
        # broken connection, and closes the command's session on the way out.
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "standard output: the reader went away")


def _stdout_console() -> Console:
    # Piped tables keep full cell contents (a pager or file has no 80-column limit);
    # an explicit COLUMNS still wins.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return _StdoutConsole(file=sys.stdout, width=200 if wide else None)


pass_app = click.make_pass_decorator(AppContext, ensure=True)


def _set_on_app(attribute: str, transform: Callable[[Any], Any] = lambda v: v):
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is not None and value is not False:
            setattr(ctx.ensure_object(AppContext), attribute, transform(value))
        return value

    return callback


output_option = click.option(
    "-o",
    "--output",
    type=click.Choice(output.FORMATS),
    default=None,
    expose_value=False,
    callback=_set_on_app("output"),
    help="Output format: table (default), json or yaml.",
)

yes_option = click.option(
    "--yes",
    "-y",
    is_flag=True,
    default=False,
    expose_value=False,
    callback=_set_on_app("assume_yes"),
    help="Do not ask for confirmation.",
)


def command_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options every leaf command accepts after its name (``dlctl log list -o json``)."""
    return output_option(func)


def mutating(confirm: bool = True) -> Callable[[Callable[..., Plan]], Callable[..., Any]]:
    """Turn a function that *builds* a Plan into a command with --dry-run, --yes and -o.

    With --dry-run the plan is rendered and nothing happens; otherwise it is confirmed
    (when ``confirm``), applied step by step with progress on stderr, and its result rendered.
    """

    def decorate(build: Callable[..., Plan]) -> Callable[..., Any]:
        @click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
        @yes_option
        @output_option
        @pass_app
        @functools.wraps(build)
        def command(app: AppContext, *args: Any, dry_run: bool, **kwargs: Any) -> None:
            plan = build(app, *args, **kwargs)
            if dry_run or plan.empty:
                app.render(plan)
                return
            if confirm:
                app.confirm(plan)
            app.render(app.run_plan(plan))

        return command

    return decorate


__all__ = ["AppContext", "pass_app", "command_options", "mutating", "output_option", "yes_option"]
