"""The Spark engine's scratch and log directories (issue 19): private (0700), made by mkdtemp,
never a fixed name in the shared temp directory that another local user could create first.

The engine is started with its SparkContext factory replaced (no JVM): what is checked is the
directories and files the engine itself makes before and around the launch.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from dlctl.spark.engine import EngineOptions, SparkEngine  # noqa: E402


class FakeContext:
    version = "fake"

    def __init__(self, conf=None) -> None:
        self.conf = conf

    def setLogLevel(self, level: str) -> None:  # noqa: N802 - PySpark's name
        pass

    def stop(self) -> None:
        pass


@pytest.fixture
def quiet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # start() sets these for local mode; recorded here so they are restored after the test.
    for name, value in (("SPARK_LOCAL_IP", "127.0.0.1"), ("PYSPARK_PYTHON", sys.executable), ("PYSPARK_DRIVER_PYTHON", sys.executable)):
        monkeypatch.setenv(name, value)


@pytest.fixture
def engines(quiet_env) -> Iterator[list[SparkEngine]]:
    made: list[SparkEngine] = []
    yield made
    for engine in made:
        engine.stop()
        if engine.log_path is not None:
            shutil.rmtree(engine.log_path.parent, ignore_errors=True)


def started(engines: list[SparkEngine], monkeypatch: pytest.MonkeyPatch, **options) -> SparkEngine:
    engine = SparkEngine(EngineOptions(**options))
    engines.append(engine)
    monkeypatch.setattr(engine, "_launch", lambda factory, conf, quiet: FakeContext(conf))
    engine.start()
    return engine


def private_dir(path: Path) -> bool:
    st = path.lstat()
    return stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()


def test_scratch_and_log_directories_are_private_and_new_for_every_engine(engines, monkeypatch):
    old = os.umask(0o022)  # the usual default: a directory made without a mode would be 0755
    try:
        first = started(engines, monkeypatch)
        second = started(engines, monkeypatch)
    finally:
        os.umask(old)
    for engine in (first, second):
        assert private_dir(engine._tmp), engine._tmp
        assert engine.log_path is not None and private_dir(engine.log_path.parent), engine.log_path
        assert engine.log_path.parent.parent == Path(tempfile.gettempdir())
    assert first.log_path.parent != second.log_path.parent and first._tmp != second._tmp
    # The name the log directory used to have, the same for every run of a user: gone.
    assert first.log_path.parent.name != f"dlctl-spark-{os.getuid()}"


def test_a_directory_planted_under_the_old_fixed_name_is_not_used(engines, monkeypatch):
    planted = Path(tempfile.gettempdir()) / f"dlctl-spark-{os.getuid()}"
    created = not planted.exists()
    if created:
        planted.mkdir()
        os.chmod(planted, 0o777)  # as another local user would leave it, to read the logs
    try:
        engine = started(engines, monkeypatch)
        assert engine.log_path is not None and planted not in engine.log_path.parents
    finally:
        if created:
            shutil.rmtree(planted, ignore_errors=True)


def test_the_spark_log_file_is_0600(engines, monkeypatch):
    engine = started(engines, monkeypatch)
    old = os.umask(0)
    try:
        # The real launch with a fake JVM and context: the JVM's stdout/stderr go to the log
        # file, as its own descriptors (this process's stay as they are).
        def launch_gateway(conf, popen_kwargs):
            os.write(popen_kwargs["stdout"], b"jvm noise\n")
            os.write(popen_kwargs["stderr"], b"jvm errors\n")
            return "gateway"

        def factory(conf, gateway):
            assert gateway == "gateway"
            return FakeContext(conf)

        SparkEngine._launch(engine, factory, None, True, launch_gateway)
    finally:
        os.umask(old)
    assert engine.log_path is not None
    assert stat.S_IMODE(engine.log_path.stat().st_mode) == 0o600
    assert b"jvm noise\njvm errors\n" in engine.log_path.read_bytes()
