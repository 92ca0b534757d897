"""The filter rules of ``init-replication`` (``dlctl.ops.network_rules.check_connection``) on
small networks: what is refused, with which reason, and the two #314 exceptions accepted."""

from __future__ import annotations

import pytest

from dlctl.errors import RefusedError
from dlctl.ops.network_rules import NetworkView, check_connection
from dlctl.replication.history import NetworkEvent

F, G = "key=eu-*", "key=us-*"


def view(*events: NetworkEvent) -> NetworkView:
    """The network the events leave (as ``network_view`` merges streams and history)."""
    edges: dict[tuple[str, str], str] = {}
    for e in events:
        if e.kind in ("connect", "filter"):
            edges[e.edge] = e.filter
        elif e.kind == "disconnect":
            edges.pop(e.edge, None)
    return NetworkView(edges, list(events))


PAIR = (NetworkEvent("connect", "a", "b", causal=True), NetworkEvent("connect", "b", "a", causal=True))
INTO_D = NetworkEvent("connect", "a", "d", causal=True, filter=F)


def refused(v: NetworkView, src: str, snk: str, record_filter: str = "", *, causal: bool = True) -> str:
    with pytest.raises(RefusedError) as exc:
        check_connection(v, src, snk, record_filter, causal=causal)
    return str(exc.value)


def test_a_second_feed_with_the_same_filter_and_a_fail_over_are_accepted():
    check_connection(view(*PAIR, INTO_D), "b", "d", F, causal=True)  # redundant: both at once
    lost = view(*PAIR, INTO_D, NetworkEvent("disconnect", "a", "d", causal=True, filter=F))
    check_connection(lost, "b", "d", F, causal=True)  # fail-over: A -> D is gone
    check_connection(view(*PAIR, INTO_D), "a", "d", F, causal=True)  # re-declared as it is


def test_a_feed_of_a_filtered_location_with_another_filter_or_none_is_refused_now_and_later():
    for v in (view(*PAIR, INTO_D), view(*PAIR, INTO_D, NetworkEvent("disconnect", "a", "d", filter=F))):
        assert "filter key=us-*" in refused(v, "b", "d", G)
        assert "never bring the records that filter held back" in refused(v, "b", "d")
    assert "never bring" in refused(view(*PAIR, INTO_D), "a", "d")  # the filter removed
    assert "never bring" in refused(view(*PAIR, INTO_D), "a", "d", G)  # or changed


def test_a_further_feed_is_causal_and_so_was_the_first():
    assert "must be causal" in refused(view(*PAIR, INTO_D), "b", "d", F, causal=False)
    plain_first = view(*PAIR, NetworkEvent("connect", "a", "d", filter=F))
    assert "one-way stream(s) from a" in refused(plain_first, "b", "d", F)


def test_a_filtered_location_passes_nothing_on_and_a_filter_stays_off_cycles_and_unfiltered_neighbours():
    assert "a location a filter feeds is terminal" in refused(view(*PAIR, INTO_D), "d", "c")
    assert "is or was on a cycle" in refused(view(*PAIR), "a", "b", F)
    broken = view(*PAIR, NetworkEvent("disconnect", "b", "a", causal=True))
    assert "is or was on a cycle" in refused(broken, "a", "b", F)  # a past cycle counts
    fed = view(*PAIR, NetworkEvent("connect", "b", "c"))
    assert "without a filter too" in refused(fed, "a", "c", F)
    relay = view(*PAIR, NetworkEvent("connect", "c", "e"))
    assert "passes records on" in refused(relay, "a", "c", F)
    check_connection(view(*PAIR), "a", "c", F, causal=False)  # a first filtered feed may be one-way
