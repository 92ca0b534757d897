"""The cluster CA (dlctl.pki), the operator's TLS directory (dlctl.certdir), TLS file reloading."""

from __future__ import annotations

import datetime
import hashlib
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from dlctl import pki
from dlctl.certdir import CA_KEY, CertDir
from dlctl.errors import ConfigError
from dlctl.log.tls import TlsFiles, bound_context
from dlctl.secrets import write_secret_file


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def test_agent_certificates_serve_both_ends_and_name_their_hosts() -> None:
    ca = pki.new_ca("east")
    agent = pki.issue(ca, "dlagent n1", ["n1", "127.0.0.1", "node1.example"])
    cert = _cert(agent.cert_pem)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert set(pki.describe(agent.cert_pem).names) == {"n1", "127.0.0.1", "node1.example"}
    assert cert.issuer == _cert(ca.cert_pem).subject
    operator = _cert(pki.issue(ca, "operator", server=False).cert_pem)
    assert list(operator.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_a_leaf_never_outlives_its_ca() -> None:
    ca = pki.new_ca("east", days=30)
    leaf = pki.describe(pki.issue(ca, "n1", ["n1"], days=397).cert_pem)
    assert leaf.not_after <= _cert(ca.cert_pem).not_valid_after_utc
    assert 29 < leaf.days_left() <= 30


def test_certificates_verify_against_their_ca_with_ssl(tmp_path: Path) -> None:
    ca = pki.new_ca("east")
    agent = pki.issue(ca, "n1", ["127.0.0.1"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    (tmp_path / "c.pem").write_bytes(agent.cert_pem)
    (tmp_path / "k.pem").write_bytes(agent.key_pem)
    ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")  # the pair matches
    other = pki.issue(ca, "n2", ["127.0.0.2"])
    (tmp_path / "k.pem").write_bytes(other.key_pem)
    with pytest.raises(ssl.SSLError):
        ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")


def test_bundle_and_signer_during_a_ca_rotation() -> None:
    old, new = pki.new_ca("east"), pki.new_ca("east", generation=2)
    both = pki.bundle(old.cert_pem, new.cert_pem, old.cert_pem)
    assert [pki.describe(p).subject for p in pki.split_bundle(both)] == ["CN=dlctl cluster east CA 1", "CN=dlctl cluster east CA 2"]
    assert pki.signer_of(both, new.key_pem) == new.cert_pem
    assert pki.signer_of(both, old.key_pem) == old.cert_pem
    with pytest.raises(ValueError):
        pki.signer_of(old.cert_pem, new.key_pem)


def test_certdir_creates_once_and_keeps(tmp_path: Path) -> None:
    certs = CertDir(tmp_path / "east.tls", "east")
    assert not certs.exists()
    assert certs.ensure() == "created"
    ca_before = certs.bundle()
    assert certs.ensure() == "kept" and certs.bundle() == ca_before
    assert stat.S_IMODE((tmp_path / "east.tls").stat().st_mode) == 0o700
    for f in (tmp_path / "east.tls").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    issued = certs.issue_agent("n1", ["127.0.0.1"])
    assert pki.describe(issued.cert_pem).issuer == pki.describe(ca_before).subject


def test_certdir_without_its_ca_key_says_where_certificates_are_issued(tmp_path: Path) -> None:
    certs = CertDir(tmp_path / "east.tls", "east")
    certs.ensure()
    (tmp_path / "east.tls" / CA_KEY).unlink()
    with pytest.raises(ConfigError, match="does not exist"):
        certs.issue_agent("n1", [])


def _files(root: Path, ca: pki.Issued, issued: pki.Issued) -> TlsFiles:
    root.mkdir(mode=0o700, exist_ok=True)
    for name, data in (("ca.pem", ca.cert_pem), ("cert.pem", issued.cert_pem), ("key.pem", issued.key_pem)):
        write_secret_file(root / name, data)
    return TlsFiles(root / "ca.pem", root / "cert.pem", root / "key.pem")


def test_tls_files_reload_on_change_and_keep_the_old_pair_while_mismatched(tmp_path: Path) -> None:
    ca = pki.new_ca("east")
    first = pki.issue(ca, "n1", ["127.0.0.1"])
    files = _files(tmp_path / "tls", ca, first)
    _, der = files.server()
    assert hashlib.sha256(der).hexdigest() == pki.describe(first.cert_pem).fingerprint
    second = pki.issue(ca, "n1", ["127.0.0.1"])
    write_secret_file(files.key_file, second.key_pem)  # half-way through a rotation
    assert files.server()[1] == der  # the previous, matching pair stays in service
    write_secret_file(files.cert_file, second.cert_pem)
    assert hashlib.sha256(files.server()[1]).hexdigest() == pki.describe(second.cert_pem).fingerprint


def test_tls_files_refuse_a_readable_key_and_missing_files(tmp_path: Path) -> None:
    ca = pki.new_ca("east")
    files = _files(tmp_path / "tls", ca, pki.issue(ca, "n1", []))
    files.key_file.chmod(0o644)
    with pytest.raises(ConfigError, match="accessible by group or others"):
        files.client()
    missing = TlsFiles(tmp_path / "nope.pem", files.cert_file, files.key_file)
    with pytest.raises(ConfigError, match="does not exist"):
        missing.client()


def test_bound_context_depends_on_the_certificate_only_under_tls() -> None:
    assert bound_context(b"c", None) == b"c"
    assert bound_context(b"c", b"x") == bound_context(b"c", b"x")
    assert bound_context(b"c", b"x") not in (b"c", bound_context(b"c", b"y"))


def test_issue_time_tolerates_clock_skew() -> None:
    ca = pki.new_ca("east")
    cert = _cert(pki.issue(ca, "n1", []).cert_pem)
    assert cert.not_valid_before_utc < datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)


def test_an_agent_serves_the_way_cluster_init_recorded(tmp_path: Path) -> None:
    from harness.agenttoml import load

    from dlagent.daemon import _check_tls_mode

    plain = load(tmp_path)
    with_tls = load(tmp_path, '\n[tls]\nca_file = "ca.pem"\ncert_file = "a.pem"\nkey_file = "a.key"\n')
    with pytest.raises(ConfigError, match="runs TLS .* no \\[tls\\] table"):
        _check_tls_mode(plain, {"tls": True})
    with pytest.raises(ConfigError, match="initialised with --no-tls"):
        _check_tls_mode(with_tls, {"tls": False})
    for config, recorded in ((plain, {"tls": False}), (with_tls, {"tls": True}), (plain, {}), (with_tls, {})):
        _check_tls_mode(config, recorded)  # agreeing, or a cluster never `cluster init`ed: served


class _Config:
    """The cluster config znode as ``cluster init`` left it (the session reads only this)."""

    def __init__(self, value: dict) -> None:
        self.value = value

    def cluster_config(self) -> dict:
        return self.value


def _session(tmp_path: Path, recorded: dict, *, files: bool):
    from dlctl.inventory import Cluster
    from dlctl.session import ClusterSession

    cluster = Cluster(name="east", zookeeper="127.0.0.1:1", secret_file=tmp_path / "east.secret", zk_auth_file=None, tls_dir=tmp_path / "east.tls")
    if files:
        CertDir(cluster.tls_dir, "east").ensure()
    session = ClusterSession(cluster)
    session.__dict__["meta"] = _Config(recorded)  # the cached property, without a ZooKeeper
    return session


def test_a_session_uses_tls_as_recorded_and_never_falls_back_to_plaintext(tmp_path: Path) -> None:
    assert _session(tmp_path / "a", {"tls": True}, files=True).tls is not None
    assert _session(tmp_path / "b", {}, files=True).tls is not None  # not init'ed here: the files decide
    assert _session(tmp_path / "c", {"tls": False}, files=True).tls is None  # --no-tls: plaintext, warned
    assert _session(tmp_path / "d", {}, files=False).tls is None
    with pytest.raises(ConfigError, match="runs TLS, but this host has no certificate"):
        _ = _session(tmp_path / "e", {"tls": True}, files=False).tls
