"""Records from a blocking source (standard input) handed to a coroutine as they arrive.

`log append` reads stdin; read on the event loop, a read that waits for the next line blocks the
loop, so nothing else runs meanwhile: the producer's batch timer never fires and a record already
read waits for the next line (or the end of the input) to be sent — `tail -f app.log | dlctl log
append` appended nothing until the pipe closed — and a Ctrl-C cannot cancel the append. Here a
thread of its own reads, and the coroutine takes the records as they come, with at most
``max_bytes`` read ahead of it (back-pressure on the producer of the input).
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator, Iterable

_END = object()
RECORD_OVERHEAD = 64  # bytes counted per record on top of its own: empty lines are bounded too


async def records_from_thread(records: Iterable[bytes], *, max_bytes: int = 8 * 1024 * 1024, name: str = "dlctl-input") -> AsyncIterator[bytes]:
    """Iterate ``records`` (blocking) on a daemon thread; yield each record here as soon as it
    is read. An exception of the iterator is raised here, after the records before it. Leaving
    the iteration early stops the thread at its next record (one blocked in a read stays so;
    being a daemon, it never holds the process up)."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    queue: collections.deque = collections.deque()  # append and popleft are atomic: no lock per record
    room = threading.Event()  # set by the consumer when it took something: the reader may go on
    # Each counter has one writer (the reader thread, the consumer), so neither needs a lock.
    read_bytes = taken_bytes = 0
    waiting = False  # the consumer is (about to be) asleep
    stop = False  # the consumer left
    failure: list[BaseException] = []

    def wake() -> None:
        try:
            loop.call_soon_threadsafe(ready.set)
        except RuntimeError:  # the loop closed: nobody is waiting any more
            pass

    def put(item: object) -> None:
        nonlocal waiting
        queue.append(item)
        if waiting:  # read after the append: a consumer that checked the queue before it is woken
            waiting = False
            wake()

    def pump() -> None:
        nonlocal read_bytes
        try:
            for record in records:
                while read_bytes - taken_bytes >= max_bytes and not stop:
                    room.clear()
                    if read_bytes - taken_bytes >= max_bytes:
                        room.wait(0.1)
                if stop:
                    return
                read_bytes += len(record) + RECORD_OVERHEAD
                put(record)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            failure.append(exc)
        finally:
            put(_END)

    threading.Thread(target=pump, name=name, daemon=True).start()
    try:
        while True:
            if not queue:
                waiting = True  # set before the second look: an append after it wakes us
                if not queue:
                    await ready.wait()
                ready.clear()
                waiting = False
                continue
            item = queue.popleft()
            if item is _END:
                if failure:
                    raise failure[0]
                return
            taken_bytes += len(item) + RECORD_OVERHEAD
            if not room.is_set():  # the reader cleared it: it is waiting for room (Event.set takes a lock)
                room.set()
            yield item
    finally:
        stop = True
        room.set()


__all__ = ["records_from_thread"]
