"""``dlctl bootstrap --spark-master`` on a real Spark standalone cluster: a master and a worker
started from the pyspark wheel's jars on loopback, with Spark authentication, network and I/O
encryption on (the shared secret in 0600 properties files, never in argv), and the two-cluster
sandbox of ``test_bootstrap`` (real ZooKeeper, six real agents).

The copy must reach the sink record for record with its origin, and must have run on the
standalone cluster's executors (the master lists the application as finished).
"""

from __future__ import annotations

import json
import sys

import pytest
from harness.procs import wait_until
from harness.spark import SECURITY_SETTINGS, SparkStandalone
from test_bootstrap import (  # noqa: F401 - sandbox is a fixture
    SINK,
    SOURCE,
    assert_sink_holds_source,
    bootstrap,
    create_source_log,
    records_of,
    sandbox,
    sink_segments,
)

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.spark, pytest.mark.slow]


def test_bootstrap_on_a_standalone_spark_cluster_copies_every_record_in_order_with_its_origin(
    sandbox,  # noqa: F811 - the fixture imported from test_bootstrap
    procs,
    tmp_path,
):
    spark = SparkStandalone(tmp_path / "spark", procs, cores=2, memory="1g").start()
    name = "cluster-copy"
    create_source_log(sandbox, name, segments=4, per_segment=25, size=200)

    # The driver's half of the shared secret: spark.authenticate.secret in a 0600
    # spark-defaults.conf, read by the JVM that PySpark launches; the rest goes by --conf.
    env = {
        **sandbox,
        "SPARK_CONF_DIR": str(spark.client_conf_dir()),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    conf = [
        f"{k}={v}"
        for k, v in {
            **SECURITY_SETTINGS,
            "spark.pyspark.python": sys.executable,
            "spark.executor.memory": "512m",
        }.items()
    ]
    result = bootstrap(
        env,
        name,
        "--spark-master",
        spark.url,
        *(a for c in conf for a in ("--conf", c)),
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert spark.secret not in result.stdout + result.stderr

    report = json.loads(result.stdout)
    (logres,) = report["logs"]
    assert logres["segments"] == 4 and logres["copied"] == 4 and logres["committed"]
    assert_sink_holds_source(
        records_of(sandbox, SOURCE, name), records_of(sandbox, SINK, name)
    )
    assert all(s.state.value == "completed" for s in sink_segments(sandbox, name))

    # It ran on the standalone cluster: the master saw the driver's application, and it is over.
    def listed_completed():
        active, completed = spark.applications()
        return (
            (active, completed)
            if any(app["name"] == "dlctl-bootstrap" for app in completed)
            else None
        )

    active, completed = wait_until(
        listed_completed,
        30,
        message="the master to list the bootstrap's application as completed",
        watch=[spark.master],
    )
    apps = [app for app in completed if app["name"] == "dlctl-bootstrap"]
    assert len(apps) == 1 and apps[0]["state"] == "FINISHED", apps
    assert not [app for app in active if app["name"] == "dlctl-bootstrap"]
    assert f"Asked to launch executor {apps[0]['id']}/" in spark.worker.output(), (
        "no executor of the job ran on the worker"
    )
    # The shared secret stayed in the 0600 files: not in the argv the master and worker logged
    # (executor launch commands included), nor in what they or the driver wrote.
    for proc in procs:
        assert spark.secret not in proc.output(), (
            f"the Spark secret leaked into {proc.describe()}"
        )
    with open(report["spark_log"], errors="replace") as driver_log:
        assert spark.secret not in driver_log.read()
