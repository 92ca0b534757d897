"""TLS material for Spark executors (``dlctl.spark.credentials.TlsRef``).

On a real Spark cluster the driver broadcasts the operator's CA bundle, certificate and key as
bytes; each executor process writes them once into a private directory (0700, files 0600,
created O_EXCL) and reuses that ``TlsFiles`` for every task. In local mode the operator's own
files are used in place. The copy's ``StaticPool`` then speaks mutual TLS to a real (in-process)
agent server, and a pool with another CA's certificate is refused.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import stat
from pathlib import Path

import pytest

from dlctl import pki
from dlctl.errors import ConfigError
from dlctl.log.auth import Credentials
from dlctl.log.errors import AgentUnavailableError
from dlctl.log.tls import TlsFiles
from dlctl.secrets import write_secret_file
from dlctl.spark import credentials as C
from dlctl.spark.credentials import SecretRef, TlsRef
from dlctl.spark.engine import EngineOptions, SparkEngine
from dlctl.spark.task import Endpoints, StaticPool

SECRET = b"spark-tls-test-secret-0123456789"


class Broadcast:
    """What a Spark broadcast variable offers a task: ``.value``."""

    def __init__(self, value: object) -> None:
        self.value = value


def material(cluster: str = "east") -> tuple[pki.Issued, tuple[bytes, bytes, bytes]]:
    ca = pki.new_ca(cluster)
    mine = pki.issue(ca, f"dlctl operator of {cluster}", server=False)
    return ca, (ca.cert_pem, mine.cert_pem, mine.key_pem)


def write_files(directory: Path, blobs: tuple[bytes, bytes, bytes]) -> TlsFiles:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, data in zip(C.TLS_NAMES, blobs):
        write_secret_file(directory / name, data)
    return TlsFiles(*(directory / n for n in C.TLS_NAMES))


@pytest.fixture(autouse=True)
def fresh_process_cache(monkeypatch, tmp_path):
    """Each test is a fresh executor process, whose Spark local dir is under tmp_path."""
    monkeypatch.setattr(C, "_tls_files", {})
    local = tmp_path / "spark-local"
    local.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{local},{tmp_path / 'unused'}")
    return local


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_broadcast_tls_bytes_are_written_once_per_process_into_a_private_directory(fresh_process_cache):
    _ca, blobs = material()
    old = os.umask(0o022)  # the usual default: files made without a mode would be 0644
    try:
        ref = TlsRef(broadcast=Broadcast(blobs), label="east")
        files = ref.get()
    finally:
        os.umask(old)
    directory = files.ca_file.parent
    assert directory.parent == fresh_process_cache  # under the executor's Spark local dir, which Spark deletes
    assert mode(directory) == 0o700 and directory.lstat().st_uid == os.getuid()
    for path, data in zip(files.paths, blobs):
        assert path.parent == directory and stat.S_ISREG(path.lstat().st_mode)
        assert mode(path) == 0o600
        assert path.read_bytes() == data
    files.client()  # the material loads as a client context

    # Every later task of this process (its own unpickled copy of the ref) reuses the files.
    again = pickle.loads(pickle.dumps(TlsRef(broadcast=Broadcast(blobs), label="east")))
    assert again.get() is files
    assert sorted(p.name for p in fresh_process_cache.iterdir()) == [directory.name]

    # Another certificate (a rotation between jobs), or another cluster: a directory of its own.
    _ca2, other = material()
    rotated = TlsRef(broadcast=Broadcast(other), label="east").get()
    assert rotated.ca_file.parent != directory and rotated.cert_file.read_bytes() == other[1]
    west = TlsRef(broadcast=Broadcast(blobs), label="west").get()
    assert west.ca_file.parent not in (directory, rotated.ca_file.parent)
    assert files.key_file.read_bytes() == blobs[2]  # the first one untouched


def test_a_tls_reference_never_shows_the_key_and_local_mode_ships_paths_only(tmp_path):
    _ca, blobs = material()
    files = write_files(tmp_path / "east.tls", blobs)
    local = TlsRef(paths=files.paths, label="east")
    assert local.get().paths == files.paths and local.get() is local.get()
    assert blobs[2] not in pickle.dumps(local)  # paths travel to executors, not the key
    remote = TlsRef(broadcast=Broadcast(blobs), label="east")
    for ref in (local, remote):
        assert b"PRIVATE KEY" not in repr(ref).encode() and "***" in str(ref)
    with pytest.raises(ValueError):
        TlsRef(label="east")


def test_the_engine_checks_the_operators_files_on_the_driver_and_plaintext_stays_none(tmp_path):
    _ca, blobs = material()
    files = write_files(tmp_path / "east.tls", blobs)
    engine = SparkEngine(EngineOptions(parallelism=1))  # not started: local mode needs no context
    try:
        assert engine.tls(None, "east") is None
        ref = engine.tls(files, "east")
        assert ref is not None and ref.paths == files.paths and ref.broadcast is None
        os.chmod(files.key_file, 0o644)
        with pytest.raises(ConfigError, match="accessible by group or others"):
            engine.tls(TlsFiles(*files.paths), "east")  # refused here, not in every task
    finally:
        engine.stop()


def test_on_a_cluster_the_engine_broadcasts_the_files_bytes(tmp_path):
    _ca, blobs = material()
    files = write_files(tmp_path / "east.tls", blobs)

    class Context:
        def broadcast(self, value):
            return Broadcast(value)

    engine = SparkEngine(EngineOptions(master="spark://127.0.0.1:7077"))
    engine.sc = Context()
    try:
        ref = engine.tls(files, "east")
        assert ref.paths is None and tuple(ref.broadcast.value) == blobs
    finally:
        engine.sc = None
        engine.stop()


def test_a_static_pool_over_broadcast_material_speaks_mutual_tls_to_an_agent(tmp_path):
    from dlagent.server import AgentServer
    from dlagent.storage import SegmentStore

    ca, blobs = material()
    served = pki.issue(ca, "n1", ["n1", "127.0.0.1"])
    agent_files = write_files(tmp_path / "agent", (ca.cert_pem, served.cert_pem, served.key_pem))
    endpoints = Endpoints(
        source_cluster="east",
        source_nodes={},
        source_secret=SecretRef(broadcast=Broadcast(SECRET), label="east"),
        sink_cluster="west",
        sink_nodes={},
        sink_secret=SecretRef(broadcast=Broadcast(SECRET), label="west"),
        source_tls=TlsRef(broadcast=Broadcast(blobs), label="east"),
    )
    assert endpoints.sink_credentials().tls is None  # a plaintext cluster keeps working as before

    async def go() -> None:
        store = SegmentStore(tmp_path / "data")
        await store.open()
        server = AgentServer(store, SECRET, "127.0.0.1", 0, tls=agent_files)
        await server.start()
        nodes = {"n1": {"address": f"127.0.0.1:{server.address[1]}"}}
        _other_ca, foreign = material("evil")
        stranger = Credentials(SECRET, TlsRef(broadcast=Broadcast(foreign), label="east").get())
        pools = [StaticPool(nodes, endpoints.source_credentials(), 5.0), StaticPool(nodes, stranger, 5.0)]
        try:
            await (await pools[0].client("n1")).stat()
            assert server.stat()["requests"] >= 1
            with pytest.raises(AgentUnavailableError):  # another CA's certificate: refused in the handshake
                await (await pools[1].client("n1")).stat()
        finally:
            for pool in pools:
                await pool.close()
            await server.stop()
            await store.close()

    asyncio.run(go())
