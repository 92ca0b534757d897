"""The one renderer: the same data as a table, JSON and YAML."""

from __future__ import annotations

import enum
import io
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from dlctl.output import Table, render, to_plain


class Color(enum.Enum):
    RED = "red"


@dataclass
class Node:
    id: str
    up: bool
    color: Color
    seen: datetime
    path: Path


NODE = Node("n1", True, Color.RED, datetime(2026, 1, 2, tzinfo=timezone.utc), Path("/data"))


def rendered(data, fmt):
    buf = io.StringIO()
    render(data, fmt, stream=buf)
    return buf.getvalue()


def test_to_plain_converts_dataclasses_enums_dates_paths():
    assert to_plain(NODE) == {"id": "n1", "up": True, "color": "red", "seen": "2026-01-02T00:00:00+00:00", "path": "/data"}


def test_json_and_yaml_carry_the_same_data():
    data = [NODE, NODE]
    assert json.loads(rendered(data, "json")) == yaml.safe_load(rendered(data, "yaml")) == [to_plain(NODE)] * 2


def test_table_keeps_column_order_and_json_keeps_rows():
    table = Table([{"b": 2, "a": 1}], columns=["a", "b"], title="t")
    text = rendered(table, "table")
    assert text.index("a") < text.index("b")
    assert json.loads(rendered(table, "json")) == [{"b": 2, "a": 1}]


def test_table_of_dicts_shows_every_key_and_value():
    text = rendered([{"node": "n1", "up": True}, {"node": "n2", "up": False, "extra": None}], "table")
    for word in ("node", "n1", "n2", "yes", "no", "extra"):
        assert word in text


def test_mapping_renders_as_key_value_lines():
    text = rendered({"cluster_id": "c1", "nodes": 3}, "table")
    assert "cluster id" in text and "c1" in text and "3" in text


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown output format"):
        render({}, "xml")
