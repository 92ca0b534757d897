"""The owner's table of idempotent producers (dlctl.log.idempotence): each request number is
applied once, a resend gets its first positions, zombies and gaps are refused, state is bounded
by a TTL and a producer count, and a request mark survives the round trip through a header."""

from __future__ import annotations

import pytest

from dlctl.log.errors import DuplicateTooOldError, OutOfOrderSequenceError, ProducerFencedError, UnknownProducerError
from dlctl.log.idempotence import PRODUCER_HEADER, RETAINED, ProducerMark, ProducerTable, producer_mark


def apply(table: ProducerTable, producer: int, epoch: int, seq: int, now: float = 0.0) -> list[str]:
    assert table.check(producer, epoch, seq, now) is None, f"request {seq} should be new"
    results = [f"{producer}/{epoch}/{seq}"]
    table.applied(producer, epoch, seq, results, now)
    return results


def test_each_number_is_applied_once_and_a_resend_gets_the_first_results():
    table = ProducerTable(ttl=60)
    first = [apply(table, 7, 0, seq) for seq in range(1, 5)]
    for seq in range(1, 5):
        duplicate = table.check(7, 0, seq, 1.0)
        assert duplicate is not None and duplicate.results is first[seq - 1]
    assert table.check(7, 0, 5, 1.0) is None  # the next one is new
    assert table.counters["duplicates"] == 4


def test_a_new_producer_must_start_at_one_and_an_unknown_one_is_refused_later():
    table = ProducerTable(ttl=60)
    with pytest.raises(UnknownProducerError, match="request 3 from a producer this owner holds no state for.*nothing written"):
        table.check(9, 0, 3, 0.0)
    assert table.check(9, 0, 1, 0.0) is None


def test_an_older_epoch_is_fenced_and_a_newer_one_starts_again_at_one():
    table = ProducerTable(ttl=60)
    apply(table, 7, 0, 1)
    apply(table, 7, 0, 2)
    with pytest.raises(OutOfOrderSequenceError, match="new epoch must start at request 1, got 3"):
        table.check(7, 1, 3, 0.0)
    apply(table, 7, 1, 1)  # the new incarnation
    with pytest.raises(ProducerFencedError, match="fenced by epoch 1"):
        table.check(7, 0, 3, 0.0)  # the zombie's next request
    with pytest.raises(ProducerFencedError):
        table.check(7, 0, 2, 0.0)  # or its resend
    assert table.counters["fenced"] == 2


def test_a_gap_is_refused_and_a_repeat_older_than_the_retained_window_too():
    table = ProducerTable(ttl=60)
    for seq in range(1, RETAINED + 3):
        apply(table, 7, 0, seq)
    with pytest.raises(OutOfOrderSequenceError, match=f"request {RETAINED + 4} after {RETAINED + 2}"):
        table.check(7, 0, RETAINED + 4, 0.0)
    with pytest.raises(DuplicateTooOldError, match="older than the last"):
        table.check(7, 0, 2, 0.0)  # applied, but its positions are forgotten
    assert table.check(7, 0, 3, 0.0) is not None  # the oldest one still remembered


def test_an_idle_producer_expires_and_its_resend_is_refused_not_duplicated():
    table = ProducerTable(ttl=10)
    apply(table, 7, 0, 1, now=0.0)
    apply(table, 8, 0, 1, now=5.0)
    assert table.check(7, 0, 1, 9.9) is not None  # still known
    with pytest.raises(UnknownProducerError, match="a retry of request 1 .*producer_id_ttl = 10s"):
        table.check(7, 0, 1, 20.0, retry=True)  # its first request, resent after the TTL
    with pytest.raises(UnknownProducerError):
        table.check(7, 0, 2, 20.0)  # its next one
    assert table.counters["expired"] == 2 and len(table) == 0
    assert table.check(7, 0, 1, 20.0) is None  # a first attempt of request 1: a new producer (epoch)


def test_a_retry_is_answered_from_state_when_the_owner_knows_the_producer():
    table = ProducerTable(ttl=60)
    first = apply(table, 7, 0, 1)
    assert table.check(7, 0, 1, 0.0, retry=True).results is first
    assert table.check(7, 0, 2, 0.0, retry=True) is None  # never written: the next number


def test_past_the_producer_limit_the_least_recently_seen_is_forgotten():
    table = ProducerTable(ttl=60, max_producers=2)
    apply(table, 1, 0, 1)
    apply(table, 2, 0, 1)
    table.check(1, 0, 1, 0.0)  # 1 seen again: 2 is now the least recently seen
    apply(table, 3, 0, 1)
    assert table.counters["evicted"] == 1 and len(table) == 2
    with pytest.raises(UnknownProducerError):
        table.check(2, 0, 2, 0.0)
    assert table.check(1, 0, 2, 0.0) is None


def test_restoring_from_the_log_keeps_the_newest_of_each_producer():
    table = ProducerTable(ttl=60)
    table.restore(ProducerMark(7, 0, 4, 1), ["a"], 0.0)
    table.restore(ProducerMark(7, 0, 5, 1), ["b"], 0.0)
    table.restore(ProducerMark(7, 0, 3, 1), ["stale"], 0.0)  # older than what is known: ignored
    assert table.check(7, 0, 5, 0.0).results == ["b"]
    assert table.check(7, 0, 4, 0.0).results == ["a"]
    assert table.check(7, 0, 6, 0.0) is None


def test_a_mark_round_trips_through_its_header_and_a_malformed_one_is_refused():
    mark = ProducerMark(2**63 - 1, 2**32 - 1, 2**40, 3)
    assert producer_mark({PRODUCER_HEADER: mark.encode()}) == mark
    assert producer_mark({"other": b"x"}) is None
    with pytest.raises(ValueError, match="malformed dl.p header of 3 bytes"):
        producer_mark({PRODUCER_HEADER: b"abc"})
    with pytest.raises(ValueError, match="sequence 0"):
        producer_mark({PRODUCER_HEADER: ProducerMark(1, 0, 0, 1).encode()})
