"""``dlagent fsck``: reports what recovery would do, changes nothing."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from click.testing import CliRunner

from dlagent.cli import cli
from dlagent.storage import SegmentStore
from dlctl.log.format import HEADER_SIZE


def populate(root: Path, entry) -> None:
    async def body():
        store = SegmentStore(root)
        await store.open()
        for seq in (1, 2, 3):
            for i in range(5):
                await store.add(entry(1, seq, i, payload=b"z" * 64))
        await store.fence(1, 2)
        await store.fence(2, 1)  # an empty fenced replica
        await store.close()

    asyncio.run(body())


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (p.read_bytes(), st.st_mtime_ns)
        else:
            out[str(p.relative_to(root))] = (b"<dir>", p.stat().st_mtime_ns)
    return out


def seg(root: Path, log_id: int, seq: int) -> Path:
    return root / "segments" / f"{log_id:016x}" / f"{seq:016x}.log"


def test_fsck_clean_data_dir(tmp_path, entry):
    populate(tmp_path, entry)
    result = CliRunner().invoke(cli, ["fsck", str(tmp_path), "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["clean"] is True and doc["segments"] == 4 and doc["entries"] == 15
    rows = {(r["log_id"], r["segment_seq"]): r for r in doc["replicas"]}
    assert rows[(1, 2)]["fenced"] is True and rows[(1, 1)]["fenced"] is False
    assert rows[(1, 3)]["entries"] == 5 and rows[(1, 3)]["last_entry"] == 4 and rows[(1, 3)]["lac"] == 3
    assert rows[(2, 1)]["entries"] == 0 and rows[(2, 1)]["fenced"] is True
    assert all(r["problems"] == [] for r in rows.values())

    table = CliRunner().invoke(cli, ["fsck", str(tmp_path)])
    assert table.exit_code == 0 and "fsck" in table.output


def test_fsck_reports_problems_without_modifying_anything(tmp_path, entry, forget_checkpoints):
    populate(tmp_path, entry)
    forget_checkpoints(tmp_path)  # the agent's start below reads it all, as fsck does
    entry_size = HEADER_SIZE + 64
    with open(seg(tmp_path, 1, 1), "ab") as f:  # torn tail
        f.write(entry(1, 1, 5, payload=b"z" * 64)[:70])
    with open(seg(tmp_path, 1, 3), "r+b") as f:  # mid-file bit flip
        f.seek(2 * entry_size + HEADER_SIZE + 10)
        f.write(b"\xff")
    os.unlink(tmp_path / "LOCK")  # fsck must not create it either
    before = snapshot(tmp_path)

    result = CliRunner().invoke(cli, ["fsck", str(tmp_path), "-o", "json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    assert doc["clean"] is False and doc["segments_with_problems"] == 2
    rows = {(r["log_id"], r["segment_seq"]): r for r in doc["replicas"]}
    [torn] = rows[(1, 1)]["problems"]
    assert f"torn tail at offset {5 * entry_size} (70 bytes)" in torn and "would be cut" in torn
    [limbo] = rows[(1, 3)]["problems"]
    assert f"offset {2 * entry_size}" in limbo and f"valid entry at offset {3 * entry_size}" in limbo
    assert rows[(1, 3)]["limbo"] is True
    assert rows[(1, 2)]["problems"] == []

    table = CliRunner().invoke(cli, ["fsck", str(tmp_path)])
    assert table.exit_code == 1 and "torn tail" in table.output

    assert snapshot(tmp_path) == before  # bytes and mtimes; no LOCK, no .limbo marker

    # The agent then does what fsck announced.
    async def body():
        store = SegmentStore(tmp_path)
        report = await store.open()
        assert [c.offset for c in report.tails_cut] == [5 * entry_size]
        assert [r.offset for r in report.limbo] == [2 * entry_size]
        await store.close()

    asyncio.run(body())
    result = CliRunner().invoke(cli, ["fsck", str(tmp_path), "-o", "json"])
    doc = json.loads(result.output)
    assert result.exit_code == 1 and doc["segments_with_problems"] == 1  # limbo stays until re-replicated
    assert "marker" in {(r["log_id"], r["segment_seq"]): r for r in doc["replicas"]}[(1, 3)]["problems"][0]


def test_fsck_refuses_while_an_agent_holds_the_data_dir(tmp_path, entry):
    async def body():
        store = SegmentStore(tmp_path)
        await store.open()
        await store.add(entry())
        result = CliRunner().invoke(cli, ["fsck", str(tmp_path)])
        assert result.exit_code == 1
        assert "in use by" in result.output
        await store.close()

    asyncio.run(body())


def test_fsck_usage_errors(tmp_path):
    runner = CliRunner()
    assert runner.invoke(cli, ["fsck", str(tmp_path / "missing")]).exit_code == 2
    assert runner.invoke(cli, ["fsck", str(tmp_path), "-o", "xml"]).exit_code == 2
    assert runner.invoke(cli, ["fsck"]).exit_code == 2
    empty = runner.invoke(cli, ["fsck", str(tmp_path), "-o", "json"])
    assert empty.exit_code == 0 and json.loads(empty.output)["segments"] == 0
