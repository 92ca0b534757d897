"""Pin records: JSON round trip, expiry and what a pin protects (pure logic)."""

import pytest

from dlctl.log.dlsn import DLSN
from dlctl.meta.pins import PinRecord, pin_path


def pin(**kw):
    base = dict(holder="s1", log="orders", position=DLSN(5, 0, 0), created=100.0, updated=100.0, max_age_seconds=60.0)
    return PinRecord(**{**base, **kw})


def test_round_trip():
    p = pin(sink_cluster="b", needs_bootstrap=True, reason="expired")
    assert PinRecord.from_json(p.to_json(), "x") == p


def test_protects_segments_at_and_after_its_position_while_live():
    p = pin()
    assert not p.protects(4, now=120.0)
    assert p.protects(5, now=120.0) and p.protects(9, now=120.0)


def test_expired_or_bootstrap_pin_protects_nothing():
    assert not pin().protects(7, now=161.0)
    assert not pin(needs_bootstrap=True).protects(7, now=120.0)


@pytest.mark.parametrize("data", [b"{", b"[]", b'{"holder":"s"}', b'{"holder":"s","log":"l","position":"x"}'])
def test_malformed_pin_names_where(data):
    with pytest.raises(ValueError, match="pins/s1/l: malformed pin record"):
        PinRecord.from_json(data, "pins/s1/l")


def test_pin_path_rejects_escaping_names():
    with pytest.raises(ValueError):
        pin_path("c", "../x", "log")
