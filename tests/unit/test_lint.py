"""The lint gate (issue 26 item 7): ruff, with pyproject.toml's rules, finds nothing in the
project — and finds what those rules are for in code written to break them (so a gate that
checked nothing, or the wrong config, fails here too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=cwd, capture_output=True, text=True)


def test_the_project_passes_the_lint_gate():
    result = ruff("dlctl", "agent", "tests", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_gate_catches_what_its_rules_are_for(tmp_path: Path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import asyncio\n"
        "import os\n"  # F401: unused
        "\n"
        "\n"
        "def f(items=[]):\n"  # B006: shared mutable default
        "    asyncio.ensure_future(g())\n"  # RUF006: a task nobody holds
        "    return undefined_name\n"  # F821
        "\n"
        "\n"
        "async def g():\n"
        "    pass\n"
    )
    result = ruff("--config", str(ROOT / "pyproject.toml"), str(bad), cwd=tmp_path)
    assert result.returncode == 1
    for code in ("F401", "B006", "RUF006", "F821"):
        assert code in result.stdout, (code, result.stdout)
