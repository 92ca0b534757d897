"""The region-aware placement policy (DESIGN.md §6): the invariant, exactness against a
brute-force oracle, spreading, drained regions, replacement, and BookKeeper's scenarios."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlctl.errors import RefusedError
from dlctl.placement import PlacementPolicy, choose_ensemble, region_of, replace_member, violations, write_sets
from dlctl.placement_check import check_policy, hypothetical_nodes


def topo(spec: dict[str, dict[str, int]]) -> dict[str, dict]:
    """region -> rack -> number of nodes, as availability records."""
    return {
        f"{region}-{rack}-{i}": {"region": region, "rack": rack, "address": f"{region}.{rack}.{i}:1"}
        for region, racks in spec.items()
        for rack, count in racks.items()
        for i in range(count)
    }


def regions_of(ensemble, nodes):
    return [region_of(nodes[n]) for n in ensemble]


def valid(ensemble, nodes, policy):
    return not violations(regions_of(ensemble, nodes), policy.write_quorum, policy.ack_quorum, policy.min_regions)


def oracle_exists(nodes, policy, exclude=()) -> bool:
    """Brute force: is there any sequence of region labels (respecting each eligible region's
    number of agents) whose every write set satisfies the invariant?"""
    caps = Counter(region_of(r) for n, r in nodes.items() if n not in exclude)
    caps = {r: c for r, c in caps.items() if r not in policy.drained and (not policy.regions or r in policy.regions)}
    labels = sorted(caps)
    for seq in itertools.product(labels, repeat=policy.ensemble_size):
        counts = Counter(seq)
        if all(counts[r] <= caps[r] for r in counts) and not violations(list(seq), policy.write_quorum, policy.ack_quorum, policy.min_regions):
            return True
    return False


small_topologies = st.dictionaries(
    st.sampled_from(["ra", "rb", "rc"]),
    st.dictionaries(st.sampled_from(["k1", "k2"]), st.integers(1, 3), min_size=1, max_size=2),
    min_size=1,
    max_size=3,
)


@st.composite
def small_policies(draw):
    e = draw(st.integers(1, 6))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    m = draw(st.integers(1, 3))
    drained = draw(st.sets(st.sampled_from(["ra", "rb", "rc"]), max_size=1))
    return PlacementPolicy(e, w, a, m, drained=frozenset(drained))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=small_topologies, policy=small_policies(), seed=st.integers(0, 2**16))
def test_the_policy_refuses_exactly_when_the_brute_force_oracle_finds_no_valid_ensemble(spec, policy, seed):
    nodes = topo(spec)
    exists = oracle_exists(nodes, policy)
    if not exists:
        with pytest.raises(RefusedError):
            choose_ensemble(nodes, policy=policy, seed=seed)
        return
    ensemble = choose_ensemble(nodes, policy=policy, seed=seed)
    assert len(set(ensemble)) == policy.ensemble_size
    assert valid(ensemble, nodes, policy)
    assert not {region_of(nodes[n]) for n in ensemble} & policy.drained


@st.composite
def larger_cases(draw):
    n_regions = draw(st.integers(1, 6))
    spec = {f"r{i}": {f"k{j}": draw(st.integers(0, 6)) for j in range(draw(st.integers(1, 3)))} for i in range(n_regions)}
    e = draw(st.integers(1, 12))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    m = draw(st.integers(1, 4))
    return spec, PlacementPolicy(e, w, a, m)


@settings(max_examples=300, deadline=None)
@given(case=larger_cases(), seed=st.integers(0, 2**16), down=st.sets(st.integers(0, 5), max_size=3))
def test_every_ensemble_returned_satisfies_the_invariant_also_with_regions_down(case, seed, down):
    spec, policy = case
    nodes = {n: r for n, r in topo(spec).items() if int(r["region"][1:]) not in down}
    try:
        ensemble = choose_ensemble(nodes, policy=policy, seed=seed)
    except RefusedError as exc:
        assert exc.message and exc.hint  # says what failed and what would satisfy it
        return
    assert len(set(ensemble)) == policy.ensemble_size and set(ensemble) <= set(nodes)
    assert valid(ensemble, nodes, policy)


@settings(max_examples=200, deadline=None)
@given(case=larger_cases(), seed=st.integers(0, 2**16))
def test_a_replacement_keeps_the_other_positions_and_the_invariant(case, seed):
    spec, policy = case
    nodes = topo(spec)
    try:
        ensemble = choose_ensemble(nodes, policy=policy, seed=seed)
    except RefusedError:
        return
    failed = ensemble[seed % len(ensemble)]
    survivors = {n: r for n, r in nodes.items() if n != failed}
    try:
        new = replace_member(ensemble, failed, survivors, policy=policy, seed=seed, known=nodes)
    except RefusedError as exc:
        assert "no agent can replace" in exc.message
        return
    assert [x for x, y in zip(new, ensemble) if x != y] == [new[ensemble.index(failed)]]
    assert failed not in new and len(set(new)) == len(new)
    assert valid(new, nodes, policy)


def test_the_documented_example_a_8_is_refused_and_a_9_accepted():
    refused = PlacementPolicy(15, 15, 8, 2)
    with pytest.raises(RefusedError) as info:
        refused.validate()
    assert "with only 2 regions available" in info.value.message and "8 replicas in 1 region(s)" in info.value.message
    assert "A must be ≥ 9" in info.value.hint
    PlacementPolicy(15, 15, 9, 2).validate()
    nodes = hypothetical_nodes(3, 20)
    one_down = {n: r for n, r in nodes.items() if r["region"] != "region-3"}
    with pytest.raises(RefusedError, match="8 of them sit in 1 region"):
        choose_ensemble(one_down, policy=refused, seed=1)
    ensemble = choose_ensemble(one_down, policy=PlacementPolicy(15, 15, 9, 2), seed=1)
    assert sorted(Counter(regions_of(ensemble, nodes)).values()) == [7, 8]


def test_check_reports_every_combination_of_regions_down():
    report = check_policy(PlacementPolicy(15, 15, 9, 2), hypothetical_nodes(3, 20))
    assert report.valid
    rows = {tuple(r["down"]): r for r in report.scenarios}
    assert len(rows) == 8
    assert rows[()]["new_segments"] and rows[()]["existing_writes"] and rows[()]["reads"]
    assert rows[("region-1",)]["new_segments"] and rows[("region-1",)]["existing_writes"]
    two = rows[("region-1", "region-2")]
    assert not two["new_segments"] and not two["existing_writes"] and two["reads"]
    assert not rows[("region-1", "region-2", "region-3")]["reads"]
    bad = check_policy(PlacementPolicy(15, 15, 8, 2), hypothetical_nodes(3, 20))
    assert not bad.valid and "A must be ≥ 9" in bad.fix
    assert not {tuple(r["down"]): r for r in bad.scenarios}[("region-2",)]["new_segments"]


def test_write_sets_are_w_consecutive_members_round_robin():
    assert write_sets(3, 3) == [(0, 1, 2)]
    assert write_sets(4, 2) == [(0, 1), (1, 2), (2, 3), (3, 0)]


def test_striping_puts_consecutive_positions_in_different_regions():
    nodes = topo({"a": {"k": 4}, "b": {"k": 4}, "c": {"k": 4}})
    policy = PlacementPolicy(6, 3, 2, 2)
    ensemble = choose_ensemble(nodes, policy=policy, seed=3)
    for ws in write_sets(6, 3):
        assert max(Counter(regions_of([ensemble[p] for p in ws], nodes)).values()) == 1


def test_a_seed_makes_the_choice_reproducible_and_seeds_spread_the_load():
    nodes = topo({f"r{i}": {"k1": 5, "k2": 5} for i in range(4)})
    policy = PlacementPolicy(3, 3, 2, 2)
    assert choose_ensemble(nodes, policy=policy, seed=5) == choose_ensemble(dict(reversed(nodes.items())), policy=policy, seed=5)
    used = Counter(n for s in range(200) for n in choose_ensemble(nodes, policy=policy, seed=s))
    assert len(used) > 30 and len({nodes[n]["region"] for n in used}) == 4


def test_an_unknown_member_region_counts_against_the_replacement():
    nodes = topo({"a": {"k": 3}, "b": {"k": 3}})
    ensemble = ("a-k-0", "gone", "b-k-0")
    with pytest.raises(RefusedError, match="no agent can replace 'b-k-0'"):
        # 'gone' could be in region a: replacing b-k-0 in a could give 2 of 3 in one region with A=2.
        replace_member(ensemble, "b-k-0", {n: r for n, r in nodes.items() if n != "b-k-0"}, policy=PlacementPolicy(3, 3, 2, 2), exclude={"b-k-1", "b-k-2"})


# -- scenarios ported from BookKeeper's TestRegionAwareEnsemblePlacementPolicy -------------------


def test_replacement_prefers_the_failed_members_region_and_a_different_rack():
    nodes = topo({"r1": {"k1": 2, "k2": 2}, "r2": {"k1": 2, "k2": 2}, "r3": {"k1": 2, "k2": 2}})
    policy = PlacementPolicy(3, 3, 2, 2)
    ensemble = ("r1-k1-0", "r2-k1-0", "r3-k1-0")
    new = replace_member(ensemble, "r2-k1-0", {n: r for n, r in nodes.items() if n != "r2-k1-0"}, policy=policy, seed=1, known=nodes)
    assert nodes[new[1]]["region"] == "r2"


def test_replacement_goes_to_another_region_when_the_failed_region_is_empty():
    nodes = topo({"r1": {"k1": 2}, "r2": {"k1": 1}, "r3": {"k1": 2}})
    policy = PlacementPolicy(3, 3, 3, 2)  # 2 of 3 in one region still leaves any 3 acks in 2 regions
    ensemble = ("r1-k1-0", "r2-k1-0", "r3-k1-0")
    new = replace_member(ensemble, "r2-k1-0", {n: r for n, r in nodes.items() if n != "r2-k1-0"}, policy=policy, seed=1, known=nodes)
    assert nodes[new[1]]["region"] in {"r1", "r3"} and valid(new, nodes, policy)


def test_replacement_is_refused_when_only_the_ensembles_regions_remain_and_the_quorum_needs_another():
    nodes = topo({"r1": {"k1": 3}, "r2": {"k1": 1}})
    policy = PlacementPolicy(2, 2, 2, 2)
    with pytest.raises(RefusedError, match="without breaking the invariant"):
        replace_member(("r1-k1-0", "r2-k1-0"), "r2-k1-0", {n: r for n, r in nodes.items() if n != "r2-k1-0"}, policy=policy, known=nodes)


def test_new_ensemble_spreads_one_member_per_region_when_regions_are_plenty():
    nodes = topo({f"r{i}": {"k1": 3, "k2": 3} for i in range(5)})
    ensemble = choose_ensemble(nodes, policy=PlacementPolicy(5, 5, 3, 2), seed=2)
    assert sorted(Counter(regions_of(ensemble, nodes)).values()) == [1, 1, 1, 1, 1]


def test_new_ensemble_spreads_inside_a_region_over_racks():
    nodes = topo({"r1": {"k1": 4, "k2": 4, "k3": 4}, "r2": {"k1": 4, "k2": 4, "k3": 4}})
    ensemble = choose_ensemble(nodes, policy=PlacementPolicy(6, 6, 4, 2), seed=9)
    for region in ("r1", "r2"):
        racks = [nodes[n]["rack"] for n in ensemble if nodes[n]["region"] == region]
        assert sorted(racks) == ["k1", "k2", "k3"]


def test_new_ensemble_with_too_few_regions_is_refused_naming_m():
    nodes = topo({"r1": {"k1": 10}})
    with pytest.raises(RefusedError, match=r"must span m=2 regions but only 1 region\(s\)"):
        choose_ensemble(nodes, policy=PlacementPolicy(3, 3, 2, 2))


def test_new_ensemble_in_degraded_mode_uses_the_remaining_regions():
    nodes = topo({"r1": {"k1": 5}, "r2": {"k1": 5}})  # r3 is down
    ensemble = choose_ensemble(nodes, policy=PlacementPolicy(4, 4, 3, 2), seed=4)
    assert sorted(Counter(regions_of(ensemble, nodes)).values()) == [2, 2]


def test_drained_region_gets_no_new_members_and_draining_to_below_m_is_refused():
    nodes = topo({"r1": {"k1": 5}, "r2": {"k1": 5}, "r3": {"k1": 5}})
    ensemble = choose_ensemble(nodes, policy=PlacementPolicy(4, 4, 3, 2, drained=frozenset({"r3"})), seed=1)
    assert "r3" not in regions_of(ensemble, nodes)
    with pytest.raises(RefusedError, match="r2: drained"):
        choose_ensemble(nodes, policy=PlacementPolicy(3, 3, 2, 2, drained=frozenset({"r2", "r3"})))


def test_regions_to_write_restrict_placement():
    nodes = topo({"r1": {"k1": 5}, "r2": {"k1": 5}, "r3": {"k1": 5}})
    ensemble = choose_ensemble(nodes, policy=PlacementPolicy(4, 4, 3, 2, regions=("r1", "r3")), seed=1)
    assert set(regions_of(ensemble, nodes)) == {"r1", "r3"}


def test_a_below_m_is_refused_statically():
    with pytest.raises(RefusedError, match="A=1 < m=2") as info:
        PlacementPolicy(3, 3, 1, 2).validate()
    assert "A must be ≥ 2" in info.value.hint


def test_excluded_agents_are_never_chosen():
    nodes = topo({"r1": {"k1": 3}, "r2": {"k1": 3}})
    ensemble = choose_ensemble(nodes, policy=PlacementPolicy(4, 4, 3, 2), exclude={"r1-k1-0"}, seed=0)
    assert "r1-k1-0" not in ensemble


def test_check_on_a_live_cluster_judges_writes_and_reads_on_its_real_segments():
    from dlctl.placement_check import LiveSegment, check_policy

    nodes = {f"{r}n{i}": {"region": r, "rack": "a"} for r in ("r1", "r2", "r3") for i in (1, 2)}
    segments = [
        LiveSegment("orders", 7, True, ("r1n1", "r1n2", "r2n1"), 3, 2),  # in progress, two in r1
        LiveSegment("audit", 3, False, ("r3n1", "r3n2"), 2, 2),  # completed, all in r3
    ]
    report = check_policy(PlacementPolicy(3, 3, 2, min_regions=1), nodes, segments=segments)
    by_down = {tuple(s["down"]): s for s in report.scenarios}
    assert by_down[()]["existing_writes"] and by_down[()]["reads"]
    r1 = by_down[("r1",)]
    assert r1["existing_writes"] is False and r1["reads"] is True and "segment 7 of log orders" in r1["why"]
    r3 = by_down[("r3",)]
    assert r3["existing_writes"] is True and r3["reads"] is False and "segment 3 of log audit" in r3["why"]
