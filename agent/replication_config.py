"""The ``[replication]`` table of agent.toml: this agent as a sink-side replication worker.

    [replication]
    enabled = true                 # false: this agent never runs replication workers
    poll_seconds = 1.0             # how often streams and claims are looked at
    claim_grace_seconds = 10       # claim work left unclaimed this long even above the fair share
    checkpoint_seconds = 0.5       # how often a worker checkpoints while records flow
    pin_seconds = 5                # how often a worker refreshes its retention pin at the source
    source_filtering = true        # causal streams: records the sink holds stay at the source
    poll_depth = 8                 # caught up, long polls kept waiting this many entries ahead at
                                   # the source: a new entry crosses the link once (1: one poll
                                   # per source replica, a poll and a read per entry; see README)
    upkeep_seconds = 10            # how often new matching source logs join, settings propagate
    sources_dir = "sources"        # where `dlctl init-replication` installs sources' credentials
                                   # (relative to this file's directory; see below)

    [replication.sources.east]     # how to reach source cluster "east" (one table per source)
    zookeeper = "10.0.0.5:2181"    # optional: default is the connect string in the stream config
    secret_file = "/etc/dlagent/east.secret"    # optional (0600): default is this agent's secret
    zk_auth_file = "/etc/dlagent/east.zk-auth"  # optional (0600): default is this agent's
    region = "us-east"             # optional: the source region to read from first (default: ours)
    addresses = { "use-1" = "10.9.0.1:3181" }   # optional: reach these source agents elsewhere
    tls_ca_file = "/etc/dlagent/east-tls/ca.pem"     # optional, all three or none: the source's CA
    tls_cert_file = "/etc/dlagent/east-tls/client.pem"  # and a certificate it issued to this agent;
    tls_key_file = "/etc/dlagent/east-tls/client.key"   # default: this agent's own [tls]
    zookeeper_tls_ca_file = "/etc/dlagent/east-zk/ca.pem"   # optional: TLS to the source's ZooKeeper
    zookeeper_tls_cert_file = "/etc/dlagent/east-zk/client.pem"  # (with _key_file, or neither);
    zookeeper_tls_key_file = "/etc/dlagent/east-zk/client.key"   # default: this agent's [zookeeper_tls]

Secrets stay in 0600 files; only their paths are here.

A worker reads a source only when an operator declared it: here, or by installing its
credentials with ``dlctl init-replication``, which writes ``<sources_dir>/<cluster>/source.toml``
(the keys of a ``[replication.sources.<cluster>]`` table, paths relative to that directory) beside
the files it names. A table here wins over an installed file. A source that neither declares is
never read: its streams report "not declared on this agent", and the worker does not connect to the
address the stream's record names (anyone who can write the sink's metadata could point it
elsewhere).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlctl.errors import ConfigError
from dlctl.log.tls import TlsFiles
from dlctl.meta.zk import ZK_TLS_KEYS, parse_tls
from dlctl.names import validate_name
from dlctl.replication.source import SourceSettings

_KEYS = {"enabled", "poll_seconds", "claim_grace_seconds", "checkpoint_seconds", "pin_seconds", "source_filtering", "poll_depth", "upkeep_seconds", "sources_dir", "sources"}
SOURCE_FILE = "source.toml"  # in <sources_dir>/<cluster>/: written last by init-replication
_TLS_KEYS = ("tls_ca_file", "tls_cert_file", "tls_key_file")
_ZK_TLS_PREFIX = "zookeeper_tls_"
_SOURCE_KEYS = {"zookeeper", "secret_file", "zk_auth_file", "region", "addresses", *_TLS_KEYS, *(_ZK_TLS_PREFIX + k for k in ZK_TLS_KEYS)}


@dataclass(frozen=True)
class ReplicationSettings:
    enabled: bool = True
    poll_seconds: float = 1.0
    claim_grace_seconds: float = 10.0
    checkpoint_seconds: float = 0.5
    pin_seconds: float = 5.0
    source_filtering: bool = True
    poll_depth: int = 8
    upkeep_seconds: float = 10.0  # dlctl.replication.upkeep
    sources: dict[str, SourceSettings] = field(default_factory=dict)
    sources_dir: Path | None = None  # None: no installed sources (only the tables above)


def declared_source(settings: ReplicationSettings, cluster: str) -> SourceSettings | None:
    """How to reach source ``cluster``: its ``[replication.sources.<cluster>]`` table, else the
    credentials ``dlctl init-replication`` installed; None when neither declares it. Read anew on
    each call (an installed file appears while the agent runs). Raises ``ConfigError`` naming
    the file when an installed one is unreadable or malformed."""
    if cluster in settings.sources:
        return settings.sources[cluster]
    if settings.sources_dir is None:
        return None
    try:
        validate_name("cluster", cluster)  # a name read from metadata: it never leaves sources_dir
    except ValueError as exc:
        raise ConfigError(f"source cluster of a stream: {exc}") from None
    path = settings.sources_dir / cluster / SOURCE_FILE
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: installed credentials of source {cluster!r} are not valid TOML: {exc}", hint=f"re-run `dlctl init-replication --source {cluster} ...` to install them again") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the installed credentials of source {cluster!r}: {exc}", hint=f"re-run `dlctl init-replication --source {cluster} ...` to install them again") from None
    return _source(cluster, raw, path, where=str(path))


def parse_replication(raw: Any, path: Path) -> ReplicationSettings:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: key 'replication' must be a table ([replication])")
    extra = sorted(set(raw) - _KEYS)
    if extra:
        raise ConfigError(f"{path}: unknown key(s) in [replication]: {', '.join(extra)}", hint=f"known keys: {', '.join(sorted(_KEYS))}")
    enabled, source_filtering = raw.get("enabled", True), raw.get("source_filtering", True)
    for key, value in (("enabled", enabled), ("source_filtering", source_filtering)):
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: [replication] key '{key}' must be true or false, got {value!r}")

    def seconds(key: str, default: float, low: float, high: float) -> float:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ConfigError(f"{path}: [replication] key '{key}' must be seconds in {low:g}..{high:g}, got {value!r}")
        return float(value)

    depth = raw.get("poll_depth", ReplicationSettings.poll_depth)
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 256:
        raise ConfigError(f"{path}: [replication] key 'poll_depth' must be an integer in 1..256, got {depth!r}")

    sources_raw = raw.get("sources", {})
    if not isinstance(sources_raw, dict):
        raise ConfigError(f"{path}: [replication] key 'sources' must be a table of tables ([replication.sources.NAME])")
    sources_dir = raw.get("sources_dir", "sources")
    if not isinstance(sources_dir, str) or not sources_dir:
        raise ConfigError(f"{path}: [replication] key 'sources_dir' must be a directory path, got {sources_dir!r}")
    sources = {}
    for name, table in sources_raw.items():
        sources[name] = _source(name, table, path)
    return ReplicationSettings(
        enabled=enabled,
        poll_seconds=seconds("poll_seconds", 1.0, 0.05, 600),
        claim_grace_seconds=seconds("claim_grace_seconds", 10.0, 0.0, 3600),
        checkpoint_seconds=seconds("checkpoint_seconds", 0.5, 0.01, 600),
        pin_seconds=seconds("pin_seconds", 5.0, 0.05, 3600),
        source_filtering=source_filtering,
        poll_depth=depth,
        upkeep_seconds=seconds("upkeep_seconds", 10.0, 0.1, 86400),
        sources=sources,
        sources_dir=(path.parent / sources_dir).resolve(),
    )


def _source(name: str, table: Any, path: Path, *, where: str | None = None) -> SourceSettings:
    where = where or f"{path}: [replication.sources.{name}]"
    try:
        validate_name("cluster", name)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    extra = sorted(set(table) - _SOURCE_KEYS)
    if extra:
        raise ConfigError(f"{where}: unknown key(s): {', '.join(extra)}", hint=f"known keys: {', '.join(sorted(_SOURCE_KEYS))}")
    for key in ("zookeeper", "secret_file", "zk_auth_file", "region", *_TLS_KEYS):
        if key in table and not isinstance(table[key], str):
            raise ConfigError(f"{where}: key '{key}' must be a string")
    addresses = table.get("addresses", {})
    if not isinstance(addresses, dict) or not all(isinstance(k, str) and isinstance(v, str) and ":" in v for k, v in addresses.items()):
        raise ConfigError(f"{where}: key 'addresses' must map node ids to 'host:port' strings")
    base = path.parent
    given = [k for k in _TLS_KEYS if table.get(k)]
    if given and len(given) != len(_TLS_KEYS):
        raise ConfigError(f"{where}: give all of {', '.join(_TLS_KEYS)} or none (got {', '.join(given)})")
    tls = TlsFiles(*((base / table[k]).resolve() for k in _TLS_KEYS)) if given else None
    return SourceSettings(
        cluster=name,
        zookeeper=table.get("zookeeper"),
        secret_file=(base / table["secret_file"]).resolve() if table.get("secret_file") else None,
        zk_auth_file=(base / table["zk_auth_file"]).resolve() if table.get("zk_auth_file") else None,
        region=table.get("region"),
        addresses=dict(addresses),
        tls=tls,
        zookeeper_tls=parse_tls(table, where, base, prefix=_ZK_TLS_PREFIX),
    )
