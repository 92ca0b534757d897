"""EntryIndex: compact id -> location map, checked against a dict model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dlagent.storage.index import EntryIndex

ids = st.one_of(
    st.integers(0, 200),  # dense, reordered
    st.integers(0, 10_000),  # striped / gappy
    st.integers(0, 2**63 - 1),  # far jumps (hostile or re-replicated ranges)
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ids, unique=True, max_size=200), st.integers(0, 300), st.integers(0, 400))
def test_index_matches_a_dict(entry_ids, first, span):
    index = EntryIndex()
    model: dict[int, tuple[int, int, int]] = {}
    for n, eid in enumerate(entry_ids):
        loc = (n * 100, n % 7, (eid * 2654435761) & 0xFFFFFFFF)
        index.add(eid, *loc)
        model[eid] = loc
    assert index.count == len(model)
    assert index.last_id == (max(model) if model else -1)
    assert index.first_id == (min(model) if model else -1)
    for eid, loc in model.items():
        assert index.get(eid) == loc
    for probe in (0, 1, 199, 4096, 2**62):
        if probe not in model:
            assert index.get(probe) is None
    assert [t[0] for t in index.items()] == sorted(model)
    last = first + span
    assert list(index.items(first, last)) == [(k, *model[k]) for k in sorted(model) if first <= k <= last]


def test_memory_stays_linear_under_hostile_ids():
    index = EntryIndex()
    for n in range(1000):
        index.add(n * 1_000_000, n, 1, 2)  # every id a huge jump from the last
    assert len(index._off) < 100_000  # the arrays did not fill the gaps
    assert index.get(999_000_000) == (999, 1, 2)


def test_dense_ids_use_the_arrays():
    index = EntryIndex()
    for eid in [1, 0, 3, 2] + list(range(4, 10_000)):
        index.add(eid, eid * 10, 5, 6)
    assert not index._sparse
    assert len(index._off) == 10_000
    assert index.get(9_999) == (99_990, 5, 6)
