"""The command loop (dlctl.loop): one event loop in a background thread that synchronous code
hands coroutines to, from any thread; results and exceptions come back; a coroutine on it may not
wait for itself; an interrupt cancels the coroutine and lets its clean-up run."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from dlctl import loop


def test_a_coroutine_runs_on_the_one_background_loop_and_its_result_comes_back():
    async def where() -> tuple[asyncio.AbstractEventLoop, str]:
        return asyncio.get_running_loop(), threading.current_thread().name

    first_loop, thread = loop.run(where())
    second_loop, _ = loop.run(where())
    assert first_loop is second_loop is loop.command_loop()  # the same loop outlives each step
    assert thread == "dlctl-command-loop" and thread != threading.current_thread().name


def test_state_made_by_one_step_lives_on_for_the_next():
    async def start_ticker() -> asyncio.Task:
        async def tick() -> int:
            await asyncio.sleep(0.01)
            return 7

        return asyncio.ensure_future(tick())

    task = loop.run(start_ticker())
    # The loop ran on while no step was running: the ticker finished without another step.
    done = threading.Event()
    task.add_done_callback(lambda _t: done.set())  # (from this thread: only reads its state)
    assert done.wait(5.0) and task.result() == 7


def test_an_exception_in_the_coroutine_is_raised_to_the_caller():
    class Boom(Exception):
        pass

    async def fail() -> None:
        raise Boom("from the loop")

    with pytest.raises(Boom, match="from the loop"):
        loop.run(fail())


def test_threads_may_hand_coroutines_over_at_the_same_time():
    async def echo(i: int) -> int:
        await asyncio.sleep(0.01 * (i % 3))
        return i

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda i: loop.run(echo(i)), range(32))) == list(range(32))


def test_waiting_for_the_loop_from_a_coroutine_on_it_is_refused_not_a_deadlock():
    async def inner() -> int:
        return 1

    async def outer() -> None:
        assert loop.on_command_loop()
        loop.run(inner())

    with pytest.raises(RuntimeError, match="await the coroutine instead"):
        loop.run(outer())
    assert not loop.on_command_loop()  # this thread is not the loop's


def test_close_soon_runs_a_clean_up_handed_over_on_the_loop():
    closed = threading.Event()

    async def clean_up() -> None:
        await asyncio.sleep(0)
        closed.set()

    async def step() -> None:
        loop.close_soon(clean_up())

    loop.run(step())
    assert closed.wait(5.0)


@pytest.mark.parametrize("delivered_to", ["process", "another thread"])
def test_an_interrupt_while_waiting_cancels_the_coroutine_and_its_clean_up_runs(delivered_to):
    # The kernel hands a process's SIGINT to any of its threads; Python runs the handler in the
    # main thread once that runs Python code again (CI once saw the step run to its end first).
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("SIGINT reaches the main thread only: run this test in it")
    started, cleaned = threading.Event(), threading.Event()
    outcome: list[str] = []

    async def long_step() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
            outcome.append("finished")
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        finally:
            cleaned.set()

    def interrupt() -> None:
        started.wait(10)
        if delivered_to == "process":
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends
        else:
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # as if the kernel chose this thread

    threading.Thread(target=interrupt, daemon=True).start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # (a test runner's worker may ignore it)
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run(long_step())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert cleaned.is_set(), "run() returned before the coroutine's clean-up ran"
    assert outcome == ["cancelled"]
