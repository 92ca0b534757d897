"""The ``dlagent`` command: node-level verbs (serve, fsck, ...)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import click

from dlctl import __version__
from dlctl.allocator import keep_large_buffers
from dlctl.errors import ConfigError, DlctlError, ExitCode


def run_loop(choice: str, main: Coroutine[Any, Any, int]) -> int:
    """Run the agent's event loop: uvloop when installed (``auto``) or asked for. uvloop's loop
    is libuv in C: each request costs fewer microseconds of loop overhead, measured on the
    single-record append latency (``tests/benchmarks/bench_vs_jetstream.py``)."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                main.close()
                raise ConfigError("event_loop = \"uvloop\" but uvloop is not installed", hint="pip install uvloop, or set event_loop = \"auto\"") from None
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(main)
    return asyncio.run(main)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="dlagent")
def cli() -> None:
    """The per-node agent of a dlctl cluster."""


@cli.command("serve")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Agent configuration (TOML).")
@click.option("-v", "--verbose", count=True, help="More log output on stderr.")
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Log into this file, rotated by size ([log] in agent.toml), instead of stderr (`dlagent start` does, without systemd).",
)
def serve_command(config_path: Path, verbose: int, log_file: Path | None) -> None:
    """Run the agent: recover storage, serve the protocol, register in ZooKeeper.

    Stops cleanly on SIGTERM/SIGINT (exit 0). Exits 1 if the disk fails (a failed fsync):
    the agent never acknowledges what may be lost.
    """
    from . import config as agent_config
    from .daemon import serve

    # Everything the agent creates is its own: directories 0700, files 0600 (DESIGN.md §10),
    # whatever umask it was started with. Here, in the daemon's own process only (a verb run
    # in-process, as tests do with fsck, must not change its caller's umask); the explicit
    # modes in agent/storage say the same, for stores opened without this command.
    os.umask(0o077)
    logging.basicConfig(
        level=logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("dlagent").setLevel(logging.INFO if verbose < 2 else logging.DEBUG)
    keep_large_buffers()  # entries and ranges pass through large buffers: reuse warm pages
    try:
        config = agent_config.load(config_path)
        if log_file is not None:
            from .logconfig import use_log_file

            use_log_file(log_file, config.log)
        code = run_loop(config.event_loop, serve(config))
    except DlctlError as exc:
        click.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(int(exc.exit_code))
    sys.exit(code)


from .fsck import fsck_command  # noqa: E402 - registered after the group exists

cli.add_command(fsck_command)


def _node_verb(name: str, doc: str):
    """A lifecycle verb over the agent's own config; prints one result object (JSON by default)."""

    def decorate(func):
        @cli.command(name, help=doc)
        @click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Agent configuration (TOML).")
        @click.option("-o", "--output", type=click.Choice(["json", "table", "yaml"]), default="json", show_default=True)
        def command(config_path: Path, output: str) -> None:
            from dlctl.output import render

            from . import config as agent_config

            try:
                result = func(agent_config.load(config_path))
            except DlctlError as exc:
                click.echo(f"error: {exc.message}", err=True)
                if exc.hint:
                    click.echo(f"hint: {exc.hint}", err=True)
                sys.exit(int(exc.exit_code))
            render(result, output)

        return command

    return decorate


@_node_verb("start", "Start the agent in the background (no-op if it runs). Waits until it listens.")
def _start(config):
    from .control import start

    return start(config)


@_node_verb("stop", "Stop the agent: SIGTERM, wait for a clean exit, then SIGKILL. No-op if stopped.")
def _stop(config):
    from .control import stop

    return stop(config)


@_node_verb("status", "Report whether the agent runs, its pid, address, version and disk use.")
def _status(config):
    from .control import status

    return status(config)


@cli.command("logs")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Agent configuration (TOML).")
@click.option("-n", "--lines", type=click.IntRange(1, 100_000), default=100, show_default=True)
def logs_command(config_path: Path, lines: int) -> None:
    """Print the agent's last log lines, newest last: from journald when a systemd unit runs it,
    else from its rotated log files in the data dir."""
    from . import config as agent_config
    from .control import logs

    try:
        click.echo(logs(agent_config.load(config_path), lines), nl=False)
    except DlctlError as exc:
        click.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(int(exc.exit_code))


def main() -> None:  # pragma: no cover - console script
    try:
        sys.exit(cli.main(prog_name="dlagent"))
    except KeyboardInterrupt:
        sys.exit(int(ExitCode.INTERRUPTED))
