"""The write stall when a replica the ack quorum needs goes silent, with the writer's silence
detection and without it, in the same run (issue 24).

    .venv/bin/python tests/benchmarks/bench_silent_replica.py [--rounds 3] [--request-timeout 10]

Four real agents (one real ZooKeeper: the test harness); a log with E = W = A = 3, so every
member is needed for an acknowledgement and the fourth agent is there to roll onto. A writer
appends one record at a time; a member of its ensemble is SIGSTOPped (no reset, no answer: a
silent agent, as a region whose packets are dropped) and the next append is timed until it is
acknowledged (the writer rolls to an ensemble without the silent member). Per round, once with
``WriterOptions.silent_after`` at its default and once with it off (the request timeout decides,
``--request-timeout``, 10 s as the library's default).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the harness

from harness.agents import AgentNode, harness_credentials
from harness.logcluster import CLUSTER, bench_agents

from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter, WriterOptions
from dlctl.meta.records import LogConfig
from dlctl.meta.store import MetaStore

DEFAULT_SILENT_AFTER = WriterOptions().silent_after


async def one_stall(meta: MetaStore, agents: dict[str, AgentNode], log: str, silent_after: float | None, request_timeout: float) -> float:
    pool = AgentPool(meta, harness_credentials(), request_timeout=request_timeout)
    writer = await LogWriter.open(meta, pool, log, options=WriterOptions(silent_after=silent_after))
    victim = None
    try:
        for i in range(50):
            await writer.append(b"warm-up %d" % i)
        victim = writer._segment.ensemble[0]
        agents[victim].proc.pause()
        started = time.perf_counter()
        await writer.append(b"while a member is silent")
        return time.perf_counter() - started
    finally:
        if victim is not None:
            agents[victim].proc.resume()
        await writer.close()
        await pool.close()


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--rounds", type=int, default=3)
    args.add_argument("--request-timeout", type=float, default=10.0)
    opts = args.parse_args(argv)
    with bench_agents("bench-silent-", ("n1", "n2", "n3", "n4")) as up:
        admin, agents = up.admin, up.agents
        meta = MetaStore(admin, CLUSTER)
        results: dict[str, list[float]] = {"detection": [], "request timeout": []}
        for r in range(opts.rounds):
            for name, silent_after in (("detection", DEFAULT_SILENT_AFTER), ("request timeout", None)):
                log = f"silent-{r}-{name.replace(' ', '-')}"
                meta.create_log(log, LogConfig(3, 3, 3))
                results[name].append(asyncio.run(one_stall(meta, agents, log, silent_after, opts.request_timeout)))
                for agent in agents.values():
                    agent.wait_ready(admin)  # the paused one re-registers if its session expired
        print(f"E=W=A=3 over 4 agents; one member SIGSTOPped; stall of the next append ({opts.rounds} rounds)")
        for name, took in results.items():
            label = f"silent_after={DEFAULT_SILENT_AFTER:g}s" if name == "detection" else f"off (request timeout {opts.request_timeout:g}s)"
            print(f"  {label:<36} median {statistics.median(took):6.2f} s   max {max(took):6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
