"""Write proxies against real agents and ZooKeeper: routing, ownership moves, fencing of a
paused owner, per-producer order and exactly-once for acknowledged records.

Four agents in three regions share the module (an owner can die and three remain for a fresh
ensemble of E=3). Records are read back straight from the agents over the segment metadata.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest

from dlctl.log.client import AgentClient
from dlctl.log.errors import AgentError, NotOwnerError, OrderBarrierError
from dlctl.log.ownership import owner_info
from dlctl.log.producer import LogProducer, ProducerOptions
from dlctl.log.records import encode_record
from harness.agents import DEFAULT_SECRET, harness_credentials
from harness.zk import write_harness_zk_auth
from harness.logcluster import LogEnv, agent_cluster, eventually, healed_env, read_back, run, solo_agent
from harness.tls import tls_dir_for

pytestmark = [pytest.mark.zk, pytest.mark.agent]

SESSION_TIMEOUT = 2.0  # the agents' ZooKeeper session timeout (harness default)
MAX_LOG_BYTES = 2 * 1024 * 1024  # the agents' [proxy] bound on a log's queued + unacknowledged bytes
REGIONS = {"n1": "r1", "n2": "r2", "n3": "r3", "n4": "r1"}


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    yield from agent_cluster(
        zk_server, tmp_path_factory.mktemp("proxy-agents"), "proxy", extra_config=f"[proxy]\nmax_log_bytes = {MAX_LOG_BYTES}\n", regions=REGIONS
    )


@pytest.fixture
def env(cluster, request):
    yield from healed_env(cluster, request.node.name)


def owner_node(env: LogEnv) -> str | None:
    current = env.meta().owner_of(env.name)
    return owner_info(current[0]).get("node") if current else None


def payload(client: int, seq: int) -> bytes:
    return f"c{client:02d}-{seq:06d}".encode()


def parse(data: bytes) -> tuple[int, int]:
    client, seq = data.decode().split("-")
    return int(client[1:]), int(seq)


async def records_in_log(env: LogEnv) -> list[tuple[int, int]]:
    meta = env.meta()
    pool = env.pool(meta)
    try:
        return [parse(r.payload) for _, r in await read_back(meta, pool, env.name)]
    finally:
        await pool.close()


def assert_per_client_order(found: list[tuple[int, int]]) -> None:
    """Each client's records appear in the order it submitted them (first occurrences)."""
    seen: dict[int, int] = {}
    for client, seq in found:
        if seq <= seen.get(client, -1):
            continue  # a duplicate of an earlier record (at-least-once resend); order is judged on firsts
        assert seq > seen.get(client, -1)
        seen[client] = seq
    firsts: dict[int, list[int]] = {}
    done: set[tuple[int, int]] = set()
    for rec in found:
        if rec not in done:
            done.add(rec)
            firsts.setdefault(rec[0], []).append(rec[1])
    for client, seqs in firsts.items():
        assert seqs == sorted(seqs), f"client {client}'s records are out of order in the log"


def test_twenty_clients_through_different_agents_end_at_the_owner_exactly_once_in_order(env):
    env.create_log()
    clients, per_client = 20, 300

    async def scenario():
        producers = []
        for c in range(clients):
            meta = env.meta()
            # Clients in different regions: rendezvous hashing sends them to different agents first.
            producers.append(LogProducer(meta, env.pool(meta), env.name, region=f"r{c % 3 + 1}"))
        first_choices = set()
        for producer in producers:
            await producer.router.refresh(force=True)
            first_choices.add(producer.router.choose(env.name))

        async def write(c: int, producer: LogProducer) -> list:
            futures = []
            for i in range(per_client):
                await producer.wait_writable()
                futures.append(producer.submit(payload(c, i)))
                if i % 50 == 0:
                    await asyncio.sleep(0)  # interleave the clients
            return await asyncio.gather(*futures)

        acked = await asyncio.gather(*(write(c, p) for c, p in enumerate(producers)))
        owner = owner_node(env)
        talking_to = {p.confirmed_owner for p in producers}
        for producer in producers:
            await producer.close()
            await producer.pool.close()
        return first_choices, acked, owner, talking_to

    first_choices, acked, owner, talking_to = run(scenario(), timeout=120)
    assert len(first_choices) >= 2, "the clients should have started at different agents"
    assert owner is not None and talking_to == {owner}
    for dlsns in acked:  # each client's acknowledgements increase in submission order
        assert dlsns == sorted(dlsns) and len(set(dlsns)) == len(dlsns)
    found = run(records_in_log(env))
    counts = Counter(found)
    assert len(counts) == clients * per_client and set(counts.values()) == {1}, "every record exactly once"
    assert_per_client_order(found)


def test_sigkill_of_the_owner_under_load_fails_over_within_session_timeout_plus_one_second(env, cluster):
    env.create_log()
    clients = 5

    async def scenario():
        producers = []
        for c in range(clients):
            meta = env.meta()
            producers.append(LogProducer(meta, env.pool(meta), env.name, region="r1", options=ProducerOptions(retry_timeout=30)))
        acks: dict[int, list] = {c: [] for c in range(clients)}  # (seq, dlsn, time acknowledged)
        failed: dict[int, list] = {c: [] for c in range(clients)}
        stop = asyncio.Event()

        async def write(c: int, producer: LogProducer) -> None:
            seq = 0
            pending = []
            while not stop.is_set():
                await producer.wait_writable()
                fut = producer.submit(payload(c, seq))
                fut.add_done_callback(lambda f, s=seq: (acks if f.exception() is None else failed)[c].append(
                    (s, f.result() if f.exception() is None else f.exception(), time.monotonic())))
                pending.append(fut)
                seq += 1
                if len(pending) > 64:
                    await asyncio.wait(pending[:32])
                    pending = pending[32:]
            await asyncio.wait(pending) if pending else None

        tasks = [asyncio.ensure_future(write(c, p)) for c, p in enumerate(producers)]
        await eventually(lambda: sum(len(a) for a in acks.values()) > 2000, timeout=30, message="acks before the kill")
        owner = owner_node(env)
        killed_at = time.monotonic()
        cluster.agents[owner].proc.kill()
        last_seg = max(d.segment_seq for a in acks.values() for _, d, _ in a)

        def new_owner_acks() -> list[float]:
            # The new owner recovers the old owner's segment and writes a new one.
            return [t for a in acks.values() for _, d, t in a if d.segment_seq > last_seg]

        await eventually(lambda: len(new_owner_acks()) > 2000, timeout=20, message="steady acks at the new owner")
        first_after = min(new_owner_acks())
        stop.set()
        await asyncio.gather(*tasks)
        new_owner = owner_node(env)
        stats = [p.stats for p in producers]
        for producer in producers:
            await producer.close()
            await producer.pool.close()
        return owner, new_owner, first_after - killed_at, acks, failed, stats

    owner, new_owner, gap, acks, failed, stats = run(scenario(), timeout=120)
    assert new_owner is not None and new_owner != owner
    assert gap <= SESSION_TIMEOUT + 1.0, f"failover took {gap:.2f}s"
    assert not any(failed.values()), "no record may fail: the producers retry through the new owner"
    found = run(records_in_log(env))
    counts = Counter(found)
    for c, acked in acks.items():
        for seq, _dlsn, _t in acked:
            assert counts[(c, seq)] >= 1, f"acknowledged record {c}/{seq} lost"
    # At least once for records whose acknowledgement was lost; never a duplicate created by
    # resending an acknowledged one (those are never resent), and order holds on first occurrences.
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    resent = sum(s["resent_requests"] for s in stats)
    print(f"failover {gap:.2f}s; {sum(map(len, acks.values()))} acknowledged; {resent} request(s) resent; {duplicates} duplicate(s)")
    assert duplicates == 0 or resent > 0
    assert_per_client_order(found)


def test_paused_owner_loses_the_log_and_its_pending_writes_fail_fenced_and_stay_invisible(env, cluster):
    env.create_log()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta)
        producer = LogProducer(meta, pool, env.name, region="r1")
        for i in range(100):
            await producer.append(payload(0, i))
        owner = owner_node(env)
        node = cluster.agents[owner]
        # A raw connection to the owner, opened while it runs: appends on it reach the old owner.
        raw = AgentClient(node.host, node.port, DEFAULT_SECRET, tls=node.client_tls, request_timeout=30)
        await raw.connect()
        node.proc.pause()
        stale = [
            asyncio.ensure_future(raw.append(env.name, 77, 1, encode_record(payload(9, i)))) for i in range(20)
        ]
        # Another agent takes over once the paused owner's session expired.
        for i in range(100, 200):
            await producer.append(payload(0, i))
        new_owner = owner_node(env)
        node.proc.resume()
        results = await asyncio.gather(*stale, return_exceptions=True)
        await raw.close()
        await producer.close()
        await pool.close()
        return owner, new_owner, results

    owner, new_owner, results = run(scenario(), timeout=120)
    assert new_owner is not None and new_owner != owner
    assert all(isinstance(r, AgentError) for r in results), results
    errors = {type(r).__name__ for r in results}
    assert errors <= {"FencedError", "OrderBarrierError", "NotOwnerError"}, errors
    assert "FencedError" in errors or "NotOwnerError" in errors
    found = run(records_in_log(env))
    assert not [r for r in found if r[0] == 9], "a deposed owner's pending writes must never become visible"
    assert [r for r in found if r[0] == 0] == [(0, i) for i in range(200)]


def test_not_owner_answer_names_the_owner_and_a_failed_append_holds_back_later_ones(env, cluster):
    env.create_log()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta)
        producer = LogProducer(meta, pool, env.name)
        await producer.append(b"first")
        owner = owner_node(env)
        other = next(n for n in cluster.agents if n != owner)
        node = cluster.agents[other]
        async with AgentClient(node.host, node.port, DEFAULT_SECRET, tls=node.client_tls) as client:
            with pytest.raises(NotOwnerError) as refused:
                await client.append(env.name, 5, 1, encode_record(b"x"))
            # The same producer's next append on this connection is held back until it resets.
            with pytest.raises(OrderBarrierError):
                await client.append(env.name, 5, 1, encode_record(b"y"))
            with pytest.raises(NotOwnerError):
                await client.append(env.name, 5, 1, encode_record(b"y"), reset_order=True)
            # Another producer on the same connection is not held back by producer 5's failure.
            with pytest.raises(NotOwnerError):
                await client.append(env.name, 6, 1, encode_record(b"z"))
        await producer.close()
        await pool.close()
        return owner, refused.value.owner

    owner, hinted = run(scenario())
    assert hinted == cluster.agents[owner].address


def test_release_moves_the_log_to_another_agent_without_losing_records(env, cluster):
    env.create_log()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta)
        producer = LogProducer(meta, pool, env.name)
        for i in range(50):
            await producer.append(payload(0, i))
        owner = owner_node(env)
        node = cluster.agents[owner]
        async with AgentClient(node.host, node.port, DEFAULT_SECRET, tls=node.client_tls) as client:
            released = await client.release(env.name)
            again = await client.release(env.name)
        assert owner_node(env) is None
        for i in range(50, 100):
            await producer.append(payload(0, i))
        await producer.close()
        await pool.close()
        return released, again

    released, again = run(scenario())
    assert released and not again
    meta = env.meta()
    segments = meta.segments(env.name)
    assert segments[0].value.state.value == "completed", "a release completes the segment gracefully"
    assert run(records_in_log(env)) == [(0, i) for i in range(100)]


def test_owner_holds_producers_back_when_a_log_cannot_drain_and_loses_nothing(env, cluster):
    env.create_log()
    producers_count, record = 3, b"r" * 1000

    async def scenario():
        producers = []
        for _ in range(producers_count):
            meta = env.meta()
            producers.append(LogProducer(meta, env.pool(meta, request_timeout=30), env.name, options=ProducerOptions(max_in_flight=64, max_pending_bytes=64 * 1024 * 1024)))
        await producers[0].append(b"claim")
        owner = owner_node(env)
        ensemble = env.meta().segments(env.name)[-1].value.ensembles[-1].nodes
        stalled = [n for n in ensemble if n != owner][:2]
        for n in stalled:  # without two of its three replicas no entry can be acknowledged
            cluster.agents[n].proc.pause()
        futures = [p.submit(record) for p in producers for _ in range(4000)]  # 12 MB, six times the bound
        node = cluster.agents[owner]
        async with AgentClient(node.host, node.port, DEFAULT_SECRET, tls=node.client_tls) as stat_client:
            async def held_back() -> bool:
                stat = (await stat_client.stat())["proxy"]["logs"].get(env.name, {})
                return stat.get("held_connections", 0) > 0

            await eventually(held_back, timeout=1.0, message="the owner to hold its producers back")
            for n in stalled:
                cluster.agents[n].proc.resume()
            dlsns = await asyncio.gather(*futures)
            peak = (await stat_client.stat())["proxy"]["logs"][env.name]["peak_bytes"]
        for producer in producers:
            await producer.close()
            await producer.pool.close()
        return dlsns, peak

    dlsns, peak = run(scenario(), timeout=120)
    # The bound is checked before each request is queued: it can be passed by at most one
    # request per connection.
    assert peak <= MAX_LOG_BYTES + producers_count * ProducerOptions().max_request_bytes, peak
    assert len(set(dlsns)) == producers_count * 4000
    found = run(records_in_log_raw(env))
    assert found.count(record) == producers_count * 4000


async def records_in_log_raw(env: LogEnv) -> list[bytes]:
    meta = env.meta()
    pool = env.pool(meta)
    try:
        return [r.payload for _, r in await read_back(meta, pool, env.name)]
    finally:
        await pool.close()


def test_malformed_append_is_refused_and_the_agent_keeps_serving(env, cluster):
    env.create_log()

    async def scenario():
        node = cluster.agents["n1"]
        async with AgentClient(node.host, node.port, DEFAULT_SECRET, tls=node.client_tls) as client:
            with pytest.raises(AgentError, match="record"):
                await client.append(env.name, 1, 2, encode_record(b"only one"))
            with pytest.raises(AgentError, match="log name|invalid"):
                await client.append("../etc", 1, 1, encode_record(b"x"))
            with pytest.raises(AgentError, match="does not exist"):
                await client.append("no-such-log", 2, 1, encode_record(b"x"))
            return await client.append(env.name, 3, 2, encode_record(b"a") + encode_record(b"b"), reset_order=True)

    positions = run(scenario())
    assert len(positions) == 2


# -- the command line ----------------------------------------------------------------------------


@pytest.fixture
def cli_env(cluster, tmp_path):
    from dlctl.secrets import write_secret_file

    write_secret_file(tmp_path / "c1.secret", DEFAULT_SECRET)
    tls_dir_for(tmp_path / "c1.secret", "c1")  # the inventory's default tls_dir: the harness CA
    nodes = "\n".join(
        f'[[clusters.c1.regions.{node.region}.racks.a.nodes]]\nid = "{name}"\nhost = "{node.host}"\nlisten = "{node.address}"\n' for name, node in cluster.agents.items()
    )
    path = tmp_path / "config.toml"
    path.write_text(f'[clusters.c1]\nzookeeper = "{cluster.ns.connect_string}"\nsecret_file = "c1.secret"\nzk_auth_file = "{write_harness_zk_auth(tmp_path / "c1.zk-auth")}"\n{nodes}')
    return {**os.environ, "DLCTL_CONFIG": str(path), "DLCTL_CLUSTER": "c1"}


def dlctl(env: dict, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlctl.cli", "-o", "json", *argv], input=stdin, capture_output=True, text=True, timeout=120, env=env)


def test_cli_appends_through_the_owner_shows_it_and_releases_it(env, cli_env, cluster):
    env.create_log()
    lines = "".join(f"line-{i}\n" for i in range(500))
    result = dlctl(cli_env, "--yes", "log", "append", env.name, stdin=lines)
    assert result.returncode == 0, result.stderr
    step = json.loads(result.stdout)["steps"][0]["result"]
    owner = owner_node(env)
    assert step["records"] == 500 and step["via"] == owner
    shown = json.loads(dlctl(cli_env, "log", "show", env.name).stdout)
    assert shown["owner"].startswith(f"{owner}/") and cluster.agents[owner].address in shown["owner"]

    plan = dlctl(cli_env, "log", "release", env.name, "--dry-run")
    assert plan.returncode == 0 and json.loads(plan.stdout)["steps"][0]["action"] == "release-log"
    assert owner_node(env) == owner, "a dry run changes nothing"
    released = dlctl(cli_env, "--yes", "log", "release", env.name)
    assert released.returncode == 0, released.stderr
    assert owner_node(env) is None

    direct = dlctl(cli_env, "--yes", "log", "append", env.name, "--direct", stdin="direct-1\ndirect-2\n")
    assert direct.returncode == 0, direct.stderr
    assert json.loads(direct.stdout)["steps"][0]["result"]["via"] == "library writer"
    assert owner_node(env) is None, "the library writer releases the log when it is done"
    meta = env.meta()
    pool = env.pool(meta)
    payloads = [r.payload for _, r in run(read_back(meta, pool, env.name))]
    run(pool.close())
    assert payloads == [f"line-{i}".encode() for i in range(500)] + [b"direct-1", b"direct-2"]


def test_cli_append_no_idempotence_is_accepted_documented_and_unmarked(env, cli_env):
    """`log append --no-idempotence` is the at-least-once mode: documented in --help, its requests
    carry no producer mark (the default's first record of each request does), and --direct,
    which goes through no proxy, refuses it."""
    from dlctl.errors import ExitCode
    from dlctl.log.idempotence import PRODUCER_HEADER

    helped = dlctl(cli_env, "log", "append", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--no-idempotence" in helped.stdout and "may be stored twice" in helped.stdout

    env.create_log()
    plain = dlctl(cli_env, "--yes", "log", "append", env.name, "--no-idempotence", stdin="".join(f"plain-{i}\n" for i in range(300)))
    assert plain.returncode == 0, plain.stderr
    result = json.loads(plain.stdout)["steps"][0]["result"]
    assert result["records"] == 300 and result["idempotent"] is False
    marked = dlctl(cli_env, "--yes", "log", "append", env.name, stdin="marked-0\nmarked-1\n")
    assert marked.returncode == 0, marked.stderr
    assert json.loads(marked.stdout)["steps"][0]["result"]["idempotent"] is True
    refused = dlctl(cli_env, "--yes", "log", "append", env.name, "--direct", "--no-idempotence", stdin="direct\n")
    assert refused.returncode == ExitCode.USAGE and "--direct" in refused.stderr

    meta = env.meta()
    pool = env.pool(meta)
    records = [r for _, r in run(read_back(meta, pool, env.name))]
    run(pool.close())
    assert [r.payload for r in records] == [f"plain-{i}".encode() for i in range(300)] + [b"marked-0", b"marked-1"]
    assert not any(PRODUCER_HEADER in r.headers for r in records[:300]), "an at-least-once request carries no producer mark"
    assert PRODUCER_HEADER in records[300].headers, "an idempotent request's first record carries its mark"


def test_cli_release_refuses_a_library_writer_unless_forced(env, cli_env):
    env.create_log()

    async def hold_and_release() -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess, bool]:
        writer = await env.writer()
        await writer.append(b"held")
        loop = asyncio.get_running_loop()
        refused = await loop.run_in_executor(None, lambda: dlctl(cli_env, "--yes", "log", "release", env.name))
        forced = await loop.run_in_executor(None, lambda: dlctl(cli_env, "--yes", "log", "release", env.name, "--force"))
        await eventually(lambda: writer.error is not None, message="the deposed writer to notice")
        lost = writer.error is not None
        await writer.close()
        return refused, forced, lost

    refused, forced, lost = run(hold_and_release())
    assert refused.returncode == 4 and "library writer" in refused.stderr
    assert forced.returncode == 0, forced.stderr
    assert lost and owner_node(env) is None


def test_an_idle_log_is_released_and_claimed_again_on_the_next_append(zk, procs, tmp_path):
    from dlctl.log.pool import AgentPool

    node, meta = solo_agent(zk, procs, tmp_path, "idle", "[proxy]\nidle_release_seconds = 1\n")

    async def scenario():
        pool = AgentPool(meta, harness_credentials())
        producer = LogProducer(meta, pool, "idle")
        await producer.append(b"one")
        assert meta.owner_of("idle") is not None
        await eventually(lambda: meta.owner_of("idle") is None, timeout=10, message="the idle log to be released")
        await producer.append(b"two")
        await producer.close()
        await pool.close()

    run(scenario())
    segments = meta.segments("idle")
    assert [s.value.state.value for s in segments] == ["completed", "inprogress"]
    assert meta.owner_of("idle") is not None


def stream_records(first: int, last: int) -> bytes:
    """Records as a replication worker sends them: each carries its source position (origin)."""
    from dlctl.replication.origin import ORIGIN_CLUSTER, ORIGIN_DLSN, VECTOR_TIME

    return b"".join(
        encode_record(f"east-{i}".encode(), headers={ORIGIN_CLUSTER: b"east", ORIGIN_DLSN: f"1/{i}/0".encode(), VECTOR_TIME: f"east={i}".encode()})
        for i in range(first, last + 1)
    )


async def stream_payloads(env: LogEnv) -> list[bytes]:
    return [p for p in await records_in_log_raw(env) if p.startswith(b"east-")]


def test_resent_stream_records_are_applied_once_by_the_owner(env, cluster):
    env.create_log()

    async def scenario():
        node = cluster.agents["n2"]
        async with AgentClient(node.host, node.port, DEFAULT_SECRET, tls=node.client_tls) as client:
            first = await client.append(env.name, 11, 10, stream_records(1, 10))
            again = await client.append(env.name, 11, 11, stream_records(5, 15))
        return first, again

    first, again = run(scenario())
    assert again[:6] == [first[-1]] * 6, "a resent record is answered with the copy already in the log"
    assert len(set(again[6:])) == 5 and min(again[6:]) > first[-1]
    assert run(stream_payloads(env)) == [f"east-{i}".encode() for i in range(1, 16)]


def test_a_new_owner_drops_stream_records_its_dead_predecessor_already_wrote(env, cluster):
    env.create_log()

    async def scenario():
        meta = env.meta()
        pool = env.pool(meta)
        producer = LogProducer(meta, pool, env.name)
        await producer.append(b"claim")  # some agent owns the log now
        owner = owner_node(env)
        node = cluster.agents[owner]
        async with AgentClient(node.host, node.port, DEFAULT_SECRET, tls=node.client_tls) as client:
            await client.append(env.name, 12, 10, stream_records(1, 10))
        node.proc.kill()  # as if the acknowledgement of 1..10 had been lost with it
        other = next(n for n in cluster.agents if n != owner)
        peer = cluster.agents[other]

        async def resend() -> list:
            async with AgentClient(peer.host, peer.port, DEFAULT_SECRET, tls=peer.client_tls, request_timeout=30) as client:
                try:
                    return await client.append(env.name, 12, 15, stream_records(1, 15))
                except NotOwnerError:
                    return []  # the dead owner's session has not expired yet

        positions = await eventually(resend, timeout=15, message="another agent to take the log over")
        await producer.close()
        await pool.close()
        return positions

    positions = run(scenario(), timeout=60)
    assert len(positions) == 15
    assert run(stream_payloads(env)) == [f"east-{i}".encode() for i in range(1, 16)], "each stream record exactly once"
