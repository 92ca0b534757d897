"""dlctl's command line run in this process, and the one-cluster inventory it reads, for tests
of a command against a real ZooKeeper (no agents needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlctl.cli.main import main
from dlctl.secrets import write_secret_file

from .tls import tls_dir_for

ONE_NODE = '[[clusters.c1.regions.r1.racks.a.nodes]]\nid = "n1"\nhost = "127.0.0.1"\n'


def write_inventory(directory: Path, zk_connect: str, secret: bytes, *, zk_auth: bytes | None = None, keys: str = "", nodes: str = ONE_NODE) -> Path:
    """``directory``/config.toml naming cluster c1 on ``zk_connect``: its secret file, the
    harness CA as its default tls_dir, its ZooKeeper credentials (``zk_auth``, "user:password";
    None: the default file beside the secret, which ``cluster init`` makes), ``keys`` (more
    keys of [clusters.c1]) and ``nodes``."""
    write_secret_file(directory / "c1.secret", secret)
    tls_dir_for(directory / "c1.secret", "c1")
    lines = ["[clusters.c1]", f'zookeeper = "{zk_connect}"', 'secret_file = "c1.secret"']
    if zk_auth is not None:
        write_secret_file(directory / "c1.zk-auth", zk_auth)
        lines.append('zk_auth_file = "c1.zk-auth"')
    path = directory / "config.toml"
    path.write_text("\n".join([*lines, keys, nodes]))
    return path


def dlctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    """``dlctl -o json argv`` (the inventory from DLCTL_CONFIG): (exit code, stdout parsed as
    JSON or None when empty, stderr)."""
    code = main(["-o", "json", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err
