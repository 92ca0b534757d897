"""The command's event loop: one per process, running in a background thread, on which every
session's agent pool lives (issue 26 item 4).

Before it, each synchronous step of an operation ran ``asyncio.run`` with an agent pool of its
own, and so opened fresh authenticated (TLS + challenge/response) connections to the same agents
a dozen times per command. With one loop the connections outlive the step that opened them; the
loop keeps running between steps, so a connection an agent dropped meanwhile is seen as closed
(its ``connection_lost`` runs) before the next step sends on it — which a loop that only ran
during steps would not notice.

Synchronous code calls ``run(coro)`` from any thread; a coroutine already on the loop must await
instead (calling ``run`` there would wait for itself, and is refused).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CANCEL_GRACE = 5.0  # seconds an interrupted step gets to run its finally blocks (close writers, release pins)
# How often a thread waiting for a step wakes up. A Ctrl-C the kernel hands to another thread of
# the process is only flagged; the main thread runs its handler (KeyboardInterrupt) when it next
# runs Python code, which an untimed wait would not do until the step ends.
SIGNAL_CHECK = 0.2

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def command_loop() -> asyncio.AbstractEventLoop:
    """The process's command loop, started on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            started = threading.Event()
            loop.call_soon(started.set)
            threading.Thread(target=loop.run_forever, name="dlctl-command-loop", daemon=True).start()
            started.wait()
            _loop = loop
        return _loop


def on_command_loop() -> bool:
    """True when the caller is a coroutine (or callback) running on the command loop."""
    try:
        return asyncio.get_running_loop() is _loop
    except RuntimeError:
        return False


class _Step:
    """One coroutine handed to the loop, as the waiting thread and the loop both see it."""

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None  # set by the loop when the step starts
        self.abandoned = False  # set by the waiting thread when it was interrupted
        self.finished = threading.Event()

    def cancel(self) -> None:
        """On the loop: cancel the step if it started (if not, it sees ``abandoned`` first)."""
        if self.task is not None:
            self.task.cancel()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the command loop and return its result (or raise its exception) to the
    synchronous caller. An interrupt (Ctrl-C) while waiting cancels the coroutine, waits up to
    CANCEL_GRACE for its clean-up, and re-raises."""
    if on_command_loop():
        coro.close()
        raise RuntimeError("dlctl.loop.run called from a coroutine on the command loop: await the coroutine instead")
    loop = command_loop()
    step = _Step()

    async def main() -> T:
        step.task = asyncio.current_task()
        try:
            if step.abandoned:  # interrupted before it started
                coro.close()
                raise asyncio.CancelledError
            return await coro
        finally:
            step.finished.set()

    try:
        # (Inside the try: an interrupt may land between handing the step over and waiting.)
        future = asyncio.run_coroutine_threadsafe(main(), loop)
        while not future.done():
            concurrent.futures.wait([future], timeout=SIGNAL_CHECK)
        return future.result()
    except BaseException:
        if not step.finished.is_set():
            step.abandoned = True
            loop.call_soon_threadsafe(step.cancel)
            step.finished.wait(CANCEL_GRACE)
        raise


_closing: set[asyncio.Task] = set()  # the loop holds tasks weakly: these are held until done


def close_soon(coro: Coroutine[Any, Any, Any]) -> None:
    """From a coroutine on the command loop: run ``coro`` (a clean-up) in the background, as
    ``run`` cannot be waited on there. Its failure is of no interest to anyone but the log."""
    task = asyncio.get_running_loop().create_task(coro)
    _closing.add(task)
    task.add_done_callback(_closing.discard)


def _stop() -> None:
    """At exit: stop the loop so its thread does not run callbacks into a finalising interpreter."""
    loop = _loop
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)


atexit.register(_stop)
