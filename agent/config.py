"""The agent's configuration file (TOML), validated with errors that name file, key and fix.

    node_id     = "r1-n1"              # unique within the cluster
    cluster     = "east"
    region      = "r1"
    rack        = "rack-a"
    data_dir    = "/var/lib/dlagent"
    listen      = "127.0.1.1:3181"     # host:port the protocol server binds
    advertise   = "127.0.1.1:3181"     # optional: address clients should use (default: listen)
    zookeeper   = "127.0.0.1:2181"     # connect string (may carry a chroot: host:port/path)
    secret_file = "/etc/dlagent/secret"        # cluster secret, mode 0600
    zk_auth_file = "/etc/dlagent/zk-auth"      # optional, 'user:password', mode 0600
    event_loop  = "auto"               # "uvloop", "asyncio", or "auto": uvloop when installed

    [tls]                      # mutual TLS on the agent protocol (dlctl.log.tls); absent: plaintext
    ca_file   = "tls/ca.pem"   # the cluster CA bundle this agent trusts (clients and other agents)
    cert_file = "tls/agent.pem"        # this agent's certificate (names its advertised host)
    key_file  = "tls/agent.key"        # its key, mode 0600; all three re-read when they change

    [zookeeper_tls]            # TLS to ZooKeeper (`zookeeper` names its secureClientPort); absent:
                               # plaintext, the zk_auth_file password included (dlctl.meta.zk)
    ca_file   = "zk-tls/ca.pem"        # the CA of the ensemble's server certificates (required)
    cert_file = "zk-tls/client.pem"    # optional, with key_file: this agent's client certificate,
    key_file  = "zk-tls/client.key"    # for an ensemble with ssl.clientAuth=need (key 0600)

    [storage]
    sync = "always"            # or "never": relies on replication alone (see SyncPolicy)
    group_commit_ms = 2.0
    group_commit_bytes = 524288
    inline_sync_bytes = 65536      # small batches are synced on the event loop (0: never)
    preallocate_bytes = 4194304    # segment files grow ahead of the data by up to this (0: off)

    [auditor]                  # re-replication auditor (see dlagent.auditor)
    enabled = true             # false: this agent never stands for election
    grace_seconds = 300        # how long an agent must stay gone before its data is copied
    check_seconds = 10         # how often the elected auditor looks (and surveys live replicas)
    max_bytes_per_second = 67108864  # copy rate of its repairs and re-replications (0: no limit)

    [proxy]                    # write proxy: clients append to logs this agent owns (dlagent.proxy)
    enabled = true             # false: APPEND/RELEASE are refused; the agent only stores segments
    max_log_bytes = 33554432   # per owned log: unacknowledged + queued bytes before clients are held back
    batch_delay_ms = 2.0       # how long the owner lets an entry fill with records from many clients
    producer_id_ttl = 3600     # seconds an idempotent producer may be idle and its resends still be recognised

    [housekeeping]             # retention and GC of truncated segments (dlagent.housekeeping)
    enabled = true             # false: never the elected housekeeper (still reclaims its own files)
    check_seconds = 60         # how often retention/collection run and own stale files are reclaimed
    disk_override_free_bytes = 0   # > 0: once an agent has less free disk, retention passes pins
    delete_concurrency = 4     # replica deletions in flight at once (gentle on the disk)
    delete_rate = 50           # replica deletions per second at most (0: no limit)
    cold_credentials_file = "" # 0600 TOML (access_key_id, secret_access_key) for an S3 cold store the
                               # cluster requires (`dlctl cluster cold-storage enable`); "": boto3's chain
    offload_bytes_per_second = 33554432  # read rate of the copies it makes for the cold store, or
                               # e.g. "32MiB" (0: no limit): offload never crowds out the writers

    [scrub]                    # background re-reading of every replica (dlagent.storage.scrub)
    enabled = true             # false: damage is found only when read, or at the next start
    bytes_per_second = 4194304 # read rate cap, or e.g. "4MiB" (tests/benchmarks/bench_scrub.py:
                               # appends lose ~1-2 %, within noise); on spinning disks, where
                               # every 1 MiB chunk costs two seeks, 1-2 MiB/s
    interval = 604800          # seconds, or e.g. "7d", between the starts of two full passes; a
                               # longer pass is followed at once. The first starts one interval
                               # after the agent does (startup recovery reads every file in full)

    [metrics]                  # Prometheus / OpenMetrics endpoint (dlagent.metrics): GET /metrics
    listen = "127.0.1.1:9181"  # default: the host of `listen`, port 9181; "HOST:0": any free port;
                               # "off": no endpoint. The bound address is published in the agent's
                               # availability record and its stat (key "metrics")

    [server]                   # the protocol server's limits (dlagent.limits); the defaults are safe
    max_connections = 1024     # authenticated connections at once
    max_connections_per_peer = 512     # from one source address, authenticated or not
    max_unauthenticated = 256  # still in the handshake: a budget apart from max_connections (over
                               # it, a new one closes the oldest of the address holding the most)
    max_unauthenticated_per_peer = 128 # of those from one address (over it: that address's oldest)
    max_unauthenticated_frame = 4096   # bytes; a larger frame before AUTH closes the connection unread
    handshake_timeout = 10     # seconds from accept to a verified AUTH
    max_in_flight = 256        # requests per connection being handled at once
    max_in_flight_bytes = 67108864     # their bytes, or e.g. "64MiB"
    max_long_polls = 4096      # long polls waiting per connection (counted apart from the above)
    max_response_bytes = 16777216      # answers per connection the client has not taken yet, or
                               # e.g. "16MiB": past it the agent stops reading that connection
    idle_timeout = 600         # seconds without a byte received or a request in flight
    frame_timeout = 60         # seconds a started frame may take to complete
    max_long_poll = 120        # seconds; longer long-poll timeouts are cut to this
    compression = true         # zstd answers to reads that ask (replication streams); false:
                               # refused as by an agent that predates it (its readers read plain)

    [log]                      # the detached agent's log file, rotated (dlagent.logconfig); under
    max_bytes = 10485760       # systemd, journald keeps the log instead
    backups = 5

Each agent raises its own soft open-files limit to the hard one at start, and warns when the limit
is below what these limits and the store's open files may need (stat: fds_open, fds_headroom).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlctl.errors import ConfigError
from dlctl.log.tls import TlsFiles
from dlctl.meta.zk import ZkTls, check_connect_string, parse_tls
from dlctl import units
from dlctl.names import validate_name

from .limits import CONFIG_KEYS as SERVER_KEYS
from .limits import ServerLimits
from .logconfig import LogSettings, parse_log
from .replication_config import ReplicationSettings, parse_replication

_REQUIRED = ("node_id", "cluster", "region", "rack", "data_dir", "listen", "zookeeper", "secret_file")
_OPTIONAL = (
    "advertise", "zk_auth_file", "event_loop", "storage", "tls", "zookeeper_tls", "session_timeout", "auditor", "proxy", "replication",
    "housekeeping", "scrub", "server", "metrics",
)
_OPTIONAL += ("log",)  # [log]: dlagent.logconfig


@dataclass(frozen=True)
class StorageSettings:
    sync: str = "always"
    group_commit_ms: float = 2.0
    group_commit_bytes: int = 512 * 1024
    inline_sync_bytes: int = 64 * 1024
    preallocate_bytes: int = 4 << 20


@dataclass(frozen=True)
class AuditorSettings:
    enabled: bool = True
    grace_seconds: float = 300.0
    check_seconds: float = 10.0
    max_bytes_per_second: float = 64 * 1024 * 1024  # repairs' and re-replications' copy rate (0: no limit)


@dataclass(frozen=True)
class ProxySettings:
    enabled: bool = True
    max_log_bytes: int = 32 * 1024 * 1024
    batch_delay_ms: float = 2.0
    idle_release_seconds: float = 600.0
    producer_id_ttl: float = 3600.0


@dataclass(frozen=True)
class HousekeepingSettings:
    enabled: bool = True
    check_seconds: float = 60.0
    disk_override_free_bytes: int = 0
    delete_concurrency: int = 4
    delete_rate: float = 50.0  # replica deletions per second (0: no limit)
    cold_credentials_file: Path | None = None  # for the cold store the cluster requires (dlctl.retention.offload)
    offload_bytes_per_second: int = 32 << 20  # read rate of the copies it makes for the cold store (0: no limit)


@dataclass(frozen=True)
class ScrubSettings:
    enabled: bool = True
    bytes_per_second: int = 4 << 20
    interval: float = 7 * 86400.0


METRICS_PORT = 9181  # the endpoint's port unless [metrics] listen says otherwise


@dataclass(frozen=True)
class MetricsSettings:
    listen: tuple[str, int] | None = None  # (host, port) to serve /metrics on; port 0: any free one; None: off


@dataclass(frozen=True)
class AgentConfig:
    path: Path
    node_id: str
    cluster: str
    region: str
    rack: str
    data_dir: Path
    host: str
    port: int
    advertise: str
    zookeeper: str
    secret_file: Path
    zk_auth_file: Path | None
    storage: StorageSettings
    session_timeout: float = 6.0
    auditor: AuditorSettings = AuditorSettings()
    proxy: ProxySettings = ProxySettings()
    replication: ReplicationSettings = ReplicationSettings()  # [replication]: see dlagent.replication_config
    housekeeping: HousekeepingSettings = HousekeepingSettings()
    event_loop: str = "auto"
    scrub: ScrubSettings = ScrubSettings()
    metrics: MetricsSettings = MetricsSettings()  # [metrics]; from_dict fills in the default address
    server: ServerLimits = ServerLimits()  # [server]: see dlagent.limits
    tls: TlsFiles | None = None  # [tls]; None: plaintext (the agent warns at start)
    zookeeper_tls: ZkTls | None = None  # [zookeeper_tls]; None: plaintext ZooKeeper
    log: LogSettings = LogSettings()  # [log]: the detached agent's rotated log (dlagent.logconfig)


EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def parse_address(text: str, *, where: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{where}: expected host:port, got {text!r}")
    return host.strip("[]"), int(port)


def load(path: Path) -> AgentConfig:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"agent configuration {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return from_dict(raw, path)


def from_dict(raw: dict[str, Any], path: Path) -> AgentConfig:
    def where(key: str) -> str:
        return f"{path}: key '{key}'"

    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ConfigError(f"{path}: missing required key(s): {', '.join(missing)}")
    unknown = sorted(set(raw) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s): {', '.join(unknown)}", hint="check for typos against `dlagent serve --help`")
    for key in _REQUIRED + ("advertise", "zk_auth_file"):
        if key in raw and not isinstance(raw[key], str):
            raise ConfigError(f"{where(key)} must be a string")
    try:
        names = {k: validate_name(k.replace("_id", ""), raw[k]) for k in ("node_id", "cluster", "region", "rack")}
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    check_connect_string(raw["zookeeper"], where("zookeeper"))
    host, port = parse_address(raw["listen"], where=where("listen"))
    advertise = raw.get("advertise") or f"{host}:{port}"
    parse_address(advertise, where=where("advertise"))
    storage_raw = raw.get("storage", {})
    if not isinstance(storage_raw, dict):
        raise ConfigError(f"{where('storage')} must be a table")
    extra = sorted(set(storage_raw) - {"sync", "group_commit_ms", "group_commit_bytes", "inline_sync_bytes", "preallocate_bytes"})
    if extra:
        raise ConfigError(f"{path}: unknown key(s) in [storage]: {', '.join(extra)}")
    storage = StorageSettings(**storage_raw)
    if storage.sync not in ("always", "never"):
        raise ConfigError(f"{path}: [storage] sync must be 'always' or 'never', got {storage.sync!r}")
    if not (isinstance(storage.group_commit_ms, (int, float)) and 0 <= storage.group_commit_ms <= 1000):
        raise ConfigError(f"{path}: [storage] group_commit_ms must be a number of milliseconds in 0..1000")
    if not (isinstance(storage.group_commit_bytes, int) and storage.group_commit_bytes > 0):
        raise ConfigError(f"{path}: [storage] group_commit_bytes must be a positive integer")
    for key in ("inline_sync_bytes", "preallocate_bytes"):
        value = getattr(storage, key)
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1 << 30):
            raise ConfigError(f"{path}: [storage] {key} must be a number of bytes in 0..1073741824 (0: off)")
    event_loop = raw.get("event_loop", "auto")
    if event_loop not in EVENT_LOOPS:
        raise ConfigError(f"{where('event_loop')} must be one of {', '.join(EVENT_LOOPS)}, got {event_loop!r}")
    session_timeout = raw.get("session_timeout", 6.0)
    if not isinstance(session_timeout, (int, float)) or not 0.5 <= session_timeout <= 120:
        raise ConfigError(f"{where('session_timeout')} must be seconds in 0.5..120")
    auditor = _auditor_settings(raw.get("auditor", {}), path)
    proxy = _proxy_settings(raw.get("proxy", {}), path)
    replication = parse_replication(raw.get("replication", {}), path)
    housekeeping = _housekeeping_settings(raw.get("housekeeping", {}), path)
    scrub = _scrub_settings(raw.get("scrub", {}), path)
    server = _server_limits(raw.get("server", {}), path)
    metrics = _metrics_settings(raw.get("metrics", {}), path, host, port)
    base = path.parent
    tls = _tls_files(raw.get("tls"), path, base)
    zookeeper_tls = parse_tls(raw.get("zookeeper_tls"), f"{path}: [zookeeper_tls]", base)
    return AgentConfig(
        path=path,
        data_dir=(base / raw["data_dir"]).resolve(),
        host=host,
        port=port,
        advertise=advertise,
        zookeeper=raw["zookeeper"],
        secret_file=(base / raw["secret_file"]).resolve(),
        zk_auth_file=(base / raw["zk_auth_file"]).resolve() if raw.get("zk_auth_file") else None,
        storage=storage,
        session_timeout=float(session_timeout),
        auditor=auditor,
        proxy=proxy,
        replication=replication,
        housekeeping=housekeeping,
        event_loop=event_loop,
        scrub=scrub,
        metrics=metrics,
        server=server,
        tls=tls,
        zookeeper_tls=zookeeper_tls,
        log=parse_log(raw.get("log", {}), path),
        **names,
    )


TLS_KEYS = ("ca_file", "cert_file", "key_file")


def _tls_files(raw: Any, path: Path, base: Path) -> TlsFiles | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: key 'tls' must be a table ([tls] with {', '.join(TLS_KEYS)})")
    extra = sorted(set(raw) - set(TLS_KEYS))
    missing = [k for k in TLS_KEYS if k not in raw]
    if extra or missing:
        problem = f"unknown key(s) {', '.join(extra)}" if extra else f"missing key(s) {', '.join(missing)}"
        raise ConfigError(f"{path}: [tls] has {problem}", hint=f"[tls] needs exactly {', '.join(TLS_KEYS)}")
    for key in TLS_KEYS:
        if not isinstance(raw[key], str) or not raw[key]:
            raise ConfigError(f"{path}: [tls] key '{key}' must be a file path")
    return TlsFiles(*((base / raw[k]).resolve() for k in TLS_KEYS))


def _auditor_settings(raw: Any, path: Path) -> AuditorSettings:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: key 'auditor' must be a table ([auditor])")
    extra = sorted(set(raw) - {"enabled", "grace_seconds", "check_seconds", "max_bytes_per_second"})
    if extra:
        raise ConfigError(f"{path}: unknown key(s) in [auditor]: {', '.join(extra)}", hint="known keys: enabled, grace_seconds, check_seconds, max_bytes_per_second")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{path}: [auditor] key 'enabled' must be true or false, got {enabled!r}")

    def seconds(key: str, default: float, low: float, high: float) -> float:
        value = raw.get(key, default)
        # bool is an int in Python: `grace_seconds = true` must not read as 1 second.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ConfigError(f"{path}: [auditor] key '{key}' must be seconds in {low:g}..{high:g}, got {value!r}")
        return float(value)

    # A grace of 0 would re-replicate on every blip of a ZooKeeper session: refuse it.
    grace = seconds("grace_seconds", 300.0, 0.1, 7 * 24 * 3600)
    check = seconds("check_seconds", 10.0, 0.05, 3600)
    rate = raw.get("max_bytes_per_second", AuditorSettings.max_bytes_per_second)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate >= 0:
        raise ConfigError(f"{path}: [auditor] key 'max_bytes_per_second' must be a number of bytes per second >= 0 (0: no limit), got {rate!r}")
    return AuditorSettings(enabled=enabled, grace_seconds=grace, check_seconds=check, max_bytes_per_second=float(rate))


def _housekeeping_settings(raw: Any, path: Path) -> HousekeepingSettings:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: key 'housekeeping' must be a table ([housekeeping])")
    known = ("enabled", "check_seconds", "disk_override_free_bytes", "delete_concurrency", "delete_rate", "cold_credentials_file", "offload_bytes_per_second")
    extra = sorted(set(raw) - set(known))
    if extra:
        raise ConfigError(f"{path}: unknown key(s) in [housekeeping]: {', '.join(extra)}", hint=f"known keys: {', '.join(known)}")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{path}: [housekeeping] key 'enabled' must be true or false, got {enabled!r}")
    check = raw.get("check_seconds", 60.0)
    if isinstance(check, bool) or not isinstance(check, (int, float)) or not 0.05 <= check <= 86400:
        raise ConfigError(f"{path}: [housekeeping] key 'check_seconds' must be seconds in 0.05..86400, got {check!r}")

    def count(key: str, default: int, low: int) -> int:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{path}: [housekeeping] key '{key}' must be an integer >= {low}, got {value!r}")
        return value

    return HousekeepingSettings(
        enabled=enabled,
        check_seconds=float(check),
        disk_override_free_bytes=count("disk_override_free_bytes", 0, 0),
        delete_concurrency=count("delete_concurrency", 4, 1),
        delete_rate=_rate(raw.get("delete_rate", 50.0), path),
        cold_credentials_file=_optional_path(raw.get("cold_credentials_file", ""), path, "[housekeeping] key 'cold_credentials_file'"),
        offload_bytes_per_second=_offload_rate(raw.get("offload_bytes_per_second", HousekeepingSettings.offload_bytes_per_second), path),
    )


def _offload_rate(value: Any, path: Path) -> int:
    rate = _with_units("parse_size", value) if isinstance(value, str) else value  # with units: "32MiB"
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < 0:
        raise ConfigError(f"{path}: [housekeeping] key 'offload_bytes_per_second' must be bytes per second >= 0 (an integer, or e.g. \"32MiB\"; 0: no limit), got {value!r}")
    return rate


def _optional_path(value: Any, path: Path, what: str) -> Path | None:
    if not isinstance(value, str):
        raise ConfigError(f"{path}: {what} must be a path (a string), got {value!r}")
    if not value:
        return None
    resolved = Path(value).expanduser()
    return resolved if resolved.is_absolute() else path.parent / resolved


SCRUB_RATE_RANGE = (64 * 1024, 1 << 34)  # 64 KiB/s .. 16 GiB/s
SCRUB_INTERVAL_RANGE = (0.05, 366 * 86400.0)


def _scrub_settings(raw: Any, path: Path) -> ScrubSettings:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: key 'scrub' must be a table ([scrub])")
    known = ("enabled", "bytes_per_second", "interval")
    extra = sorted(set(raw) - set(known))
    if extra:
        raise ConfigError(f"{path}: unknown key(s) in [scrub]: {', '.join(extra)}", hint=f"known keys: {', '.join(known)}")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{path}: [scrub] key 'enabled' must be true or false, got {enabled!r}")
    low, high = SCRUB_RATE_RANGE
    rate = raw.get("bytes_per_second", ScrubSettings.bytes_per_second)
    if isinstance(rate, str):  # with units: "4MiB"
        rate = _with_units("parse_size", rate)
    # bool is an int in Python: `bytes_per_second = true` must not read as 1 byte/s.
    if isinstance(rate, bool) or not isinstance(rate, int) or not low <= rate <= high:
        raise ConfigError(
            f"{path}: [scrub] key 'bytes_per_second' must be bytes per second in {low}..{high} (an integer, or e.g. \"4MiB\"), "
            f"got {raw.get('bytes_per_second')!r}",
            hint="to stop scrubbing, set [scrub] enabled = false",
        )
    low, high = SCRUB_INTERVAL_RANGE
    interval = raw.get("interval", ScrubSettings.interval)
    if isinstance(interval, str):  # with units: "7d", "12h"
        interval = _with_units("parse_duration", interval)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not low <= interval <= high:
        raise ConfigError(
            f"{path}: [scrub] key 'interval' must be seconds in {low:g}..{high:.0f} (a number, or e.g. \"7d\", \"12h\"), "
            f"got {raw.get('interval')!r}"
        )
    return ScrubSettings(enabled=enabled, bytes_per_second=rate, interval=float(interval))


def _metrics_settings(raw: Any, path: Path, host: str, port: int) -> MetricsSettings:
    """``[metrics] listen``: by default beside the protocol server (same host, METRICS_PORT), so
    a scraper finds every agent of a fleet at one port; "off" serves nothing."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: key 'metrics' must be a table ([metrics])")
    extra = sorted(set(raw) - {"listen"})
    if extra:
        raise ConfigError(f"{path}: unknown key(s) in [metrics]: {', '.join(extra)}", hint="known keys: listen")
    listen = raw.get("listen", f"{host}:{METRICS_PORT}")
    if listen == "off":
        return MetricsSettings(None)
    usage = 'must be "host:port" (port 0: any free port) or "off"'
    if not isinstance(listen, str):
        raise ConfigError(f"{path}: [metrics] key 'listen' {usage}, got {listen!r}")
    try:
        address = parse_address(listen, where=f"{path}: [metrics] key 'listen'")
    except ConfigError:
        raise ConfigError(f"{path}: [metrics] key 'listen' {usage}, got {listen!r}") from None
    if address == (host, port) and port:
        raise ConfigError(
            f"{path}: [metrics] key 'listen' is {listen!r}, the agent protocol's own address ('listen')",
            hint=f'give the metrics endpoint a port of its own, e.g. "{host}:{METRICS_PORT}"',
        )
    return MetricsSettings(address)


_SERVER_BYTES = ("max_unauthenticated_frame", "max_in_flight_bytes", "max_response_bytes")
_SERVER_SECONDS = ("handshake_timeout", "idle_timeout", "frame_timeout", "max_long_poll")


def _server_limits(raw: Any, path: Path) -> ServerLimits:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: key 'server' must be a table ([server])")
    extra = sorted(set(raw) - set(SERVER_KEYS))
    if extra:
        raise ConfigError(f"{path}: unknown key(s) in [server]: {', '.join(extra)}", hint=f"known keys: {', '.join(SERVER_KEYS)}")
    values = dict(raw)
    for key, value in raw.items():
        if isinstance(value, str) and key in _SERVER_BYTES + _SERVER_SECONDS:  # with units: "16MiB", "30s"
            parsed = _with_units("parse_size" if key in _SERVER_BYTES else "parse_duration", value)
            if parsed is None:
                raise ConfigError(f"{path}: [server] key '{key}' must be a number or a {'size' if key in _SERVER_BYTES else 'duration'} with units, got {value!r}")
            values[key] = parsed
    try:
        return ServerLimits(**values)
    except ValueError as exc:
        raise ConfigError(f"{path}: [server] {exc}", hint="the defaults are safe: remove the key to use its default") from None


def _with_units(parser: str, text: str) -> Any:
    """``text`` read by the operators' parser of that name (``dlctl.units``), None if it can not."""
    try:
        return getattr(units, parser)(text)
    except ValueError:
        return None


def _rate(value: Any, path: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{path}: [housekeeping] key 'delete_rate' must be a number of deletions per second >= 0 (0: no limit), got {value!r}")
    return float(value)


def _proxy_settings(raw: Any, path: Path) -> ProxySettings:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: key 'proxy' must be a table ([proxy])")
    known = {"enabled", "max_log_bytes", "batch_delay_ms", "idle_release_seconds", "producer_id_ttl"}
    extra = sorted(set(raw) - known)
    if extra:
        raise ConfigError(f"{path}: unknown key(s) in [proxy]: {', '.join(extra)}", hint=f"known keys: {', '.join(sorted(known))}")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{path}: [proxy] key 'enabled' must be true or false, got {enabled!r}")
    size = raw.get("max_log_bytes", ProxySettings.max_log_bytes)
    if isinstance(size, bool) or not isinstance(size, int) or not 1024 * 1024 <= size <= 2**40:
        raise ConfigError(f"{path}: [proxy] key 'max_log_bytes' must be an integer of bytes in 1 MiB..1 TiB, got {size!r}")
    delay = raw.get("batch_delay_ms", ProxySettings.batch_delay_ms)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 1000:
        raise ConfigError(f"{path}: [proxy] key 'batch_delay_ms' must be milliseconds in 0..1000, got {delay!r}")
    idle = raw.get("idle_release_seconds", ProxySettings.idle_release_seconds)
    if isinstance(idle, bool) or not isinstance(idle, (int, float)) or not (idle == 0 or 1 <= idle <= 7 * 24 * 3600):
        raise ConfigError(f"{path}: [proxy] key 'idle_release_seconds' must be 0 (never) or seconds in 1..604800, got {idle!r}")
    ttl = raw.get("producer_id_ttl", ProxySettings.producer_id_ttl)
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 1 <= ttl <= 7 * 24 * 3600:
        raise ConfigError(f"{path}: [proxy] key 'producer_id_ttl' must be seconds in 1..604800, got {ttl!r}")
    return ProxySettings(enabled=enabled, max_log_bytes=size, batch_delay_ms=float(delay), idle_release_seconds=float(idle), producer_id_ttl=float(ttl))
