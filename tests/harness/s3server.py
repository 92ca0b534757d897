"""An S3-compatible server for tests: moto's standalone server (from PyPI, ``moto[server]``) as
a process on a loopback port, with a bucket and a 0600 credentials file for it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .procs import ProcessRegistry, free_port, tcp_connectable, wait_until

ACCESS_KEY, SECRET_KEY = "dlctl-test-key", "dlctl-test-secret"


@dataclass
class S3Server:
    endpoint: str
    credentials_file: Path

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def inventory_table(self, cluster: str, bucket: str, prefix: str = "") -> str:
        """``[clusters.<cluster>.cold_storage]`` pointing at ``bucket`` on this server."""
        return (
            f"\n[clusters.{cluster}.cold_storage]\nkind = \"s3\"\nbucket = \"{bucket}\"\nprefix = \"{prefix}\"\n"
            f"endpoint = \"{self.endpoint}\"\nregion = \"us-east-1\"\ncredentials_file = \"{self.credentials_file}\"\n"
        )


def start_s3_server(procs: ProcessRegistry, base: Path) -> S3Server:
    port = free_port()
    procs.start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], name="s3-server")
    wait_until(lambda: tcp_connectable("127.0.0.1", port), 30, message=f"the S3 server on port {port}")
    base.mkdir(parents=True, exist_ok=True)
    creds = base / "s3.credentials"
    fd = os.open(creds, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f'access_key_id = "{ACCESS_KEY}"\nsecret_access_key = "{SECRET_KEY}"\n')
    return S3Server(f"http://127.0.0.1:{port}", creds)


def s3_with_bucket(tmp_path_factory, bucket: str) -> Iterator[S3Server]:
    """Body of a module-scoped fixture: ``yield from s3_with_bucket(tmp_path_factory, BUCKET)``
    — a server of the module's own with ``bucket`` created, stopped afterwards."""
    registry = ProcessRegistry(tmp_path_factory.mktemp("s3-procs"))
    try:
        server = start_s3_server(registry, tmp_path_factory.mktemp("s3"))
        server.create_bucket(bucket)
        yield server
    finally:
        registry.close()
