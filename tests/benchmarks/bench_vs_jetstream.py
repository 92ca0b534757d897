"""Peer comparison: dlctl against NATS JetStream, on this machine, in one run.

    .venv/bin/python tests/benchmarks/bench_vs_jetstream.py [--records 300000] [--rounds 5]
        [--sync-samples 1000] [--js-batch 2000] [--json] [--strict] [--keep]

Prerequisites (checked first; the script says what to install):
  * NATS server (Debian):  bash tests/benchmarks/fetch_nats_server.sh   (trixie's 2.10, into
                           .venv/bin, apt sources untouched), or apt-get install -y nats-server
                           (bookworm's 2.9: no fsync-every-write column); $NATS_SERVER overrides
  * NATS Python client:     .venv/bin/pip install -e '.[bench]'   (nats-py >= 2.6)
  * what `dlctl sandbox up` needs: Java 17 and the pyspark jars (`make install`)

What runs:
  1. JetStream: three ``nats-server`` processes with JetStream on 127.0.0.1, distinct
     client/route/monitoring ports, a store directory each, clustered by routes (one config
     file each: ``jetstream { store_dir }`` and ``cluster { listen, routes }``, the file forms
     of ``-js -sd --cluster --routes``); the script waits until every server names the same
     JetStream meta leader, creates one file-backed stream with 3 replicas per record size,
     waits for its leader and current replicas, and connects the client to the stream
     leader's server (JetStream's best case: no forwarding hop). Throughput: ``js.publish_async``
     pipelined, acknowledgements awaited in batches of ``--js-batch`` with two batches in flight
     (the next batch is sent while the previous one's acks arrive; a sweep of 250..8000 gave
     the same rate within noise). Single-record latency: ``await js.publish`` (waits for the
     PubAck), repeated.
  2. dlctl: ``dlctl sandbox up --regions 1 --nodes-per-region 3`` in a temp dir (3 agents),
     ``dlctl log create -e 3 -w 3 -a 2`` per record size, and the same workload through
     ``dlctl bench write`` (one pipelined ``LogWriter``: submit under wait_writable
     backpressure; single-record ``await append``). A second sandbox, the same but with its
     agents restarted with ``[storage] sync = "never"`` (never dlctl's default), gives the
     dlctl column of JetStream's default durability (``--no-sync-never`` skips it).
  Both clusters stay up for the whole run, idle when not measured, and the measurement
  **alternates** between them in ``--rounds`` rounds (the order flips every round): on a
  shared machine the background load drifts over minutes, and measuring one system after the
  other would hand the difference in load to one of them. Each round, each system: a warm-up
  of a fifth of a run (at least 5,000 records), one timed run of ``--records`` records of 100 B,
  the same at 1 KiB, and ``--sync-samples`` single-record appends of 100 B (after 100 untimed).
  A timed run ends when its last record is acknowledged. Reported: the median over rounds of
  records/s and of each round's p50/p99, every round's figures, and the load average.

How the comparison is fair, and where it is not:
  * Same machine, same run, loopback only, rounds interleaved. Both clients are asyncio Python
    in one process (nats-py here; dlctl's writer in the ``dlctl bench`` process), so client CPU
    counts for both; neither is given extra processes or connections. Both run on uvloop when it
    is installed (a dlctl dependency; the ``dlctl`` console script and the agents use it).
  * Replication: both keep 3 copies and acknowledge after a majority (JetStream R3 acks once the
    stream's Raft quorum, 2 of 3, has the message; dlctl E=W=3, A=2 acks once 2 agents have it).
  * Durability is NOT the same by default, and the difference favours JetStream. dlctl's agents
    acknowledge an add only after fdatasync (group commit). JetStream's file store by default
    does not fsync before acknowledging: it writes to the OS page cache, relies on replication,
    and flushes dirty blocks in the background every ``sync_interval`` (default 2 minutes in
    current servers). The ``sync_interval`` option — ``always`` fsyncs on every write — exists
    only from nats-server 2.10; Debian bookworm ships 2.9.10, which rejects it ("unknown
    field"), so there only the default can be measured, and the report says so. When the
    installed server accepts ``sync_interval: always`` (probed with ``nats-server -t``), a second
    JetStream cluster runs with it and both JetStream columns are reported.
    Checked on 2.9.10 with ``strace -f -c`` attached to the three servers for 45 s (100,000 async
    publishes, then 600 synchronous ones, R3 file stream): 0 fsync, fdatasync, sync_file_range
    or msync calls, ~155,000 pwrite64 per server. Every JetStream figure here is therefore for
    acknowledgements out of replicas' page caches, every dlctl figure for acknowledgements after
    fdatasync on 2 of 3 agents.
  * JetStream's per-message overhead (subject, reply inbox, PubAck JSON) is part of its protocol,
    as dlctl's per-record framing and per-entry CRC are part of dlctl's.

Goals (issue 4): dlctl >= 5 x JetStream's acknowledged records/s at 100 B, and dlctl's
single-record p99 no worse than JetStream's (default sync). Printed after them, each system next
to the other's column of the same durability: dlctl sync = never vs JetStream default (both
acknowledge from page caches), dlctl vs JetStream sync_interval: always (both fsync first). Exit code 0 unless --strict and a
goal is missed; 2 when a prerequisite is missing; 130 when interrupted. Every process the
script starts is stopped on the way out, also on failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RECORD_SIZES = (100, 1024)
MB = 1_000_000
GOAL_RATIO_100B = 5.0


# -- prerequisites -----------------------------------------------------------------------------


def missing_prerequisites() -> list[str]:
    missing = []
    if nats_server_binary() is None:
        missing.append("nats-server is not installed: bash tests/benchmarks/fetch_nats_server.sh (2.10, into .venv/bin), or apt-get install -y nats-server")
    try:
        import nats  # noqa: F401
    except ImportError:
        missing.append(f"the NATS Python client is not installed: {sys.executable} -m pip install -e '{REPO}[bench]'  (or pip install 'nats-py>=2.6')")
    return missing


def nats_server_binary() -> str | None:
    """``$NATS_SERVER``, else the one ``fetch_nats_server.sh`` put next to this Python, else the
    system's (Debian bookworm's is 2.9, which cannot fsync every write)."""
    candidates = [os.environ.get("NATS_SERVER"), str(Path(sys.executable).parent / "nats-server"), shutil.which("nats-server"), "/usr/sbin/nats-server"]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def nats_server_version() -> str:
    out = subprocess.run([nats_server_binary(), "--version"], capture_output=True, text=True, timeout=10)
    return (out.stdout or out.stderr).strip()


# -- process bookkeeping -------------------------------------------------------------------------


class Processes:
    """Every process this script starts, ended by pid in ``close`` (also on failure and Ctrl-C)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], log: Path) -> subprocess.Popen:
        with open(log, "ab") as out:
            # Own session: Ctrl-C reaches this script only, which then stops them in order.
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc in self.procs:
            self.procs.remove(proc)

    def close(self) -> None:
        for proc in list(self.procs):
            self.stop(proc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentiles_ms(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    n = len(ordered)

    def rank(q: float) -> float:
        return round(ordered[max(0, min(n - 1, -(-int(q * n * 1000) // 1000) - 1))] * 1000, 3)

    return {"samples": n, "p50": rank(0.5), "p99": rank(0.99), "p999": rank(0.999)}


def warmup_records(records: int) -> int:
    return max(5_000, records // 5)  # the same rule as `dlctl bench write`


# -- JetStream -----------------------------------------------------------------------------------


class JetStreamCluster:
    """Three clustered nats-server processes with JetStream on loopback."""

    def __init__(self, base: Path, procs: Processes, sync_always: bool) -> None:
        self.base, self.procs, self.sync_always = base, procs, sync_always
        self.servers: list[dict[str, Any]] = []
        self.running: list[subprocess.Popen] = []

    def config(self, server: dict[str, Any], routes: list[str]) -> str:
        route_list = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in routes)
        sync = "  sync_interval: always\n" if self.sync_always else ""
        return (
            f'server_name: "{server["name"]}"\n'
            f'listen: "127.0.0.1:{server["client"]}"\n'
            f'http: "127.0.0.1:{server["http"]}"\n'
            "jetstream {\n"
            f'  store_dir: "{server["store"]}"\n'
            "  max_memory_store: 256MB\n"
            "  max_file_store: 64GB\n"
            f"{sync}"
            "}\n"
            "cluster {\n"
            '  name: "bench"\n'
            f'  listen: "127.0.0.1:{server["route"]}"\n'
            f"  routes: [{route_list}]\n"
            "}\n"
        )

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.servers = [
            {"name": f"n{i}", "client": free_port(), "route": free_port(), "http": free_port(), "store": self.base / f"n{i}" / "store"}
            for i in range(1, 4)
        ]
        for server in self.servers:
            server["store"].mkdir(parents=True, exist_ok=True)
            routes = [str(o["route"]) for o in self.servers if o is not server]
            conf = self.base / f"{server['name']}.conf"
            conf.write_text(self.config(server, routes))
            self.running.append(self.procs.start([nats_server_binary(), "-c", str(conf)], self.base / f"{server['name']}.log"))
        self.wait_for_meta_leader(60.0)

    def jsz(self, server: dict[str, Any]) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{server['http']}/jsz", timeout=2) as resp:
            return json.loads(resp.read())

    def wait_for_meta_leader(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for proc, server in zip(self.running, self.servers):
                if proc.poll() is not None:
                    log = (self.base / f"{server['name']}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"nats-server {server['name']} exited with code {proc.returncode}:\n{log}")
            try:
                leaders = {self.jsz(s).get("meta_cluster", {}).get("leader") for s in self.servers}
                if len(leaders) == 1 and None not in leaders and "" not in leaders:
                    return leaders.pop()
                last = leaders
            except OSError as exc:
                last = exc
            time.sleep(0.2)
        raise RuntimeError(f"the JetStream cluster has no meta leader after {timeout:.0f} s (last seen: {last})")

    def url(self, name: str | None = None) -> str:
        server = next((s for s in self.servers if s["name"] == name), self.servers[0])
        return f"nats://127.0.0.1:{server['client']}"

    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{s['client']}" for s in self.servers]

    def stop(self) -> None:
        for proc in self.running:
            self.procs.stop(proc)
        self.running = []


async def _js_stream(cluster: JetStreamCluster, name: str) -> str:
    """Create the R3 file stream ``name``; return the name of the server that leads it."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(servers=cluster.urls(), connect_timeout=5)
    try:
        js = nc.jetstream(timeout=10)
        deadline = time.monotonic() + 30
        while True:
            try:
                await js.add_stream(StreamConfig(name=name, subjects=[name.lower()], storage=StorageType.FILE, num_replicas=3))
                break
            except Exception:  # noqa: BLE001 - JetStream answers "temporarily unavailable" right after startup
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        while True:
            info = await js.stream_info(name)
            if info.cluster and info.cluster.leader and len([r for r in (info.cluster.replicas or []) if r.current]) >= 2:
                return info.cluster.leader
            if time.monotonic() > deadline:
                raise RuntimeError(f"stream {name} has no leader with current replicas after 30 s")
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


async def _js_throughput_run(js: Any, subject: str, payload: bytes, count: int, batch: int) -> dict[str, Any]:
    started = time.perf_counter()
    previous: list[asyncio.Future] = []
    current: list[asyncio.Future] = []
    for _ in range(count):
        current.append(await js.publish_async(subject, payload))
        if len(current) >= batch:
            # Two batches in flight: wait for the one before, then keep sending.
            if previous:
                await asyncio.gather(*previous)
            previous, current = current, []
    await asyncio.gather(*previous, *current)
    elapsed = time.perf_counter() - started
    return {"records": count, "seconds": elapsed, "records_per_second": count / elapsed, "mb_per_second": count * len(payload) / elapsed / MB}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_client(main: Any) -> Any:
    """The JetStream client's event loop: uvloop when installed, as the ``dlctl`` console script
    uses for dlctl's client (``dlctl.cli.main.use_uvloop``), so both clients run on the same loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


class JetStreamSystem:
    """A JetStream cluster with one R3 file stream per record size, measured round by round."""

    def __init__(self, base: Path, procs: Processes, args: argparse.Namespace, sync_always: bool) -> None:
        self.label = "JetStream (sync always)" if sync_always else "JetStream (default sync)"
        self.key = "jetstream_sync_always" if sync_always else "jetstream_default"
        self.cluster = JetStreamCluster(base, procs, sync_always)
        self.args = args
        self.leaders: dict[int, str] = {}

    def start(self) -> None:
        self.cluster.start()
        for size in RECORD_SIZES:
            self.leaders[size] = run_client(_js_stream(self.cluster, f"BENCH{size}"))

    async def _round(self, size: int, sync_samples: int) -> dict[str, Any]:
        import nats

        # The stream leader's server: a publish there needs no forwarding hop (JetStream's best case).
        nc = await nats.connect(servers=[self.cluster.url(self.leaders[size])], connect_timeout=5, max_reconnect_attempts=0)
        try:
            js = nc.jetstream(timeout=30, publish_async_max_pending=2 * self.args.js_batch + 1)
            payload = os.urandom(size)
            subject = f"bench{size}"
            await _js_throughput_run(js, subject, payload, warmup_records(self.args.records), self.args.js_batch)
            out = await _js_throughput_run(js, subject, payload, self.args.records, self.args.js_batch)
            if sync_samples:
                for _ in range(min(100, sync_samples)):
                    await js.publish(subject, payload)
                samples = []
                for _ in range(sync_samples):
                    t0 = time.perf_counter()
                    await js.publish(subject, payload)
                    samples.append(time.perf_counter() - t0)
                out["sync_latency_ms"] = percentiles_ms(samples)
            return out
        finally:
            await nc.close()

    def round(self, size: int, sync_samples: int) -> dict[str, Any]:
        return run_client(self._round(size, sync_samples))

    def stop(self) -> None:
        self.cluster.stop()


class DlctlSystem:
    """A 3-agent dlctl sandbox with one E=W=3, A=2 log per record size, measured through
    ``dlctl bench write``. ``sync_never``: the agents run with ``[storage] sync = "never"``
    (acknowledge from the page cache and rely on replication, as JetStream does by default) —
    never dlctl's default; measured so that each JetStream column has a dlctl column of the
    same durability next to it."""

    def __init__(self, base: Path, args: argparse.Namespace, state: dict[str, Any], sync_never: bool = False) -> None:
        self.base, self.args, self.state, self.sync_never = base, args, state, sync_never
        self.label = "dlctl (sync never)" if sync_never else "dlctl (fsync)"
        self.key = "dlctl_sync_never" if sync_never else "dlctl"
        self.env: dict[str, str] = {}

    def start(self) -> None:
        sandbox = self.base / ("sandbox-sync-never" if self.sync_never else "sandbox")
        self.env = {"DLCTL_CONFIG": str(sandbox / "config.toml"), "DLCTL_SANDBOX_DIR": str(sandbox)}
        self.state.setdefault("sandbox_envs", []).append(self.env)  # from here on, cleanup runs `sandbox down --purge`
        dlctl(self.env, "--yes", "sandbox", "up", "--regions", "1", "--nodes-per-region", "3", "--dir", str(sandbox))
        if self.sync_never:
            configs = sorted(sandbox.glob("*/*/agent.toml"))
            for config in configs:
                text = config.read_text()
                if "[storage]" in text:
                    raise RuntimeError(f"{config} has a [storage] table already; cannot set sync = \"never\" safely")
                config.write_text(text + '\n[storage]\nsync = "never"\n')
            dlctl(self.env, "--yes", "agent", "restart")
            progress(f"  {len(configs)} agents restarted with [storage] sync = \"never\"")
        for size in RECORD_SIZES:
            dlctl(self.env, "--yes", "log", "create", f"bench{size}", "-e", "3", "-w", "3", "-a", "2")

    def round(self, size: int, sync_samples: int) -> dict[str, Any]:
        result = json.loads(
            dlctl(
                self.env, "-q", "-o", "json", "bench", "write", f"bench{size}", "--record-size", str(size),
                "--records", str(self.args.records), "--runs", "1", "--sync-latency-samples", str(sync_samples),
            )
        )
        out: dict[str, Any] = {"records_per_second": result["records_per_second"], "mb_per_second": result["mb_per_second"]}
        if sync_samples:
            lat = result["sync_append_latency_ms"]
            out["sync_latency_ms"] = {k: lat[k] for k in ("samples", "p50", "p99", "p999")}
        return out

    def stop(self) -> None:
        stop_dlctl(self.state)


class DiskFloor:
    """The floor under any fsync-before-ack append on this machine, measured in the same run:
    a 100-byte write + fdatasync of one file, and — what an E=W=3, A=2 ack waits for when the
    three agents share one disk, as in the sandbox — three such syncs of three files started
    together, until the second completes."""

    label = "write+fdatasync floor"
    key = "disk_floor"

    def __init__(self, base: Path, samples: int) -> None:
        self.base, self.samples = base, samples

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)

    def round(self) -> dict[str, Any]:
        import threading

        block = os.urandom(100)
        fds = [os.open(self.base / f"floor-{i}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) for i in range(3)]
        one: list[float] = []
        second: list[float] = []
        try:
            for _ in range(self.samples):
                t0 = time.perf_counter()
                os.write(fds[0], block)
                os.fdatasync(fds[0])
                one.append(time.perf_counter() - t0)
            for _ in range(self.samples):
                done: list[float] = []
                lock = threading.Lock()
                gate = threading.Barrier(4)

                def sync(fd: int) -> None:
                    gate.wait()
                    os.write(fd, block)
                    os.fdatasync(fd)
                    with lock:
                        done.append(time.perf_counter())

                threads = [threading.Thread(target=sync, args=(fd,)) for fd in fds]
                for t in threads:
                    t.start()
                gate.wait()
                t0 = time.perf_counter()
                for t in threads:
                    t.join()
                second.append(sorted(done)[1] - t0)
        finally:
            for fd in fds:
                os.close(fd)
        return {"one_file_ms": percentiles_ms(one), "second_of_three_ms": percentiles_ms(second)}

    def stop(self) -> None:
        pass


def sync_always_supported(base: Path) -> bool:
    """Does the installed nats-server accept ``jetstream { sync_interval: always }``?"""
    base.mkdir(parents=True, exist_ok=True)
    conf = base / "probe.conf"
    conf.write_text(f'jetstream {{\n  store_dir: "{base / "probe-store"}"\n  sync_interval: always\n}}\n')
    result = subprocess.run([nats_server_binary(), "-t", "-c", str(conf)], capture_output=True, text=True, timeout=20)
    return result.returncode == 0


# -- dlctl --------------------------------------------------------------------------------------


def dlctl(env: dict[str, str], *argv: str, timeout: float = 600) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "dlctl.cli", *argv], capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}, stdin=subprocess.DEVNULL
    )
    if result.returncode != 0:
        raise RuntimeError(f"dlctl {' '.join(argv)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result.stdout


def stop_dlctl(state: dict[str, Any]) -> None:
    envs = state.pop("sandbox_envs", [])
    for env in envs:
        try:
            dlctl(env, "--yes", "sandbox", "down", "--purge", "--dir", env["DLCTL_SANDBOX_DIR"], timeout=120)
        except Exception as exc:  # noqa: BLE001 - report and go on cleaning up
            progress(f"warning: sandbox down failed: {exc}")


# -- measuring and reporting --------------------------------------------------------------------


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def loadavg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def measure(systems: list[Any], floor: DiskFloor | None, args: argparse.Namespace) -> dict[str, Any]:
    """``args.rounds`` rounds; in each, every system in turn (the order flips every round), then
    the disk floor."""
    rounds: dict[str, list[dict[str, Any]]] = {s.key: [] for s in systems}
    floors: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = systems if r % 2 == 0 else list(reversed(systems))
        for system in order:
            entry: dict[str, Any] = {"round": r + 1, "load": loadavg()}
            for size in RECORD_SIZES:
                # Latency with the 100-byte records only: the goal is about one small record.
                entry[str(size)] = system.round(size, args.sync_samples if size == RECORD_SIZES[0] else 0)
            rounds[system.key].append(entry)
            lat = entry["100"].get("sync_latency_ms") or {}
            progress(
                f"  round {r + 1} {system.label:<25} 100 B {entry['100']['records_per_second']:>9,.0f} rec/s   "
                f"1 KiB {entry['1024']['records_per_second']:>8,.0f} rec/s   sync p50/p99 {lat.get('p50', float('nan')):.3f}/"
                f"{lat.get('p99', float('nan')):.3f} ms   load {entry['load']}"
            )
        if floor is not None:
            floors.append({"round": r + 1, "load": loadavg(), **floor.round()})
            f1, f2 = floors[-1]["one_file_ms"], floors[-1]["second_of_three_ms"]
            progress(f"  round {r + 1} {floor.label:<25} one file p50/p99 {f1['p50']:.3f}/{f1['p99']:.3f} ms   2nd of 3 p50/p99 {f2['p50']:.3f}/{f2['p99']:.3f} ms")
    out: dict[str, Any] = {}
    if floors:
        out["disk_floor"] = {
            "label": floor.label if floor else "",
            "rounds": floors,
            **{kind: {q: round(_median([f[kind][q] for f in floors]), 3) for q in ("p50", "p99", "p999")} for kind in ("one_file_ms", "second_of_three_ms")},
        }
    for system in systems:
        rs = rounds[system.key]
        summary: dict[str, Any] = {"label": system.label, "rounds": rs}
        for size in RECORD_SIZES:
            summary[str(size)] = {
                "records_per_second": round(_median([x[str(size)]["records_per_second"] for x in rs])),
                "mb_per_second": round(_median([x[str(size)]["mb_per_second"] for x in rs]), 2),
            }
        if args.sync_samples:
            summary["100"]["sync_latency_ms"] = {
                q: round(_median([x["100"]["sync_latency_ms"][q] for x in rs]), 3) for q in ("p50", "p99", "p999")
            }
        out[system.key] = summary
    return out


def _p99(system: dict[str, Any]) -> float:
    return system["100"]["sync_latency_ms"]["p99"]


def _rounds_no_worse(ours: dict[str, Any], theirs: dict[str, Any]) -> int:
    """Rounds in which our single-record p99 was at most theirs (round by round, as interleaved)."""
    return sum(o["100"]["sync_latency_ms"]["p99"] <= t["100"]["sync_latency_ms"]["p99"] for o, t in zip(ours["rounds"], theirs["rounds"]))


def report(results: dict[str, Any], keys: list[str]) -> tuple[str, bool]:
    js, dl = results["jetstream_default"], results["dlctl"]
    cols = [results[k]["label"] for k in keys] + ["dlctl / JetStream default"]
    rows: list[list[str]] = []

    def row(label: str, get: Any, fmt: str) -> None:
        values = [get(results[k]) for k in keys]
        ratio = get(dl) / get(js) if get(js) else float("nan")
        rows.append([label] + [format(v, fmt) for v in values] + [f"{ratio:.2f}x"])

    row("records/s, 100 B", lambda s: s["100"]["records_per_second"], ",d")
    row("records/s, 1 KiB", lambda s: s["1024"]["records_per_second"], ",d")
    row("MB/s, 1 KiB", lambda s: s["1024"]["mb_per_second"], ".1f")
    has_sync = "sync_latency_ms" in dl["100"]
    if has_sync:
        for q in ("p50", "p99"):
            row(f"single-record {q} ms, 100 B", lambda s, q=q: s["100"]["sync_latency_ms"][q], ".3f")
    header = ["figure (median of rounds)"] + cols
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    # Paired: each round's ratio, dlctl over the JetStream run next to it in time.
    paired = [d["100"]["records_per_second"] / j["100"]["records_per_second"] for d, j in zip(dl["rounds"], js["rounds"])]
    ratio = dl["100"]["records_per_second"] / js["100"]["records_per_second"]
    goal1 = ratio >= GOAL_RATIO_100B
    lines += ["", f"goal: dlctl >= {GOAL_RATIO_100B:g} x JetStream records/s at 100 B: {ratio:.2f}x "
              f"(per round: {', '.join(f'{p:.1f}x' for p in paired)}) -> {'MET' if goal1 else 'MISSED'}"]
    ok = goal1
    if has_sync:
        d99, j99 = _p99(dl), _p99(js)
        goal2 = d99 <= j99
        ok = ok and goal2
        lines.append(
            f"goal: dlctl single-record p99 <= JetStream's: {d99:.3f} ms vs {j99:.3f} ms "
            f"(dlctl no worse in {_rounds_no_worse(dl, js)} of {len(dl['rounds'])} rounds) -> {'MET' if goal2 else 'MISSED'}"
        )
        # Each JetStream column next to the dlctl column of the same durability.
        pairs = (
            ("no fsync (dlctl sync = never vs JetStream default)", results.get("dlctl_sync_never"), js),
            ("fsync before the ack (dlctl vs JetStream sync_interval: always)", dl, results.get("jetstream_sync_always")),
        )
        for what, ours, theirs in pairs:
            if ours and theirs:
                lines.append(
                    f"same durability, {what}: records/s at 100 B "
                    f"{ours['100']['records_per_second'] / theirs['100']['records_per_second']:.2f}x; single-record p99 "
                    f"{_p99(ours):.3f} ms vs {_p99(theirs):.3f} ms (dlctl no worse in {_rounds_no_worse(ours, theirs)} of {len(ours['rounds'])} rounds)"
                )
    floor = results.get("disk_floor")
    if floor:
        lines.append(
            f"baseline, same run: 100-byte write+fdatasync p50/p99 {floor['one_file_ms']['p50']:.3f}/{floor['one_file_ms']['p99']:.3f} ms; "
            f"3 files synced at once, 2nd done (A=2 of 3 agents on this one disk) {floor['second_of_three_ms']['p50']:.3f}/"
            f"{floor['second_of_three_ms']['p99']:.3f} ms: dlctl's single-record latency cannot go below it, JetStream's does not include it"
        )
    if "jetstream_sync_always" not in results:
        lines.append(f"note: {results['nats_server_version']} does not accept sync_interval: always; JetStream ran with its default (no fsync before the ack).")
    lines.append(
        f"{results['rounds_count']} interleaved rounds, {results['records']:,} records per timed run; "
        f"machine: {results['cpus']} CPUs, load average before {results['load_before']}, after {results['load_after']}"
    )
    return "\n".join(lines), ok


def _terminate(_signum: int, _frame: Any) -> None:
    # SIGTERM ends the run like Ctrl-C, so that the cleanup in main's finally runs.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000, help="records per timed run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians reported)")
    parser.add_argument("--sync-samples", type=int, default=1000, help="single-record appends timed per system and round (0: skip)")
    parser.add_argument("--js-batch", type=int, default=2000, help="JetStream async publishes per acknowledged batch")
    parser.add_argument("--json", action="store_true", help="print every figure as JSON on stdout after the table")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (server logs, stores)")
    parser.add_argument("--no-sync-never", action="store_true", help="skip the dlctl column with agents in sync = never (JetStream's default durability)")
    args = parser.parse_args(argv)

    missing = missing_prerequisites()
    if missing:
        for m in missing:
            print(f"missing: {m}", file=sys.stderr)
        return 2

    signal.signal(signal.SIGTERM, _terminate)
    base = Path(tempfile.mkdtemp(prefix="bench-vs-jetstream-"))
    procs = Processes()
    state: dict[str, Any] = {}
    systems: list[Any] = []
    results: dict[str, Any] = {
        "nats_server_version": nats_server_version(),
        "records": args.records,
        "rounds_count": args.rounds,
        "cpus": os.cpu_count(),
        "load_before": loadavg(),
    }
    try:
        progress(f"{results['nats_server_version']}; work dir {base}")
        always = sync_always_supported(base / "probe")
        results["jetstream_sync_always_available"] = always
        systems.append(JetStreamSystem(base / "js-default", procs, args, sync_always=False))
        if always:
            systems.append(JetStreamSystem(base / "js-always", procs, args, sync_always=True))
        systems.append(DlctlSystem(base, args, state))
        if not args.no_sync_never:
            systems.append(DlctlSystem(base, args, state, sync_never=True))
        for system in systems:
            progress(f"starting {system.label} ...")
            system.start()
        floor = DiskFloor(base / "floor", args.sync_samples) if args.sync_samples else None
        if floor is not None:
            floor.start()
        results.update(measure(systems, floor, args))
        results["load_after"] = loadavg()
        text, ok = report(results, [s.key for s in systems])
        results["goals_met"] = ok
        print(text)
        if args.json:
            print(json.dumps(results, indent=2))
        return 1 if args.strict and not ok else 0
    except KeyboardInterrupt:
        progress("interrupted: cleaning up")
        return 130
    finally:
        # Every process this script started ends here, whatever happened above.
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for system in systems:
            try:
                system.stop()
            except Exception as exc:  # noqa: BLE001 - go on stopping the others
                progress(f"warning: stopping {system.label} failed: {exc}")
        procs.close()
        stop_dlctl(state)
        if args.keep:
            progress(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
