"""The current context (dlctl.current_context) and where it ranks: ``--config`` >
``$DLCTL_CONFIG`` > the current context > the user config dir > /etc/dlctl; -vv names the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlctl import current_context
from dlctl.cli.main import main
from dlctl.config import locate_config, user_config_dir
from dlctl.errors import ConfigError
from dlctl.inventory import load


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("DLCTL_CONFIG", raising=False)
    return tmp_path


def test_the_context_file_lives_in_the_user_config_dir(home, monkeypatch):
    assert current_context.context_file(user_config_dir()) == home / "xdg" / "dlctl" / "current"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert current_context.context_file(user_config_dir()) == home / "home" / ".config" / "dlctl" / "current"


def test_precedence_config_option_env_context_user(home):
    user = user_config_dir() / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text("")
    assert (locate_config(None, env={}).path, locate_config(None, env={}).source) == (user, "user")

    sandbox = home / "sbx" / "config.toml"
    written = current_context.set_current(user_config_dir(), sandbox)
    assert written.stat().st_mode & 0o777 == 0o600
    assert written.read_text() == f"{sandbox}\n"
    assert (locate_config(None, env={}).path, locate_config(None, env={}).source) == (sandbox, "current-context")
    assert locate_config(None, env={"DLCTL_CONFIG": "/env.toml"}).source == "DLCTL_CONFIG"
    assert locate_config("/opt.toml", env={"DLCTL_CONFIG": "/env.toml"}).source == "--config"


def test_clearing_only_removes_a_context_naming_that_inventory(home):
    mine, other = home / "a" / "config.toml", home / "b" / "config.toml"
    current_context.set_current(user_config_dir(), mine)
    assert current_context.clear_if(user_config_dir(), other) is False
    assert current_context.read(user_config_dir()) == mine
    assert current_context.clear_if(user_config_dir(), mine) is True
    assert current_context.read(user_config_dir()) is None
    assert locate_config(None, env={}).source in {"none", "system"}
    assert current_context.clear_if(user_config_dir(), mine) is False  # nothing left to clear


def test_an_empty_context_is_ignored(home):
    path = current_context.context_file(user_config_dir())
    path.parent.mkdir(parents=True)
    path.write_text("")
    assert locate_config(None, env={}).source in {"none", "system"}


def test_a_context_naming_a_missing_file_fails_saying_so_rather_than_falling_through(home):
    gone = home / "gone" / "config.toml"
    current_context.set_current(user_config_dir(), gone)
    with pytest.raises(ConfigError, match="from current-context") as info:
        load(locate_config(None, env={}))
    assert str(current_context.context_file(user_config_dir())) in info.value.hint


def test_debug_logging_names_the_configuration_used(home, capsys):
    inventory = home / "sbx" / "config.toml"
    inventory.parent.mkdir()
    inventory.write_text('[clusters.east]\nzookeeper = "127.0.0.1:1"\n')
    current_context.set_current(user_config_dir(), inventory)
    code = main(["-vv", "-o", "json", "config", "show"])
    out, err = capsys.readouterr()
    assert code == 0 and '"source": "current-context"' in out
    assert "configuration:" in err and "current-context" in err and "config.toml" in err
    code = main(["-o", "json", "config", "show"])
    assert "configuration:" not in capsys.readouterr().err  # only at debug level
