"""Real ``dlagent serve`` processes: registration, shutdown, crashes, torn tails, limbo, fencing.

Every test starts real agent processes against the test's ZooKeeper chroot and talks to them
over TCP with the real client; faults are real signals and real damage to real files.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from dlctl.log import format as fmt
from dlctl.log.client import AgentClient, SyncAgentClient
from dlctl.log.errors import AgentUnavailableError, FencedError, LimboError, NoSuchEntryError, UnauthorizedError
from harness.agents import AgentNode
from harness.procs import wait_until

pytestmark = [pytest.mark.zk, pytest.mark.agent]

LOG_ID, SEG = 42, 1


def entry(entry_id: int, payload: bytes | None = None, lac: int | None = None) -> bytes:
    body = payload if payload is not None else f"entry-{entry_id}-".encode() * 8
    return fmt.encode(fmt.Entry(LOG_ID, SEG, entry_id, entry_id - 1 if lac is None else lac, body))


@pytest.fixture
def admin(zk):
    return zk.client()


@pytest.fixture
def node(procs, tmp_path, zk, admin) -> AgentNode:
    return AgentNode(procs, tmp_path, zk.connect_string).start(zk=admin)


def test_agent_registers_region_rack_and_address_then_unregisters_on_sigterm(node, admin):
    record = node.registration(admin)
    assert (record["region"], record["rack"], record["address"]) == ("r1", "rack1", node.address)
    assert record["pid"] == node.proc.pid
    node.proc.popen.send_signal(signal.SIGTERM)
    assert node.proc.wait(timeout=15) == 0
    assert node.registration(admin) is None


def test_agent_reregisters_after_its_session_expires(node, admin):
    first = admin.exists(f"/dlctl/c1/available/{node.node_id}").ephemeralOwner
    node.proc.pause()  # longer than the 2 s session timeout: ZooKeeper expires the session
    try:
        wait_until(lambda: node.registration(admin) is None, 15, message="registration to vanish with the session")
    finally:
        node.proc.resume()
    wait_until(lambda: node.registration(admin) is not None, 15, message="re-registration after reconnect", watch=node.proc)
    assert admin.exists(f"/dlctl/c1/available/{node.node_id}").ephemeralOwner != first
    with node.client() as c:  # and it still serves
        c.add(entry(0))
        assert c.read(LOG_ID, SEG, 0) == entry(0)


def test_agent_refuses_another_clusters_data_dir(procs, tmp_path, zk, admin):
    first = AgentNode(procs, tmp_path, zk.connect_string, cluster="c1").start(zk=admin)
    first.proc.terminate()
    text = first.config_path.read_text().replace('cluster = "c1"', 'cluster = "c2"')
    first.config_path.write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "dlagent", "serve", "--config", str(first.config_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 4
    assert "belongs to node 'n1' of cluster 'c1'" in result.stderr


def test_wrong_secret_is_unauthorized_and_serves_nothing(node):
    with SyncAgentClient(node.host, node.port, b"not-the-cluster-secret-0123456789", tls=node.client_tls) as c:
        with pytest.raises(UnauthorizedError):
            c.stat()
    with node.client() as c:  # the right secret still works: the agent survived the attempt
        assert c.stat()["segments"] == 0


def test_wrong_zookeeper_credentials_stop_the_agent_with_an_error_naming_the_file(node, admin):
    """The digest scheme takes any password at connection: the agent died of a bare NoAuthError
    traceback at its first read."""
    node.proc.terminate()
    user = node.zk_auth_file.read_text().split(":", 1)[0]
    node.zk_auth_file.write_text(f"{user}:not-the-password\n")
    result = subprocess.run([sys.executable, "-m", "dlagent", "serve", "--config", str(node.config_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    said = " ".join(result.stderr.split())
    assert f"ZooKeeper refuses its metadata to user '{user}' of {node.zk_auth_file}" in said and "Traceback" not in said, said


class AddStream:
    """Adds entries with many in flight from a background loop, recording every acknowledgement."""

    def __init__(self, node: AgentNode, in_flight: int = 32) -> None:
        self.node, self.in_flight = node, in_flight
        self.acked: set[int] = set()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        client = AgentClient(self.node.host, self.node.port, self.node.secret, tls=self.node.client_tls, request_timeout=5)
        next_id = 0
        lock = asyncio.Lock()

        async def worker() -> None:
            nonlocal next_id
            while True:
                async with lock:
                    eid = next_id
                    next_id += 1
                await client.add(entry(eid))
                self.acked.add(eid)

        try:
            await asyncio.gather(*(worker() for _ in range(self.in_flight)))
        except AgentUnavailableError as exc:
            self.errors.append(exc)
        finally:
            await client.close()


def test_every_acknowledged_entry_survives_sigkill_mid_stream(node, admin):
    stream = AddStream(node)
    stream.thread.start()
    wait_until(lambda: len(stream.acked) >= 300, 30, message="300 acknowledged adds", watch=node.proc)
    node.proc.kill()
    stream.thread.join(30)
    assert stream.errors, "the stream should have seen the agent die"
    acked = set(stream.acked)
    node.start(zk=admin)
    with node.client() as c:
        for eid in sorted(acked):
            assert c.read(LOG_ID, SEG, eid) == entry(eid), f"acknowledged entry {eid} lost or changed"


def test_torn_tail_after_crash_is_cut_and_acknowledged_entries_survive(node, admin):
    with node.client() as c:
        for eid in range(20):
            c.add(entry(eid))
    node.proc.kill()
    (segment,) = [p for p in node.segment_files() if p.suffix == ".log"]
    end = sum(len(entry(eid)) for eid in range(20))
    whole = segment.read_bytes()[:end]
    # The file may run on past the data (preallocated zeros); a torn write lands right after
    # the last entry: half of a header and some garbage.
    with open(segment, "r+b") as f:
        f.seek(end)
        f.write(entry(20)[:30] + os.urandom(17))
    node.start(zk=admin)
    with node.client() as c:
        for eid in range(20):
            assert c.read(LOG_ID, SEG, eid) == entry(eid)
        with pytest.raises(NoSuchEntryError):
            c.read(LOG_ID, SEG, 20)
        c.add(entry(20))  # the replica accepts appends after the cut
        assert c.read(LOG_ID, SEG, 20) == entry(20)
    assert segment.read_bytes().startswith(whole)


def test_preallocated_space_left_by_a_crash_is_trimmed_quietly_and_nothing_is_lost(node, admin):
    with node.client() as c:
        for eid in range(20):
            c.add(entry(eid))
    (segment,) = [p for p in node.segment_files() if p.suffix == ".log"]
    end = sum(len(entry(eid)) for eid in range(20))
    assert segment.stat().st_size > end, "the agent grows segment files ahead of the data"
    node.proc.kill()
    whole = segment.read_bytes()
    assert whole[end:].count(0) == len(whole) - end  # zeros behind the data, as the crash left them
    node.start(zk=admin)
    assert segment.stat().st_size == end, "startup recovery trims the zeros"
    with node.client() as c:
        assert [c.read(LOG_ID, SEG, eid) for eid in range(20)] == [entry(eid) for eid in range(20)]
        c.add(entry(20))  # right after the data, not after the zeros
        assert c.read(LOG_ID, SEG, 20) == entry(20)
    assert segment.read_bytes()[: end + len(entry(20))] == whole[:end] + entry(20)
    assert "torn tail" not in node.proc.output(), "preallocated space reported as a torn write"


def test_bit_flip_before_valid_data_puts_the_replica_in_limbo(node, admin):
    with node.client() as c:
        for eid in range(10):
            c.add(entry(eid))
    node.proc.kill()
    (segment,) = [p for p in node.segment_files() if p.suffix == ".log"]
    data = bytearray(segment.read_bytes())
    data[len(entry(0)) * 3 + fmt.HEADER_SIZE + 5] ^= 0x10  # inside entry 3's payload
    segment.write_bytes(bytes(data))
    fsck = subprocess.run([sys.executable, "-m", "dlagent", "fsck", str(node.data_dir), "-o", "json"], capture_output=True, text=True, timeout=60)
    assert fsck.returncode == 1 and re.search(r"limbo|corrupt", fsck.stdout, re.I)
    node.start(zk=admin)
    with node.client() as c:
        for eid in (0, 3, 9):  # never served, not even the intact entries
            with pytest.raises(LimboError):
                c.read(LOG_ID, SEG, eid)
        with pytest.raises(LimboError):
            c.fence(LOG_ID, SEG)
    assert segment.read_bytes() == bytes(data), "limbo data must be left untouched for re-replication"


def test_fence_survives_restart_and_only_recovery_adds_pass(node, admin):
    with node.client() as c:
        c.add(entry(0))
        c.add(entry(1))
        result = c.fence(LOG_ID, SEG)
        assert result.last_entry_id == 1
    node.proc.kill()
    node.start(zk=admin)
    with node.client() as c:
        with pytest.raises(FencedError):
            c.add(entry(2))
        c.add(entry(2), recovery=True)
        assert c.read(LOG_ID, SEG, 2) == entry(2)
