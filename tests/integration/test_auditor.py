"""The re-replication auditor against real ZooKeeper and four real agents.

Each test starts its own four agents (two regions, two racks each) with a short grace, writes a
closed log with E=W=3, A=2 across them and then kills agents. Results are checked on what the
agents really hold (``assert_fully_replicated`` from the re-replication tests) and in the
metadata (segments, op records, the election's contenders).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from dlagent.auditor import election_path, set_cluster_switch
from harness.agents import AgentNode
from harness.procs import wait_until
from kazoo.client import KazooClient
from test_rereplication import assert_fully_replicated, read_back, run, write

from dlctl.log.rereplication import members
from dlctl.meta.records import LogConfig
from dlctl.meta.store import MetaStore

pytestmark = [pytest.mark.zk, pytest.mark.agent]

CLUSTER = "c1"
GRACE, CHECK = 2.0, 0.5
LAYOUT = {"n1": ("ra", "rack1"), "n2": ("ra", "rack2"), "n3": ("rb", "rack1"), "n4": ("rb", "rack2")}
ENTRIES = 300


def auditor_toml(enabled: bool = True, grace: float = GRACE, check: float = CHECK) -> str:
    return f"[auditor]\nenabled = {str(enabled).lower()}\ngrace_seconds = {grace}\ncheck_seconds = {check}\n"


class Setup:
    def __init__(self, procs, tmp_path, zk, *, enabled: bool = True, grace: float = GRACE) -> None:
        self.admin: KazooClient = zk.client()
        self.meta = MetaStore(self.admin, CLUSTER)
        self.grace = grace
        self.agents = {
            n: AgentNode(procs, tmp_path, zk.connect_string, cluster=CLUSTER, node_id=n, region=r, rack=k, extra_config=auditor_toml(enabled, grace))
            for n, (r, k) in LAYOUT.items()
        }

    def start(self) -> Setup:
        for node in self.agents.values():
            node.start(wait=False)
        for node in self.agents.values():
            node.wait_ready(self.admin)
        return self

    def write_log(self, name: str) -> None:
        self.meta.create_log(name, LogConfig(3, 3, 2))
        _, pool = run(write(self.meta, name, ENTRIES, roll_bytes=20_000))
        run(pool.close())
        assert len(self.meta.segments(name)) >= 2

    def contenders(self) -> list[str]:
        return self.admin.Election(election_path(CLUSTER)).contenders()

    def leader(self, among: set[str] | None = None) -> str:
        """The elected auditor, once every live enabled agent stands in the election."""
        among = set(self.agents) if among is None else among
        wait_until(lambda: set(self.contenders()) == among, 20, message=f"contenders {sorted(among)}")
        leader = self.contenders()[0]
        wait_until(lambda: "elected re-replication auditor" in self.agents[leader].proc.output(), 20, message=f"{leader} acting as auditor", watch=self.agents[leader].proc)
        return leader

    def named(self, name: str) -> set[str]:
        return set().union(*(members(s.value) for s in self.meta.segments(name)))

    def ops(self) -> list[dict[str, Any]]:
        return [self.meta.get_op(op_id).value for op_id in self.meta.list_ops()]

    def kill(self, node: str) -> float:
        self.agents[node].proc.kill()
        killed = time.monotonic()
        # Gone for ZooKeeper once its session expires (session_timeout 2 s in the harness).
        wait_until(lambda: node not in self.meta.available_nodes(), 20, message=f"{node} gone from available/")
        return killed

    def victim(self, name: str, leader: str) -> str:
        """An ensemble member of the log's first segment that is not the auditor."""
        return min(members(self.meta.segments(name)[0].value) - {leader})


def holds_for(predicate: Callable[[], bool], seconds: float, message: str) -> None:
    """A bounded negative check: ``predicate`` must stay true for ``seconds``. There is no event
    to await for "nothing happened", so this one observes for a fixed time (polling, 0.2 s)."""
    deadline = time.monotonic() + seconds
    pause = threading.Event()
    while time.monotonic() < deadline:
        assert predicate(), message
        pause.wait(0.2)
    assert predicate(), message


def test_the_auditor_rereplicates_a_dead_agent_after_the_grace_exactly_once(procs, tmp_path, zk):
    s = Setup(procs, tmp_path, zk).start()
    s.write_log("audited")
    leader = s.leader()
    victim = s.victim("audited", leader)
    killed = s.kill(victim)

    wait_until(lambda: victim not in s.named("audited"), 60, message=f"no segment names {victim}", watch=s.agents[leader].proc)
    # Never before the grace: the absence only starts once the session has expired.
    assert time.monotonic() - killed > GRACE
    run(assert_fully_replicated(s.meta, "audited", {victim}))
    assert run(read_back(s.meta, "audited", ENTRIES)) == [f"audited-{i:06d}".encode() * 20 for i in range(ENTRIES)]

    # The auditor re-planned after its run and found nothing left (a positive event to await
    # instead of waiting for a duplicate that should not come).
    out = lambda: s.agents[leader].proc.output()
    wait_until(lambda: f"nothing (more) to re-replicate for gone agent(s) {victim}" in out(), 20, message="the auditor settled")
    (op,) = s.ops()
    assert op["kind"] == "rereplicate" and op["lost"] == [victim] and op["state"] == "done", op
    # Exactly one auditor acted: no other agent started an operation.
    for node, agent in s.agents.items():
        if node not in (leader, victim):
            assert "re-replicating" not in agent.proc.output(), f"{node} acted without being elected"

    # SIGTERM stops the auditor cleanly, contender or elected, and the elected one gives up the
    # role at once (no session expiry to wait for).
    follower = min(set(s.agents) - {leader, victim})
    assert s.agents[follower].proc.terminate(10) == 0
    assert s.agents[leader].proc.terminate(10) == 0
    (rest,) = set(s.agents) - {leader, victim, follower}
    assert s.leader({rest}) == rest


def test_killing_the_elected_auditor_moves_the_role_and_its_data_is_rereplicated(procs, tmp_path, zk):
    s = Setup(procs, tmp_path, zk).start()
    s.write_log("takeover")
    leader = s.leader()
    assert leader in s.named("takeover")  # three of four agents hold every segment: make sure
    s.kill(leader)

    successor = s.leader(set(s.agents) - {leader})
    assert successor != leader
    wait_until(lambda: leader not in s.named("takeover"), 60, message=f"no segment names the old auditor {leader}", watch=s.agents[successor].proc)
    run(assert_fully_replicated(s.meta, "takeover", {leader}))
    wait_until(lambda: f"nothing (more) to re-replicate for gone agent(s) {leader}" in s.agents[successor].proc.output(), 20, message="the new auditor settled")
    (op,) = s.ops()
    assert op["lost"] == [leader] and op["state"] == "done"


@pytest.mark.parametrize("switch", ["agent-config", "cluster-znode"])
def test_a_switched_off_auditor_leaves_dead_agents_alone(procs, tmp_path, zk, switch):
    s = Setup(procs, tmp_path, zk, enabled=(switch != "agent-config"))
    if switch == "cluster-znode":
        set_cluster_switch(s.admin, CLUSTER, False)
    s.start()
    s.write_log("off")
    if switch == "agent-config":
        assert s.contenders() == []  # disabled agents do not even stand for election
        leader = None
    else:
        leader = s.leader()
    victim = s.victim("off", leader or "")
    s.kill(victim)
    if leader:
        # The auditor is running and looking: it reads the switch on every check.
        wait_until(lambda: "switched off cluster-wide" in s.agents[leader].proc.output() or victim not in s.named("off"), 20, message="the auditor saw the switch")
    before = {seg.value.seq: seg.value for seg in s.meta.segments("off")}
    # Bounded negative check: 3x the grace (plus the check interval) with nothing changing.
    holds_for(lambda: {seg.value.seq: seg.value for seg in s.meta.segments("off")} == before and not s.ops(), 3 * GRACE + CHECK, "the metadata changed although auditing is off")
    assert victim in s.named("off")

    if switch == "cluster-znode":
        # Switching it back on is live: the grace starts again and the auditor acts.
        set_cluster_switch(s.admin, CLUSTER, True)
        wait_until(lambda: victim not in s.named("off"), 60, message="re-replicated after switching back on")
        run(assert_fully_replicated(s.meta, "off", {victim}))


def test_an_agent_back_within_the_grace_is_not_rereplicated(procs, tmp_path, zk):
    grace = 6.0
    s = Setup(procs, tmp_path, zk, grace=grace).start()
    s.write_log("back")
    leader = s.leader()
    victim = s.victim("back", leader)
    out = lambda: s.agents[leader].proc.output()
    s.kill(victim)
    wait_until(lambda: f"agent {victim} is gone" in out(), 20, message=f"the auditor saw {victim} gone")
    seen_gone = time.monotonic()
    s.agents[victim].start(zk=s.admin)
    wait_until(lambda: f"agent {victim} is back" in out(), 20, message=f"the auditor saw {victim} back")
    assert time.monotonic() - seen_gone < grace, "the restart took longer than the grace: the test proves nothing"
    before = {seg.value.seq: seg.value for seg in s.meta.segments("back")}
    # Bounded negative check: until well past when the grace would have run out had the
    # absence not been reset.
    holds_for(lambda: {seg.value.seq: seg.value for seg in s.meta.segments("back")} == before and not s.ops(), max(0.0, seen_gone + 2 * grace - time.monotonic()), "re-replicated an agent that came back")
    assert "re-replicating" not in out()
