"""Which engine runs a bootstrap's copy, and one Spark context shared by an operation's copies.

A Spark start (a context on a JVM, then its stop) costs seconds of two cores whatever the
size of the copy. So:

* **Small copies run in-process** (``dlctl.spark.local``): below ``local_below`` bytes to copy,
  the same tasks run on a thread pool here, with the same verification and job records.
  ``DEFAULT_LOCAL_BELOW`` is where the benchmark (``tests/benchmarks/bench_bootstrap.py
  --local``) showed Spark stop losing. An explicit Spark master always means Spark.
* **One context per operation**: ``Engines`` belongs to an operation (``dlctl bootstrap``, an
  ``init-replication`` or a ``dr recover`` with copies of several logs); every copy that needs
  Spark gets the same ``SparkEngine``, started at most once, and ``close`` stops it at the end
  of the operation, however it ends.
* **Started early**: ``prestart`` begins the start on a background thread as soon as the
  operation knows a copy will need Spark, so it overlaps the operation's other work (planning,
  pins, reservations, other steps); the copy waits for it only when it needs it.
"""

from __future__ import annotations

import logging
import threading
from typing import Union

from .engine import EngineOptions, SparkEngine, contexts_started
from .local import LocalEngine

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# Below this many bytes to copy, a copy runs in-process. Measured on the 2-core sandbox VM
# (bench_bootstrap.py --gib 1 --segments 100 --sink-w 1 3 --parallelism 2, one run, session 17):
# Spark's fixed cost 1.7 s (2.8 s with the JVM launch every `dlctl` run pays). Where Spark's
# start is paid back: relayed copies above 2.2 GiB (W=1) / 1.9 GiB (W=3); copies the sink agents
# pull (dlctl.spark.segment_pull), where the copying process only steers and verifies, above
# 9.8 / 6.0 GiB. The default is the smaller of those, so neither route loses to Spark below it;
# the thread pool's one interpreter lock matters little once the agents do the copying.
DEFAULT_LOCAL_BELOW = 2048 * MIB

Engine = Union[LocalEngine, SparkEngine]


class Engines:
    """The engines of one operation (a context manager: ``close`` stops Spark if it started)."""

    def __init__(self, options: EngineOptions | None = None, *, local_below: int = DEFAULT_LOCAL_BELOW) -> None:
        if local_below < 0:
            raise ValueError("local_below must be at least 0")
        self.options = options or EngineOptions()
        self.local_below = local_below
        self._lock = threading.Lock()
        self._spark: SparkEngine | None = None
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._contexts_before = contexts_started()

    def __enter__(self) -> Engines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def spark_starts(self) -> int:
        """Spark contexts this process started since the operation began (observable: one for
        an operation whose copies share a context, however many logs it copies)."""
        return contexts_started() - self._contexts_before

    @property
    def spark_log(self) -> str | None:
        return str(self._spark.log_path) if self._spark is not None and self._spark.log_path else None

    def needs_spark(self, nbytes: int) -> bool:
        """Whether a copy of ``nbytes`` runs on Spark: an explicit master, or not small."""
        return self.options.master is not None or nbytes >= self.local_below

    def for_copy(self, nbytes: int, *, sink_agents: int = 0) -> Engine:
        """The engine for a copy of ``nbytes`` to a cluster of ``sink_agents`` available agents:
        the shared Spark context (started now, or the one a ``prestart`` is starting), or a fresh
        in-process engine (whose default parallelism follows the agents that pull, unless relaying)."""
        if self.needs_spark(nbytes):
            return self.spark()
        return LocalEngine(self.options.parallelism, pulling_agents=0 if self.options.relay else sink_agents)

    def prestart(self) -> None:
        """Begin starting Spark on a background thread, unless it is started or starting."""
        with self._lock:
            if self._spark is not None or self._starting is not None:
                return
            engine = SparkEngine(self.options)
            self._starting = threading.Thread(target=self._start, args=(engine,), name="dlctl-spark-start", daemon=True)
            self._starting.start()

    def _start(self, engine: SparkEngine) -> None:
        try:
            engine.start()
        except BaseException as exc:  # noqa: BLE001 - handed to the copy that waits for it
            engine.stop()  # its scratch directory
            self._start_error = exc
            return
        self._spark = engine

    def spark(self) -> SparkEngine:
        """The shared Spark engine, started (waits for a start under way; raises its error)."""
        self.prestart()
        starting = self._starting
        if starting is not None:
            starting.join()
        with self._lock:
            self._starting = None
            error, self._start_error = self._start_error, None
        if error is not None:
            raise error  # the next copy that needs Spark tries again
        assert self._spark is not None
        return self._spark

    def close(self) -> None:
        """Stop Spark if it was started (waiting for a start under way first)."""
        starting = self._starting
        if starting is not None:
            starting.join()
        with self._lock:
            engine, self._spark, self._starting, self._start_error = self._spark, None, None, None
        if engine is not None:
            engine.stop()


__all__ = ["DEFAULT_LOCAL_BELOW", "Engine", "Engines"]
