"""A real Spark standalone cluster for tests: one master and one worker on loopback, started
from the jars inside the installed pyspark wheel, with Spark authentication and network
encryption on (the secret in a 0600 properties file, never in argv).

``SparkStandalone.start()`` returns once the master's JSON UI lists an ALIVE worker;
``applications()`` reads what the master says about running and completed applications.
``client_conf_dir()`` writes a ``spark-defaults.conf`` (0600) for drivers: the same secret and
security settings, for ``SPARK_CONF_DIR`` of a ``dlctl bootstrap --spark-master`` run.
Executors keep their scratch files under ``local_dir``.
"""

from __future__ import annotations

import json
import os
import secrets
import urllib.request
from pathlib import Path
from typing import Any

import pyspark

from dlctl.sandbox.zookeeper import java_executable

from .procs import ManagedProcess, ProcessRegistry, free_port, wait_until

START_TIMEOUT = 90.0  # two cold JVMs on a busy 2-core machine

SPARK_HOME = Path(pyspark.__file__).resolve().parent

# What master, worker and driver must agree on for secrets to travel authenticated and encrypted.
SECURITY_SETTINGS = {
    "spark.authenticate": "true",
    "spark.network.crypto.enabled": "true",
    "spark.io.encryption.enabled": "true",
}


def _write_private(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return path


def _scala_version() -> str:
    """The Scala version the wheel's Spark was built with (``spark-core_<scala>-<spark>.jar``)."""
    for jar in (SPARK_HOME / "jars").glob("spark-core_*.jar"):
        return jar.name.split("_", 1)[1].split("-", 1)[0]
    raise RuntimeError(f"no spark-core jar in {SPARK_HOME / 'jars'}")


def _properties(values: dict[str, str]) -> str:
    return "".join(f"{k} {v}\n" for k, v in values.items())


class SparkStandalone:
    """``spark://127.0.0.1:<port>`` with one worker of ``cores`` cores and ``memory`` of memory."""

    def __init__(
        self,
        workdir: Path,
        registry: ProcessRegistry,
        *,
        cores: int = 2,
        memory: str = "1g",
    ) -> None:
        self.workdir = workdir
        self.registry = registry
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.webui_port = free_port()
        self.worker_webui_port = free_port()
        self.secret = secrets.token_hex(32)
        self.master: ManagedProcess | None = None
        self.worker: ManagedProcess | None = None

    @property
    def local_dir(self) -> Path:
        return self.workdir / "local"

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def json_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}/json/"

    def _server_properties(self) -> Path:
        return _write_private(
            self.workdir / "spark-server.properties",
            _properties(
                {**SECURITY_SETTINGS, "spark.authenticate.secret": self.secret}
            ),
        )

    def client_conf_dir(self) -> Path:
        """A ``SPARK_CONF_DIR`` whose 0600 ``spark-defaults.conf`` holds the secret for drivers."""
        conf_dir = self.workdir / "client-conf"
        conf_dir.mkdir(mode=0o700, exist_ok=True)
        _write_private(
            conf_dir / "spark-defaults.conf",
            _properties({"spark.authenticate.secret": self.secret}),
        )
        return conf_dir

    def _env(self) -> dict[str, str]:
        return {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            # The worker builds each executor's classpath with Spark's launcher, which asks for
            # the Scala version when it is not told and finds no build directories in a wheel.
            "SPARK_SCALA_VERSION": _scala_version(),
            "SPARK_LOG_DIR": str(self.workdir / "logs"),
            "SPARK_WORKER_DIR": str(self.workdir / "work"),
            # Executors' scratch (block manager dirs, SPARK_LOCAL_DIRS of their Python workers)
            # under the workdir: the worker deletes an application's part when it finishes.
            "SPARK_LOCAL_DIRS": str(self.local_dir),
        }

    def _java(self, main: str, *args: str) -> list[str]:
        java = java_executable()
        if java is None:
            raise RuntimeError(
                "java is not installed: apt-get install -y openjdk-17-jre-headless"
            )
        return [
            java,
            "-Xmx512m",
            "-Djava.net.preferIPv4Stack=true",
            "-cp",
            f"{SPARK_HOME / 'jars'}/*",
            main,
            *args,
        ]

    def start(self, timeout: float = START_TIMEOUT) -> SparkStandalone:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "work").mkdir(exist_ok=True)
        self.local_dir.mkdir(exist_ok=True)
        props = self._server_properties()
        self.master = self.registry.start(
            self._java(
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.webui_port),
                "--properties-file",
                str(props),
            ),
            name="spark-master",
            env=self._env(),
        )
        wait_until(
            lambda: self.state() is not None,
            timeout,
            message=f"Spark master's JSON UI at {self.json_url}",
            watch=self.master,
        )
        self.worker = self.registry.start(
            self._java(
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--webui-port",
                str(self.worker_webui_port),
                "--work-dir",
                str(self.workdir / "work"),
                "--properties-file",
                str(props),
                self.url,
            ),
            name="spark-worker",
            env=self._env(),
        )
        wait_until(
            lambda: any(
                w.get("state") == "ALIVE"
                for w in (self.state() or {}).get("workers", [])
            ),
            timeout,
            message=f"an ALIVE worker registered with the Spark master at {self.url}",
            watch=[self.master, self.worker],
        )
        return self

    def state(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, active and completed apps), None if it does not answer."""
        try:
            with urllib.request.urlopen(self.json_url, timeout=2) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return None

    def applications(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(active, completed) applications as the master lists them."""
        state = self.state() or {}
        return list(state.get("activeapps", [])), list(state.get("completedapps", []))

    def stop(self) -> None:
        for proc in (self.worker, self.master):
            if proc is not None:
                proc.terminate()
