"""Packaging and generated files stay in step with the code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from dlctl.cli import docs

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {"dlctl": ROOT / "dlctl", "dlagent": ROOT / "agent"}
    found = set()
    for name, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            found.add(".".join((name, *rel)))
    assert found == listed, f"add {sorted(found - listed)} / remove {sorted(listed - found)} in pyproject.toml"


def test_completions_and_man_pages_match_the_cli():
    assert docs.drift() == [], "run `make docs` to regenerate completions/ and man/"


def test_man_pages_render_and_document_exit_status():
    for page in ("dlctl.1", "dlagent.1"):
        rendered = subprocess.run(
            ["man", "-l", str(ROOT / "man" / page)], capture_output=True, text=True, check=True,
            env={**os.environ, "MANWIDTH": "100"},
        ).stdout
        text = re.sub(".\x08", "", rendered)  # drop the terminal's bold/underline overstrikes
        assert "EXIT STATUS" in text and "Refused for safety" in text


def test_man_dlctl_resolves_next_to_the_installed_script():
    env = {**os.environ, "PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("MANPATH", None)
    found = subprocess.run(["man", "-w", "dlctl"], capture_output=True, text=True, env=env)
    assert found.returncode == 0, f"`man dlctl` finds no page ({found.stderr.strip()}); run `make install`"
    assert Path(found.stdout.strip()).read_text() == (ROOT / "man" / "dlctl.1").read_text()


def test_console_scripts_are_installed():
    for script in ("dlctl", "dlagent"):
        path = shutil.which(script, path=str(Path(sys.prefix) / "bin"))
        assert path, f"{script} console script missing from {sys.prefix}/bin"
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
        assert script in out
