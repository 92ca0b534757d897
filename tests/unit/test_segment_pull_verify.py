"""The task's side of a pulled copy (``dlctl.spark.task._pull``): it trusts nothing the puller
says that the members' own DIGESTs do not confirm, and relays when the puller refuses. The agents
are faked (pure logic); real pulls run in tests/integration/test_bootstrap.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dlctl.log.errors import AgentIOError, BadRequestError, PullRefusedError
from dlctl.log.protocol import SegmentDigest
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.placement import PlacementPolicy
from dlctl.spark import plan as P
from dlctl.spark import task as T
from dlctl.spark.credentials import SecretRef
from dlctl.spark.segment_read import CopyFailed

ENSEMBLE = ("w1", "w2", "w3")
SOURCE = SegmentRecord(5, SegmentState.COMPLETED, (EnsembleChange(0, ("e1", "e2", "e3")),), 3, 2, 1.0, last_entry_id=9, bytes=10_000)


def task() -> P.SegmentTask:
    return P.SegmentTask("orders", "east", 7, SOURCE, "west", 9, 3, PlacementPolicy(ensemble_size=3, write_quorum=2, ack_quorum=2), {"east": 1}, False)


def endpoints(tmp_path: Path) -> T.Endpoints:
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 32)
    secret.chmod(0o600)
    ref = SecretRef(path=secret)
    return T.Endpoints("east", {}, ref, "west", {}, ref)


def held(node: str) -> int:
    """Entries 0..9 striped over E=3 with W=2: what a member's write sets hold (the oracle)."""
    return sum(1 for e in range(10) if node in {ENSEMBLE[e % 3], ENSEMBLE[(e + 1) % 3]})


class Agent:
    def __init__(self, node: str, stores: dict[str, tuple[int, str]], answer=None) -> None:
        self.node, self.stores, self.answer = node, stores, answer
        self.pulls = 0

    async def pull_segment(self, body: bytes, **_):
        self.pulls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return dict(self.answer)

    async def digest(self, log_id: int, seq: int) -> SegmentDigest:
        entries, digest = self.stores[self.node]
        return SegmentDigest(log_id, seq, entries, 0, 9, 9, 0, digest)


def answer(replicas: dict) -> dict:
    return {"entries": 10, "records": 10, "source_records": 10, "source_digest": "d", "sink_digest": "d", "replicas": replicas}


def run_pull(tmp_path, stores, reply):
    clients = {n: Agent(n, stores, reply) for n in ENSEMBLE}
    result = asyncio.run(T._pull(task(), endpoints(tmp_path), ENSEMBLE, clients, "segment 5 of log 'orders'"))  # type: ignore[arg-type]
    return result, clients


def test_members_whose_digests_match_what_the_puller_handed_them_verify(tmp_path):
    stores = {n: (held(n), f"digest-{n}") for n in ENSEMBLE}
    result, clients = run_pull(tmp_path, stores, answer({n: {"entries": held(n), "digest": f"digest-{n}"} for n in ENSEMBLE}))
    assert result["replica_check"] == {n: "ok" for n in ENSEMBLE} and result["pulled"] is True
    assert P.verification_problem(dict(result, log="orders", source_seq=5)) is None
    assert sum(c.pulls for c in clients.values()) == 1  # one member pulls, and forwards
    assert result["puller"] == ENSEMBLE[SOURCE.seq % 3]


@pytest.mark.parametrize(
    ("stores", "said", "why"),
    [
        # a member holds other bytes than the puller says it handed it
        ({"w1": (held("w1"), "digest-w1"), "w2": (held("w2"), "other"), "w3": (held("w3"), "digest-w3")}, None, "w2"),
        # the puller says it handed a member fewer entries than its write sets hold, and the member agrees
        ({"w1": (held("w1") - 1, "digest-w1"), "w2": (held("w2"), "digest-w2"), "w3": (held("w3"), "digest-w3")}, {"w1": held("w1") - 1}, "w1"),
    ],
)
def test_a_member_that_does_not_hold_exactly_its_entries_fails_verification(tmp_path, stores, said, why):
    counts = {n: (said or {}).get(n, held(n)) for n in ENSEMBLE}
    result, _ = run_pull(tmp_path, stores, answer({n: {"entries": counts[n], "digest": f"digest-{n}"} for n in ENSEMBLE}))
    assert result["replica_check"][why] != "ok"
    problem = P.verification_problem(dict(result, log="orders", source_seq=5))
    assert problem is not None and why in problem


def test_an_answer_for_other_members_than_the_ensemble_is_refused(tmp_path):
    stores = {n: (held(n), f"digest-{n}") for n in ENSEMBLE}
    with pytest.raises(CopyFailed, match="not the ensemble"):
        run_pull(tmp_path, stores, answer({"w1": {"entries": held("w1"), "digest": "digest-w1"}}))


@pytest.mark.parametrize("refusal", [PullRefusedError("source cluster 'east' is not declared on agent w3"), BadRequestError("unknown opcode 16 in request 9")])
def test_a_puller_that_does_not_read_the_source_or_predates_the_op_means_relay(tmp_path, refusal):
    result, _ = run_pull(tmp_path, {}, refusal)
    assert result is None


def test_a_puller_that_fails_fails_the_copy_naming_it(tmp_path):
    with pytest.raises(CopyFailed, match=r"sink agent w3 could not pull it: disk full"):
        run_pull(tmp_path, {}, AgentIOError("disk full"))
