"""Cold storage building blocks (dlctl.cold): the inventory table, keys that cannot escape the
store, the filesystem store, segment objects and manifests refusing anything that does not hold
what it claims. The S3 store and the backup command run against real servers in
tests/integration/test_cold_backup.py."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest

from dlctl.cold.config import parse
from dlctl.cold.manifest import SegmentManifest, manifest_key, object_key
from dlctl.cold.segobject import CorruptObject, encode_segment, iter_entries
from dlctl.cold.store import ColdStoreError, FilesystemStore, check_key
from dlctl.errors import ConfigError, NotFoundError
from dlctl.log import format as fmt
from dlctl.meta.records import EnsembleChange, SegmentRecord, SegmentState


def test_the_inventory_table_names_what_is_wrong_and_where(tmp_path):
    fs = parse({"kind": "filesystem", "path": "backup"}, "[clusters.c.cold_storage]", tmp_path)
    assert fs.path == tmp_path / "backup" and fs.describe() == f"filesystem {tmp_path / 'backup'}"
    s3 = parse({"kind": "s3", "bucket": "b", "prefix": "/east/", "endpoint": "http://127.0.0.1:9", "credentials_file": "s3.creds"}, "w", tmp_path)
    assert (s3.bucket, s3.prefix, s3.credentials_file) == ("b", "east", tmp_path / "s3.creds")
    assert "credentials_file" in s3.to_dict() and "secret" not in str(s3.to_dict())
    for body, message in (
        ({"kind": "tape"}, "kind must be"),
        ({"kind": "filesystem"}, "path is required"),
        ({"kind": "s3"}, "bucket is required"),
        ({"kind": "s3", "bucket": "b", "path": "/x"}, "unknown key"),
        ({"kind": "s3", "bucket": "b", "prefix": "a/../b"}, "'..'"),
        ({"kind": "filesystem", "path": 5}, "must be a string"),
        ("s3", "must be a table"),
    ):
        with pytest.raises(ConfigError, match=message) as err:
            parse(body, "[clusters.c.cold_storage]", tmp_path)
        assert "[clusters.c.cold_storage]" in err.value.message


def test_credentials_come_only_from_a_0600_file_with_both_keys(tmp_path):
    creds = tmp_path / "s3.creds"
    creds.write_text('access_key_id = "AK"\nsecret_access_key = "SK"\n')
    config = parse({"kind": "s3", "bucket": "b", "credentials_file": str(creds)}, "w", tmp_path)
    os.chmod(creds, 0o644)
    with pytest.raises(ConfigError, match="group or others"):
        config.credentials()
    os.chmod(creds, stat.S_IRUSR | stat.S_IWUSR)
    assert config.credentials() == ("AK", "SK")
    creds.write_text('access_key_id = "AK"\n')
    with pytest.raises(ConfigError, match="needs access_key_id and secret_access_key"):
        config.credentials()


@pytest.mark.parametrize("key", ["../x", "a/../../etc/passwd", "/abs", "a//b", "a/./b", "", "a\\b", "a/b/"])
def test_keys_that_could_leave_the_store_are_refused(key, tmp_path):
    with pytest.raises(ValueError, match="invalid cold store key"):
        check_key(key)
    with pytest.raises(ValueError):
        FilesystemStore(tmp_path).put(key, b"x")
    assert list(tmp_path.iterdir()) == []


def test_log_names_from_metadata_cannot_shape_keys():
    with pytest.raises(ValueError):
        object_key("../../etc", 1, 1)
    assert object_key("orders", 7, 3) == "logs/orders/7/0000000000000000003.segment"


def test_the_filesystem_store_writes_whole_objects_and_lists_them(tmp_path):
    store = FilesystemStore(tmp_path)
    store.put("logs/a/1/x.segment", b"data")
    store.put("logs/a/1/x.segment", b"newer")  # replaced whole
    assert store.get("logs/a/1/x.segment") == b"newer"
    assert store.list("logs/a") == ["logs/a/1/x.segment"]
    assert not any(p.name.startswith(".") for p in tmp_path.rglob("*"))  # no temporary left
    store.delete("logs/a/1/x.segment")
    store.delete("logs/a/1/x.segment")  # idempotent
    with pytest.raises(NotFoundError, match="no object logs/a/1/x.segment"):
        store.get("logs/a/1/x.segment")
    with pytest.raises(ColdStoreError, match="not a directory"):
        FilesystemStore(tmp_path / "unmounted").put("k", b"x")


def _segment(log_id: int, seq: int, count: int) -> tuple[SegmentRecord, bytes]:
    entries = [fmt.encode(fmt.Entry(log_id, seq, e, e - 1, f"payload-{e}".encode())) for e in range(count)]
    record = SegmentRecord(seq, SegmentState.COMPLETED, (EnsembleChange(0, ("n1", "n2", "n3")),), 3, 2, 1.0, writer="w", first_txid=0).completed_with(
        count - 1, count - 1, count, sum(map(len, entries)), 2.0
    )
    return record, encode_segment(entries)


def test_a_segment_object_reads_back_entry_by_entry_and_any_damage_is_named():
    record, data = _segment(9, 4, 5)
    entries = list(iter_entries(data, where="obj", log_id=9, seq=4, count=5))
    assert [e.payload for e in entries] == [f"payload-{e}".encode() for e in range(5)]
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    with pytest.raises(CorruptObject, match="obj: entry"):
        list(iter_entries(bytes(flipped), where="obj", log_id=9, seq=4, count=5))
    with pytest.raises(CorruptObject, match="expected entry 0 of segment 5"):
        list(iter_entries(data, where="obj", log_id=9, seq=5, count=5))
    with pytest.raises(CorruptObject, match="bytes follow the last"):
        list(iter_entries(data + b"x", where="obj", log_id=9, seq=4, count=5))
    with pytest.raises(CorruptObject, match="short header"):
        list(iter_entries(data, where="obj", log_id=9, seq=4, count=6))


def test_a_manifest_round_trips_and_refuses_other_bytes_or_a_foreign_object():
    record, data = _segment(9, 4, 3)
    manifest = SegmentManifest.of("c1", "orders", 9, record, data)
    back = SegmentManifest.from_json(manifest.to_json(), "here")
    assert back == manifest and back.object == object_key("orders", 9, 4)
    back.verify(data)
    with pytest.raises(CorruptObject, match="the manifest says"):
        back.verify(data[:-1] + bytes([data[-1] ^ 1]))
    raw = manifest.to_json().replace(b"0000000000000000004.segment", b"0000000000000000005.segment")
    with pytest.raises(CorruptObject, match="not this segment's"):
        SegmentManifest.from_json(raw, "here")
    for bad in (b"{", b"{}", b'{"version": 2}'):
        with pytest.raises(CorruptObject, match="here: malformed manifest"):
            SegmentManifest.from_json(bad, "here")
    assert manifest_key("orders", 9, 4).endswith("0000000000000000004.manifest.json")


def test_with_a_cold_store_required_only_copied_truncated_segments_are_collected():
    from dataclasses import replace

    from dlctl.meta.truncation import collectable

    base, _ = _segment(9, 1, 2)
    one = replace(base, state=SegmentState.TRUNCATED)
    two = replace(base, seq=2, state=SegmentState.TRUNCATED, cold="logs/x/9/0000000000000000002.segment")
    top = replace(base, seq=3, state=SegmentState.TRUNCATED)  # the log's last: a tombstone at most
    free = collectable([one, two, top], [], 0.0)
    assert [s.seq for s in free.collect] == [1, 2] and free.tombstone == 3
    gated = collectable([one, two, top], [], 0.0, require_cold=True)
    assert [s.seq for s in gated.collect] == [2] and gated.tombstone is None
    assert "cold store" in gated.kept[1] and "cold store" in gated.kept[3]
    assert collectable([replace(top, cold="k")], [], 0.0, require_cold=True).tombstone == 3


def test_the_retention_sweep_deletes_exactly_the_expired_copies_manifest_first(tmp_path):
    from dlctl.retention.offload import sweep_expired

    store = FilesystemStore(tmp_path)
    for seq, stored in ((1, 100.0), (2, 200.0), (3, 290.0)):
        record, data = _segment(9, seq, 2)
        manifest = dataclasses.replace(SegmentManifest.of("c", "orders", 9, record, data), stored=stored)
        store.put(manifest.object, data)
        store.put(manifest_key("orders", 9, seq), manifest.to_json())
    assert sweep_expired(store, None, now=1e9)["deleted"] == 0  # no retention: kept for ever
    # A log's own cold retention wins over the cluster's (another incarnation keeps the default).
    assert sweep_expired(store, None, now=300.0, per_log={("orders", 9): 1000.0, ("orders", 8): 1.0})["deleted"] == 0
    assert sweep_expired(store, 1e6, now=300.0, per_log={("orders", 9): 150.0})["deleted"] == 1  # stored at 100
    seen: dict = {}
    result = sweep_expired(store, 50.0, now=300.0, seen=seen)
    assert result["deleted"] == 1
    assert store.list("logs") == [manifest_key("orders", 9, 3), object_key("orders", 9, 3)]
    assert list(seen) == [manifest_key("orders", 9, 3)]  # a later round reads no manifest again


def test_the_published_cold_store_record_round_trips_without_credentials_and_refuses_garbage(tmp_path):
    from dlctl.cold.config import ColdStorageConfig
    from dlctl.meta import coldpolicy

    config = ColdStorageConfig("s3", bucket="b", prefix="p", endpoint="http://e", region="r", credentials_file=tmp_path / "creds")
    data = coldpolicy.to_json(config, 86400.0)
    assert b"creds" not in data
    back, retention = coldpolicy.from_json(data, "zk")
    assert retention == 86400.0 and back.credentials_file is None and (back.bucket, back.prefix, back.endpoint) == ("b", "p", "http://e")
    assert coldpolicy.with_credentials(back, tmp_path / "mine").credentials_file == tmp_path / "mine"
    for bad in (b"{", b'{"kind": "tape"}', b'{"kind": "s3"}', b'{"kind": "filesystem", "path": "/x", "retention_seconds": -1}'):
        with pytest.raises(ValueError, match="zk: malformed cold storage record"):
            coldpolicy.from_json(bad, "zk")


def test_a_log_s_cold_retention_is_validated_and_absent_from_records_that_do_not_set_it():
    from dlctl.meta.records import LogConfig, LogRecord, log_from_json, to_json

    plain = LogRecord("orders", 9, 1.0, LogConfig())
    assert b"cold_retention" not in to_json(plain)  # older readers see the record unchanged
    assert log_from_json(to_json(plain), "here") == plain
    kept = LogRecord("orders", 9, 1.0, LogConfig(cold_retention_seconds=86400.0))
    assert log_from_json(to_json(kept), "here").config.cold_retention_seconds == 86400.0
    for bad in (0, -1.0, True, "1d"):
        with pytest.raises(ValueError, match="cold_retention_seconds"):
            LogConfig(cold_retention_seconds=bad)
