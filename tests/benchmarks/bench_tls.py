"""The cost of TLS on the agent protocol: the same agent, plaintext and mutual TLS, same run.

    .venv/bin/python tests/benchmarks/bench_tls.py [--entries 20000] [--rounds 3] [--strict]

Two real agent processes (``SegmentStore`` + ``AgentServer``, fsync on, default group commit,
the agent's own event loop: uvloop when installed) on the same disk, one plaintext, one with a
cluster CA's certificates (``dlctl.pki``) exactly as ``cluster init`` + ``agent install`` set
them up. The client runs in this process. For records of 100 B and 1 KiB, each one entry:

  * acknowledged adds/s with 64 in flight (throughput; goal: TLS at most 15 % lower);
  * p99 latency of single adds, one in flight.

Plaintext and TLS alternate within every round (the disk and the machine's load drift); the
median of ``--rounds`` is reported with the rounds in brackets. Connection set-up is outside
the timings (a TLS handshake costs once per connection, not per record). Exit 0 unless
--strict and the throughput goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dlctl import pki
from dlctl.log import format as fmt
from dlctl.log.client import AgentClient
from dlctl.log.tls import TlsFiles
from dlctl.secrets import write_secret_file

SECRET = b"benchmark-secret-0123456789abcdef"
HOST = "127.0.0.1"
GOAL = 0.85


def _tls_files(directory: Path, ca: pki.Issued, name: str, *, server: bool) -> TlsFiles:
    issued = pki.issue(ca, name, [HOST], server=server)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for fname, data in (("ca.pem", ca.cert_pem), ("cert.pem", issued.cert_pem), ("key.pem", issued.key_pem)):
        write_secret_file(directory / fname, data)
    return TlsFiles(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")


def serve(data_dir: Path, port_file: Path, tls_dir: str) -> None:
    from dlagent.server import AgentServer
    from dlagent.storage import SegmentStore, SyncPolicy

    tls = TlsFiles(Path(tls_dir) / "ca.pem", Path(tls_dir) / "cert.pem", Path(tls_dir) / "key.pem") if tls_dir else None

    async def main() -> None:
        store = SegmentStore(data_dir, SyncPolicy())
        await store.open()
        server = AgentServer(store, SECRET, HOST, 0, tls=tls)
        await server.start()
        port_file.write_text(str(server.address[1]))
        await asyncio.Event().wait()

    try:
        import uvloop  # the agent's default event loop (dlagent.cli: event_loop = "auto")

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def start(work: Path, name: str, tls_dir: Path | None) -> tuple[subprocess.Popen, int]:
    port_file = work / f"{name}.port"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(work / name), str(port_file), str(tls_dir or "")])
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"agent {name} did not start")
        time.sleep(0.05)  # a child's port file: nothing to await on
    return proc, int(port_file.read_text())


async def throughput(client: AgentClient, seq: int, count: int, size: int, window: int = 64) -> float:
    payload = os.urandom(size)
    entries = [fmt.encode(fmt.Entry(1, seq, i, i - 1, payload)) for i in range(count)]
    sem = asyncio.Semaphore(window)

    async def one(e: bytes) -> None:
        try:
            await client.add(e)
        finally:
            sem.release()

    started = time.perf_counter()
    tasks = []
    for e in entries:
        await sem.acquire()
        tasks.append(asyncio.ensure_future(one(e)))
    await asyncio.gather(*tasks)
    return count / (time.perf_counter() - started)


async def p99_latency(client: AgentClient, seq: int, count: int, size: int) -> float:
    payload = os.urandom(size)
    samples = []
    for i in range(count):
        e = fmt.encode(fmt.Entry(1, seq, i, i - 1, payload))
        t = time.perf_counter()
        await client.add(e)
        samples.append(time.perf_counter() - t)
    samples.sort()
    return samples[int(0.99 * (len(samples) - 1))]


async def measure(ports: dict[str, int], client_tls: TlsFiles, args: argparse.Namespace) -> dict[tuple[str, int, str], list[float]]:
    clients = {
        "plaintext": AgentClient(HOST, ports["plaintext"], SECRET, request_timeout=60),
        "tls": AgentClient(HOST, ports["tls"], SECRET, tls=client_tls, request_timeout=60),
    }
    results: dict[tuple[str, int, str], list[float]] = {}
    seq = 0
    try:
        for c in clients.values():
            await c.stat()  # connect (and handshake) outside the timings
            seq += 1
            await throughput(c, seq, 2000, 100)  # warm-up
        for r in range(args.rounds):
            for size in (100, 1024):
                for mode, client in clients.items():
                    seq += 1
                    results.setdefault((mode, size, "adds/s"), []).append(await throughput(client, seq, args.entries, size))
                    seq += 1
                    results.setdefault((mode, size, "p99 ms"), []).append(1000 * await p99_latency(client, seq, args.latency_samples, size))
            print(f"round {r + 1} done", file=sys.stderr, flush=True)
    finally:
        for c in clients.values():
            await c.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--entries", type=int, default=20000)
    parser.add_argument("--latency-samples", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="a directory on the disk to use (default: a temporary one)")
    parser.add_argument("--client-loop", choices=("asyncio", "uvloop"), default="asyncio", help="the client's event loop (the agent's is uvloop when installed)")
    parser.add_argument("--strict", action="store_true")
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), Path(args.serve[1]), args.serve[2])
        return 0
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)  # a --dir that does not exist yet is made
    work = Path(tempfile.mkdtemp(prefix="bench-tls-", dir=args.dir))
    procs = []
    try:
        ca = pki.new_ca("bench")
        _tls_files(work / "agent-tls", ca, "agent", server=True)
        client_tls = _tls_files(work / "client-tls", ca, "operator", server=False)
        plain, plain_port = start(work, "plaintext", None)
        procs.append(plain)
        tls, tls_port = start(work, "tls", work / "agent-tls")
        procs.append(tls)
        run = asyncio.run
        if args.client_loop == "uvloop":
            import uvloop

            run = uvloop.run
        results = run(measure({"plaintext": plain_port, "tls": tls_port}, client_tls, args))
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)

    def fmt_rounds(values: list[float]) -> str:
        return f"{statistics.median(values):,.1f} [" + ", ".join(f"{v:,.1f}" for v in values) + "]"

    worst = 1.0
    print(f"{'record':>7}  {'figure':>7}  {'plaintext':>34}  {'TLS':>34}  TLS/plain")
    for size in (100, 1024):
        for figure in ("adds/s", "p99 ms"):
            plain_v, tls_v = results[("plaintext", size, figure)], results[("tls", size, figure)]
            ratio = statistics.median(tls_v) / statistics.median(plain_v)
            if figure == "adds/s":
                worst = min(worst, ratio)
            print(f"{size:>6}B  {figure:>7}  {fmt_rounds(plain_v):>34}  {fmt_rounds(tls_v):>34}  {ratio:.0%}")
    verdict = "PASS" if worst >= GOAL else "MISS"
    print(f"TLS throughput: {worst:.0%} of plaintext at worst (goal >= {GOAL:.0%}, i.e. at most 15 % lower): {verdict}")
    return 1 if args.strict and worst < GOAL else 0


if __name__ == "__main__":
    sys.exit(main())
