"""write_secret_file (issue 19): private from the first byte, atomic, and never written through
a symbolic link, whether at the target or at the temporary name beside it."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlctl import secrets as secrets_mod
from dlctl.errors import RefusedError
from dlctl.secrets import read_secret_file, write_secret_file
from harness.procs import umask


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    """The widest umask: a mode not asked for explicitly would show as 0666."""
    with umask(0):
        yield


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_new_secret_is_0600_and_reads_back(tmp_path):
    path = tmp_path / "secrets" / "east.secret"
    write_secret_file(path, b"s3cret\n")
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700  # the directory it had to make, too
    assert read_secret_file(path) == b"s3cret"
    assert sorted(p.name for p in path.parent.iterdir()) == ["east.secret"]  # no temp left


def test_a_symlink_at_the_target_is_refused_and_what_it_points_to_is_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    os.chmod(victim, 0o644)
    link = tmp_path / "east.secret"
    link.symlink_to(victim)
    with pytest.raises(RefusedError, match=r"east\.secret.*symbolic link.*victim") as err:
        write_secret_file(link, b"s3cret\n")
    assert "remove the link" in (err.value.hint or "")
    assert victim.read_bytes() == b"precious\n" and mode(victim) == 0o644
    assert link.is_symlink() and os.readlink(link) == str(victim)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["east.secret", "victim"]


def test_a_dangling_symlink_at_the_target_is_refused_and_nothing_is_created_through_it(tmp_path):
    planted = tmp_path / "elsewhere" / "collected"
    planted.parent.mkdir()
    link = tmp_path / "east.secret"
    link.symlink_to(planted)
    with pytest.raises(RefusedError, match="symbolic link"):
        write_secret_file(link, b"s3cret\n")
    assert not planted.exists()


def test_a_link_planted_under_the_temp_name_is_never_written_through(tmp_path, monkeypatch):
    """An attacker who can write in the directory and guesses (here: is handed) the temp name
    links it to a file of theirs: the write must not land there; another name is drawn."""
    path = tmp_path / "east.secret"
    victim = tmp_path / "attacker-reads-this"
    victim.write_bytes(b"")
    planted = tmp_path / ".east.secret.tmp-planted"
    planted.symlink_to(victim)
    names = iter([planted, tmp_path / ".east.secret.tmp-second"])
    monkeypatch.setattr(secrets_mod, "_temp_name", lambda p: next(names))
    write_secret_file(path, b"s3cret\n")
    assert victim.read_bytes() == b""
    assert planted.is_symlink()  # left alone, not followed, not replaced
    assert path.read_bytes() == b"s3cret\n" and mode(path) == 0o600 and not path.is_symlink()


def test_a_file_planted_under_the_temp_name_is_not_reused(tmp_path, monkeypatch):
    """A pre-existing file under the temp name (opened beforehand by someone who keeps the
    descriptor) must not receive the secret: O_EXCL refuses it, another name is drawn."""
    path = tmp_path / "east.secret"
    planted = tmp_path / ".east.secret.tmp-planted"
    planted.write_bytes(b"")
    os.chmod(planted, 0o666)
    with open(planted, "rb") as spy:
        names = iter([planted, tmp_path / ".east.secret.tmp-second"])
        monkeypatch.setattr(secrets_mod, "_temp_name", lambda p: next(names))
        write_secret_file(path, b"s3cret\n")
        assert spy.read() == b""
    assert planted.read_bytes() == b""
    assert path.read_bytes() == b"s3cret\n" and mode(path) == 0o600


def test_replacing_a_secret_is_atomic_and_narrows_the_mode(tmp_path):
    path = tmp_path / "east.secret"
    path.write_bytes(b"old-secret\n")
    os.chmod(path, 0o644)
    with open(path, "rb") as reader_before:  # opened before the replacement
        write_secret_file(path, b"new-secret\n")
        assert reader_before.read() == b"old-secret\n"  # a new file was renamed in: the old one is whole
    assert path.read_bytes() == b"new-secret\n"
    assert mode(path) == 0o600


def test_a_failed_write_leaves_the_old_secret_whole_and_no_temp_behind(tmp_path, monkeypatch):
    path = tmp_path / "east.secret"
    write_secret_file(path, b"old-secret\n")

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(secrets_mod.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="injected"):
        write_secret_file(path, b"new-secret\n")
    monkeypatch.undo()
    assert path.read_bytes() == b"old-secret\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["east.secret"]


def test_the_temp_file_is_0600_before_its_first_byte(tmp_path, monkeypatch):
    """Seen from inside the write: at the first os.write, the file already exists with mode 0600."""
    path = tmp_path / "east.secret"
    seen: list[int] = []
    real_write = os.write

    def spying_write(fd: int, data) -> int:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(secrets_mod.os, "write", spying_write)
    write_secret_file(path, b"s3cret\n")
    assert seen and set(seen) == {0o600}
