"""How the cluster secrets reach Spark executors without ever being in argv, logs or task reprs.

* **Local mode** (``local[N]``): executors run on this machine as this user, so they are given
  the *path* of the cluster's secret file (the inventory's ``secret_file``, 0600, checked on
  every read by ``dlctl.secrets.read_secret_file``). The secret bytes never enter Spark at all.
* **A real Spark cluster**: executors cannot read the operator's files, so the secret travels as
  a Spark **broadcast variable**. Spark moves broadcasts over its own RPC and block manager, so
  the job refuses to run unless Spark authentication and network encryption are on
  (``spark.authenticate=true``, ``spark.network.crypto.enabled=true``; and
  ``spark.io.encryption.enabled=true`` so a broadcast spilled to an executor's disk is
  encrypted) — see ``dlctl bootstrap --help`` and the README.

Either way the object pickled into each task is a ``SecretRef`` whose ``repr`` shows no secret.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
