"""``dlctl fence`` and ``dlctl recover log`` on a real sandbox, with a real in-process writer."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from harness.logcluster import run
from harness.procs import wait_until
from harness.sandbox import dlctl, sandbox_up, session_for
from harness.zk import segment_record, scribbled

from dlctl.errors import ExitCode
from dlctl.log.pool import AgentPool
from dlctl.log.writer import LogWriter, WriterDeposedError

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    yield from sandbox_up(tmp_path_factory.mktemp("sbx"))


def test_recover_closes_an_abandoned_segment_with_every_acknowledged_record(sandbox):
    assert dlctl(sandbox, "log", "create", "abandoned").returncode == 0
    session = session_for(sandbox)

    async def write_and_abandon() -> int:
        pool = AgentPool(session.meta, session.credentials)
        writer = await LogWriter.open(session.meta, pool, "abandoned")
        for i in range(250):
            writer.submit(f"r{i}".encode())
        await writer.flush()
        await pool.close()  # the writer is simply dropped: no close, no completion
        return writer.last_txid

    # (harness run: it also cancels what the dropped writer starts as its connections close)
    last_txid = run(write_and_abandon())
    session.close()  # ends its ZooKeeper session: the owner znode goes, the segment stays in progress

    shown = json.loads(dlctl(sandbox, "-o", "json", "log", "show", "abandoned").stdout)
    assert shown["owner"] is None and shown["segments"][-1]["state"] == "inprogress"
    dry = json.loads(dlctl(sandbox, "-o", "json", "recover", "log", "abandoned", "--dry-run").stdout)
    assert dry["dry_run"] and dry["steps"][0]["action"] == "recover"

    result = dlctl(sandbox, "-o", "json", "--yes", "recover", "log", "abandoned")
    assert result.returncode == 0, result.stderr
    (recovered,) = json.loads(result.stdout)["steps"][0]["result"]
    assert recovered["records"] == 250 and recovered["last_txid"] == last_txid
    shown = json.loads(dlctl(sandbox, "-o", "json", "log", "show", "abandoned").stdout)
    assert shown["segments"][-1]["state"] == "completed" and shown["segments"][-1]["records"] == 250
    lines = dlctl(sandbox, "-o", "json", "log", "read", "abandoned").stdout.splitlines()
    assert [json.loads(line)["payload"] for line in lines] == [f"r{i}" for i in range(250)]

    again = json.loads(dlctl(sandbox, "-o", "json", "--yes", "recover", "log", "abandoned").stdout)
    assert again["steps"] == [] and "nothing to recover" in again["notes"][0]


def test_fence_refuses_a_live_writer_without_force_and_deposes_it_with_force(sandbox):
    assert dlctl(sandbox, "log", "create", "live").returncode == 0
    session = session_for(sandbox)

    async def scenario() -> tuple[int, str, int, str]:
        pool = AgentPool(session.meta, session.credentials)
        writer = await LogWriter.open(session.meta, pool, "live")
        await writer.append(b"before the fence")
        loop = asyncio.get_running_loop()
        refused = await loop.run_in_executor(None, lambda: dlctl(sandbox, "--yes", "fence", "live"))
        forced = await loop.run_in_executor(None, lambda: dlctl(sandbox, "-o", "json", "--yes", "fence", "live", "--force"))
        with pytest.raises(WriterDeposedError):
            await writer.append(b"after the fence")
        await writer.close()
        await pool.close()
        return refused.returncode, refused.stderr, forced.returncode, forced.stdout

    refused_code, refused_err, forced_code, forced_out = asyncio.run(scenario())
    session.close()
    assert refused_code == ExitCode.REFUSED and "live writer" in refused_err
    assert forced_code == 0
    outcome = json.loads(forced_out)["steps"][0]["result"]
    (fenced,) = outcome.values()
    assert len(fenced["fenced"]) >= 2  # W - A + 1 = 2 replicas of every write set
    lines = dlctl(sandbox, "-o", "json", "log", "read", "live").stdout.splitlines()
    assert [json.loads(line)["payload"] for line in lines] == ["before the fence"]


def test_log_count_between_positions_matches_the_records_a_reader_reads(sandbox):
    """(Before the roles test below: it kills an agent.) `log count` works from the segments' totals and the entries' running totals; the oracle
    is the reader: the positions `log read` prints for every record. Several segments, the last
    one in progress (the appending agent keeps the log open)."""
    assert dlctl(sandbox, "log", "create", "counted", "--roll-bytes", "4096").returncode == 0
    # Three appends of 5 KiB (each one entry, and a roll after it), then a small one: several
    # segments, the last still in progress.
    for first, size in ((0, 95), (95, 95), (190, 95), (285, 15)):
        lines = "".join(f"record {i:04d} {'x' * 40}\n" for i in range(first, first + size))
        appended = subprocess.run(
            [sys.executable, "-m", "dlctl.cli", "--yes", "log", "append", "counted"], input=lines,
            capture_output=True, text=True, timeout=180, env={**os.environ, **sandbox},
        )
        assert appended.returncode == 0, appended.stderr
    read = dlctl(sandbox, "-o", "json", "log", "read", "counted")
    positions = [json.loads(line)["dlsn"] for line in read.stdout.splitlines() if line.strip()]
    assert len(positions) == 300
    shown = json.loads(dlctl(sandbox, "-o", "json", "log", "show", "counted").stdout)
    assert len(shown["segments"]) >= 3 and shown["segments"][-1]["state"] == "inprogress"
    # An in-progress segment's end, read from a quorum: at least the last record's entry.
    assert shown["segments"][-1]["lac"] >= int(positions[-1].split("/")[1]), shown["segments"][-1]

    def count(*bounds: str) -> int:
        out = dlctl(sandbox, "-o", "json", "log", "count", "counted", *bounds)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["records"]

    assert count() == 300
    assert count("--from", positions[10], "--to", positions[250]) == 240
    assert count("--from", positions[299]) == 1 and count("--to", positions[0]) == 0
    middle = next(i for i, p in enumerate(positions) if p.split("/")[0] != positions[0].split("/")[0])  # first of the second segment
    assert count("--from", positions[middle - 1], "--to", positions[middle + 1]) == 2
    backwards = dlctl(sandbox, "log", "count", "counted", "--from", positions[250], "--to", positions[10])
    assert backwards.returncode == ExitCode.USAGE and "is before" in backwards.stderr


def test_an_entry_that_is_not_records_stops_a_read_with_an_error_naming_it_and_where_to_read_on(sandbox):
    """A writer stored bytes that are not records under a correct CRC (a writer bug, or a client
    with the credentials that writes its own layout). `log read` prints every record before
    that entry, then stops with exit 1 and an error that names the entry and the position after
    it (it was "internal error: CorruptRecords"); reading on from there gives the records after."""
    assert dlctl(sandbox, "log", "create", "garbled").returncode == 0
    session = session_for(sandbox)

    async def write() -> None:
        pool = AgentPool(session.meta, session.credentials)
        writer = await LogWriter.open(session.meta, pool, "garbled")
        for i in range(3):
            writer.submit(f"before{i}".encode())
        await writer.flush()
        # Acknowledged before anything else is submitted: an entry of its own.
        await writer.submit_encoded(b"\x00\x00\x00\xffnot records", 1, writer.last_txid + 1)
        for i in range(2):
            writer.submit(f"after{i}".encode())
        await writer.close()
        await pool.close()

    try:
        asyncio.run(write())
    finally:
        session.close()
    read = dlctl(sandbox, "-o", "json", "log", "read", "garbled")
    flat = "".join(read.stderr.split())
    assert read.returncode == ExitCode.FAILED and "internalerror" not in flat and "doesnotparseasrecords" in flat, read.stderr
    assert [json.loads(line)["payload"] for line in read.stdout.splitlines() if line.strip()] == ["before0", "before1", "before2"]
    (after,) = re.findall(r"startat(\d+/\d+/0)", flat)
    assert payloads(sandbox, "garbled", "--from-dlsn", after) == ["after0", "after1"]


def test_a_metadata_record_dlctl_did_not_write_is_an_error_naming_its_znode(sandbox):
    """A segment record scribbled over (a hand edit, another tool): `log show` and `log read`
    stop with exit 1 and an error naming the znode and what is wrong in it, with what to do —
    not "internal error: ValueError"; with the record put back, both work again."""
    for name in ("scribbled", "legible"):
        assert dlctl(sandbox, "log", "create", name).returncode == 0
        appended = subprocess.run(
            [sys.executable, "-m", "dlctl.cli", "--yes", "log", "append", name], input="a\nb\n",
            capture_output=True, text=True, timeout=180, env={**os.environ, **sandbox},
        )
        assert appended.returncode == 0, appended.stderr
    session = session_for(sandbox)
    try:
        with scribbled(session.meta.client, segment_record(session.meta.client, session.cluster.name, "scribbled")) as where:
            for argv in (("log", "show", "scribbled"), ("log", "read", "scribbled")):
                out = dlctl(sandbox, *argv)
                flat = "".join(out.stderr.split())
                assert out.returncode == ExitCode.FAILED and "internalerror" not in flat, (argv, out.stderr)
                assert f"{where}:malformedsegmentrecord" in flat and "hint:dlctldidnotwritethis" in flat, (argv, out.stderr)
            # `log list` still lists every log: this one as unreadable (and why, on stderr).
            listed = dlctl(sandbox, "-o", "json", "log", "list")
            rows = {r["name"]: r for r in json.loads(listed.stdout)}
            assert listed.returncode == 0 and rows["scribbled"]["last_state"] == "unreadable", listed.stdout + listed.stderr
            assert rows["legible"]["segments"] == 1 and rows["legible"]["last_state"] != "unreadable" and where in "".join(listed.stderr.split())
        assert payloads(sandbox, "scribbled") == ["a", "b"]
    finally:
        session.close()


def payloads(sandbox, log: str, *options: str) -> list[str]:
    """What `log read` prints of LOG's records (the oracle of the append tests)."""
    read = dlctl(sandbox, "-o", "json", "log", "read", log, *options)
    assert read.returncode == 0, read.stderr
    return [json.loads(line)["payload"] for line in read.stdout.splitlines() if line.strip()]


def test_an_append_stopped_by_a_record_too_large_says_what_it_appended_and_exits_partial(sandbox):
    """Five lines, one over the request limit, three more: the five are in the log and the run
    says so (exit 3, where to continue). It said "nothing was changed" (exit 1), and a script
    that appended the same input again stored the five twice. The oracle is `log read`. A first
    record too large is a usage error with nothing appended."""
    assert dlctl(sandbox, "log", "create", "half-appended").returncode == 0

    def append(lines: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dlctl.cli", "--yes", "log", "append", "half-appended"], input=lines,
            capture_output=True, text=True, timeout=180, env={**os.environ, **sandbox},
        )

    too_large = "x" * 200_000  # over the write proxy's 128 KiB per request
    first = append(f"{too_large}\nlater\n")
    assert first.returncode == ExitCode.USAGE and "nothing was appended" in first.stderr, first.stderr
    assert payloads(sandbox, "half-appended") == []

    half = append("".join(f"r{i}\n" for i in range(1, 6)) + f"{too_large}\nr6\nr7\nr8\n")
    assert half.returncode == ExitCode.PARTIAL, half.stderr
    said = " ".join(half.stderr.split())  # rich wraps the message
    assert "the 5 record(s) before it were appended" in said and "tail -n +6" in said and "nothing was changed" not in said, said
    assert payloads(sandbox, "half-appended") == [f"r{i}" for i in range(1, 6)]


def test_an_append_from_a_pipe_left_open_appends_each_line_as_it_comes_and_ctrl_c_says_what_landed(sandbox):
    """`tail -f app.log | dlctl log append` must append each line when it comes. Input was read
    on the event loop: a read waiting for the next line stopped everything else, so a line read
    waited for the pipe to close (nothing appended while it stayed open) and a Ctrl-C could not
    end the command. The oracle is `log read`; the pipe stays open until the end."""
    assert dlctl(sandbox, "log", "create", "piped").returncode == 0

    reading, writing = os.pipe()
    append = subprocess.Popen(
        [sys.executable, "-m", "dlctl.cli", "--yes", "log", "append", "piped"], stdin=reading,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **sandbox}, text=True,
    )
    os.close(reading)
    try:
        os.write(writing, b"first line\n")
        wait_until(lambda: payloads(sandbox, "piped") == ["first line"], 30, message="the first line in the log while the pipe is open")
        os.write(writing, b"second line\n")
        wait_until(lambda: payloads(sandbox, "piped") == ["first line", "second line"], 30, message="the second line in the log")
        append.send_signal(signal.SIGINT)
        _, err = append.communicate(timeout=30)
    finally:
        os.close(writing)
        if append.poll() is None:
            append.kill()
    assert append.returncode == ExitCode.INTERRUPTED, err
    assert "2 of the 2 record(s) read were acknowledged" in " ".join(err.split()), err


def test_a_reader_that_goes_away_ends_dlctl_silently_with_141_and_a_tail_shows_each_record_at_once(sandbox):
    """`dlctl log read x | head` ended with exit 1 and nothing said (click's and rich's own
    handling of EPIPE); `log tail`'s output now leaves when the reader waits, not after each
    record, so this also checks that a followed record is shown at once; a tail whose reader
    goes ends then, not at the next record (a quiet log may not have one). The processes run
    with buffered output, as an operator's do (no PYTHONUNBUFFERED)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | sandbox
    command = [sys.executable, "-m", "dlctl.cli"]
    assert dlctl(sandbox, "log", "create", "headed").returncode == 0
    appended = subprocess.run([*command, "--yes", "log", "append", "headed"], input="".join(f"r{i}\n" for i in range(20_000)), capture_output=True, text=True, env=env, timeout=120)
    assert appended.returncode == 0, appended.stderr

    # `| head -1`: the reader takes one line and goes.
    read = subprocess.Popen([*command, "log", "read", "headed"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    assert read.stdout.readline().split("\t")[-1] == "r0\n"
    read.stdout.close()
    assert read.wait(timeout=60) == ExitCode.OUTPUT_CLOSED and read.stderr.read() == ""

    # `| true`: gone before anything was written (the output is written only at exit).
    reading, writing = os.pipe()
    os.close(reading)
    listed = subprocess.run([*command, "log", "list"], stdout=writing, stderr=subprocess.PIPE, env=env, text=True, timeout=60)
    os.close(writing)
    assert listed.returncode == ExitCode.OUTPUT_CLOSED and listed.stderr == ""

    # A tail: each record appended is on its stdout while it goes on following.
    assert dlctl(sandbox, "log", "create", "followed").returncode == 0
    tail = subprocess.Popen([*command, "log", "tail", "followed"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=0)
    shown = b""

    def next_line() -> str:
        # Read as the records come, with a deadline (no thread: closing a pipe a thread is
        # blocked reading would wait for that read).
        nonlocal shown
        deadline = time.monotonic() + 30
        while b"\n" not in shown:
            ready, _, _ = select.select([tail.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no line from the tail within 30 s (has {shown!r})"
            chunk = os.read(tail.stdout.fileno(), 65536)
            assert chunk, "the tail ended"
            shown += chunk
        line, _, shown = shown.partition(b"\n")
        return line.decode()

    try:
        for payload in ("first", "second"):
            put = subprocess.run([*command, "--yes", "log", "append", "followed"], input=f"{payload}\n", capture_output=True, text=True, env=env, timeout=60)
            assert put.returncode == 0, put.stderr
            assert next_line().split("\t")[-1] == payload, f"{payload!r} shown by the tail"
        assert tail.poll() is None, "the tail follows"
        tail.stdout.close()  # and no record comes after: the tail sees its reader go, as tail -f does
        assert tail.wait(timeout=60) == ExitCode.OUTPUT_CLOSED and tail.stderr.read() == b""
    finally:
        if tail.poll() is None:
            tail.kill()


def test_cluster_roles_names_the_elected_agents_and_the_auditor_switch_is_cluster_wide(sandbox):
    """``cluster roles`` shows who holds each elected role and who stands behind; the auditor
    switch is a dry-runnable, idempotent plan; SIGKILL of the auditor moves the role to the next
    contender shown."""
    from dlctl.meta import roles

    def rows() -> dict[str, dict]:
        out = dlctl(sandbox, "-o", "json", "cluster", "roles")
        assert out.returncode == 0, out.stderr
        return {r["role"]: r for r in json.loads(out.stdout)}

    nodes = {n["node"]: n for n in json.loads(dlctl(sandbox, "-o", "json", "sandbox", "status").stdout)["nodes"] if n.get("pid")}
    wait_until(lambda: all(set(r["contenders"]) == set(nodes) for r in rows().values()), 30, message="every agent stands for both roles")
    before = rows()
    for role in ("auditor", "housekeeping"):
        assert before[role]["holder"] == before[role]["contenders"][0] and before[role]["holder"] in nodes
    assert before["auditor"]["enabled"] is True and before["auditor"]["problem"] is None

    session = session_for(sandbox)
    try:
        plan = json.loads(dlctl(sandbox, "-o", "json", "cluster", "auditor", "disable", "--dry-run").stdout)
        assert [s["action"] for s in plan["steps"]] == ["auditor-disable"]
        assert roles.read_auditor_switch(session.meta.client, session.cluster.name) == (True, None), "--dry-run changed the switch"
        done = dlctl(sandbox, "-o", "json", "--yes", "cluster", "auditor", "disable")
        assert done.returncode == 0, done.stderr
        assert roles.read_auditor_switch(session.meta.client, session.cluster.name) == (False, None)
        assert rows()["auditor"]["enabled"] is False
        again = json.loads(dlctl(sandbox, "-o", "json", "--yes", "cluster", "auditor", "disable", "--dry-run").stdout)
        assert again["steps"] == [] and "already off" in " ".join(again["notes"])
        assert dlctl(sandbox, "--yes", "cluster", "auditor", "enable").returncode == 0
        assert roles.read_auditor_switch(session.meta.client, session.cluster.name) == (True, None)
    finally:
        roles.write_auditor_switch(session.meta.client, session.cluster.name, True, session.zk_auth)
        session.close()

    holder = before["auditor"]["holder"]
    successor = before["auditor"]["contenders"][1]
    os.kill(nodes[holder]["pid"], 9)
    # The dead holder's election znode goes with its session (2 s in the sandbox).
    wait_until(lambda: rows()["auditor"]["holder"] == successor, 30, message=f"{successor} holds the auditor role after {holder} died")
    assert holder not in rows()["auditor"]["contenders"]
    dlctl(sandbox, "--yes", "sandbox", "up", "--regions", "1", "--nodes-per-region", "3")
