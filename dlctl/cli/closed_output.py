"""When the reader of stdout goes away (`dlctl log read x | head`, `dlctl log list | true`).

click turns any EPIPE into a silent exit 1 and rich's console exits 1 by itself, so a script
could not tell a closed pipe from a failure, and a broken pipe on an agent's connection was
silenced the same way. ``DlctlGroup`` tells the two apart: stdout's is ``OutputClosed`` (exit
141, silent, as for a tool killed by SIGPIPE), any other is carried past click as
``ForeignBrokenPipe`` and reported as the internal error it is.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import sys
import threading
from collections.abc import Callable

import click


class OutputClosed(Exception):
    """The reader of stdout went away (`dlctl log read x | head`). Not an OSError: click would
    turn an EPIPE into exit 1 by itself."""


GONE = select.POLLERR | select.POLLHUP  # what poll reports on a pipe's writing end once nobody reads it


def _stdout_fd() -> int | None:
    """stdout's descriptor; None when it has none (an embedding, a test's capture)."""
    try:
        return sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket nobody reads any more: a broken pipe met on an
    agent's connection must stay an error."""
    fd = _stdout_fd()
    if fd is None:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & GONE for _, events in poller.poll(0))


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


def watch_stdout_reader(on_gone: Callable[[BrokenPipeError], None]) -> Callable[[], None]:
    """Call ``on_gone`` (from a thread of its own) once stdout is a pipe or socket whose reader
    went away, as `tail -f` notices: a `log tail | grep -m1 x` must end when grep does, not at
    the next record, which a quiet log may never append. Returns the function that stops the
    watching. The thread waits in poll() for an error on stdout (reported whatever events are
    asked for) or for its stop pipe: nothing is polled on a timer."""
    fd = _stdout_fd()
    kind = 0
    if fd is not None:
        with contextlib.suppress(OSError):  # (a descriptor closed under sys.stdout)
            kind = os.fstat(fd).st_mode
    if not (stat.S_ISFIFO(kind) or stat.S_ISSOCK(kind)):
        return lambda: None  # no descriptor, a terminal or a file: no reader to lose
    wake_read, wake_write = os.pipe()
    poller = select.poll()
    poller.register(fd, 0)
    poller.register(wake_read, select.POLLIN)

    stopped = threading.Event()

    def watch() -> None:
        try:
            for ready, events in poller.poll():
                if ready == fd and events & GONE and not stopped.is_set():
                    on_gone(BrokenPipeError(errno.EPIPE, "standard output: the reader went away"))
                    return
        finally:
            os.close(wake_read)

    def stop() -> None:
        stopped.set()
        with contextlib.suppress(OSError):  # (the watcher may be gone already, its end closed)
            os.write(wake_write, b"x")
        os.close(wake_write)

    threading.Thread(target=watch, name="dlctl-stdout-watch", daemon=True).start()
    return stop
