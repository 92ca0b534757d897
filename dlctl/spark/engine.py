"""The Spark side of a bootstrap: one SparkContext, stages of one task per item, live results.

* **Where it runs.** ``local[N]`` by default (N = ``parallelism``, or every core): the driver
  JVM and the executors run here, started by PySpark. ``master`` (``--spark-master``) submits
  the same stages to a real cluster; the dlctl package is then zipped and shipped to the
  executors with ``addPyFile`` (its dependencies — kazoo is not needed there, ``crc32c`` is —
  must be installed on the executors).
* **Secrets.** See ``credentials``: the cluster secret and the operator's TLS files (for a
  cluster that runs TLS) go as file paths in local mode, as broadcasts (refused unless Spark
  authentication and encryption are on) on a cluster. Never in argv or the conf.
* **Noise.** Unless ``verbose``, the JVM's stdout and stderr (Spark's log4j output, its console
  progress bar, Python workers' stderr) go to a log file whose path ``log_path`` names, and
  log4j is set to WARN; the user's terminal shows only dlctl's own progress and messages.
* **Live results.** Each task adds its result to an accumulator; Spark merges accumulator
  updates into the driver as each task *finishes*, so a monitor thread sees results while the
  stage runs (the driver records verified copies at once — an interrupted job loses at most a
  moment's worth) and feeds progress from ``SparkContext.statusTracker()``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DlctlError, Interrupted, RefusedError, UsageError
from ..log.tls import TlsFiles
from ..secrets import read_secret_file
from .credentials import SecretRef, TlsRef, secret_file_ref, secret_like, secure_spark_conf_problems, tls_files_ref

log = logging.getLogger(__name__)

_LOG4J = """\
rootLogger.level = {level}
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
"""


# The driver JVM only schedules tasks and relays their small results (the data goes from agent
# to agent through the Python workers), yet by default it spends more CPU than a copy task
# in its first seconds: the C2 JIT compiling and parallel GC threads. C1 only and the serial
# collector measured 7.5 -> 4.4 CPU seconds and 5.7 -> 4.0 s for start + first stage + stop
# on two cores (tests/benchmarks/profile_bootstrap.py). Replaced, not appended to, when the
# user sets spark.driver.extraJavaOptions.
DRIVER_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"

# A stop still finishing in the background (see ``SparkEngine.stop``); a new start waits for it.
_stopping: threading.Thread | None = None

# SparkContexts this process started: what an operation that shares one context across its
# logs reports (``dlctl.spark.engines``), so "started once" is observable, not assumed.
_contexts_started = 0


def contexts_started() -> int:
    """How many SparkContexts this process has started so far."""
    return _contexts_started


@dataclass(frozen=True)
class EngineOptions:
    master: str | None = None  # None: local[parallelism or *]
    parallelism: int | None = None
    conf: Mapping[str, str] = field(default_factory=dict)
    verbose: int = 0
    log_dir: Path | None = None
    app_name: str = "dlctl-bootstrap"
    relay: bool = False  # copy through the tasks even where sink agents could pull (dlctl.spark.segment_pull)

    @property
    def effective_master(self) -> str:
        if self.master:
            return self.master
        return f"local[{self.parallelism}]" if self.parallelism else "local[*]"

    @property
    def local(self) -> bool:
        return self.effective_master.startswith("local")


def parse_conf(pairs: Iterable[str]) -> dict[str, str]:
    """``k=v`` strings from ``--conf``; secret-bearing keys are refused (they would sit in argv)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key.startswith("spark."):
            raise UsageError(f"--conf {pair!r}: expected spark.KEY=VALUE")
        if secret_like(key):
            raise RefusedError(
                f"--conf {key}: a secret must not be passed on the command line (it would show in ps and shell history)",
                hint="put it in $SPARK_CONF_DIR/spark-defaults.conf (mode 0600) instead",
            )
        out[key] = value
    return out


@dataclass
class StageProgress:
    """What a progress display needs, refreshed a few times a second while a stage runs."""

    description: str
    tasks: int
    completed: int = 0
    active: int = 0
    failed: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.bytes_done / elapsed if elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        rate = self.rate
        return (self.bytes_total - self.bytes_done) / rate if rate > 0 else None


class SparkEngine:
    """One SparkContext for the life of a bootstrap (``with SparkEngine(options) as engine``),
    or of an operation's several bootstraps (``dlctl.spark.engines.Engines`` shares one).
    ``start`` may run on a background thread: nothing in it touches this process's stdout or
    stderr (see ``_launch``)."""

    kind = "spark"

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.sc: Any = None
        self.log_path: Path | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="dlctl-spark-"))
        self._broadcasts: list[Any] = []

    # -- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> SparkEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        global _contexts_started
        if _stopping is not None:
            _stopping.join()  # one SparkContext per process: the previous one must be gone
        try:
            from pyspark import SparkConf, SparkContext
        except ImportError:
            raise DlctlError("pyspark is not installed; the bootstrap copy runs on Spark", hint="pip install 'dlctl[spark]'") from None
        opts = self.options
        conf_values = dict(opts.conf)
        if not opts.local:
            problems = secure_spark_conf_problems(conf_values)
            if problems:
                raise RefusedError(
                    f"refusing to send the cluster secrets and TLS keys to Spark at {opts.master} without authentication and encryption ({', '.join(problems)} missing)",
                    hint="pass --conf " + " --conf ".join(problems) + " and set spark.authenticate.secret in spark-defaults.conf (see README: Bootstrap)",
                )
        self.log_path = _log_dir(opts.log_dir) / f"{opts.app_name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
        level = "warn" if opts.verbose < 2 else "info"
        log4j = self._tmp / "log4j2.properties"
        log4j.write_text(_LOG4J.format(level=level))
        java_opts = f"-Dlog4j2.configurationFile=file:{log4j}"
        if "spark.driver.extraJavaOptions" not in conf_values:
            java_opts += " " + DRIVER_JVM_OPTIONS
        conf = SparkConf().setMaster(opts.effective_master).setAppName(opts.app_name)
        conf.set("spark.ui.enabled", "false")  # no web UI port per job (sandboxes run several)
        conf.set("spark.ui.showConsoleProgress", "false")  # dlctl draws its own progress
        conf.set("spark.speculation", "false")  # two attempts must never write the same sink segment at once
        conf.set("spark.driver.extraJavaOptions", (conf_values.pop("spark.driver.extraJavaOptions", "") + " " + java_opts).strip())
        if opts.local:
            # Local mode talks to itself only: keep the driver on loopback, not on whatever
            # address the host name resolves to.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            conf.set("spark.driver.host", "127.0.0.1")
            conf.set("spark.driver.bindAddress", "127.0.0.1")
            conf.set("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        elif conf_values.get("spark.pyspark.python"):
            # A SparkContext made from Python names the executors' interpreter from
            # $PYSPARK_PYTHON only (else "python3") and ignores this setting, which the Spark
            # docs promise for driver and executors: honour it, or tasks would run in a Python
            # without dlctl's dependencies (crc32c).
            os.environ["PYSPARK_PYTHON"] = conf_values["spark.pyspark.python"]
        for key, value in conf_values.items():
            conf.set(key, value)
        quiet = opts.verbose < 1
        self.sc = self._launch(SparkContext, conf, quiet)
        _contexts_started += 1
        self.sc.setLogLevel("WARN" if opts.verbose < 2 else "INFO")
        if not opts.local:
            self.sc.addPyFile(str(self._package_zip()))
        log.info("Spark %s started (master %s); its log: %s", self.sc.version, opts.effective_master, self.log_path)

    def _launch(self, factory: Any, conf: Any, quiet: bool, launch_gateway: Callable[..., Any] | None = None) -> Any:
        """Start the SparkContext with the JVM's stdout/stderr on the log file: stdout stays data
        only, stderr stays dlctl's own. The JVM (and the Python workers it forks) get the file
        as their own descriptors at launch (``popen_kwargs``); this process's descriptors are
        never swapped, so a start on a background thread cannot swallow what the main thread
        prints meanwhile. PySpark launches the JVM once per process and keeps it for the next
        contexts, whose output follows the first one's."""
        if not quiet:
            return factory(conf=conf)
        assert self.log_path is not None
        if launch_gateway is None:
            from pyspark.java_gateway import launch_gateway
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            gateway = None if getattr(factory, "_gateway", None) else launch_gateway(conf, popen_kwargs={"stdout": fd, "stderr": fd})
            return factory(conf=conf, gateway=gateway)
        except Exception as exc:
            raise DlctlError(f"Spark did not start: {exc}", hint=f"see {self.log_path}") from exc
        finally:
            os.close(fd)

    def _package_zip(self) -> Path:
        """The dlctl package as a zip for executors of a real cluster."""
        import dlctl

        root = Path(dlctl.__file__).resolve().parent
        out = self._tmp / "dlctl.zip"
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(root.rglob("*.py")):
                z.write(path, Path("dlctl") / path.relative_to(root))
        return out

    def stop(self) -> None:
        if self.sc is not None:
            for b in self._broadcasts:
                try:
                    b.destroy()
                except Exception:  # noqa: BLE001 - best effort: the context goes next
                    pass
            sc, self.sc = self.sc, None
            _stop(sc, self._tmp)
        else:
            shutil.rmtree(self._tmp, ignore_errors=True)

    @property
    def slots(self) -> int:
        """Tasks Spark runs at once: ``local[N]``'s N, else the cluster's default parallelism."""
        try:
            return max(1, int(self.sc.defaultParallelism))
        except Exception:  # noqa: BLE001 - no context: one
            return 1

    # -- secrets ------------------------------------------------------------------------------

    def secret(self, path: Path | None, label: str) -> SecretRef:
        if self.options.local or path is None:
            return secret_file_ref(path, label)
        broadcast = self.sc.broadcast(read_secret_file(path))
        self._broadcasts.append(broadcast)
        return SecretRef(broadcast=broadcast, label=label)

    def tls(self, files: TlsFiles | None, label: str) -> TlsRef | None:
        """The operator's TLS files for executors (``ClusterSession.tls``); None: plaintext."""
        if files is None or self.options.local:
            return tls_files_ref(files, label)
        files.client()  # fail here, clearly (a missing file, a key readable by others), not in every task
        # The gate in ``start`` already refused a cluster without Spark authentication and encryption.
        broadcast = self.sc.broadcast(tuple(path.read_bytes() for path in files.paths))
        self._broadcasts.append(broadcast)
        return TlsRef(broadcast=broadcast, label=label)

    # -- stages -------------------------------------------------------------------------------

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
        """Run ``fn`` over ``items``, one Spark task each; ``fn`` returns a list of results (a
        task may cover several segments). Returns every result, in item order.

        ``on_result`` sees each result as its task finishes (from a monitor thread);
        ``on_progress`` gets a ``StageProgress`` a few times a second."""
        if not items:
            return []
        from pyspark.accumulators import AccumulatorParam

        class _Collect(AccumulatorParam):
            def zero(self, value: list) -> list:
                return []

            def addInPlace(self, a: list, b: list) -> list:
                a.extend(b)
                return a

        sc = self.sc
        acc = sc.accumulator([], _Collect())

        group = f"dlctl-{description.replace(' ', '-')}-{time.monotonic_ns()}"
        progress = StageProgress(description, len(items), bytes_total=sum(weight(i) for i in items))
        progress.tasks = sum(count(i) for i in items)
        seen: set[int] = set()
        done = threading.Event()
        lock = threading.Lock()

        def deliver(results: list[dict]) -> None:
            with lock:
                for r in results:
                    key = (r["_index"], r["_position"])
                    if key in seen:
                        continue
                    seen.add(key)
                    progress.bytes_done += result_bytes(r)
                    if on_result is not None:
                        on_result(r)

        def monitor() -> None:
            tracker = sc.statusTracker()
            while not done.wait(0.25):
                try:
                    deliver(list(acc.value))
                    completed = active = failed = 0
                    for job_id in tracker.getJobIdsForGroup(group):
                        job = tracker.getJobInfo(job_id)
                        for stage_id in job.stageIds if job else ():
                            stage = tracker.getStageInfo(stage_id)
                            if stage is not None:
                                completed += stage.numCompletedTasks
                                active += stage.numActiveTasks
                                failed += stage.numFailedTasks
                    progress.active, progress.failed = active, failed
                    with lock:
                        progress.completed = len(seen)
                    if on_progress is not None:
                        on_progress(progress)
                except Exception:  # noqa: BLE001 - a progress glitch must not stop the copy
                    log.debug("progress monitor", exc_info=True)

        indexed = [(i, item) for i, item in enumerate(items)]

        def run_pair(pair: tuple[int, Any]) -> list[dict]:
            index, item = pair
            results = [dict(r, _index=index, _position=i) for i, r in enumerate(fn(item))]
            acc.add(results)
            return results

        watcher = threading.Thread(target=monitor, name="dlctl-spark-progress", daemon=True)
        sc.setJobGroup(group, description, interruptOnCancel=True)
        watcher.start()
        try:
            results = sc.parallelize(indexed, len(indexed)).flatMap(run_pair).collect()
        except KeyboardInterrupt:
            sc.cancelJobGroup(group)
            raise Interrupted(f"{description}: interrupted", hint="re-run the same command: verified copies are kept") from None
        except Exception as exc:  # noqa: BLE001 - py4j errors: say what the task said
            raise DlctlError(f"{description}: the Spark job failed: {_python_error(exc)}", hint=f"Spark's log: {self.log_path}") from None
        finally:
            done.set()
            watcher.join()
        deliver(results)
        progress.completed = len(seen)
        if on_progress is not None:
            on_progress(progress)
        results.sort(key=lambda r: (r["_index"], r["_position"]))
        for r in results:
            r.pop("_index", None)
            r.pop("_position", None)
        return results


def _log_dir(chosen: Path | None) -> Path:
    """Where Spark's log goes: the directory the caller chose, or a new private one (mkdtemp:
    0700, a random name). Never a fixed name in the shared temp directory: another local user
    could create it first (or a symlink by that name) and read, or redirect, every log."""
    if chosen is not None:
        chosen.mkdir(parents=True, exist_ok=True, mode=0o700)
        return chosen
    return Path(tempfile.mkdtemp(prefix="dlctl-spark-log-"))


def _stop(sc: Any, tmp: Path) -> None:
    """Stop the JVM side now and let PySpark finish its own side in the background.

    ``SparkContext.stop`` ends by shutting down PySpark's accumulator server, whose handler
    only looks at its shutdown flag once a second: a wait of up to a second (no work) at the
    end of every job. The JVM's context is stopped here (no task runs after this returns);
    the rest completes on a thread that the next ``start`` in this process joins first, and
    removes ``tmp`` (the engine's log4j settings and package zip, read at start)."""
    global _stopping
    jsc = getattr(sc, "_jsc", None)
    if jsc is not None:
        try:
            jsc.stop()
            sc._jsc = None  # stopped: sc.stop() below does only the Python side
        except Exception:  # noqa: BLE001 - sc.stop() below tries again and warns, as before
            log.debug("stopping the Spark context", exc_info=True)
    def finish() -> None:
        try:
            sc.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    thread = threading.Thread(target=finish, name="dlctl-spark-stop")
    thread.start()
    _stopping = thread


def _python_error(exc: BaseException) -> str:
    """The Python exception a Spark task died of, from a Py4J error's text."""
    text = str(exc)
    lines = [line for line in text.splitlines() if line and not line.startswith("\tat ") and not line.startswith("\t...")]
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^[A-Za-z_.]+(Error|Exception|Failed)\b.*:", lines[i]) and not lines[i].startswith(("org.", "py4j.", "java.")):
            return lines[i][:500]
    return (lines[0] if lines else type(exc).__name__)[:500]


__all__ = ["EngineOptions", "SparkEngine", "StageProgress", "contexts_started", "parse_conf"]
