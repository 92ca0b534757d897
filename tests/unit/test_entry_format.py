"""The entry header's layout is declared once (dlctl.log.format): what the writer encodes, the
fields the copies and the agent's storage read in place agree with it, byte for byte."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dlctl.log import format as fmt


@given(st.integers(1, 2**63), st.integers(1, 2**63), st.integers(0, 2**62), st.binary(max_size=64))
def test_the_fields_read_in_place_are_the_ones_encoded(log_id, seq, entry_id, payload):
    encoded = fmt.encode(fmt.Entry(log_id, seq, entry_id, entry_id - 1, payload))
    assert fmt.HEADER.size == fmt.HEADER_SIZE == fmt.HEADER_FIELDS.size + 4 == 48
    assert fmt.stored_entry_id(encoded) == entry_id
    assert fmt.stored_entry_id(b"x" * 7 + encoded, 7) == entry_id
    decoded = fmt.decode_header(encoded[: fmt.HEADER_SIZE])
    magic, version, flags, _reserved, got_log, got_seq, got_entry, lac, length, crc = fmt.HEADER.unpack_from(encoded)
    assert (magic, version, got_log, got_seq, got_entry, lac, length) == (fmt.MAGIC, fmt.FORMAT_VERSION, log_id, seq, entry_id, entry_id - 1, len(payload))
    assert crc == decoded.crc == fmt.stored_crc(encoded)
