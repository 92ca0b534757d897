"""How the cluster secrets (and TLS client keys) reach Spark executors without ever being in
argv, logs or task reprs.

* **Local mode** (``local[N]``): executors run on this machine as this user, so they are given
  the *path* of the cluster's secret file (the inventory's ``secret_file``, 0600, checked on
  every read by ``dlctl.secrets.read_secret_file``) and the paths of the operator's TLS files
  (``tls_dir``). The secret and key bytes never enter Spark at all.
* **A real Spark cluster**: executors cannot read the operator's files, so the secret and the
  TLS files' bytes travel as Spark **broadcast variables**. Spark moves broadcasts over its own
  RPC and block manager, so the job refuses to run unless Spark authentication and network
  encryption are on (``spark.authenticate=true``, ``spark.network.crypto.enabled=true``; and
  ``spark.io.encryption.enabled=true`` so a broadcast spilled to an executor's disk is
  encrypted) — see ``dlctl bootstrap --help`` and the README. Python's ``ssl`` loads a
  certificate and key from files only, so each executor process writes the TLS bytes once into
  a private directory of its own (``TlsRef.get``).

Either way the objects pickled into each task are a ``SecretRef`` and a ``TlsRef`` (None for a
plaintext cluster) whose ``repr`` shows no secret.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..log.tls import TlsFiles
from ..secrets import read_secret_file


class SecretRef:
    """A cluster secret for executors: a 0600 file path, or a Spark broadcast of the bytes."""

    def __init__(self, *, path: Path | None = None, broadcast: Any = None, label: str = "cluster") -> None:
        if (path is None) == (broadcast is None):
            raise ValueError("a SecretRef needs exactly one of path or broadcast")
        self.path = Path(path) if path is not None else None
        self.broadcast = broadcast
        self.label = label

    def get(self) -> bytes:
        if self.path is not None:
            return read_secret_file(self.path)
        return bytes(self.broadcast.value)

    def __repr__(self) -> str:
        how = f"file {self.path}" if self.path is not None else "broadcast"
        return f"SecretRef({self.label}: {how}, secret=***)"

    __str__ = __repr__


TLS_NAMES = ("ca.pem", "client.pem", "client.key")  # as TlsFiles(ca_file, cert_file, key_file)


class TlsRef:
    """A cluster's client TLS files for executors: the operator's paths (local mode), or a Spark
    broadcast of their bytes (a real cluster), as ``(ca bundle, certificate, key)``."""

    def __init__(self, *, paths: tuple[Path, Path, Path] | None = None, broadcast: Any = None, label: str = "cluster") -> None:
        if (paths is None) == (broadcast is None):
            raise ValueError("a TlsRef needs exactly one of paths or broadcast")
        self.paths = tuple(Path(p) for p in paths) if paths is not None else None
        self.broadcast = broadcast
        self.label = label

    def get(self) -> TlsFiles:
        """The ``TlsFiles`` of this process for the cluster: one per process and content, so its
        SSL context is built once and the bytes are written to disk once, not once per task."""
        if self.paths is not None:
            key: tuple = ("paths", self.paths)
        else:
            blobs = tuple(bytes(b) for b in self.broadcast.value)
            digest = hashlib.sha256(b"".join(len(b).to_bytes(8, "big") + b for b in blobs)).hexdigest()
            key = (self.label, digest)
        with _tls_lock:
            files = _tls_files.get(key)
            if files is None:
                files = _tls_files[key] = TlsFiles(*self.paths) if self.paths is not None else _materialise(blobs, self.label)
            return files

    def __repr__(self) -> str:
        how = f"files {self.paths[0].parent}" if self.paths is not None else "broadcast"
        return f"TlsRef({self.label}: {how}, key=***)"

    __str__ = __repr__


_tls_lock = threading.Lock()
_tls_files: dict[tuple, TlsFiles] = {}  # this executor process's, by (cluster, content hash)


def _materialise(blobs: tuple[bytes, ...], label: str) -> TlsFiles:
    """Write the broadcast TLS bytes into a new private directory (mkdtemp: 0700, a random name
    nobody can have planted), each file created O_EXCL|O_NOFOLLOW with mode 0600 so the key is
    never readable by anyone else, not even for a moment. The directory goes under the
    executor's Spark local dir when there is one (``SPARK_LOCAL_DIRS``, which Spark deletes when
    the executor stops: Python workers end with ``os._exit``, so no atexit hook would run)."""
    local = (os.environ.get("SPARK_LOCAL_DIRS") or "").split(",")[0] or None
    directory = Path(tempfile.mkdtemp(prefix=f"dlctl-tls-{label}-", dir=local))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for name, data in zip(TLS_NAMES, blobs):
        fd = os.open(directory / name, flags, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return TlsFiles(*(directory / name for name in TLS_NAMES))


def secret_file_ref(path: Path | None, label: str) -> SecretRef:
    """A cluster secret for tasks on this machine as this user (Spark's local mode, or the
    in-process engine): the secret file's path, checked now."""
    if path is None:
        raise UsageError(f"cluster {label!r} has no secret_file in the inventory; the copy needs it to talk to its agents")
    read_secret_file(path)  # fail here, clearly, rather than in every task
    return SecretRef(path=path, label=label)


def tls_files_ref(files: TlsFiles | None, label: str) -> TlsRef | None:
    """The operator's TLS files for tasks on this machine as this user (None: plaintext), checked now."""
    if files is None:
        return None
    files.client()  # fail here, clearly (a missing file, a key readable by others), not in every task
    return TlsRef(paths=files.paths, label=label)


def secure_spark_conf_problems(conf: dict[str, str]) -> list[str]:
    """What is missing for secrets to travel to a real Spark cluster encrypted and authenticated."""
    need = {
        "spark.authenticate": "true",
        "spark.network.crypto.enabled": "true",
        "spark.io.encryption.enabled": "true",
    }
    return [f"{key}={value}" for key, value in need.items() if str(conf.get(key, "")).lower() != value]


SECRET_LIKE = ("secret", "password", "token", "credential", "keystore", "truststore")


def secret_like(key: str) -> bool:
    """Spark settings that carry secrets must not be passed in argv (``--conf``): put them in
    ``$SPARK_CONF_DIR/spark-defaults.conf`` (0600) instead."""
    lowered = key.lower()
    return any(word in lowered for word in SECRET_LIKE)
