"""``dlctl placement show|set|check|drain-region|undrain-region`` against a real ZooKeeper."""

from __future__ import annotations


import pytest

from harness.cli import dlctl, write_inventory
from harness.zk import close_client, make_client

from dlctl.cli.main import main
from dlctl.errors import ConflictError, ExitCode
from dlctl.meta import paths
from dlctl.meta import policy as store
from dlctl.meta.zk import ZkAuth, connect

pytestmark = pytest.mark.zk


@pytest.fixture
def config(tmp_path, zk, monkeypatch):
    nodes = "".join(
        f'[[clusters.c1.regions.{region}.racks.{rack}.nodes]]\nid = "{region}-{rack}-{i}"\nhost = "127.0.0.1"\nlisten = "127.0.0.1:{4000 + 10 * r + 2 * k + i}"\n'
        for r, region in enumerate(("east", "west", "north"))
        for k, rack in enumerate(("a", "b"))
        for i in range(2)
    )
    path = write_inventory(tmp_path, zk.connect_string, b"cluster-secret-for-cli-tests-0123", zk_auth=b"dlctl:zk-password-for-cli-tests", nodes=nodes)
    monkeypatch.setenv("DLCTL_CONFIG", str(path))
    return path


def test_check_reproduces_the_documented_example_without_a_cluster(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("DLCTL_CONFIG", str(tmp_path / "missing.toml"))  # no cluster is needed
    monkeypatch.delenv("COLUMNS", raising=False)  # piped output keeps whole cells (pytest-xdist workers set COLUMNS)
    code, report, err = dlctl(capsys, "placement", "check", "--regions", "3", "--nodes-per-region", "20", "-m", "2", "-e", "15", "-w", "15", "-a", "8")
    assert code == ExitCode.REFUSED
    assert report["verdict"] == "refused" and "8 replicas in 1 region(s)" in report["reason"] and "A must be ≥ 9" in report["fix"]
    assert "A must be ≥ 9" in err and len(report["scenarios"]) == 8
    one_down = [s for s in report["scenarios"] if len(s["down"]) == 1]
    assert all(not s["new_segments"] and s["existing_writes"] and s["reads"] for s in one_down)

    code, report, _ = dlctl(capsys, "placement", "check", "--regions", "3", "--nodes-per-region", "20", "-m", "2", "-e", "15", "-w", "15", "-a", "9")
    assert code == 0 and report["verdict"] == "accepted"
    assert all(s["new_segments"] for s in report["scenarios"] if len(s["down"]) <= 1)
    assert code == 0

    assert main(["placement", "check", "--regions", "3", "--nodes-per-region", "20", "-m", "2", "-e", "15", "-w", "15", "-a", "8"]) == ExitCode.REFUSED
    out = capsys.readouterr().out
    assert "REFUSED" in out and "new segments" in out and "A must be ≥ 9" in out


def test_set_show_and_check_against_the_live_cluster(config, capsys, zk):
    code, plan, err = dlctl(capsys, "placement", "set", "-e", "4", "-w", "4", "-a", "3", "-m", "2", "--dry-run")
    assert code == 0, err
    assert plan["dry_run"] and plan["steps"][0]["params"]["version"] is None
    code, shown, _ = dlctl(capsys, "placement", "show")
    assert code == 0 and shown["version"] is None and shown["policy"]["min_regions_for_durability"] == 1  # dry run changed nothing

    code, result, _ = dlctl(capsys, "placement", "set", "-e", "4", "-w", "4", "-a", "3", "-m", "2")
    assert code == 0 and result["ok"]
    code, shown, _ = dlctl(capsys, "placement", "show")
    assert shown["policy"]["min_regions_for_durability"] == 2 and shown["version"] == 0
    assert {r["region"]: r["agents"] for r in shown["regions"]} == {"east": 4, "north": 4, "west": 4}

    code, _, err = dlctl(capsys, "placement", "set", "-a", "1")
    assert code == ExitCode.REFUSED and "A=1 < m=2" in err and "A must be ≥ 2" in err

    code, report, _ = dlctl(capsys, "placement", "check")
    assert code == 0 and report["policy"]["min_regions_for_durability"] == 2 and len(report["scenarios"]) == 8


def test_per_log_overrides(config, capsys):
    assert dlctl(capsys, "log", "create", "orders", "-e", "4", "-w", "4", "-a", "3")[0] == 0
    code, result, _ = dlctl(capsys, "placement", "set", "--log", "orders", "-m", "2", "--write-regions", "east,west")
    assert code == 0 and result["ok"]
    code, shown, _ = dlctl(capsys, "placement", "show", "--log", "orders")
    assert shown["effective"] == {"ensemble_size": 4, "write_quorum": 4, "ack_quorum": 3, "min_regions_for_durability": 2, "regions": ["east", "west"], "drained": []}
    code, _, err = dlctl(capsys, "placement", "set", "--log", "orders", "-m", "3")
    assert code == ExitCode.REFUSED and "A must be ≥ 4" in err


def test_drain_and_undrain_a_region(config, capsys, zk):
    assert dlctl(capsys, "placement", "set", "-e", "4", "-w", "4", "-a", "3", "-m", "2")[0] == 0
    code, _, err = dlctl(capsys, "placement", "drain-region", "east")
    assert code == ExitCode.REFUSED and "--yes" in err  # confirmation needed
    code, result, _ = dlctl(capsys, "--yes", "placement", "drain-region", "east")
    assert code == 0 and result["ok"]
    code, shown, _ = dlctl(capsys, "placement", "show")
    assert shown["policy"]["drained"] == ["east"] and [r["drained"] for r in shown["regions"] if r["region"] == "east"] == [True]
    code, _, err = dlctl(capsys, "--yes", "placement", "drain-region", "west")
    assert code == ExitCode.REFUSED and "would leave new segments unplaceable" in err and "--force" in err
    code, result, _ = dlctl(capsys, "placement", "undrain-region", "east")
    assert code == 0 and result["ok"]
    code, shown, _ = dlctl(capsys, "placement", "show")
    assert shown["policy"]["drained"] == []
    code, _, err = dlctl(capsys, "--yes", "placement", "drain-region", "nowhere")
    assert code == ExitCode.FAILED and "has no agents" in err


def test_concurrent_change_is_a_conflict_and_the_znode_carries_the_acl(config, capsys, zk):
    assert dlctl(capsys, "placement", "set", "-a", "3", "-m", "2")[0] == 0
    client = connect(zk.connect_string, ZkAuth("dlctl", "zk-password-for-cli-tests"))
    try:
        current = store.load(client, "c1")
        store.save(client, "c1", current.value, current.version, ZkAuth("dlctl", "zk-password-for-cli-tests"))
        with pytest.raises(ConflictError, match=r"aborted: /dlctl/c1/placement changed concurrently \(expected version 0\)"):
            store.save(client, "c1", current.value, current.version, None)
    finally:
        client.stop()
        client.close()
    admin = make_client(zk.connect_string, superuser=True)
    try:
        acls, _ = admin.get_acls(store.placement_path("c1"))
        assert [a.id.scheme for a in acls] == ["digest"]
    finally:
        close_client(admin)


def test_drain_is_checked_against_every_log_s_own_ensemble_not_only_the_defaults(config, capsys):
    """Four agents per region: with east drained, 8 remain. The defaults (E=3) still place, but
    a log created with E=9 could never roll to a new segment; the drain names that log."""
    assert dlctl(capsys, "log", "create", "wide", "-e", "9", "-w", "9", "-a", "5")[0] == 0
    code, _, err = dlctl(capsys, "--yes", "placement", "drain-region", "east")
    assert code == ExitCode.REFUSED and "would leave new segments unplaceable" in err and "log wide" in err, err
    code, shown, _ = dlctl(capsys, "placement", "show")
    assert shown["policy"]["drained"] == []
    code, plan, _ = dlctl(capsys, "placement", "drain-region", "east", "--force", "--dry-run")
    assert code == 0 and any("log wide" in n for n in plan["notes"]), plan
    assert dlctl(capsys, "--yes", "placement", "drain-region", "east", "--force")[0] == 0
    assert dlctl(capsys, "placement", "show")[1]["policy"]["drained"] == ["east"]


def test_check_names_a_log_whose_segment_records_cannot_be_read_and_judges_the_others(config, capsys, zk):
    """A segment record holding bytes dlctl did not write failed the live check of every log."""
    for name in ("plain", "scribbled"):
        assert dlctl(capsys, "log", "create", name)[0] == 0
    client = connect(zk.connect_string, ZkAuth("dlctl", "zk-password-for-cli-tests"))  # as dlctl creates its records
    try:
        client.create(paths.segment("c1", "scribbled", 1), b'{"seq": "one"}')
        code, report, err = dlctl(capsys, "placement", "check")
        assert code == 0, err
        (note,) = [n for n in report["notes"] if "scribbled" in n]
        assert note.startswith("log scribbled: its segments are not judged") and paths.segment("c1", "scribbled", 1) in note, note
        assert not any("plain" in n for n in report["notes"])
    finally:
        client.stop()
        client.close()

