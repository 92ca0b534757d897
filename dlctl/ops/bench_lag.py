"""The measurement of ``dlctl bench replication``: replication lag of one log, source -> sink,
next to a tailing reader at the source in the same run (``dlctl.ops.bench_replication`` sets
the log and its stream up and takes them down).

How (the method of ``tests/benchmarks/bench_replication.py``, against real clusters):

1. **Prime**: one record is appended at the source and a tailing reader at the sink waits for
   it (``deliver_timeout``). Only then is the stream known to deliver — a worker holds the log
   and reaches the source — so a stream that is still starting (or never will) is not timed.
2. **Run**: the paced writer of ``dlctl.ops.bench`` (a child process, so the readers do not
   share its interpreter lock) appends ``rate`` records/s for ``warmup + seconds``; each
   record carries its sequence number and this run's random tag, and the writer notes when
   each one was acknowledged by the source's ack quorum. Two tailing readers here — one at
   the sink, one at the source — note when each record becomes visible to them.
3. **Figures**: per record sent after the warm-up, *lag* = visible at the sink - acknowledged
   at the source, and *baseline* = visible at the source - acknowledged at the source. Every
   time is ``time.time_ns`` on this host, so no clock skew between the clusters enters; this
   host's network distance to each cluster does (see ``dlctl bench replication --help``).

Records of this run are told from any other record in the log by their tag: on an existing
log, an application's records (or a backlog the sink is still applying) are skipped.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import TimeoutExpired
from ..log.pool import AgentPool
from ..replication import positions
from ..replication.store import StreamStore
from ..session import ClusterSession
from .bench import STAMP, PacedWriterProcess, Progress, machine_conditions, percentiles

TAG_BYTES = 8
MIN_RECORD_SIZE = STAMP.size + TAG_BYTES  # send time, sequence number, run tag
PRIME_SEQ = 2**32 - 1  # the prime record's sequence number: never one of the run's
QUANTILES = (0.50, 0.90, 0.99)
# How often the readers report progress, and how long one read waits before the loop looks
# at the writer again.
_PROGRESS_EVERY = 1000
_READ_WAIT = 0.5


@dataclass(frozen=True)
class LagSpec:
    rate: int = 1000  # records/s
    seconds: float = 10.0  # measured
    warmup: float = 1.0  # written first, not measured
    record_size: int = 100
    # How long the sink may stay silent: for the prime record, and after the writer finished.
    deliver_timeout: float = 60.0


# -- figures (pure) ------------------------------------------------------------------------------


def lag_samples(acked_ns: Sequence[int | None], seen_ns: dict[int, int], first: int) -> list[float]:
    """Seconds from acknowledgement to visibility of records ``first``.. that were both
    acknowledged (``acked_ns[seq]`` not None) and seen (``seen_ns[seq]``)."""
    out = []
    for seq in range(first, len(acked_ns)):
        acked, seen = acked_ns[seq], seen_ns.get(seq)
        if acked is not None and seen is not None:
            out.append((seen - acked) / 1e9)
    return out


def difference(lag: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float | None]:
    """Each percentile of ``lag`` minus the same of ``baseline`` (ms): what replication adds
    to what a reader at the source sees."""
    keys = [k for k in lag if k != "samples"]
    return {k: round(lag[k] - baseline[k], 3) if lag[k] is not None and baseline.get(k) is not None else None for k in keys}


def first_measured(rate: int, warmup: float) -> int:
    """The sequence number of the first record that counts: the paced writer sends ``rate``
    records per second from its start (credit-based), so the warm-up is its first records."""
    return int(rate * warmup)


# -- reading ---------------------------------------------------------------------------------------


class _Tail:
    """A tailing reader's view of this run's records: when each became visible."""

    def __init__(self, where: str, tag: bytes) -> None:
        self.where, self.tag = where, tag
        self.seen_ns: dict[int, int] = {}
        self.repeated = 0  # seen twice: the stream must deliver each record once
        self.foreign = 0  # records of the log that are not this run's

    def take(self, payload: bytes, now: int) -> int | None:
        """The record's sequence number when it is this run's (noting when it was seen)."""
        if payload[STAMP.size : STAMP.size + TAG_BYTES] != self.tag:
            self.foreign += 1
            return None
        _, seq = STAMP.unpack_from(payload)
        if seq == PRIME_SEQ:
            return seq  # the stream's proof of life, not one of the run's records
        if seq in self.seen_ns:
            self.repeated += 1
        else:
            self.seen_ns[seq] = now
        return seq


async def _follow(reader: Any, tail: _Tail, total: Callable[[], int | None], expected: int, idle: float, on_progress: Progress) -> None:
    """Read until every record the writer sent was seen, or — once the writer finished — nothing
    of this run came for ``idle`` seconds (the rest is reported missing, never waited for)."""
    loop = asyncio.get_running_loop()
    last = loop.time()  # when the last record of this run came
    phase = f"records seen at the {tail.where}"
    while True:
        sent = total()
        if sent is not None and (len(tail.seen_ns) >= sent or loop.time() - last > idle):
            on_progress(phase, len(tail.seen_ns), sent)
            return
        record = await reader.read_next(_READ_WAIT)
        if record is None:
            continue
        seq = tail.take(record.payload, time.time_ns())
        if seq is None or seq == PRIME_SEQ:
            continue
        last = loop.time()
        if len(tail.seen_ns) % _PROGRESS_EVERY == 0:
            on_progress(phase, len(tail.seen_ns), sent or expected)


def _stream_condition(sink: ClusterSession, stream_id: str, log: str) -> str:
    """What the sink's metadata says about the stream's log: state, worker, last error."""
    streams = StreamStore(sink.meta)
    try:
        state = streams.get_state(stream_id).value.state.value
        claim = streams.claims(stream_id).get(log)
        checkpoint = streams.get_checkpoint(stream_id, log).value
    except Exception as exc:  # noqa: BLE001 - this only colours an error message
        return f"its state could not be read ({exc})"
    parts = [f"state {state}", f"worker {claim['node']}" if claim else "no worker holds the log"]
    if checkpoint.last_error:
        parts.append(f"last error: {checkpoint.last_error}")
    return ", ".join(parts)


async def _prime(source: ClusterSession, sink_reader: Any, sink_tail: _Tail, source_pool: AgentPool, log: str, spec: LagSpec, describe: Callable[[], str]) -> float:
    """Append one record at the source and wait until the sink's reader sees it; seconds taken."""
    from ..log.writer import LogWriter

    payload = STAMP.pack(time.time_ns(), PRIME_SEQ) + sink_tail.tag + os.urandom(max(0, spec.record_size - MIN_RECORD_SIZE))
    writer = await LogWriter.open(source.meta, source_pool, log)
    try:
        await writer.append(payload)
    finally:
        await writer.close()
    started = time.monotonic()
    deadline = started + spec.deliver_timeout
    while (left := deadline - time.monotonic()) > 0:
        record = await sink_reader.read_next(min(left, _READ_WAIT))
        if record is not None and sink_tail.take(record.payload, time.time_ns()) == PRIME_SEQ:
            return time.monotonic() - started
    raise TimeoutExpired(
        f"the stream delivered nothing to the sink within {spec.deliver_timeout:g}s: {describe()}",
        hint="see `dlctl replication status`; the sink's agents must reach the source (its ZooKeeper and agents) and hold its credentials (init-replication installs them); a slow start needs a longer --deliver-timeout",
    )


async def measure(source: ClusterSession, sink: ClusterSession, log: str, stream_id: str, spec: LagSpec, on_progress: Progress) -> dict[str, Any]:
    """Lag of ``log`` from ``source`` to ``sink`` over ``stream_id`` and the source baseline."""
    from ..log.reader import LogReader

    tag = os.urandom(TAG_BYTES)
    sink_tail, source_tail = _Tail("sink", tag), _Tail("source", tag)
    source_pool, sink_pool = await source.pool(), await sink.pool()
    writer: PacedWriterProcess | None = None
    try:
        # At the sink's end: what the stream applied before this run is not this run's.
        sink_start = (await positions.log_end(sink.meta, sink_pool, log)).next
        async with LogReader(sink.meta, sink_pool, log, start_dlsn=sink_start) as sink_reader:
            on_progress("waiting for the stream to deliver", 0, 1)
            first_delivery = await _prime(source, sink_reader, sink_tail, source_pool, log, spec, lambda: f"stream {stream_id}: " + _stream_condition(sink, stream_id, log))
            on_progress("waiting for the stream to deliver", 1, 1)
            writer = PacedWriterProcess(source, log, spec.record_size, spec.rate, spec.warmup + spec.seconds, tag=tag, ack_times=True)
            ready = await writer.event(60.0)
            async with LogReader(source.meta, source_pool, log, start_txid=ready["last_txid"] + 1) as source_reader:
                writer.go()
                done = asyncio.ensure_future(writer.event(spec.warmup + spec.seconds + 120.0))

                def total() -> int | None:
                    return done.result()["sent"] if done.done() and not done.exception() else None

                expected = int((spec.warmup + spec.seconds) * spec.rate)
                followers = [
                    asyncio.ensure_future(_follow(sink_reader, sink_tail, total, expected, spec.deliver_timeout, on_progress)),
                    asyncio.ensure_future(_follow(source_reader, source_tail, total, expected, spec.deliver_timeout, on_progress)),
                ]
                try:
                    # The writer's failure ends the run at once; the readers end by themselves.
                    finished = await done
                    await asyncio.gather(*followers)
                finally:
                    for task in (done, *followers):
                        task.cancel()
    finally:
        if writer is not None:
            await writer.close()
    return figures(spec, finished, sink_tail, source_tail, first_delivery)


def figures(spec: LagSpec, done: dict[str, Any], sink: _Tail, source: _Tail, first_delivery: float) -> dict[str, Any]:
    acked = done["acked_ns"]
    first = first_measured(spec.rate, spec.warmup)
    lag = percentiles(lag_samples(acked, sink.seen_ns, first), quantiles=QUANTILES)
    baseline = percentiles(lag_samples(acked, source.seen_ns, first), quantiles=QUANTILES)
    sent = done["sent"]
    return {
        "rate_asked": spec.rate,
        "rate_achieved": done["rate"],
        "writer_max_lag_seconds": done["max_lag_seconds"],
        "seconds": spec.seconds,
        "warmup_seconds": spec.warmup,
        "record_size": spec.record_size,
        "records_written": sent,
        "records_acknowledged": sum(1 for a in acked if a is not None),
        "records_seen_at_sink": sum(1 for seq in sink.seen_ns if seq < sent),
        "records_seen_at_source": sum(1 for seq in source.seen_ns if seq < sent),
        "records_missing_at_sink": sum(1 for seq in range(sent) if seq not in sink.seen_ns),
        "records_repeated_at_sink": sink.repeated,
        "other_records_at_sink": sink.foreign,
        "first_delivery_seconds": round(first_delivery, 3),
        # visible at the sink - acknowledged at the source, per record after the warm-up
        "lag_ms": lag,
        # visible at the source - acknowledged at the source: the same reader without replication
        "baseline_ms": baseline,
        "lag_minus_baseline_ms": difference(lag, baseline),
        "writer_ack_latency_ms": done["ack_latency_ms"],
        "conditions": machine_conditions(),
    }
