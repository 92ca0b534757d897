"""``dlctl cluster rotate-certs`` (leaves, then a whole new CA) on a running TLS sandbox under load.

A producer appends all along, opening a new session (new TLS connections) for every batch, and
one connection opened before the rotation sends a request after every batch: nothing may fail,
and every acknowledged record must be read back afterwards. The oracle is the set of payloads
the producer saw acknowledged, compared with what a fresh reader returns.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dlctl import inventory, pki
from dlctl.config import ConfigLocation
from dlctl.log.client import AgentClient
from dlctl.ops.logio import append_records, read_records
from dlctl.session import ClusterSession

pytestmark = [pytest.mark.zk, pytest.mark.agent, pytest.mark.slow]


def dlctl(env: dict[str, str], *argv: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "dlctl.cli", "-o", "json", "--yes", *argv], capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert result.returncode == 0, f"dlctl {' '.join(argv)} exited {result.returncode}:\n{result.stderr}"
    return json.loads(result.stdout) if result.stdout.strip() else {}


@pytest.fixture
def sandbox(tmp_path):
    env = {"DLCTL_SANDBOX_DIR": str(tmp_path / "sbx"), "DLCTL_CONFIG": str(tmp_path / "sbx" / "config.toml")}
    dlctl(env, "sandbox", "up", "--regions", "3", "--nodes-per-region", "1")
    yield env
    subprocess.run([sys.executable, "-m", "dlctl.cli", "--yes", "sandbox", "down", "--purge"], env={**os.environ, **env}, capture_output=True, timeout=120)


def _session(env: dict[str, str]) -> ClusterSession:
    return ClusterSession(inventory.load(ConfigLocation(Path(env["DLCTL_CONFIG"]), "test")).cluster("east"))


def _presented_ca(session: ClusterSession, address: str) -> str:
    """The issuer of the certificate the agent at ``address`` presents now."""
    host, _, port = address.rpartition(":")

    async def go() -> bytes:
        ctx = session.certdir.client_files().client()
        _, writer = await asyncio.open_connection(host, int(port), ssl=ctx, server_hostname=host)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return der

    return pki.describe(ssl.DER_cert_to_PEM_cert(asyncio.run(go())).encode()).issuer


def test_rotation_under_load_loses_nothing(sandbox) -> None:
    dlctl(sandbox, "log", "create", "rot")
    with _session(sandbox) as session:
        _rotate_under_load(sandbox, session)


def _rotate_under_load(sandbox: dict[str, str], session: ClusterSession) -> None:
    nodes = session.meta.available_nodes()
    assert len(nodes) == 3
    old_ca = pki.describe(session.certdir.ca().cert_pem).subject
    assert {_presented_ca(session, n["address"]) for n in nodes.values()} == {old_ca}

    acked: list[bytes] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    first = next(iter(nodes.values()))["address"]

    def produce() -> None:
        async def run() -> None:
            host, _, port = first.rpartition(":")
            long_lived = AgentClient(host, int(port), session.secret, tls=session.tls)
            await long_lived.stat()  # opened before the rotation starts
            batch = 0
            while not stop.is_set():
                records = [f"r{batch}-{i}".encode() for i in range(20)]
                with _session(sandbox) as fresh:  # new session: new connections, current files
                    fresh.run(append_records(fresh, "rot", records))  # (on the command loop, where its pool lives)
                acked.extend(records)
                await long_lived.stat()
                batch += 1
            await long_lived.close()

        try:
            asyncio.run(run())
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failures.append(exc)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        leaves = dlctl(sandbox, "cluster", "rotate-certs")
        assert leaves["ok"]
        whole = dlctl(sandbox, "cluster", "rotate-certs", "--new-ca")
        assert whole["ok"] and [s["action"] for s in whole["steps"]] == ["new-ca", "trust-both", "switch-ca", "rotate", "drop-old-ca", "trust-new"]
        before = len(acked)
        while len(acked) < before + 40 and not failures:  # traffic continues after the rotation
            producer.join(0.1)
    finally:
        stop.set()
        producer.join(60)
    assert not failures, f"the producer failed during the rotation: {failures[0]!r}"
    assert len(acked) >= 40

    with _session(sandbox) as fresh:
        new_ca = pki.describe(fresh.certdir.ca().cert_pem).subject
        assert new_ca != old_ca
        assert {_presented_ca(fresh, n["address"]) for n in nodes.values()} == {new_ca}
        # Every agent now trusts only the new CA: a client certificate of the old one is refused.
        bundle = fresh.certdir.bundle()
        assert [pki.describe(c).subject for c in pki.split_bundle(bundle)] == [new_ca]

        async def read_all() -> list[bytes]:
            return [r.payload async for r in read_records(fresh, "rot", idle_timeout=2.0)]

        read = fresh.run(read_all())
    missing = set(acked) - set(read)
    assert not missing, f"{len(missing)} acknowledged records were not read back, e.g. {sorted(missing)[:3]}"
