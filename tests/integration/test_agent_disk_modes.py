"""Least privilege on disk, checked on a running ``dlagent serve`` (issue 19, DESIGN.md §10):
its data directory is 0700 and every file it writes 0600, even when whatever started it had
the widest umask and had made the data directory 0755; and an agent.toml whose paths hold an
emoji, quotes and backslashes starts a real agent that serves from exactly that directory.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlctl.log import format as fmt
from harness.agents import AgentNode
from harness.procs import umask, wait_until

pytestmark = [pytest.mark.zk, pytest.mark.agent]

LOG_ID = 42


def entry(seq: int, entry_id: int) -> bytes:
    return fmt.encode(fmt.Entry(LOG_ID, seq, entry_id, entry_id - 1, f"entry-{seq}-{entry_id}".encode() * 4))


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The agent inherits the umask of the process that starts it: the widest one here."""
    with umask(0):
        yield


def modes_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}


def test_a_running_agents_data_dir_is_0700_and_every_file_in_it_0600(procs, tmp_path, zk, open_umask):
    admin = zk.client()
    node = AgentNode(procs, tmp_path, zk.connect_string)
    node.data_dir.mkdir()
    node.data_dir.chmod(0o755)  # as `mkdir -p` under the usual umask, or an older agent, left it
    node.start(zk=admin)

    with node.client() as c:
        for i in range(3):
            c.add(entry(1, i))
        c.add(entry(2, 0))
        c.fence(LOG_ID, 2)  # a .fenced marker
    acked = [node.data_dir / "segments" / f"{LOG_ID:016x}" / f"{seq:016x}.acked" for seq in (1, 2)]
    wait_until(lambda: all(p.exists() for p in acked), 15, message=".acked files written by the running agent", watch=node.proc)

    found = modes_under(node.data_dir)  # while it runs
    suffixes = {Path(p).suffix or Path(p).name for p in found}
    assert {".log", ".acked", ".fenced", "LOCK", ".json"} <= suffixes, f"not every kind of file was made: {sorted(found)}"
    wider = {p: f"{m:04o}" for p, m in found.items() if m != (0o700 if (node.data_dir / p).is_dir() else 0o600)}
    assert not wider, f"not 0700 (directories) / 0600 (files) on a running agent: {wider}"
    assert "identity.json" in found

    status = Path(f"/proc/{node.proc.pid}/status").read_text()
    assert "Umask:\t0077" in status, [line for line in status.splitlines() if line.startswith("Umask")]
    assert "was mode 0755, open to other users: narrowed to 0700" in node.proc.output()


def test_an_agent_starts_from_a_config_whose_paths_hold_an_emoji_quotes_and_backslashes(procs, tmp_path, zk):
    admin = zk.client()
    base = tmp_path / 'dätä 😀 "quoted" back\\slash'
    node = AgentNode(procs, base, zk.connect_string).start(zk=admin)
    with node.client() as c:
        c.add(entry(1, 0))
        assert c.read(LOG_ID, 1, 0) == entry(1, 0)
    assert (node.data_dir / "segments" / f"{LOG_ID:016x}" / f"{1:016x}.log").is_file()  # in the very directory named
    assert str(node.data_dir).startswith(str(base)) and "😀" in str(node.data_dir)
