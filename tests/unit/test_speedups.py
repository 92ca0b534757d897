"""The C loops of the bootstrap copy (dlctl/_speedups.c) against their Python reference in
dlctl.spark.transform: the same sink bytes, counts, clocks, digests and error messages, for
well-formed entries and for payloads with any bytes in them."""

from __future__ import annotations

import random

import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from dlctl.log import format as fmt
from dlctl.log.dlsn import DLSN
from dlctl.log.records import CorruptRecords, Record, encode_records
from dlctl.replication.origin import SOURCE_POSITION, Origin
from dlctl.spark import transform
from dlctl.spark.transform import Clock, EntryCopier, canonical_summary_py
from dlctl.log.recovery import totals_record

# Imported, not skipped when missing: the build (setup.py) must have made it where tests run.
from dlctl import _speedups  # noqa: E402

_RECORD = st.one_of(
    st.builds(lambda p, i: Record(i, p), st.binary(max_size=120), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda p, k: Record(4, p, k), st.binary(max_size=40), st.binary(min_size=1, max_size=8)),
    st.builds(lambda p, k, h: Record(5, p, k, h), st.binary(max_size=40), st.binary(max_size=8), st.dictionaries(st.sampled_from(["app", "x", "dl.own", "dl", "dl.origin.cluster"]), st.binary(max_size=10), max_size=3)),
    st.builds(lambda vt: Record(7, b"r", headers={**Origin("north", DLSN(8, 1, 2), vt).headers(), SOURCE_POSITION: b"north@8/1/2"}), st.dictionaries(st.sampled_from(["north", "west", "east"]), st.integers(1, 50), min_size=1)),
    st.builds(lambda i: Record(i, b"", control=True), st.integers(0, 99)),
)
_LOCAL = st.one_of(
    st.builds(lambda p, i: Record(i, p), st.binary(max_size=120), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda p, k: Record(4, p, k), st.binary(max_size=40), st.binary(min_size=1, max_size=8)),
    st.builds(lambda i: Record(i, b"", control=True), st.integers(0, 99)),
)


def _entry(seq: int, entry_id: int, payload: bytes, control: bool = False) -> bytes:
    return fmt.encode(fmt.Entry(7, seq, entry_id, entry_id - 1, payload, fmt.FLAG_CONTROL if control else 0))


def _payload(records: list[Record], totals: bool) -> bytes:
    # The writer's totals carry the entry's append time (the copy keeps it: C and Python alike).
    return encode_records(records + ([totals_record(records[-1].txid if records else 0, 99, 12345, 1_795_000_000_000 + len(records))] if totals else []))


def _damage(payload: bytes, data: st.DataObject) -> bytes:
    """A few bytes overwritten, then cut anywhere: sizes, counts and lengths that lie."""
    out = bytearray(payload)
    for _ in range(data.draw(st.integers(1, 4))):
        out[data.draw(st.integers(0, len(out) - 1))] = data.draw(st.integers(0, 255))
    return bytes(out[: data.draw(st.integers(0, len(out)))])


def _outcome(fn):
    try:
        return ("ok", fn())
    except CorruptRecords as exc:
        return ("corrupt", str(exc))


def test_the_extension_is_built_and_uses_the_cpus_crc_instruction_where_there_is_one():
    assert _speedups.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    with open("/proc/cpuinfo") as f:
        assert _speedups.hardware_crc == (" sse4_2" in f.read())


# Around the three-lane blocks (3 x 256 and 3 x 8192 bytes) and the 8-byte steps.
_LENGTHS = st.one_of(st.integers(0, 300), st.sampled_from([767, 768, 769, 24575, 24576, 24577 + 8, 3 * 24576 + 3 * 768 + 7]), st.integers(0, 200_000))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_LENGTHS, st.integers(0, 2**32 - 1)), max_size=5), st.integers(0, 2**32 - 1))
def test_crc32c_chains_exactly_like_the_crc32c_package(pieces, value):
    a = b = value
    for length, seed in pieces:
        piece = random.Random(seed).randbytes(length)
        a, b = _speedups.crc32c(piece, a), crc32c.crc32c(piece, b)
    assert a == b


@settings(max_examples=300, deadline=None)
@given(st.lists(_RECORD, max_size=20), st.booleans(), st.binary(max_size=7), st.binary(max_size=7))
def test_canonical_summary_in_c_equals_the_python_reference(records, totals, before, after):
    payload = _payload(records, totals)
    buf = before + payload + after
    start, end = len(before), len(before) + len(payload)
    assert _outcome(lambda: transform.canonical_summary(buf, start, end)) == _outcome(lambda: canonical_summary_py(buf, start, end))


@settings(max_examples=300, deadline=None)
@given(st.lists(_RECORD, min_size=1, max_size=12), st.data())
def test_canonical_summary_of_damaged_records_is_the_same_result_or_error_in_c_and_python(records, data):
    damaged = _damage(_payload(records, False), data)
    assert _outcome(lambda: transform.canonical_summary(damaged)) == _outcome(lambda: canonical_summary_py(damaged))


def _copiers(seq: int, vv: dict[str, int]) -> tuple[EntryCopier, EntryCopier]:
    def make(fast: bool) -> EntryCopier:
        return EntryCopier(source_cluster="east", source_seq=seq, sink_log_id=9, sink_seq=4, clock=Clock("east", dict(vv)), speedups=fast)

    return make(True), make(False)


def _same_state(c: EntryCopier, p: EntryCopier) -> None:
    assert c.stats == p.stats
    assert c.clock.vv == p.clock.vv


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.lists(_LOCAL, max_size=15), st.lists(_RECORD, max_size=15)), st.booleans(), st.booleans()), min_size=1, max_size=5), st.dictionaries(st.sampled_from(["east", "north", "a", "z"]), st.integers(0, 9)))
def test_copying_in_c_gives_the_same_sink_entries_counts_and_clock_as_python(entries, vv):
    """Entries of local records only take the C loop; one record with headers sends the whole
    entry down the Python path, between entries that took the C loop (the clock carries over)."""
    fast, slow = _copiers(3, vv)
    for e, (records, totals, control) in enumerate(entries):
        source = _entry(3, e, _payload(records, totals), control)
        assert fast.copy(source) == slow.copy(source)
        _same_state(fast, slow)


@settings(max_examples=300, deadline=None)
@given(st.lists(_LOCAL, min_size=1, max_size=12), st.data())
def test_copying_damaged_records_is_the_same_result_or_error_in_c_and_python(records, data):
    damaged = _damage(_payload(records, True), data)
    fast, slow = _copiers(2, {"east": 3})
    source = b"pad" + _entry(2, 0, damaged)
    assert _outcome(lambda: bytes(fast.copy(source, 3))) == _outcome(lambda: bytes(slow.copy(source, 3)))
    _same_state(fast, slow)


def test_the_copy_falls_back_to_python_without_the_extension(monkeypatch):
    source = _entry(1, 0, _payload([Record(1, b"x" * 10), Record(2, b"y")], True))
    expected = EntryCopier(source_cluster="east", source_seq=1, sink_log_id=9, sink_seq=4, clock=Clock("east")).copy(source)
    monkeypatch.setattr(transform, "_speedups", None)
    copier = EntryCopier(source_cluster="east", source_seq=1, sink_log_id=9, sink_seq=4, clock=Clock("east"))
    assert not copier._fast
    assert copier.copy(source) == expected
    assert transform.canonical_summary(expected, fmt.HEADER_SIZE) == canonical_summary_py(expected, fmt.HEADER_SIZE)
