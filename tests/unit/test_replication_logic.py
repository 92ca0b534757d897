"""Pure parts of replication: origin headers, stream records, the bootstrap decision, the
claim balancing rule, the monitoring verdict, and the agent's [replication] table."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlctl.errors import ConfigError
from dlctl.log.dlsn import DLSN, INITIAL
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState
from dlctl.ops.streams import check
from dlctl.replication.assignment import plan_claims, target_load
from dlctl.replication.decision import (
    Decision,
    LogFacts,
    decide,
    gated,
    first_retained,
    start_position,
)
from dlctl.replication.origin import (
    Origin,
    OriginHeaderError,
    decode_source_position,
    decode_vt,
    encode_source_position,
    encode_vt,
    user_headers,
)
from dlctl.replication.records import (
    Checkpoint,
    StreamConfig,
    StreamState,
    StreamStatus,
)

# -- origin headers ---------------------------------------------------------------------------


def test_origin_headers_round_trip_and_local_records_have_none():
    origin = Origin("east", DLSN(3, 17, 2), {"east": 4, "west": 9})
    headers = {**origin.headers(), "app": b"x"}
    assert Origin.from_headers(headers) == origin
    assert Origin.from_headers({"app": b"x"}) is None
    assert user_headers(headers) == {"app": b"x"}
    assert encode_vt({"b": 2, "a": 1, "z": 0}) == b"a=1,b=2"
    assert decode_source_position({"dl.src": encode_source_position("east", DLSN(1, 2, 3))}) == ("east", DLSN(1, 2, 3))


@pytest.mark.parametrize("raw", [b"a=x", b"a", b"../x=1", b"a=-1", b"\xff=1"])
def test_malformed_vector_time_is_an_error_naming_the_header(raw):
    with pytest.raises(OriginHeaderError, match="dl.vt"):
        decode_vt(raw)


def test_malformed_origin_is_an_error():
    with pytest.raises(OriginHeaderError):
        Origin.from_headers({"dl.origin.cluster": b"east", "dl.origin.dlsn": b"nope"})
    with pytest.raises(OriginHeaderError):
        Origin.from_headers({"dl.origin.cluster": b"../etc", "dl.origin.dlsn": b"1/0/0"})


@settings(max_examples=100)
@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), st.integers(1, 2**40), max_size=6))
def test_vector_time_encoding_round_trips(vt):
    assert decode_vt(encode_vt(vt)) == vt


# -- records ----------------------------------------------------------------------------------


def test_stream_records_round_trip_and_reject_nonsense():
    config = StreamConfig("a-to-b", "a", "zk:2181/x", "b", ("l1", "l2"), bidirectional=True, throttle_bytes_per_second=100, created=1.0)
    assert StreamConfig.from_json(config.to_json(), "w") == config
    cp = Checkpoint("l1", next=DLSN(2, 3, 4), source_vv={"a": 3}, sink_vv={"c": 1}, sink_dlsn=DLSN(1, 1, 0), applied_records=5)
    assert Checkpoint.from_json(cp.to_json(), "w") == cp
    assert Checkpoint.from_json(Checkpoint("l1").to_json(), "w").sink_dlsn is None
    status = StreamStatus(StreamState.PAUSED, 5.0, "pause")
    assert StreamStatus.from_json(status.to_json(), "w") == status
    with pytest.raises(ValueError, match="same cluster"):
        StreamConfig("x", "a", "zk", "a", ())
    with pytest.raises(ValueError, match="invalid log name"):
        StreamConfig("x", "a", "zk", "b", ("../etc",))
    with pytest.raises(ValueError, match="where: malformed checkpoint"):
        Checkpoint.from_json(b'{"log": "l", "next": "bad"}', "where")


# -- the bootstrap decision -------------------------------------------------------------------


def seg(seq: int, state=SegmentState.COMPLETED, min_active: int = 0) -> SegmentRecord:
    return SegmentRecord(seq, state, (EnsembleChange(0, ("n1",)),), 1, 1, 0.0, min_active_entry=min_active)


def test_first_retained_position():
    assert first_retained([], 0) is None
    assert first_retained([seg(1), seg(2)], 2) is None
    assert first_retained([seg(1, SegmentState.TRUNCATED), seg(2)], 2) == DLSN(2, 0, 0)
    assert first_retained([seg(1, SegmentState.PARTIALLY_TRUNCATED, 7), seg(2)], 2) == DLSN(1, 7, 0)
    assert first_retained([seg(3)], 3) == DLSN(3, 0, 0)
    assert first_retained([], 4) == DLSN(5, 0, 0)  # everything deleted


def facts(**kw) -> LogFacts:
    base = dict(log="l", source_first=None, source_records=10, sink_exists=False, sink_records=0)
    return LogFacts(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "bidirectional", "expected", "why"),
    [
        ({}, False, Decision.START, "whole log"),
        ({"source_records": 0}, False, Decision.START, "empty"),
        ({"sink_exists": True, "sink_records": 0}, False, Decision.START, "whole log"),
        ({"sink_exists": True, "sink_records": 3}, False, Decision.BOOTSTRAP, "already holds 3"),
        ({"sink_exists": True, "sink_records": 3, "source_records": 0}, True, Decision.START, "empty"),
        ({"sink_exists": True, "sink_records": 3}, True, Decision.START, "causality filter skips what the sink's 3 hold"),
        ({"source_first": DLSN(2, 0, 0)}, False, Decision.BOOTSTRAP, "no longer holds the whole log"),
        ({"checkpoint_next": DLSN(3, 1, 0), "source_first": DLSN(2, 0, 0)}, False, Decision.RESUME, "still retained"),
        ({"checkpoint_next": DLSN(1, 1, 0), "source_first": DLSN(2, 0, 0)}, False, Decision.BOOTSTRAP, "no longer holds checkpoint"),
        ({"checkpoint_next": DLSN(3, 1, 0), "needs_bootstrap": "gc"}, False, Decision.BOOTSTRAP, "gc"),
        ({"checkpoint_next": DLSN(3, 1, 0), "sink_records": 50}, False, Decision.RESUME, "retained"),
    ],
)
def test_bootstrap_decision(kw, bidirectional, expected, why):
    decision, reason = decide(facts(**kw), bidirectional=bidirectional)
    assert decision is expected and why in reason
    start = start_position(decision, facts(**kw))
    assert start == (kw["checkpoint_next"] if decision is Decision.RESUME else INITIAL)


def test_a_new_causal_connection_from_a_truncated_source_streams_behind_the_location_addition_rule():
    truncated = dict(source_first=DLSN(3, 0, 0), sink="d", source_dvv={"a": 2, "d": 9})
    # The sink lacks a's events 1..2 (its own, d's, never count): it waits, and says which.
    f = facts(**truncated, sink_cvv={"a": 0, "b": 4})
    decision, reason = decide(f, bidirectional=True)
    assert decision is Decision.WAIT and "(a 1..2)" in reason
    assert start_position(decision, f) == DLSN(3, 0, 0) and gated(decision, f, bidirectional=True)
    # The sink holds them already (through another peer): no wait, no copy.
    f = facts(**truncated, sink_cvv={"a": 2})
    decision, _ = decide(f, bidirectional=True)
    assert decision is Decision.START and start_position(decision, f) == DLSN(3, 0, 0) and gated(decision, f, bidirectional=True)
    # Unknown deletion vector (truncated with no base), or a one-way stream: a copy, as before.
    assert decide(facts(source_first=DLSN(3, 0, 0), sink="d"), bidirectional=True)[0] is Decision.BOOTSTRAP
    assert decide(facts(**truncated, sink_cvv={}), bidirectional=False)[0] is Decision.BOOTSTRAP
    # An existing stream is no new connection: never gated.
    f = facts(**truncated, sink_cvv={}, checkpoint_next=DLSN(4, 0, 0))
    assert decide(f, bidirectional=True)[0] is Decision.RESUME and not gated(Decision.RESUME, f, bidirectional=True)
    # A source that holds its whole log deleted nothing: a plain start, not gated.
    f = facts(sink="d", source_dvv={}, sink_cvv={})
    assert decide(f, bidirectional=True)[0] is Decision.START and not gated(Decision.START, f, bidirectional=True)


# -- claims -----------------------------------------------------------------------------------


def test_target_load():
    assert target_load(0, 3) == 0 and target_load(7, 3) == 3 and target_load(2, 0) == 2


def test_agents_claim_up_to_their_share_and_hand_over_to_a_new_agent():
    work = [("s", f"l{i}") for i in range(6)]
    plan = plan_claims(work, {}, "n1", ["n1", "n2", "n3"], {}, grace=10)
    assert len(plan.claim) == 2 and not plan.release
    # n1 holds everything; n2 and n3 are idle: n1 gives one back per round.
    plan = plan_claims(work, {w: "n1" for w in work}, "n1", ["n1", "n2", "n3"], {}, grace=10)
    assert plan.claim == () and len(plan.release) == 1
    # Balanced: nothing moves.
    claims = {w: f"n{i % 3 + 1}" for i, w in enumerate(work)}
    for me in ("n1", "n2", "n3"):
        assert plan_claims(work, claims, me, ["n1", "n2", "n3"], {}, grace=10) == plan_claims([], {}, me, [], {}, 10)


def test_work_left_unclaimed_past_the_grace_is_claimed_above_the_share():
    work = [("s", "l0"), ("s", "l1")]
    claims = {("s", "l0"): "n1"}
    assert plan_claims(work, claims, "n1", ["n1", "n2"], {("s", "l1"): 1.0}, grace=10).claim == ()
    assert plan_claims(work, claims, "n1", ["n1", "n2"], {("s", "l1"): 11.0}, grace=10).claim == (("s", "l1"),)


@settings(max_examples=200)
@given(st.integers(0, 30), st.integers(1, 6), st.randoms(use_true_random=False))
def test_repeated_rounds_converge_to_a_balanced_assignment(n_work, n_agents, rnd):
    work = [("s", f"l{i}") for i in range(n_work)]
    agents = [f"n{i}" for i in range(n_agents)]
    claims: dict = {}
    for _ in range(4 * (n_work + 1)):
        me = rnd.choice(agents)
        plan = plan_claims(work, claims, me, agents, {}, grace=1e9)
        for item in plan.release:
            del claims[item]
        for item in plan.claim:
            claims.setdefault(item, me)  # a claim is a create: the first one wins
    for _ in range(3):
        for me in agents:  # a final few rounds by everyone
            plan = plan_claims(work, claims, me, agents, {}, grace=1e9)
            for item in plan.release:
                del claims[item]
            for item in plan.claim:
                claims.setdefault(item, me)
    assert set(claims) == set(work)
    loads = [sum(1 for v in claims.values() if v == a) for a in agents]
    assert max(loads) <= target_load(n_work, n_agents)


# -- the monitoring verdict -------------------------------------------------------------------


def row(**kw):
    base = {"log": "l", "state": "running", "lag_records": 0, "lag_seconds": 0.0, "last_error": None, "last_error_ago": None, "needs_bootstrap": None}
    return {**base, **kw}


@pytest.mark.parametrize(
    ("rows", "code"),
    [
        ([row()], 0),
        ([row(lag_records=50)], 2),
        ([row(lag_seconds=31.0, lag_records=5)], 2),
        ([row(state="paused", lag_records=5)], 1),
        ([row(last_error="boom", last_error_ago=3.0)], 1),
        ([row(lag_records="unknown (unreachable)", lag_seconds=None)], 1),
        ([row(needs_bootstrap="pin expired")], 2),
        ([row(), row(log="m", state="waiting for a worker")], 1),
    ],
)
def test_check_verdict(rows, code):
    assert check({"logs": rows}, max_lag_seconds=30, max_lag_records=10)[0] == code


# -- agent configuration ----------------------------------------------------------------------


def test_replication_table_of_the_agent_config(tmp_path: Path):
    from dlagent.replication_config import parse_replication

    settings_ = parse_replication(
        {"poll_seconds": 0.5, "sources": {"east": {"zookeeper": "zk:1/x", "secret_file": "east.secret", "region": "r1", "addresses": {"n1": "127.0.0.1:9"}}}},
        tmp_path / "agent.toml",
    )
    assert settings_.poll_seconds == 0.5 and settings_.sources["east"].secret_file == (tmp_path / "east.secret").resolve()
    assert parse_replication({}, tmp_path / "a.toml").enabled is True
    assert parse_replication({}, tmp_path / "a.toml").poll_depth == 8
    assert parse_replication({"poll_depth": 8}, tmp_path / "a.toml").poll_depth == 8
    for bad, message in [
        ({"pole_seconds": 1}, "unknown key"),
        ({"poll_depth": 0}, "poll_depth"),
        ({"poll_depth": True}, "poll_depth"),
        ({"poll_seconds": True}, "poll_seconds"),
        ({"sources": {"east": {"secret": "x"}}}, "unknown key"),
        ({"sources": {"../x": {}}}, "invalid cluster name"),
        ({"sources": {"east": {"addresses": {"n1": 3}}}}, "addresses"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_replication(bad, tmp_path / "agent.toml")


def test_replication_sources_take_tls_files_all_or_none(tmp_path: Path):
    """A source cluster with a CA of its own: its CA bundle and a certificate it issued to this
    agent, relative to the config file. Without them the source is reached with the agent's own
    [tls] (clusters sharing one CA), so the source settings carry none."""
    from dlagent.replication_config import parse_replication

    keys = {"tls_ca_file": "east-tls/ca.pem", "tls_cert_file": "east-tls/client.pem", "tls_key_file": "/etc/dlagent/east.key"}
    sources = parse_replication({"sources": {"east": {"zookeeper": "zk:1/x", **keys}, "west": {"zookeeper": "zk:2/y"}}}, tmp_path / "agent.toml").sources
    tls = sources["east"].tls
    assert tls is not None
    assert tls.ca_file == (tmp_path / "east-tls" / "ca.pem").resolve()
    assert tls.cert_file == (tmp_path / "east-tls" / "client.pem").resolve()
    assert tls.key_file == Path("/etc/dlagent/east.key")
    assert sources["west"].tls is None
    for missing in keys:
        partial = {k: v for k, v in keys.items() if k != missing}
        with pytest.raises(ConfigError, match="give all of tls_ca_file, tls_cert_file, tls_key_file or none"):
            parse_replication({"sources": {"east": partial}}, tmp_path / "agent.toml")
    with pytest.raises(ConfigError, match="key 'tls_ca_file' must be a string"):
        parse_replication({"sources": {"east": {**keys, "tls_ca_file": 3}}}, tmp_path / "agent.toml")
    with pytest.raises(ConfigError, match="unknown key"):
        parse_replication({"sources": {"east": {**keys, "tls_verify": "none"}}}, tmp_path / "agent.toml")
