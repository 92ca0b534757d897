"""Generate shell completions (completions/) and man pages (man/) from the click trees.

    python -m dlctl.cli.docs          # rewrite completions/ and man/
    python -m dlctl.cli.docs --check  # exit 1 if they drifted from the CLI (used by the tests)

Generated files are committed so that packagers and `man ./man/dlctl.1` work without running
Python; the test suite fails when they drift from the code.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import click

from .. import __version__
from ..errors import ExitCode

ROOT = Path(__file__).resolve().parents[2]

EXIT_STATUSES = (
    (ExitCode.OK, "Success."),
    (ExitCode.FAILED, "Failed."),
    (ExitCode.USAGE, "Usage error: bad arguments or configuration."),
    (ExitCode.PARTIAL, "Partial: some nodes or steps failed; the output has the details."),
    (ExitCode.REFUSED, "Refused for safety or not confirmed; nothing was changed."),
    (ExitCode.INTERRUPTED, "Interrupted."),
)
# dlctl's alone: the agent writes no data to stdout.
OUTPUT_CLOSED_STATUS = (ExitCode.OUTPUT_CLOSED, "The reader of standard output went away (as with | head); nothing is printed.")


def exit_status_section(program: str) -> str:
    statuses = EXIT_STATUSES + ((OUTPUT_CLOSED_STATUS,) if program == "dlctl" else ())
    return '.SH "EXIT STATUS"\n' + "".join(f".TP\n\\fB{int(code)}\\fP\n{meaning}\n" for code, meaning in statuses)


def _programs() -> dict[str, click.Command]:
    from dlagent.cli import cli as agent_cli  # the docs tool documents both programs

    from .main import cli

    return {"dlctl": cli, "dlagent": agent_cli}


def generate(completions_dir: Path, man_dir: Path) -> list[Path]:
    """Write every generated file; returns the paths written."""
    from click_man.core import write_man_pages

    from .misc import SHELLS, completion_source

    completions_dir.mkdir(parents=True, exist_ok=True)
    man_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for shell in SHELLS:
        path = completions_dir / f"dlctl.{shell}"
        path.write_text(completion_source(shell))
        written.append(path)
    for name, command in _programs().items():
        # A fixed "date" (the version) keeps regenerated pages byte-identical between runs.
        write_man_pages(name, command, version=__version__, target_dir=str(man_dir), date=f"{name} {__version__}")
        with open(man_dir / f"{name}.1", "a") as page:
            page.write(exit_status_section(name))
    written.extend(sorted(man_dir.glob("*.1")))
    return written


def drift(completions_dir: Path = ROOT / "completions", man_dir: Path = ROOT / "man") -> list[str]:
    """Names of generated files that are missing, stale or extra compared with a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh_c, fresh_m = Path(tmp, "completions"), Path(tmp, "man")
        generate(fresh_c, fresh_m)
        problems = []
        for fresh_dir, committed_dir in ((fresh_c, completions_dir), (fresh_m, man_dir)):
            fresh = {p.name: p.read_text() for p in fresh_dir.iterdir()}
            committed = {p.name: p.read_text() for p in committed_dir.iterdir()} if committed_dir.is_dir() else {}
            for name in sorted(fresh.keys() | committed.keys()):
                if name not in committed:
                    problems.append(f"{committed_dir.name}/{name}: missing")
                elif name not in fresh:
                    problems.append(f"{committed_dir.name}/{name}: no longer generated (stale)")
                elif fresh[name] != committed[name]:
                    problems.append(f"{committed_dir.name}/{name}: differs from the CLI")
        return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlctl.cli.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        problems = drift()
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run `make docs` to regenerate completions/ and man/", file=sys.stderr)
        return 1 if problems else 0
    for stale in [*ROOT.joinpath("man").glob("*.1")]:
        stale.unlink()
    for path in generate(ROOT / "completions", ROOT / "man"):
        print(path.relative_to(ROOT), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
