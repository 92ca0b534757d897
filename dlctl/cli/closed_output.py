"""When the reader of stdout goes away (`dlctl log read x | head`, `dlctl log list | true`).

click turns any EPIPE into a silent exit 1 and rich's console exits 1 by itself, so a script
could not tell a closed pipe from a failure, and a broken pipe on an agent's connection was
silenced the same way. ``DlctlGroup`` tells the two apart: stdout's is ``OutputClosed`` (exit
141, silent, as for a tool killed by SIGPIPE), any other is carried past click as
``ForeignBrokenPipe`` and reported as the internal error it is.
"""

from __future__ import annotations

import os
import select
import sys

import click


class OutputClosed(Exception):
    """The reader of stdout went away (`dlctl log read x | head`). Not an OSError: click would
    turn an EPIPE into exit 1 by itself."""


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket nobody reads any more (poll reports an error on the
    writing end): a broken pipe met on an agent's connection must stay an error."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def silence_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered must not fail again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


class ForeignBrokenPipe(Exception):
    """A broken pipe that is not stdout's (a connection), carried past click, which would make
    any EPIPE a silent exit 1: reported as the internal error it is."""


class DlctlGroup(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            if stdout_reader_gone():
                raise OutputClosed() from exc
            raise ForeignBrokenPipe() from exc
