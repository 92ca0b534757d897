"""Commands about dlctl itself: version and shell completion."""

from __future__ import annotations

import platform

import click
from click.shell_completion import get_completion_class

from .. import __version__
from .context import AppContext, command_options, pass_app

SHELLS = ("bash", "zsh", "fish")


@click.command("version")
@command_options
@pass_app
def version_command(app: AppContext) -> None:
    """Show the versions of dlctl and of what it runs on."""

    app.render(
        {
            "dlctl": __version__,
            "python": platform.python_version(),
            "click": _dist_version("click"),
            "kazoo": _dist_version("kazoo"),
            "paramiko": _dist_version("paramiko"),
            "platform": platform.platform(),
        }
    )


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def completion_source(shell: str, prog_name: str = "dlctl") -> str:
    """The completion script for ``shell``, generated from the click tree."""
    from .main import cli

    complete_var = f"_{prog_name.replace('-', '_').upper()}_COMPLETE"
    cls = get_completion_class(shell)
    if cls is None:  # pragma: no cover - SHELLS only lists shells click supports
        raise click.BadParameter(f"unsupported shell {shell!r}")
    return cls(cli, {}, prog_name, complete_var).source()


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion_command(shell: str) -> None:
    """Print the shell completion script for SHELL.

    \b
    bash:  eval "$(dlctl completion bash)"   (or copy completions/dlctl.bash)
    zsh:   eval "$(dlctl completion zsh)"
    fish:  dlctl completion fish > ~/.config/fish/completions/dlctl.fish
    """
    click.echo(completion_source(shell), nl=False)
