"""What ``init-replication`` delivers to a sink agent for a source, and what the agent makes of it
(``dlctl.ops.source_credentials`` writes, ``dlagent.replication_config.declared_source`` reads).

The delivery itself runs over a real transport in ``tests/integration/test_init_replication_credentials.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from dlctl.certdir import CertDir
from dlctl.errors import ConfigError
from dlctl.inventory import Cluster, Node
from dlctl.meta.zk import ZkTls
from dlctl.ops import source_credentials
from dlctl.secrets import write_secret_file


def source_cluster(tmp_path: Path, *, tls: bool = True, zk_tls: bool = True) -> Cluster:
    write_secret_file(tmp_path / "east.secret", b"east-secret-0123456789abcdef")
    write_secret_file(tmp_path / "east.zk-auth", b"dlctl:east-zk-password")
    certdir = CertDir(tmp_path / "east.tls", "east")
    if tls:
        certdir.ensure()
    zk = None
    if zk_tls:
        for name in ("zk-ca.pem", "zk-client.pem", "zk-client.key"):
            write_secret_file(tmp_path / name, f"contents of {name}".encode())
        zk = ZkTls(tmp_path / "zk-ca.pem", tmp_path / "zk-client.pem", tmp_path / "zk-client.key")
    return Cluster(
        "east", "zk1:2181,zk2:2181/east", tmp_path / "east.secret", tmp_path / "east.zk-auth", tls_dir=certdir.path, zookeeper_tls=zk,
    )


def sink_node(tmp_path: Path) -> Node:
    return Node(
        id="w1", cluster="west", region="r1", rack="k1", host="127.0.0.1", listen="127.0.0.1:4181", ssh_user=None, ssh_port=22, identity_file=None,
        data_dir=str(tmp_path / "w1-data"), python=None, home=str(tmp_path / "w1-home"), transport="local",
    )


def install(tmp_path: Path, source: Cluster, node: Node) -> Path:
    """Write the delivered files where the agent would find them (the transport is beside the point here)."""
    ca = source_credentials._source_ca(source)
    base = Path(source_credentials.source_dir(node, source.name))
    for name, data in source_credentials.bundle_for(source, "west", node, ca):
        write_secret_file(base / name, data)
    return base


def settings_with(home: Path, sources: dict | None = None):
    from dlagent.replication_config import parse_replication

    return parse_replication({"sources": sources or {}}, home / "agent.toml")


def test_installed_credentials_are_what_the_agent_reads_for_the_source(tmp_path: Path):
    from dlagent.replication_config import declared_source

    source = source_cluster(tmp_path)
    node = sink_node(tmp_path)
    base = install(tmp_path, source, node)
    found = declared_source(settings_with(Path(node.home)), "east")
    assert found is not None
    assert found.zookeeper == source.zookeeper
    assert found.secret_file.read_bytes() == b"east-secret-0123456789abcdef"
    assert found.zk_auth_file.read_bytes() == b"dlctl:east-zk-password"
    assert found.zookeeper_tls == ZkTls(base / "zk-tls/ca.pem", base / "zk-tls/client.pem", base / "zk-tls/client.key")
    assert (base / "zk-tls/client.key").read_bytes() == b"contents of zk-client.key"
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in base.rglob("*") if p.is_file())
    # The certificate: issued by the source's CA (checked with the CA's key, not with our code),
    # for client authentication only (a sink agent never serves as the source's agent).
    ca = x509.load_pem_x509_certificate((source.tls_dir / "ca.pem").read_bytes())
    cert = x509.load_pem_x509_certificate(found.tls.cert_file.read_bytes())
    cert.verify_directly_issued_by(ca)
    usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert found.tls.ca_file.read_bytes() == (source.tls_dir / "ca.pem").read_bytes()
    assert b"PRIVATE KEY" in found.tls.key_file.read_bytes()


def test_a_source_without_a_ca_here_or_zookeeper_tls_installs_only_the_secrets(tmp_path: Path):
    from dlagent.replication_config import declared_source

    source = source_cluster(tmp_path, tls=False, zk_tls=False)
    node = sink_node(tmp_path)
    install(tmp_path, source, node)
    found = declared_source(settings_with(Path(node.home)), "east")
    assert found is not None and found.tls is None and found.zookeeper_tls is None
    assert found.secret_file.read_bytes() == b"east-secret-0123456789abcdef"
    step, note = source_credentials.credentials_step(source, Cluster("west", "zk:1/west", None, None, nodes=(node,)))
    assert step is not None and "no CA of east" in note


def test_agent_toml_wins_over_installed_credentials_and_an_undeclared_source_is_none(tmp_path: Path):
    from dlagent.replication_config import declared_source

    source = source_cluster(tmp_path)
    node = sink_node(tmp_path)
    install(tmp_path, source, node)
    home = Path(node.home)
    by_hand = declared_source(settings_with(home, {"east": {"zookeeper": "elsewhere:2181"}}), "east")
    assert by_hand is not None and by_hand.zookeeper == "elsewhere:2181"
    assert declared_source(settings_with(home), "north") is None


@pytest.mark.parametrize("name", ["../east", "east/../../etc", ".hidden", ""])
def test_a_source_name_from_metadata_never_leaves_the_sources_directory(tmp_path: Path, name: str):
    from dlagent.replication_config import declared_source

    with pytest.raises(ConfigError, match="cluster name"):
        declared_source(settings_with(tmp_path), name)


def test_a_malformed_installed_file_is_an_error_naming_it(tmp_path: Path):
    from dlagent.replication_config import declared_source

    target = tmp_path / "sources" / "east" / "source.toml"
    target.parent.mkdir(parents=True)
    for text, message in [('zookeeper = "x', "not valid TOML"), ('zookeeper = "x"\nsecret = "s"\n', "unknown key")]:
        target.write_text(text)
        with pytest.raises(ConfigError, match=message) as caught:
            declared_source(settings_with(tmp_path), "east")
        assert str(target) in caught.value.message


def test_no_step_without_sink_nodes_and_a_refusal_without_the_source_secret(tmp_path: Path):
    source = source_cluster(tmp_path, zk_tls=False)
    step, note = source_credentials.credentials_step(source, Cluster("west", "zk:1/west", None, None))
    assert step is None and "[replication.sources.east]" in note
    sink = Cluster("west", "zk:1/west", None, None, nodes=(sink_node(tmp_path),))
    gone = Cluster("east", source.zookeeper, tmp_path / "missing.secret", None)
    with pytest.raises(ConfigError, match="missing.secret does not exist"):
        source_credentials.credentials_step(gone, sink)
