"""When the reader of stdout goes away (`dlctl log read x | head`): exit 141 in silence, told
apart from a broken connection, which stays an error; and how a stream of items is flushed
(FlushWhenIdle). The integration side (real processes, real pipes) is in
tests/integration/test_cli_recover.py."""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import threading

import click
import pytest

from dlctl.cli.closed_output import DlctlGroup, ForeignBrokenPipe, OutputClosed, stdout_reader_gone, watch_stdout_reader
from dlctl.output import FlushWhenIdle


@pytest.fixture
def stdout_pipe(monkeypatch):
    """Puts sys.stdout on a real pipe when called (in the test itself: pytest's capture sets
    sys.stdout back between a fixture's setup and the test); returns a function that closes
    the pipe's reading end."""
    ends: dict[str, int] = {}
    files = []

    def use() -> None:
        ends["reading"], writing = os.pipe()
        files.append(open(writing, "w"))  # noqa: SIM115 - closed below
        monkeypatch.setattr(sys, "stdout", files[-1])

    def close_reader() -> None:
        os.close(ends.pop("reading"))

    yield use, close_reader
    for f in files:
        f.close()
    if "reading" in ends:
        os.close(ends["reading"])


def group_raising_broken_pipe() -> click.Group:
    group = DlctlGroup("g")

    @group.command("boom")
    def boom() -> None:
        raise BrokenPipeError(errno.EPIPE, "a connection")

    return group


def test_stdout_reader_gone_only_when_nobody_reads_the_pipe(stdout_pipe, monkeypatch):
    use, close_reader = stdout_pipe
    use()
    assert not stdout_reader_gone()
    close_reader()
    assert stdout_reader_gone()
    monkeypatch.setattr(sys, "stdout", object())  # no file descriptor (an embedding, a capture)
    assert not stdout_reader_gone()


def test_a_broken_pipe_is_output_closed_only_when_stdout_is_the_broken_one(stdout_pipe):
    use, close_reader = stdout_pipe
    use()
    with pytest.raises(ForeignBrokenPipe) as foreign:
        group_raising_broken_pipe().main(["boom"], standalone_mode=False)
    assert isinstance(foreign.value.__cause__, BrokenPipeError)
    close_reader()
    with pytest.raises(OutputClosed):
        group_raising_broken_pipe().main(["boom"], standalone_mode=False)


class CountingStream:
    def __init__(self, fail: bool = False) -> None:
        self.flushes = 0
        self.fail = fail

    def flush(self) -> None:
        self.flushes += 1
        if self.fail:
            raise BrokenPipeError(errno.EPIPE, "stdout")


def test_items_written_without_waiting_are_flushed_once_when_the_writer_waits():
    stream = CountingStream()

    async def write() -> list[int]:
        out = FlushWhenIdle(stream)  # type: ignore[arg-type]
        for _ in range(1000):
            out.wrote()
        seen = [stream.flushes]
        await asyncio.sleep(0)  # the writer waits (for its next record)
        seen.append(stream.flushes)
        out.wrote()
        await asyncio.sleep(0)
        seen.append(stream.flushes)
        out.close()
        return [*seen, stream.flushes]

    assert asyncio.run(write()) == [0, 1, 2, 3]


def test_a_failed_flush_stops_a_writer_that_waits_and_is_what_it_raises():
    stream = CountingStream(fail=True)

    async def tail() -> None:
        out = FlushWhenIdle(stream)  # type: ignore[arg-type]
        out.wrote()
        try:
            await asyncio.sleep(3600)  # a tail waiting for a record that does not come
        except asyncio.CancelledError:
            out.raise_failure()
            raise

    with pytest.raises(BrokenPipeError):
        asyncio.run(asyncio.wait_for(tail(), 30))
    assert stream.flushes == 1


def test_the_watcher_calls_back_once_the_reader_goes_and_not_after_it_is_stopped(stdout_pipe, tmp_path, monkeypatch):
    use, close_reader = stdout_pipe
    use()
    gone = threading.Event()
    seen: list[BaseException] = []
    stop = watch_stdout_reader(lambda exc: (seen.append(exc), gone.set()))
    assert not gone.wait(0.2)  # the reader is there
    close_reader()
    assert gone.wait(10) and isinstance(seen[0], BrokenPipeError)
    stop()  # after the watcher ended: harmless

    use()  # a new pipe, watched, then stopped before its reader goes
    called = threading.Event()
    watch_stdout_reader(lambda exc: called.set())()
    close_reader()
    assert not called.wait(0.3)

    with open(tmp_path / "out", "w") as file:  # a file has no reader to lose: nothing to watch
        monkeypatch.setattr(sys, "stdout", file)
        before = threading.active_count()
        stop = watch_stdout_reader(lambda exc: None)
        assert threading.active_count() == before, "no watcher thread for a file"
        stop()
