"""Dependencies point one way (README: Layout; issue 26): ``dlctl.cli → dlctl.ops → the dlctl
library``, and ``dlagent → the dlctl library``. Every import of every module — top level or
inside a function, absolute or relative — is read from the source with ``ast`` and checked:

- the library (everything in ``dlctl`` outside ``ops`` and ``cli``) never imports ``dlctl.ops``
  or ``dlctl.cli``;
- ``dlctl.ops`` never imports ``dlctl.cli``;
- the agent never imports ``dlctl.ops`` or ``dlctl.cli``;
- the command line never reads ZooKeeper or builds agent pools itself: no import of kazoo, the
  metadata or stream stores or the agent pool, no ``.meta`` of a session, no ``with_pool``;
- no module imports another's private names (``from .x import _y``): what another room needs
  is a public name of the room that owns it.

A leak fails here, naming the file, the line and the import."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "agent":
        parts[0] = "dlagent"
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported(source: str, module: str, is_package: bool = False) -> Iterator[tuple[str, int]]:
    """(absolute module name, line) of every import in ``source`` of module ``module``; for
    ``from X import y`` both ``X`` and ``X.y`` (y may be a submodule)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            yield name, node.lineno
            for alias in node.names:
                yield f"{name}.{alias.name}", node.lineno


def forbidden_for(module: str) -> tuple[str, ...]:
    if module.startswith("dlctl.cli"):
        return ()
    if module.startswith("dlctl.ops"):
        return ("dlctl.cli",)
    return ("dlctl.ops", "dlctl.cli")  # the library and the agent


def leaks(source: str, module: str, is_package: bool = False) -> list[str]:
    bad = forbidden_for(module)
    return [
        f"line {line}: {name}"
        for name, line in imported(source, module, is_package)
        if any(name == b or name.startswith(b + ".") for b in bad)
    ]


CLI_MAY_NOT = ("kazoo", "dlctl.log.pool", "dlctl.meta.store", "dlctl.meta.zk", "dlctl.replication.store")


def cli_reaches_in(source: str, module: str) -> list[str]:
    """Where command-line module ``module`` does what only operations may: reach ZooKeeper (the
    stores, a session's ``.meta``) or the agents (a pool, ``with_pool``)."""
    out = [f"line {line}: imports {name}" for name, line in imported(source, module) if any(name == b or name.startswith(b + ".") for b in CLI_MAY_NOT)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("meta", "with_pool"):
            out.append(f"line {node.lineno}: .{node.attr}")
    return out


def test_the_command_line_leaves_zookeeper_and_agents_to_operations():
    found = []
    for path in sorted(ROOT.glob("dlctl/cli/*.py")):
        found += [f"{path.relative_to(ROOT)} {leak}" for leak in cli_reaches_in(path.read_text(), module_of(path))]
    assert not found, "the command line reaches into ZooKeeper or the agents:\n" + "\n".join(found)
    # The check sees both forms.
    assert cli_reaches_in("from ..log.pool import AgentPool\n", "dlctl.cli.x") == ["line 1: imports dlctl.log.pool", "line 1: imports dlctl.log.pool.AgentPool"]
    assert cli_reaches_in("def f(s):\n    return s.meta.list_logs()\n", "dlctl.cli.x") == ["line 2: .meta"]


def borrowed_privates(source: str) -> list[str]:
    """``from X import _y`` in ``source``: another module's private name (the C extension
    ``_speedups`` is a module, not a name)."""
    return [
        f"line {node.lineno}: {alias.name} from {'.' * node.level}{node.module or ''}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module != "__future__"
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__") and alias.name != "_speedups"
    ]


def test_no_module_borrows_another_modules_private_names():
    found = []
    for path in sorted([*ROOT.glob("dlctl/**/*.py"), *ROOT.glob("agent/**/*.py")]):
        found += [f"{path.relative_to(ROOT)} {use}" for use in borrowed_privates(path.read_text())]
    assert not found, "private names used outside their module:\n" + "\n".join(found)
    assert borrowed_privates("from .logs import _depose, owner_record\n") == ["line 1: _depose from .logs"]
    assert borrowed_privates("def f():\n    from dlctl.cli.agent import _fleet\n") == ["line 2: _fleet from dlctl.cli.agent"]
    assert borrowed_privates("from .. import _speedups\nfrom __future__ import annotations\n") == []


def test_dependencies_point_one_way():
    found = []
    for path in sorted([*ROOT.glob("dlctl/**/*.py"), *ROOT.glob("agent/**/*.py")]):
        module = module_of(path)
        found += [f"{path.relative_to(ROOT)} {leak}" for leak in leaks(path.read_text(), module, path.name == "__init__.py")]
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_the_check_catches_every_form_of_a_leak():
    # Relative, absolute, lazy (inside a function), and ``from package import module``.
    assert leaks("from ..ops import gc\n", "dlctl.retention.collect") == ["line 1: dlctl.ops", "line 1: dlctl.ops.gc"]
    assert leaks("def f():\n    from dlctl.ops.gc import apply_log\n", "dlagent.housekeeping") == ["line 2: dlctl.ops.gc", "line 2: dlctl.ops.gc.apply_log"]
    assert leaks("import dlctl.cli.main\n", "dlctl.ops.gc") == ["line 1: dlctl.cli.main"]
    assert leaks("from dlctl import ops\n", "dlagent.auditor") == ["line 1: dlctl.ops"]
    assert leaks("from . import gc\n", "dlctl.ops", is_package=True) == []
    assert leaks("from ..ops import gc\n", "dlctl.cli.truncate") == []  # the command line may use both
    assert leaks("from ..log import rereplicator\n", "dlctl.ops.rereplicate") == []
