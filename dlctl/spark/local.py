"""The in-process engine: a bootstrap's stages run here, on a thread pool, instead of on Spark.

For a small copy Spark's fixed cost (launching the JVM, starting and stopping a context: a few
seconds of two cores) is most of the job. This engine runs the very task functions Spark's
executors run (``task.copy_segments``, ``task.scan_clocks``) over the very items (the same
batches of segments), and hands their results to the driver the same way — each as its item
finishes, to ``on_result``, which records verified copies in the job record at once — so the
verification (content digests on both sides, every sink replica's DIGEST) and the resumable
progress are exactly the Spark path's. Only where the tasks run differs.

The pool has ``slots`` threads, each running one item at a time on its own event loop. They
share this process's interpreter lock (the C re-encoding loops hold it; CRC-32C of large
buffers releases it), where Spark runs each task in a worker process of its own: past some
size Spark's parallelism pays its start back. ``Engines.local_below`` is set from where
``tests/benchmarks/bench_bootstrap.py`` shows that happen.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from ..errors import DlctlError, Interrupted
from ..log.tls import TlsFiles
from .credentials import SecretRef, TlsRef, secret_file_ref, tls_files_ref
from .engine import StageProgress

log = logging.getLogger(__name__)


# Pulls kept running per sink agent by default. A pull is a pipeline with waits in it (reads
# from the source, its own previous batch's fdatasync): a second pull on the same agent fills
# them. Measured (bench_bootstrap.py --gib 1 --engine local --route pull, 3 sink agents on the
# 2-core sandbox, session 18): parallelism 2 / 6 / 12 copied 329 / 475 / 490 MiB/s at W=1 and
# 185 / 211 / 221 MiB/s at W=3; relayed copies were no slower at 6 or 12 than at 2.
PULLS_PER_SINK_AGENT = 2
# However many sink agents: each slot is a thread with an event loop and connections of its own.
MAX_DEFAULT_SLOTS = 32


def default_slots(sink_agents: int = 0) -> int:
    """Tasks to run at once when the operator did not say: one per core (the copy runs here),
    and when the sink agents pull the segments (the slots here only steer and wait) at least
    ``PULLS_PER_SINK_AGENT`` per sink agent, up to ``MAX_DEFAULT_SLOTS``."""
    cores = os.cpu_count() or 1
    return max(cores, min(MAX_DEFAULT_SLOTS, PULLS_PER_SINK_AGENT * sink_agents))


class LocalEngine:
    """``SparkEngine``'s interface (``secret``, ``tls``, ``run``, ``slots``), without Spark."""

    kind = "local"
    log_path: Path | None = None  # no Spark, no Spark log

    def __init__(self, parallelism: int | None = None, *, pulling_agents: int = 0) -> None:
        """``pulling_agents``: the sink agents that will pull the segments (0: the copy is relayed here)."""
        self.slots = max(1, parallelism or default_slots(pulling_agents))

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def secret(self, path: Path | None, label: str) -> SecretRef:
        return secret_file_ref(path, label)

    def tls(self, files: TlsFiles | None, label: str) -> TlsRef | None:
        return tls_files_ref(files, label)

    def run(
        self,
        fn: Callable[[Any], list[dict]],
        items: list[Any],
        *,
        description: str,
        weight: Callable[[Any], int] = lambda _i: 0,
        count: Callable[[Any], int] = lambda _i: 1,
        result_bytes: Callable[[dict], int] = lambda _r: 0,
        on_result: Callable[[dict], None] | None = None,
        on_progress: Callable[[StageProgress], None] | None = None,
    ) -> list[dict]:
        """Run ``fn`` over ``items`` on ``slots`` threads; every result, in item order. As
        ``SparkEngine.run``: ``on_result`` sees each result as its item finishes, ``on_progress``
        gets a ``StageProgress`` (here after every item, and at least every quarter second)."""
        if not items:
            return []
        progress = StageProgress(description, sum(count(i) for i in items), bytes_total=sum(weight(i) for i in items))
        results: dict[int, list[dict]] = {}
        lock = threading.Lock()

        def report() -> None:
            if on_progress is not None:
                try:
                    on_progress(progress)
                except Exception:  # noqa: BLE001 - a progress glitch must not stop the copy
                    log.debug("progress callback", exc_info=True)

        pool = ThreadPoolExecutor(max_workers=min(self.slots, len(items)), thread_name_prefix="dlctl-copy")
        futures: dict[Future, int] = {pool.submit(fn, item): index for index, item in enumerate(items)}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                progress.active = min(self.slots, len(pending))
                for future in done:
                    got = future.result()  # fn reports per-segment failures in its results; a raise is a bug or a lost secret
                    with lock:
                        results[futures[future]] = got
                        progress.completed += len(got)
                        progress.bytes_done += sum(result_bytes(r) for r in got)
                    if on_result is not None:
                        for r in got:
                            on_result(r)
                report()
        except KeyboardInterrupt:
            pool.shutdown(wait=True, cancel_futures=True)  # the running items finish their segments; nothing new starts
            raise Interrupted(f"{description}: interrupted", hint="re-run the same command: verified copies are kept") from None
        except DlctlError:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        except Exception as exc:  # noqa: BLE001 - say what the task said, as the Spark path does
            pool.shutdown(wait=True, cancel_futures=True)
            raise DlctlError(f"{description}: a copy task failed: {type(exc).__name__}: {exc}") from exc
        pool.shutdown(wait=True)
        return [r for index in sorted(results) for r in results[index]]


__all__ = ["MAX_DEFAULT_SLOTS", "PULLS_PER_SINK_AGENT", "LocalEngine", "default_slots"]
