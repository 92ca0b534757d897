"""The ``dlagent`` command: node-level verbs (serve, fsck, ...)."""

from __future__ import annotations

import sys

import click

from dlctl import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="dlagent")
def cli() -> None:
    """The per-node agent of a dlctl cluster."""


def main() -> None:  # pragma: no cover - console script
    sys.exit(cli.main(prog_name="dlagent"))
