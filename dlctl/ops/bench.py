# Over ~600 lines (about 690), deliberately: `dlctl bench write` and `bench read` share their
# figures' code (percentiles, targets, the machine's conditions) and the paced writer process
# that both the read benchmark and `bench replication` (bench_lag) drive.
"""``dlctl bench write|read``: throughput and latency of a log on the configured cluster.

What is measured, and how (issue 4):

- **Write throughput**: one ``LogWriter`` (pipelined, batched) is fed with ``submit`` under
  ``wait_writable`` backpressure; a run lasts from its first ``submit`` until ``flush`` returns,
  i.e. until every record of the run is acknowledged by the ack quorum (durable on A agents).
  Figures: acknowledged records/s and MB/s (MB = 10^6 bytes of payload). Runs are repeated on
  the same writer after a warm-up and the **median** run is reported next to every run.
  A sample of records (every ``_ACK_SAMPLE_EVERY``-th) also records submit->ack latency.
- **Synchronous append latency**: ``await append(one record)``, repeated; p50/p99/p999.
- **Catch-up read throughput**: a ``LogReader`` from the start of the log until it has read
  every record the metadata says the log holds (or ``limit``); the clock stops at the last
  record delivered, so the idle wait that tells a reader it caught up is not counted.
- **Tailing end-to-end latency**: a paced writer in a *separate process* (so the reader and
  the writer do not share one interpreter lock, as in a real deployment) appends records
  carrying their send time; a tailing reader in this process records receive time - send
  time. Both clocks are this machine's ``CLOCK_REALTIME`` (``time.time_ns``), so the figure is
  only meaningful with writer and reader on one host, as here.

Nothing in this module prints: progress goes through the ``on_progress`` callbacks, results
are returned as data.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConflictError, DlctlError, NotFoundError, UsageError
from ..inventory import Cluster
from ..meta.records import LogConfig
from ..meta.zk import ZkTls
from ..names import validate_name
from ..session import ClusterSession

MB = 1_000_000
# Every 64th record of a throughput run records its submit->ack time: enough samples for a
# p999 over a run of 100,000 records, few enough that the callbacks do not cost throughput.
_ACK_SAMPLE_EVERY = 64
# The producer yields to the event loop after this many payload bytes. Without it a submit
# loop runs until backpressure (max_pending_bytes, 64 MiB by default) and nothing is sent
# meanwhile: the writer cuts entries, but its send tasks only run when the loop gets control.
# Measured (100 B records, 3 agents): no yield 234k records/s with a p50 ack of ~800 ms; a
# yield every 4, 16, 64 or 256 KiB 300-340k records/s (alike within noise), ack p50 growing
# with the interval (16 KiB: ~6-9 ms, 256 KiB: ~36-48 ms).
_YIELD_EVERY_BYTES = 16 * 1024
# Issue 4's targets: 3 agents, E=W=3, A=2, fsync on, one writer.
TARGET_RECORDS_PER_S_100B = 100_000
TARGET_MB_PER_S_1KIB = 50.0
TARGET_TAIL_P99_MS = 20.0
TARGET_TAIL_RATE = 10_000
TARGET_CONFIG = (3, 3, 2)
STAMP = struct.Struct(">qI")  # a tailing record's send time (ns since the epoch), sequence number
_PACE_TICK = 0.0005  # the paced writer's nominal sleep between bursts

Progress = Callable[[str, int, int | None], None]  # (phase, done, total or None)


def _noop(_phase: str, _done: int, _total: int | None) -> None:
    pass


# -- figures -----------------------------------------------------------------------------------


def _quantile_key(q: float) -> str:
    return "p" + f"{q * 100:g}".replace(".", "")  # 0.5 -> p50, 0.9 -> p90, 0.999 -> p999


def percentiles(samples: Sequence[float], scale: float = 1000.0, quantiles: Sequence[float] = (0.50, 0.99, 0.999)) -> dict[str, Any]:
    """Nearest-rank percentiles (p50/p99/p999 unless ``quantiles`` says otherwise) and max of
    ``samples`` seconds, in ms (``scale``)."""
    keys = [_quantile_key(q) for q in quantiles]
    if not samples:
        return {"samples": 0, **{k: None for k in keys}, "max": None}
    ordered = sorted(samples)
    n = len(ordered)

    def rank(q: float) -> float:
        # Nearest rank: the smallest sample with at least q of the samples at or below it.
        index = max(0, min(n - 1, -(-int(q * n * 1000) // 1000) - 1))
        return round(ordered[index] * scale, 3)

    return {"samples": n, **{k: rank(q) for k, q in zip(keys, quantiles)}, "max": round(ordered[-1] * scale, 3)}


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def machine_conditions() -> dict[str, Any]:
    """What the figures were measured on: they mean little without it."""
    try:
        load = os.getloadavg()
    except OSError:  # pragma: no cover - not on Linux
        load = None
    return {"cpus": os.cpu_count(), "loadavg_1_5_15": " ".join(f"{v:.2f}" for v in load) if load else None}


def _target(figure: str, value: float | None, op: str, goal: float, unit: str, applies: bool, why_not: str = "") -> dict[str, Any]:
    met = None
    if applies and value is not None:
        met = value >= goal if op == ">=" else value <= goal
    return {
        "figure": figure,
        "value": value,
        "target": f"{op} {goal:g} {unit}",
        "met": met,
        "note": "" if applies else why_not,
    }


def _report_head(kind: str, session: ClusterSession, name: str, config: LogConfig, agents: int) -> dict[str, Any]:
    """What every benchmark report starts with: which benchmark, on which log and cluster."""
    return {
        "benchmark": kind,
        "log": name,
        "cluster": session.cluster.name,
        "log_config": {"E": config.ensemble_size, "W": config.write_quorum, "A": config.ack_quorum},
        "agents": agents,
    }


def _config_note(config: LogConfig, agents: int) -> str:
    e, w, a = TARGET_CONFIG
    if (config.ensemble_size, config.write_quorum, config.ack_quorum) == (e, w, a) and agents == e:
        return ""
    return f"issue 4's targets are for {e} agents, E={e} W={w} A={a}; this log is E={config.ensemble_size} W={config.write_quorum} A={config.ack_quorum} on {agents} agent(s)"


# -- log management ----------------------------------------------------------------------------


def prepare_log(session: ClusterSession, name: str, *, create: bool, config: LogConfig) -> tuple[LogConfig, bool]:
    """The log's configuration, creating the log when ``create`` and it is missing.
    Returns (config, created_by_us)."""
    validate_name("log", name)
    try:
        return session.meta.get_log(name).value.config, False
    except NotFoundError:
        if not create:
            raise NotFoundError(
                f"log {name!r} does not exist in cluster {session.cluster.name!r}",
                hint="create it with `dlctl log create`, or pass --create",
            ) from None
    try:
        session.meta.create_log(name, config)
    except ConflictError:  # created meanwhile by someone else: use it, and it is not ours
        return session.meta.get_log(name).value.config, False
    return config, True


def log_exists(session: ClusterSession, name: str) -> bool:
    validate_name("log", name)
    try:
        session.meta.get_log(name)
    except NotFoundError:
        return False
    return True


def delete_created_log(session: ClusterSession, name: str) -> None:
    """Delete a log this benchmark created (never one it found)."""
    session.meta.delete_log(name)


def log_record_count(session: ClusterSession, name: str) -> int:
    return sum(s.value.records for s in session.meta.segments(name))


def available_agents(session: ClusterSession) -> int:
    return len(session.meta.available_nodes())


# -- writing -----------------------------------------------------------------------------------


async def _throughput_run(writer: Any, payload: bytes, records: int | None, seconds: float | None, on_progress: Progress, phase: str) -> dict[str, Any]:
    """One timed run: submit under backpressure until ``records`` or ``seconds``, then flush."""
    submit, wait_writable = writer.submit, writer.wait_writable
    size = len(payload)
    yield_every = max(1, _YIELD_EVERY_BYTES // max(size, 1))
    acks: list[float] = []

    def sample(started: float) -> Callable[[asyncio.Future], None]:
        def done(fut: asyncio.Future) -> None:
            if not fut.cancelled() and fut.exception() is None:
                acks.append(time.perf_counter() - started)

        return done

    count = 0
    progress_every = max(yield_every, 10_000)
    started = time.perf_counter()
    deadline = started + seconds if seconds is not None else None
    while records is None or count < records:
        await wait_writable()
        fut = submit(payload)
        count += 1
        if count % _ACK_SAMPLE_EVERY == 0:
            fut.add_done_callback(sample(time.perf_counter()))
        if count % yield_every == 0:
            await asyncio.sleep(0)
            if deadline is not None and time.perf_counter() >= deadline:
                break
            if count % progress_every < yield_every:
                on_progress(phase, count, records)
    await writer.flush()
    elapsed = time.perf_counter() - started
    on_progress(phase, count, records)
    return {
        "records": count,
        "bytes": count * size,
        "seconds": round(elapsed, 4),
        "records_per_second": round(count / elapsed),
        "mb_per_second": round(count * size / elapsed / MB, 2),
        "ack_latency_ms": percentiles(acks),
    }


async def _sync_latency(writer: Any, payload: bytes, samples: int, warmup: int, on_progress: Progress) -> list[float]:
    for _ in range(warmup):
        await writer.append(payload)
    out = []
    for i in range(samples):
        started = time.perf_counter()
        await writer.append(payload)
        out.append(time.perf_counter() - started)
        if (i + 1) % 100 == 0:
            on_progress("sync append latency", i + 1, samples)
    return out


@dataclass(frozen=True)
class WriteSpec:
    record_size: int = 100
    records: int | None = 300_000  # per run; None with seconds
    seconds: float | None = None  # per run
    runs: int = 3
    warmup_records: int | None = None  # default: a fifth of a run, at least 5,000
    sync_latency_samples: int = 1000
    writer_options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.record_size < 8:
            raise UsageError("--record-size must be at least 8 bytes")
        if (self.records is None) == (self.seconds is None):
            raise UsageError("give --records or --seconds, not both")
        if self.runs < 1:
            raise UsageError("--runs must be at least 1")

    def warmup(self) -> int:
        if self.warmup_records is not None:
            return self.warmup_records
        if self.records is not None:
            return max(5_000, self.records // 5)
        return 20_000


async def bench_write(session: ClusterSession, name: str, spec: WriteSpec, on_progress: Progress = _noop) -> dict[str, Any]:
    from ..log.writer import LogWriter

    config = session.meta.get_log(name).value.config
    agents = available_agents(session)
    payload = os.urandom(spec.record_size)  # random: no layer may get away with compressing it
    pool = await session.pool()
    runs: list[dict[str, Any]] = []
    sync: list[float] = []
    written = 0
    before = log_record_count(session, name)
    writer = await LogWriter.open(session.meta, pool, name, **(spec.writer_options or {}))
    try:
        warm = spec.warmup()
        if warm:
            # Connections, the first segment and the agents' files exist before the clock runs.
            written += (await _throughput_run(writer, payload, warm, None, on_progress, "warm-up"))["records"]
        for i in range(spec.runs):
            runs.append(await _throughput_run(writer, payload, spec.records, spec.seconds, on_progress, f"throughput run {i + 1}/{spec.runs}"))
            written += runs[-1]["records"]
        if spec.sync_latency_samples:
            warm_sync = min(100, spec.sync_latency_samples)
            sync = await _sync_latency(writer, payload, spec.sync_latency_samples, warm_sync, on_progress)
            written += warm_sync + len(sync)
        await writer.flush()
    finally:
        await writer.close()
    rps = _median([r["records_per_second"] for r in runs])
    mbps = _median([r["mb_per_second"] for r in runs])
    median_run = sorted(runs, key=lambda r: r["records_per_second"])[len(runs) // 2]
    note = _config_note(config, agents)
    targets = [
        _target("records/s (100 B records)", round(rps), ">=", TARGET_RECORDS_PER_S_100B, "records/s", spec.record_size == 100 and not note, note or "measured with other than 100-byte records"),
        _target("MB/s (1 KiB records)", mbps, ">=", TARGET_MB_PER_S_1KIB, "MB/s", spec.record_size == 1024 and not note, note or "measured with other than 1 KiB records"),
    ]
    return {
        **_report_head("write", session, name, config, agents),
        "record_size": spec.record_size,
        "runs_count": len(runs),
        "records_written": written,
        "log_records_before": before,
        "log_records_after": log_record_count(session, name),
        "records_per_second": round(rps),
        "mb_per_second": round(mbps, 2),
        "pipelined_ack_latency_ms": median_run["ack_latency_ms"],
        "sync_append_latency_ms": percentiles(sync),
        "runs": [{"run": i + 1, **{k: v for k, v in r.items() if k != "ack_latency_ms"}, "ack_p99_ms": r["ack_latency_ms"]["p99"]} for i, r in enumerate(runs)],
        "targets": targets,
        "conditions": machine_conditions(),
    }


async def prefill(session: ClusterSession, name: str, records: int, record_size: int, on_progress: Progress = _noop) -> dict[str, Any]:
    """Append ``records`` records (pipelined) so that a catch-up read has something to read."""
    from ..log.writer import LogWriter

    pool = await session.pool()
    writer = await LogWriter.open(session.meta, pool, name)
    try:
        run = await _throughput_run(writer, os.urandom(record_size), records, None, on_progress, "prefill")
    finally:
        await writer.close()
    return {k: v for k, v in run.items() if k != "ack_latency_ms"}


# -- reading -----------------------------------------------------------------------------------


async def _catch_up(session: ClusterSession, name: str, expected: int, idle: float, on_progress: Progress, phase: str) -> dict[str, Any]:
    from ..log.reader import LogReader

    pool = await session.pool()
    count = size = 0
    async with LogReader(session.meta, pool, name) as reader:
        started = time.perf_counter()
        last = started
        read_next = reader.read_next
        while count < expected:
            record = await read_next(idle)
            if record is None:
                break  # fewer records than the metadata said: reported, not hidden
            last = time.perf_counter()
            count += 1
            size += len(record.payload)
            if count % 50_000 == 0:
                on_progress(phase, count, expected)
    elapsed = max(last - started, 1e-9)
    on_progress(phase, count, expected)
    return {
        "records": count,
        "bytes": size,
        "seconds": round(elapsed, 4),
        "records_per_second": round(count / elapsed) if count else 0,
        "mb_per_second": round(size / elapsed / MB, 2) if count else 0.0,
    }


async def _paced_writer(
    cluster: Cluster, name: str, record_size: int, rate: int, seconds: float, send: Callable[[dict], None], go: Callable[[], Any],
    *, tag: bytes = b"", ack_times: bool = False,
) -> dict[str, Any]:
    """Own the log, say ready (with the last txid), wait for ``go``, append at ``rate`` records/s
    for ``seconds``; each payload starts with its send time (ns) and a sequence number, then
    ``tag`` (so that readers can tell this run's records from others in the log).
    ``ack_times``: the done event carries every record's acknowledgement time (``time.time_ns``,
    by sequence number; None: not acknowledged), for lags measured from the acknowledgement."""
    from ..log.writer import LogWriter

    loop = asyncio.get_running_loop()
    with ClusterSession(cluster) as session:
        pool = await session.pool()
        writer = await LogWriter.open(session.meta, pool, name)
        try:
            send({"event": "ready", "last_txid": writer.last_txid})
            await loop.run_in_executor(None, go)
            pad = tag + os.urandom(max(0, record_size - STAMP.size - len(tag)))
            pack = STAMP.pack
            sent = 0
            lagged = 0.0
            acks: list[float] = []
            acked_at: dict[int, int] = {}

            def stamp_ack(seq: int) -> Callable[[asyncio.Future], None]:
                def done(fut: asyncio.Future) -> None:
                    if not fut.cancelled() and fut.exception() is None:
                        acked_at[seq] = time.time_ns()

                return done

            def acked(started: float) -> Callable[[asyncio.Future], None]:
                def done(fut: asyncio.Future) -> None:
                    if not fut.cancelled() and fut.exception() is None:
                        acks.append(time.perf_counter() - started)

                return done

            begin = time.perf_counter()
            end = begin + seconds
            while (now := time.perf_counter()) < end:
                # Credit-based pacing: send what the rate allows by now, so the mean rate is
                # exact although every sleep overshoots its tick.
                due = int((now - begin) * rate)
                lagged = max(lagged, (due - sent) / rate)
                while sent < due:
                    await writer.wait_writable()
                    fut = writer.submit(pack(time.time_ns(), sent) + pad)
                    if ack_times:
                        fut.add_done_callback(stamp_ack(sent))
                    if sent % _ACK_SAMPLE_EVERY == 0:
                        # Submit->ack, to tell the writer's and agents' share of the
                        # end-to-end latency from the LAC's way to the reader.
                        fut.add_done_callback(acked(time.perf_counter()))
                    sent += 1
                await asyncio.sleep(_PACE_TICK)
            await writer.flush()
            elapsed = time.perf_counter() - begin
        finally:
            await writer.close()
    done = {
        "event": "done",
        "sent": sent,
        "seconds": round(elapsed, 4),
        "rate": round(sent / elapsed, 1),
        "max_lag_seconds": round(lagged, 4),
        "ack_latency_ms": percentiles(acks),
    }
    if ack_times:
        done["acked_ns"] = [acked_at.get(seq) for seq in range(sent)]
    return done


def _paced_writer_main() -> int:
    """``python -m dlctl.ops.bench paced-writer``: parameters as one JSON line on stdin (file
    paths only, never secrets), then ``go`` on stdin; events as JSON lines on stdout."""
    import json
    import signal
    import sys
    from pathlib import Path

    # Ctrl-C reaches the whole process group; the parent stops this child itself, and a
    # traceback from here would only bury the parent's message.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    params = json.loads(sys.stdin.readline())
    c = params["cluster"]
    zk_tls = c.get("zookeeper_tls")
    cluster = Cluster(
        c["name"], c["zookeeper"], Path(c["secret_file"]) if c["secret_file"] else None, Path(c["zk_auth_file"]) if c["zk_auth_file"] else None,
        tls_dir=Path(c["tls_dir"]) if c.get("tls_dir") else None,
        zookeeper_tls=ZkTls(**{k: Path(v) if v else None for k, v in zk_tls.items()}) if zk_tls else None,
    )

    def send(event: dict) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    def go() -> None:
        if sys.stdin.readline().strip() != "go":
            raise DlctlError("paced writer: the reader went away before it started")

    from ..loop import run

    try:
        send(run(_paced_writer(
            cluster, params["log"], params["record_size"], params["rate"], params["seconds"], send, go,
            tag=bytes.fromhex(params.get("tag", "")), ack_times=params.get("ack_times", False),
        )))
    except Exception as exc:  # noqa: BLE001 - the parent must hear why, not wait for ever
        send({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


class PacedWriterProcess:
    """The paced writer as a child process (``python -m dlctl.ops.bench paced-writer``), always
    reaped: ``close`` ends it by its pid if it has not ended by itself."""

    def __init__(self, session: ClusterSession, name: str, record_size: int, rate: int, seconds: float, *, tag: bytes = b"", ack_times: bool = False) -> None:
        import json
        import subprocess
        import sys

        cluster = session.cluster
        params = {
            "cluster": {
                "name": cluster.name,
                "zookeeper": cluster.zookeeper,
                "secret_file": str(cluster.secret_file) if cluster.secret_file else None,
                "zk_auth_file": str(cluster.zk_auth_file) if cluster.zk_auth_file else None,
                "tls_dir": str(cluster.tls_dir) if cluster.tls_dir else None,
                "zookeeper_tls": cluster.zookeeper_tls.to_dict() if cluster.zookeeper_tls else None,
            },
            "log": name,
            "record_size": record_size,
            "rate": rate,
            "seconds": seconds,
            "tag": tag.hex(),
            "ack_times": ack_times,
        }
        self._json = json
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dlctl.ops.bench", "paced-writer"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(params) + "\n")
        self.proc.stdin.flush()
        self._events: asyncio.Queue[dict] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._reader = self._loop.run_in_executor(None, self._read_events)

    def _read_events(self) -> None:
        # A thread, as the child's stdout is a plain pipe; the events are few (ready, done).
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = self._json.loads(line)
            except ValueError:
                continue
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        self._loop.call_soon_threadsafe(self._events.put_nowait, {"event": "exit"})

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def pending(self) -> bool:
        return not self._events.empty()

    async def event(self, timeout: float) -> dict:
        try:
            event = await asyncio.wait_for(self._events.get(), timeout)
        except TimeoutError:
            raise DlctlError(f"paced writer: no word from it within {timeout:.0f} s") from None
        if event["event"] == "error":
            raise DlctlError(f"paced writer failed: {event['error']}")
        if event["event"] == "exit":
            self.proc.wait()
            assert self.proc.stderr is not None
            tail = self.proc.stderr.read().strip().splitlines()[-5:]
            raise DlctlError(f"paced writer exited with code {self.proc.returncode}" + (": " + " | ".join(tail) if tail else ""))
        return event

    async def close(self) -> None:
        import subprocess

        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # a child still waiting for "go" reads EOF and ends
        except OSError:
            pass
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.proc.wait, 15.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        await asyncio.shield(self._reader)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


async def _tail_latency(session: ClusterSession, name: str, record_size: int, rate: int, seconds: float, warmup: float, on_progress: Progress) -> dict[str, Any]:
    from ..log.reader import LogReader

    writer = PacedWriterProcess(session, name, record_size, rate, seconds + warmup)
    pool = await session.pool()
    latencies: list[float] = []
    received = out_of_order = 0
    ready = await writer.event(60.0)
    async with LogReader(session.meta, pool, name, start_txid=ready["last_txid"] + 1) as reader:
        writer.go()
        measure_from = time.time_ns() + int(warmup * 1e9)
        expected_max = int((seconds + warmup) * rate) + 1
        unpack = STAMP.unpack_from
        done: dict | None = None
        while done is None or received < done["sent"]:
            # Waiting longer once the writer has finished: what is missing then must come
            # soon, and what never comes is reported (records_received < records_written).
            record = await reader.read_next(0.5 if done is None else 5.0)
            if record is None:
                if done is not None:
                    break
                if writer.pending():
                    done = await writer.event(1.0)
                continue
            now = time.time_ns()
            sent_ns, seq = unpack(record.payload)
            if seq != received:
                out_of_order += 1  # a lost, repeated or reordered record: reported, never hidden
            received += 1
            if sent_ns >= measure_from:
                latencies.append((now - sent_ns) / 1e9)
            if received % 10_000 == 0:
                on_progress("tailing reader", received, expected_max)
                if done is None and writer.pending():
                    done = await writer.event(1.0)
        stats = reader.stats
        await writer.close()
    on_progress("tailing reader", received, done["sent"])
    return {
        "rate_asked": rate,
        "rate_achieved": done["rate"],
        "writer_max_lag_seconds": done["max_lag_seconds"],
        "seconds": seconds,
        "warmup_seconds": warmup,
        "records_written": done["sent"],
        "records_received": received,
        "records_out_of_sequence": out_of_order,
        "latency_ms": percentiles(latencies),
        "writer_ack_latency_ms": done["ack_latency_ms"],
        # How the reader learnt of new entries: long polls answered, entries they carried,
        # entries it had to read separately. Requests per entry drive its CPU and wake-ups.
        "reader": {"long_polls": stats.long_polls, "entries": stats.entries_fetched, "entries_from_polls": stats.entries_from_polls},
    }


@dataclass(frozen=True)
class ReadSpec:
    runs: int = 3
    limit: int | None = None  # catch-up: read at most this many records
    idle_timeout: float = 2.0  # catch-up: a reader that gets nothing for this long has caught up
    rate: int = TARGET_TAIL_RATE  # tailing: records/s; 0 skips the tailing measurement
    tail_seconds: float = 5.0
    tail_warmup: float = 1.0
    record_size: int = 100  # of the tailing writer's records

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise UsageError("--runs must be at least 1")
        if self.record_size < 12:
            raise UsageError("--record-size must be at least 12 bytes (a send time and a sequence number)")
        if self.rate < 0 or self.tail_seconds <= 0 or self.tail_warmup < 0:
            raise UsageError("--rate must be >= 0, --tail-seconds > 0 and --tail-warmup >= 0")


async def bench_read(session: ClusterSession, name: str, spec: ReadSpec, on_progress: Progress = _noop) -> dict[str, Any]:
    config = session.meta.get_log(name).value.config
    agents = available_agents(session)
    in_log = log_record_count(session, name)
    expected = in_log if spec.limit is None else min(in_log, spec.limit)
    runs: list[dict[str, Any]] = []
    if expected:
        for i in range(spec.runs):
            runs.append(await _catch_up(session, name, expected, spec.idle_timeout, on_progress, f"catch-up read {i + 1}/{spec.runs}"))
    tail = None
    if spec.rate:
        tail = await _tail_latency(session, name, spec.record_size, spec.rate, spec.tail_seconds, spec.tail_warmup, on_progress)
    note = _config_note(config, agents)
    p99 = tail["latency_ms"]["p99"] if tail else None
    applies = bool(tail) and spec.rate >= TARGET_TAIL_RATE and not note
    why = note or f"measured at {spec.rate} records/s; the target is at {TARGET_TAIL_RATE}"
    return {
        **_report_head("read", session, name, config, agents),
        "log_records": in_log,
        "records_expected": expected,
        "records_read": runs[len(runs) // 2]["records"] if runs else 0,
        "catch_up_records_per_second": round(_median([r["records_per_second"] for r in runs])) if runs else None,
        "catch_up_mb_per_second": round(_median([r["mb_per_second"] for r in runs]), 2) if runs else None,
        # Flat, so that the table shows them as lines of their own.
        "tail_rate_asked": tail["rate_asked"] if tail else None,
        "tail_rate_achieved": tail["rate_achieved"] if tail else None,
        "tail_writer_max_lag_seconds": tail["writer_max_lag_seconds"] if tail else None,
        "tail_seconds": tail["seconds"] if tail else None,
        "tail_records_written": tail["records_written"] if tail else None,
        "tail_records_received": tail["records_received"] if tail else None,
        "tail_records_out_of_sequence": tail["records_out_of_sequence"] if tail else None,
        "tail_latency_ms": tail["latency_ms"] if tail else None,
        # The paced writer's submit->ack share of it (sampled; warm-up included).
        "tail_writer_ack_latency_ms": tail["writer_ack_latency_ms"] if tail else None,
        "tail_reader_requests": tail["reader"] if tail else None,
        "runs": [{"run": i + 1, **r} for i, r in enumerate(runs)],
        "targets": [_target(f"tailing p99 ms at {spec.rate} records/s", p99, "<=", TARGET_TAIL_P99_MS, "ms", applies, why)] if tail else [],
        "conditions": machine_conditions(),
    }


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["paced-writer"]:
        sys.exit("usage: python -m dlctl.ops.bench paced-writer  (used by `dlctl bench read` and `dlctl bench replication`)")
    sys.exit(_paced_writer_main())
