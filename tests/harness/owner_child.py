"""A log owner in a child process, for tests that SIGKILL a writer mid-stream.

Run as a script: ``owner_child.py ZK_CONNECT LOG SECRET_FILE ZK_AUTH_FILE ACKED_PATH [CLUSTER [OPTIONS_JSON]]``
(OPTIONS_JSON: ``WriterOptions`` overrides, e.g. ``{"ensemble_retry": 3600}``). It owns the
log, submits records ``rec-0``, ``rec-1``, ... as fast as the writer takes them, and appends
``<i> <dlsn>`` to ACKED_PATH (line-buffered) the moment record i is acknowledged, so the file
is the test's own oracle of what was acknowledged: a torn last line is dropped by the reader.
The agents' TLS comes through the environment (``harness.tls.child_env``; absent: plaintext):
start it with ``env=owner_child.env(node)``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

if __name__ == "__main__":
    import os

    from dlctl.log.auth import Credentials
    from dlctl.log.pool import AgentPool
    from dlctl.log.tls import TlsFiles
    from dlctl.log.writer import LogWriter
    from dlctl.meta.store import MetaStore
    from dlctl.meta.zk import ZkAuth, connect
    from dlctl.secrets import read_secret_file

    async def main(zk: str, name: str, secret_file: str, zk_auth_file: str, acked_path: str, cluster: str = "c1", options: str = "{}") -> None:
        auth = ZkAuth.from_file(Path(zk_auth_file))
        meta = MetaStore(connect(zk, auth, session_timeout=1.0), cluster, auth)
        tls_paths = os.environ.get("HARNESS_CLIENT_TLS")  # harness.tls.CHILD_ENV
        tls = TlsFiles(*(Path(p) for p in tls_paths.split(os.pathsep))) if tls_paths else None
        pool = AgentPool(meta, Credentials(read_secret_file(Path(secret_file)), tls))
        writer = await LogWriter.open(meta, pool, name, owner_id="child", **json.loads(options))
        out = open(acked_path, "w", buffering=1)  # line-buffered: a line is in the file once acknowledged

        def acked(fut: asyncio.Future, i: int) -> None:
            if fut.exception() is None:
                out.write(f"{i} {fut.result()}\n")

        i = 0
        while True:
            for _ in range(40):
                writer.submit(f"rec-{i}".encode()).add_done_callback(lambda f, i=i: acked(f, i))
                i += 1
            await writer.wait_writable()
            await asyncio.sleep(0.002)

    asyncio.run(main(*sys.argv[1:]))


SCRIPT = Path(__file__)


def env(node) -> dict[str, str]:  # noqa: ANN001 - an AgentNode (not imported: this file runs as a script)
    """The child's environment for a cluster of agents like ``node``: its client TLS, if any."""
    from .tls import child_env

    return child_env(node.client_tls)


def acked_records(path: Path) -> list[tuple[int, str]]:
    """(record number, DLSN text) of every acknowledged record written so far."""
    text = path.read_text() if path.exists() else ""
    lines = text.split("\n")[:-1]  # the last piece may be a torn line
    return [(int(i), dlsn) for i, dlsn in (line.split() for line in lines)]
