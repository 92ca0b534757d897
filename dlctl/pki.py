"""A cluster's certificate authority: one CA per cluster, a certificate per agent and per operator.

Pure functions over PEM bytes (the ``cryptography`` package); files and uploads are the caller's
(``dlctl.ops.certs``). Keys are ECDSA P-256: small, fast to make and to verify, supported by every
TLS 1.3 stack. An agent's certificate serves both ends (it is a server to clients and a client of
other agents), so it carries both extended key usages; an operator's is a client certificate only.

Names in a certificate are what clients check: an agent's holds ``DNS:<node id>`` and its
advertised host (an IP address or a DNS name), because clients connect to the advertised address
and check the agent's certificate against it (``ssl`` hostname checking).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 397  # at most the CA/Browser Forum's limit: rotation is routine, not an event
_CLOCK_SKEW = datetime.timedelta(minutes=5)  # a certificate valid a little before "now" tolerates skewed clocks


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def new_ca(cluster: str, *, days: int = CA_DAYS, generation: int = 1) -> Issued:
    """A self-signed CA for ``cluster`` (``generation`` tells rotated CAs apart in their names)."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"dlctl cluster {cluster} CA {generation}")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue(ca: Issued, common_name: str, names: list[str] = (), *, server: bool = True, days: int = LEAF_DAYS) -> Issued:  # type: ignore[assignment]
    """A certificate signed by ``ca`` for ``common_name``, valid for ``names`` (hosts or IPs).

    ``server``: usable by an agent (server and client authentication); otherwise a client-only
    certificate (an operator's, a Spark job's)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = _new_key()
    now = _now()
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)  # type: ignore[arg-type]
    )
    sans = list(dict.fromkeys(n for n in names if n))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(n) for n in sans]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


@dataclass(frozen=True)
class CertInfo:
    subject: str
    issuer: str
    not_after: datetime.datetime
    names: tuple[str, ...]
    fingerprint: str  # SHA-256 of the DER, hex

    def days_left(self, now: datetime.datetime | None = None) -> float:
        return (self.not_after - (now or _now())).total_seconds() / 86400

    def to_dict(self) -> dict[str, object]:
        return {
            "subject": self.subject, "issuer": self.issuer, "not_after": self.not_after.isoformat(),
            "days_left": round(self.days_left(), 1), "names": list(self.names), "fingerprint": self.fingerprint,
        }


def describe(cert_pem: bytes) -> CertInfo:
    """The parts of a certificate an operator checks; the first certificate of a bundle."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = tuple(str(n.value) for n in san)
    except x509.ExtensionNotFound:
        names = ()
    return CertInfo(
        subject=cert.subject.rfc4514_string(),
        issuer=cert.issuer.rfc4514_string(),
        not_after=cert.not_valid_after_utc,
        names=names,
        fingerprint=cert.fingerprint(hashes.SHA256()).hex(),
    )


def bundle(*cert_pems: bytes) -> bytes:
    """Several PEM certificates as one trust bundle (each once, in order)."""
    seen: list[bytes] = []
    for pem in cert_pems:
        for cert in x509.load_pem_x509_certificates(pem):
            der = cert.public_bytes(serialization.Encoding.PEM)
            if der not in seen:
                seen.append(der)
    return b"".join(seen)


def split_bundle(pem: bytes) -> list[bytes]:
    """The PEM certificates of a bundle, one by one."""
    return [c.public_bytes(serialization.Encoding.PEM) for c in x509.load_pem_x509_certificates(pem)]


def _spki(public_key: object) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)  # type: ignore[attr-defined]


def signer_of(bundle_pem: bytes, key_pem: bytes) -> bytes:
    """The certificate of ``bundle_pem`` whose public key is ``key_pem``'s: during a CA rotation
    the bundle holds two CAs, and the one the current key belongs to is the one that signs."""
    public = _spki(serialization.load_pem_private_key(key_pem, password=None).public_key())
    for pem in split_bundle(bundle_pem):
        if _spki(x509.load_pem_x509_certificate(pem).public_key()) == public:
            return pem
    raise ValueError("the CA key matches no certificate of the CA bundle")


__all__ = ["CA_DAYS", "LEAF_DAYS", "CertInfo", "Issued", "bundle", "describe", "issue", "new_ca", "signer_of", "split_bundle"]
