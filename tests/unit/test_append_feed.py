"""`log append`'s feed (dlctl.ops.logio._feed): what a failure part-way says about the records
already in the log. A scripted sink stands for the producer: it acknowledges the first records
and fails the rest, as a producer does when every agent is lost mid-append."""

from __future__ import annotations

import asyncio
import io
import struct

import pytest

from dlctl.errors import DlctlError, ExitCode, UsageError
from dlctl.log.dlsn import DLSN
from dlctl.log.errors import AgentUnavailableError
from dlctl.ops.logio import AppendIncomplete, _feed, iter_stdin_records


class ScriptedSink:
    """Acknowledges the first ``ack`` records, fails the others with ``AgentUnavailableError``
    (when they are flushed: as a producer settles them); rejects payloads over ``limit``."""

    def __init__(self, ack: int, limit: int = 1000, failure: Exception | None = None) -> None:
        self.ack, self.limit = ack, limit
        self.failure = failure or AgentUnavailableError("every agent of the log is out of reach")
        self.futures: list[asyncio.Future] = []

    async def wait_writable(self) -> None:
        await asyncio.sleep(0)

    def submit(self, payload: bytes) -> asyncio.Future:
        if len(payload) > self.limit:
            raise ValueError(f"record of {len(payload)} bytes exceeds the {self.limit}-byte request limit")
        future = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future

    async def flush(self) -> DLSN | None:
        for i, future in enumerate(self.futures):
            if not future.done():
                if i < self.ack:
                    future.set_result(DLSN(1, i, 0))
                else:
                    future.set_exception(self.failure)
        await asyncio.sleep(0)  # the done callbacks run
        for future in self.futures:
            if future.exception() is not None:
                raise future.exception()
        return self.futures[-1].result() if self.futures else None


async def arriving(records: list[bytes]):
    for record in records:
        yield record


def feed(sink: ScriptedSink, records: list[bytes]):
    return asyncio.run(_feed(sink, arriving(records), None))


def test_a_failure_after_acknowledgements_says_how_many_are_in_the_log_and_exits_partial():
    with pytest.raises(AppendIncomplete) as failed:
        feed(ScriptedSink(ack=3), [b"r%d" % i for i in range(5)])
    assert failed.value.exit_code == ExitCode.PARTIAL
    assert "3 of the 5 record(s) read were appended from DLSN 1/0/0" in failed.value.message
    assert "every agent of the log is out of reach" in failed.value.message
    assert "may or may not be in the log" in (failed.value.hint or "")


def test_a_failure_part_way_keeps_the_hint_of_its_cause():
    """A switchover froze the log mid-append: what to do about the rest (write at the new
    primary) comes from the refusal itself."""
    refused = DlctlError("log 'orders' in cluster 'east' is read-only", hint="writes moved to another cluster; write there")
    with pytest.raises(AppendIncomplete) as failed:
        feed(ScriptedSink(ack=2, failure=refused), [b"r%d" % i for i in range(4)])
    assert failed.value.hint.startswith("writes moved to another cluster; write there; the others may or may not be in the log")


async def breaking_off(records: list[bytes]):
    for record in records:
        yield record
    raise UsageError("standard input: truncated length prefix at byte 99")


def test_input_that_breaks_off_settles_the_records_before_it_and_says_they_were_appended():
    """A truncated last record: the two before it were submitted, then in the log once the
    producer closed, while the command said "nothing was changed" (exit 2)."""
    sink = ScriptedSink(ack=10)
    with pytest.raises(AppendIncomplete) as failed:
        asyncio.run(_feed(sink, breaking_off([b"r1", b"r2"]), None))
    assert failed.value.exit_code == ExitCode.PARTIAL and all(f.done() and not f.exception() for f in sink.futures)
    assert "record 3 of standard input cannot be appended: standard input: truncated length prefix at byte 99" in failed.value.message
    assert "the 2 record(s) before it were appended from DLSN 1/0/0" in failed.value.message
    with pytest.raises(UsageError, match="nothing was appended"):
        asyncio.run(_feed(ScriptedSink(ack=10), breaking_off([]), None))


def test_a_length_prefix_larger_than_any_record_is_refused_before_reading_it():
    class Counting(io.BytesIO):
        def read(self, size=-1):
            assert size is None or size <= 1 << 24, f"asked to read {size} bytes"
            return super().read(size)

    stream = Counting(struct.pack(">I", 3) + b"abc" + struct.pack(">I", 0xFFFFFFFF) + b"x" * 10)
    records = iter_stdin_records(stream, length_delimited=True)
    assert next(records) == b"abc"
    with pytest.raises(UsageError, match=r"record at byte 7 claims 4294967295 bytes, more than any record holds"):
        next(records)


def test_a_failure_before_any_acknowledgement_is_raised_as_it_is():
    with pytest.raises(AgentUnavailableError):
        feed(ScriptedSink(ack=0), [b"r0", b"r1"])


def test_a_record_too_large_stops_the_feed_after_settling_the_ones_before_it():
    sink = ScriptedSink(ack=10, limit=4)
    with pytest.raises(AppendIncomplete) as failed:
        feed(sink, [b"r1", b"r2", b"too large", b"r4"])
    assert len(sink.futures) == 2 and all(f.done() and f.exception() is None for f in sink.futures)  # r4 never submitted
    assert "record 3 of standard input cannot be appended" in failed.value.message
    assert "the 2 record(s) before it were appended" in failed.value.message and "tail -n +3" in (failed.value.hint or "")
    with pytest.raises(UsageError, match="record 1 of standard input cannot be appended.*nothing was appended"):
        feed(ScriptedSink(ack=10, limit=4), [b"too large"])


def test_every_record_acknowledged_returns_the_counts():
    count, size, first, last = feed(ScriptedSink(ack=3), [b"a", b"bb", b"ccc"])
    assert (count, size, first, last) == (3, 6, DLSN(1, 0, 0), DLSN(1, 2, 0))


def test_an_interrupt_says_how_many_records_were_acknowledged_so_far(caplog):
    class Stalled(ScriptedSink):
        """Acknowledges the first ``ack`` records; the rest never settle (the operator presses Ctrl-C)."""

        def __init__(self, ack: int) -> None:
            super().__init__(ack)
            self.flushing = asyncio.Event()

        async def flush(self) -> DLSN | None:
            for i, future in enumerate(self.futures[: self.ack]):
                future.set_result(DLSN(1, i, 0))
            self.flushing.set()
            await asyncio.Event().wait()
            return None

    async def interrupted() -> None:
        sink = Stalled(ack=2)
        task = asyncio.ensure_future(_feed(sink, arriving([b"a", b"b", b"c"]), None))
        await sink.flushing.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level("WARNING", logger="dlctl.ops.logio"):
        asyncio.run(interrupted())
    assert "log append interrupted: 2 of the 3 record(s) read were acknowledged so far" in caplog.text
