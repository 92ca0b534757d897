"""Record append times and positioning by time (issue 24 item 4) on a real sandbox: the real
``dlctl`` command line as an operator runs it, real agents, a real in-process writer.

The oracle is the test's own clock, read before and after each group of appends: a record's
append time must lie between the two readings of its group, and a reader started at a time T
must start at the first record of the first group whose appends began after T.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest
from harness.sandbox import dlctl, sandbox_up, session_for
from harness.procs import wait_until

from dlctl.log.dlsn import DLSN
from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter
from dlctl.session import ClusterSession

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]


def json_lines(proc: subprocess.CompletedProcess[str]) -> list[dict]:
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    yield from sandbox_up(tmp_path_factory.mktemp("sbx"))


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat()


def ms(text: str) -> int:
    return round(datetime.fromisoformat(text).timestamp() * 1000)


class Group:
    """Records appended between two readings of the test's clock."""

    def __init__(self, before: float, after: float, dlsns: list[DLSN]) -> None:
        self.before, self.after, self.dlsns = before, after, dlsns

    def holds_time(self, text: str) -> bool:
        return int(self.before * 1000) <= ms(text) <= int(self.after * 1000) + 1


async def append_group(session: ClusterSession, name: str, tag: str, count: int, *, close: bool = True, clock=None) -> tuple[Group, LogWriter, AgentPool]:
    """``count`` records by a writer of their own (closing it completes their segment)."""
    pool = AgentPool(session.meta, session.credentials)
    writer = await LogWriter.open(session.meta, pool, name, **({"clock": clock} if clock else {}))
    before = time.time()
    futures = [writer.submit(f"{tag}{i}".encode()) for i in range(count)]
    await writer.flush()
    after = time.time()
    if close:
        await writer.close()
        await pool.close()
    return Group(before, after, [f.result() for f in futures]), writer, pool


def later_than(moment: float) -> None:
    """Let the clock move on, so two groups' times are told apart."""
    wait_until(lambda: time.time() > moment + 0.01, timeout=1, interval=0.005, message="the clock to move on")


def test_records_carry_their_append_time_and_readers_start_at_a_time(sandbox):
    assert dlctl(sandbox, "log", "create", "timed").returncode == 0
    session = session_for(sandbox)
    groups = []
    for g in range(3):
        group, _, _ = asyncio.run(append_group(session, "timed", f"g{g}-", 20))
        groups.append(group)
        later_than(group.after)

    read = json_lines(dlctl(sandbox, "-o", "json", "log", "read", "timed"))
    assert [r["dlsn"] for r in read] == [str(d) for g in groups for d in g.dlsns]
    for g in groups:
        for row in read:
            if DLSN.parse(row["dlsn"]) in g.dlsns:
                assert g.holds_time(row["time"]), (row, g.before, g.after)
    times = [ms(r["time"]) for r in read]
    assert times == sorted(times)

    # A reader from a time starts at the first record appended at or after it.
    since = json_lines(dlctl(sandbox, "-o", "json", "log", "read", "timed", "--since", iso(groups[1].before)))
    assert [r["dlsn"] for r in since] == [str(d) for g in groups[1:] for d in g.dlsns]
    counted = json.loads(dlctl(sandbox, "-o", "json", "log", "count", "timed", "--from", since[0]["dlsn"]).stdout)
    assert counted["records"] == len(since)  # the count from that position matches what was read
    assert json_lines(dlctl(sandbox, "-o", "json", "log", "read", "timed", "--since", iso(groups[-1].after + 1))) == []

    # Each completed segment shows when its first and last records were appended.
    shown = json.loads(dlctl(sandbox, "-o", "json", "log", "show", "timed").stdout)
    by_seq = {s["seq"]: s for s in shown["segments"]}
    for g in groups:
        seg = by_seq[g.dlsns[0].segment_seq]
        assert g.holds_time(seg["first_time"]) and g.holds_time(seg["last_time"]), (seg, g.before, g.after)

    # In progress: a writer appends and stays; a reader from its time reads them, to the LAC.
    async def while_writing() -> tuple[Group, subprocess.CompletedProcess[str]]:
        live, _, pool = await append_group(session, "timed", "live-", 10, close=False)
        argv = [sys.executable, "-m", "dlctl.cli", "-o", "json", "log", "read", "timed", "--since", iso(live.before)]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **sandbox})
        out, err = await asyncio.wait_for(proc.communicate(), 120)  # the writer's loop runs meanwhile
        await pool.close()  # the writer is dropped: its segment stays in progress
        return live, subprocess.CompletedProcess(argv, proc.returncode or 0, out.decode(), err.decode())

    live, read_live = asyncio.run(while_writing())
    assert [r["dlsn"] for r in json_lines(read_live)] == [str(d) for d in live.dlsns]
    session.close()  # its owner znode goes with this ZooKeeper session

    # Recovery closes it and records its times from its entries.
    assert dlctl(sandbox, "--yes", "recover", "log", "timed").returncode == 0
    shown = json.loads(dlctl(sandbox, "-o", "json", "log", "show", "timed").stdout)
    seg = next(s for s in shown["segments"] if s["seq"] == live.dlsns[0].segment_seq)
    assert seg["state"] == "completed" and live.holds_time(seg["first_time"]) and live.holds_time(seg["last_time"]), seg

    # Truncation by time: every record appended before the second group's first goes.
    truncate = dlctl(sandbox, "--yes", "-o", "json", "truncate", "timed", "--before", iso(groups[1].before))
    assert truncate.returncode == 0, truncate.stderr
    left = json_lines(dlctl(sandbox, "-o", "json", "log", "read", "timed"))
    assert [r["dlsn"] for r in left] == [str(d) for g in groups[1:] for d in g.dlsns] + [str(d) for d in live.dlsns]


def test_a_new_owner_whose_clock_is_behind_never_appends_earlier_times(sandbox):
    """An owner on a host whose clock is an hour behind takes the log over: its records get the
    previous owner's last time, not earlier ones (the log stays ordered in time)."""
    assert dlctl(sandbox, "log", "create", "skewed").returncode == 0
    session = session_for(sandbox)
    first, _, _ = asyncio.run(append_group(session, "skewed", "on-time-", 10))
    behind, _, _ = asyncio.run(append_group(session, "skewed", "behind-", 10, clock=lambda: time.time() - 3600))
    read = json_lines(dlctl(sandbox, "-o", "json", "log", "read", "skewed"))
    assert [r["dlsn"] for r in read] == [str(d) for d in first.dlsns + behind.dlsns]
    times = [ms(r["time"]) for r in read]
    assert times == sorted(times), times
    assert all(t >= times[len(first.dlsns) - 1] for t in times[len(first.dlsns):])
    assert all(t < int(behind.before * 1000) for t in times[len(first.dlsns):])  # it did not use its own clock's later time
    session.close()
