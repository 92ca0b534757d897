"""The ``dlctl`` command group, its global options, and the mapping of errors to exit codes."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

import click
from rich.markup import escape

from .. import __version__
from ..allocator import keep_large_buffers
from ..errors import DlctlError, ExitCode
from ..ops.failures import as_user_error
from ..output import FORMATS
from .agent import agent_group
from .bench import bench_group
from .bootstrap import bootstrap_command
from .cluster import cluster_group
from .complete import complete_cluster
from .configcmd import config_group
from .closed_output import DlctlGroup, ForeignBrokenPipe, OutputClosed, silence_stdout
from .context import AppContext
from .dr import dr_group, failback_command, failover_command, switchover_command
from .log import log_group
from .misc import completion_command, version_command
from .placement import placement_group
from .recover import fence_command, recover_group
from .replication import init_replication_command, replication_group
from .sandbox import sandbox_group
from .top import top_command
from .truncate import gc_command, truncate_command

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

EPILOG = """\b
Exit codes:
  0    ok
  1    failed
  2    usage error (bad arguments or configuration)
  3    partial: some nodes or steps failed (details in the output)
  4    refused for safety (nothing was changed)
  130  interrupted
  141  the reader of stdout went away (e.g. | head), silently
"""


@click.group(cls=DlctlGroup, context_settings=CONTEXT_SETTINGS, epilog=EPILOG)
@click.option(
    "--config",
    "config_option",
    metavar="FILE",
    envvar=None,
    help="Inventory/configuration file (default: $DLCTL_CONFIG, then the current context `sandbox up` set, then the user config dir, then /etc/dlctl/).",
)
@click.option("--cluster", "cluster_option", metavar="NAME", shell_complete=complete_cluster, help="Cluster context (default: $DLCTL_CLUSTER).")
@click.option("-o", "--output", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format.")
@click.option("-v", "--verbose", count=True, help="More log output on stderr (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr; no progress bars.")
@click.option("--yes", "-y", "assume_yes", is_flag=True, help="Do not ask for confirmation.")
@click.version_option(__version__, "--version", prog_name="dlctl")
@click.pass_context
def cli(
    ctx: click.Context,
    config_option: str | None,
    cluster_option: str | None,
    output: str,
    verbose: int,
    quiet: bool,
    assume_yes: bool,
) -> None:
    """Operate a geo-replicated log: agents, placement, fencing and recovery, replication.

    stdout carries data (-o json|yaml for scripts); logs and progress go to stderr.
    """
    app = ctx.ensure_object(AppContext)
    app.config_option = config_option
    app.cluster_option = cluster_option
    app.output = output
    app.verbosity = -1 if quiet else verbose
    app.assume_yes = assume_yes
    app.configure_logging()


cli.add_command(version_command)
cli.add_command(completion_command)
cli.add_command(config_group)
cli.add_command(log_group)
cli.add_command(cluster_group)
cli.add_command(agent_group)
cli.add_command(sandbox_group)
cli.add_command(bench_group)
cli.add_command(fence_command)
cli.add_command(recover_group)
cli.add_command(bootstrap_command)
cli.add_command(placement_group)
cli.add_command(truncate_command); cli.add_command(gc_command)  # noqa: E702 - one line per feature
cli.add_command(init_replication_command)
cli.add_command(replication_group)
cli.add_command(top_command)
cli.add_command(dr_group); cli.add_command(failover_command); cli.add_command(switchover_command); cli.add_command(failback_command)  # noqa: E702


def _report(app: AppContext, error: DlctlError) -> None:
    if error.details is not None:
        # Per-host or per-step detail is data: it goes to stdout in the chosen format.
        try:
            app.render(error.details)
        except Exception:  # noqa: BLE001 - the error message below must still be shown
            logging.getLogger("dlctl").debug("could not render error details", exc_info=True)
    # Messages quote inventory tables ([clusters.c.cold_storage]), names and remote output:
    # printed as they are, never read as rich markup.
    app.stderr.print(f"[bold red]error:[/] {escape(error.message)}", highlight=False)
    if error.hint:
        app.stderr.print(f"[dim]hint:[/] {escape(error.hint)}", highlight=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: runs the group and turns every outcome into a documented exit code."""
    app = AppContext()
    try:
        rv = cli.main(args=list(argv) if argv is not None else None, prog_name="dlctl", obj=app, standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = int(exc.exit_code)
    except OutputClosed:
        # Silent, as `cat` killed by SIGPIPE is: the reader took what it wanted. A command that
        # changed something did so before its result could not be written.
        silence_stdout()
        code = int(ExitCode.OUTPUT_CLOSED)
    except (click.exceptions.Abort, KeyboardInterrupt):
        app.stderr.print("interrupted", highlight=False)
        code = int(ExitCode.INTERRUPTED)
    except click.ClickException as exc:
        exc.show(file=sys.stderr)
        code = int(exc.exit_code)
    except DlctlError as exc:
        _report(app, exc)
        code = int(exc.exit_code)
    except Exception as caught:  # noqa: BLE001 - last resort: say what broke, exit 1
        exc = caught.__cause__ if isinstance(caught, ForeignBrokenPipe) else caught
        error = as_user_error(exc)
        if error is not None:
            _report(app, error)
            code = int(error.exit_code)
        else:
            app.stderr.print(f"[bold red]internal error:[/] {type(exc).__name__}: {escape(str(exc))}", highlight=False)
            if app.verbosity >= 2:
                app.stderr.print_exception()
            else:
                app.stderr.print("[dim]hint:[/] run again with -vv for a traceback", highlight=False)
            code = int(ExitCode.FAILED)
    else:
        code = int(rv) if isinstance(rv, int) else int(ExitCode.OK)
    finally:
        app.restore_logging()
    return code


def use_uvloop() -> bool:
    """Make ``asyncio.run`` in this process use uvloop when it is installed: the agent pool's
    round trips (appends, reads, every command that talks to agents) then cost fewer µs of loop
    overhead. Only for the console script: a library user picks their own loop."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def run() -> None:  # pragma: no cover - thin wrapper used by the console script
    use_uvloop()
    keep_large_buffers()  # reads and appends move large buffers (dlctl.allocator)
    code = main()
    try:
        sys.stdout.flush()  # output smaller than a buffer is written only here
    except BrokenPipeError:
        silence_stdout()
        code = code or int(ExitCode.OUTPUT_CLOSED)
    sys.exit(code)
