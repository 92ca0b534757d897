"""The agents' metrics as an operator's Prometheus sees them (issue 22): a real Prometheus
server scrapes real agents of two clusters with a replication stream, from the targets `dlctl
cluster metrics-targets` writes, loads the repository's alert rules and answers every query of
the repository's Grafana dashboard; a SIGKILLed agent raises DlagentDown. The alert rules also
pass their own promtool unit tests, and a wrong expectation fails them (the negative check)."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.agents import harness_credentials
from harness.logcluster import run
from harness.procs import ProcessRegistry, free_port, tcp_connectable, wait_until
from harness.twoclusters import Sites, run_cli, sites_for_test

from dlctl.log.pool import AgentPool
from dlctl.log.producer import LogProducer
from dlctl.meta.records import LogConfig
from dlctl.metrics.scrape import fetch

pytestmark = [pytest.mark.zk, pytest.mark.agent]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "dlctl-agents.json"
LOG = "ledger"


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (Debian package prometheus; .ci/run installs it)"
    return path


def test_the_alert_rules_pass_their_unit_tests_and_a_wrong_expectation_fails_them(tmp_path: Path):
    check = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    ok = subprocess.run([tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=RULES.parent, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # Negative check: DlagentDown expected before its `for` has passed must fail the test.
    shutil.copy(RULES, tmp_path / "alerts.yml")
    wrong = (RULES.parent / "alerts_test.yml").read_text().replace("- eval_time: 2m\n        alertname: DlagentDown\n        exp_alerts: []", "- eval_time: 3m\n        alertname: DlagentDown\n        exp_alerts: []", 1)
    (tmp_path / "alerts_test.yml").write_text(wrong)
    bad = subprocess.run([tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode != 0 and "DlagentDown" in bad.stdout + bad.stderr, bad.stdout + bad.stderr


@pytest.fixture
def two(zk_server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sites]:
    yield from sites_for_test(zk_server, tmp_path, request, clusters=("a", "b"), nodes=2)


class Prometheus:
    def __init__(self, procs: ProcessRegistry, base: Path, targets: list[Path]) -> None:
        self.port = free_port("127.0.0.1")
        base.mkdir(parents=True, exist_ok=True)
        config = base / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "dlagent", "file_sd_configs": [{"files": [str(t) for t in targets], "refresh_interval": "1s"}]}],
        }))
        self.proc = procs.start(
            [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={base / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            name="prometheus",
        )
        wait_until(self.ready, 60, message="prometheus ready (/-/ready)", watch=self.proc)

    def ready(self) -> bool:
        if not tcp_connectable("127.0.0.1", self.port):
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as answer:
                return answer.status == 200
        except urllib.error.HTTPError:  # 503 while it loads its rules and storage
            return False

    def api(self, path: str, **params: str) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:  # a bad query: 400 with the reason
            return json.loads(exc.read())

    def query(self, expr: str) -> list[dict]:
        answer = self.api("query", query=expr)
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]


async def append(meta, count: int, until: threading.Event | None = None) -> None:
    """``count`` records, or (``until``) records until the event is set."""
    pool = AgentPool(meta, harness_credentials())
    producer = LogProducer(meta, pool, LOG)
    try:
        i = 0
        while (i < count) if until is None else not until.is_set():
            await producer.submit(f"r{i}".encode())
            i += 1
    finally:
        await producer.close()
        await pool.close()


def dashboard_queries() -> list[str]:
    """Every query of the dashboard, its Grafana variables given values Prometheus accepts."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    return [e.replace("$__rate_interval", "1m").replace("$cluster", ".*").replace("$node", ".*") for e in exprs]


def test_prometheus_scrapes_every_agent_answers_the_dashboard_and_raises_the_alert_for_a_killed_agent(two: Sites, tmp_path: Path):
    a = two["a"]
    inventory = two.write_inventory(tmp_path / "inventory.toml", default="a")
    a.meta().create_log(LOG, LogConfig(ensemble_size=2, write_quorum=2, ack_quorum=2))
    code, _, err = run_cli(inventory, "init-replication", "--source", "a", "--sink", "b", "--logs", LOG)
    assert code == 0, err
    targets = []
    for name in ("a", "b"):
        code, groups, err = run_cli(inventory, "--cluster", name, "-o", "json", "cluster", "metrics-targets")
        assert code == 0 and len(groups) == 2, (groups, err)
        assert {g["labels"]["node"] for g in groups} == set(two[name].agents) and all(g["labels"]["cluster"] == name for g in groups)
        targets.append(tmp_path / f"targets-{name}.json")
        targets[-1].write_text(json.dumps(groups))
    run(append(a.meta(), 20))

    prometheus = Prometheus(ProcessRegistry(tmp_path / "prom-procs"), tmp_path / "prom", targets)
    try:
        def every_target_up() -> bool:
            active = prometheus.api("targets")["data"]["activeTargets"]
            return len(active) == 4 and all(t["health"] == "up" for t in active)

        wait_until(every_target_up, 60, message="Prometheus scraping all four agents", watch=prometheus.proc)
        # What Prometheus holds is what the agents serve (the writes are over: the counters stand).
        served = sum(fetch(g["targets"][0]).total("dlagent_written_entries_total") for t in targets for g in json.loads(t.read_text()))
        assert served >= 40  # 20 records, each stored on both agents of A, and copied into B

        def prometheus_holds_what_agents_serve() -> bool:
            result = prometheus.query("sum(dlagent_written_entries_total)")
            return bool(result) and float(result[0]["value"][1]) == served

        wait_until(prometheus_holds_what_agents_serve, 30, message="Prometheus's sum of written entries equal to the agents' own")
        lag = prometheus.query('dlagent_replication_lag_records{stream="a-to-b", log="ledger"}')
        assert [r["metric"]["cluster"] for r in lag] == ["b"], lag  # the sink's worker reports it

        # Every dashboard query is valid PromQL and names only metrics the agents export (some
        # series appear once measured: the stream's safe time after its worker's first measure).
        used = {n for e in dashboard_queries() for n in re.findall(r"\b(dlagent_[a-z_]+)", e)} | set(re.findall(r"\b(dlagent_[a-z_]+)", RULES.read_text()))

        def unexported() -> set[str]:
            names = set(prometheus.api("label/__name__/values")["data"])
            return {n for n in used if n not in names and re.sub(r"_(bucket|sum|count)$", "", n) + "_bucket" not in names}

        wait_until(lambda: not unexported(), 30, message="every metric the dashboard and the alert rules use in Prometheus")
        for expr in dashboard_queries():
            prometheus.query(expr)

        # dlctl top: both agents of A take writes while it watches; B's worker shows the stream.
        stop = threading.Event()
        writer = threading.Thread(target=lambda: run(append(a.meta(), 0, until=stop)))
        writer.start()
        try:
            code, view, err = run_cli(inventory, "--cluster", "a", "-o", "json", "top", "--once", "--interval", "1")
        finally:
            stop.set()
            writer.join()
        assert code == 0 and not view["errors"], (view, err)
        rows = {r["node"]: r for r in view["agents"]}
        assert set(rows) == {"a1", "a2"} and all(r["write_entries_per_s"] > 0 and r["add_p99_ms"] > 0 for r in rows.values()), rows
        code, view, err = run_cli(inventory, "--cluster", "b", "-o", "json", "top", "--once", "--interval", "0.5")
        assert code == 0 and [(r["stream"], r["log"]) for r in view["streams"]] == [("a-to-b", LOG)], (view, err)
        assert view["streams"][0]["worker"] in two["b"].agents

        live_view_quits_on_q(inventory)

        victim = two["a"].agents["a2"]
        victim.proc.kill()
        def alert_raised() -> bool:
            alerts = prometheus.query('ALERTS{alertname="DlagentDown"}')
            return [r["metric"]["node"] for r in alerts] == ["a2"]

        wait_until(alert_raised, 30, message="DlagentDown for a2 (pending, then firing after its 1m)")
        code, groups, err = run_cli(inventory, "--cluster", "a", "-o", "json", "cluster", "metrics-targets")
        assert code == 0 and {g["labels"]["node"] for g in groups} == {"a1", "a2"}, groups  # the dead agent stays a target
        code, rows, err = run_cli(inventory, "--cluster", "a", "-o", "json", "cluster", "status")
        assert code == 0 and {r["node"]: r["metrics"] for r in rows}["a1"] == next(g["targets"][0] for g in groups if g["labels"]["node"] == "a1"), rows
    finally:
        prometheus.proc.terminate()


def live_view_quits_on_q(inventory: Path) -> None:
    """``dlctl top`` in a terminal (a pseudo-terminal here): it draws the agents' table, redraws
    it, and exits 0 when q is pressed."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "dlctl"), "--config", str(inventory), "--cluster", "a", "top", "--interval", "0.3"],
        stdin=slave, stdout=slave, stderr=slave, env={**os.environ, "COLUMNS": "250", "LINES": "60"}, close_fds=True,
    )
    os.close(slave)
    screen = b""
    try:
        def drawn_twice() -> bool:
            nonlocal screen
            while select.select([master], [], [], 0.05)[0]:
                try:
                    screen += os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
            return screen.count(b"agents") >= 2 and b"a1" in screen and b"a2" in screen

        wait_until(drawn_twice, 30, message=f"dlctl top drew the agents twice (so far: {screen[-500:]!r})")
        os.write(master, b"q")
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
