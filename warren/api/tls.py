"""TLS for domain mode (``warren serve --domain D``, ``warren gateway --domain D``): the SDK reaches
sandboxes at ``https://<port>-<id>.D`` and the API at ``https://api.D``, so the server serves HTTPS
with a certificate for ``D`` and ``*.D``. Shared by the node (``warren.node_tls``) and the gateway.

Either the operator gives one (``--tls-cert``/``--tls-key``: from their own CA, or a public one
for a real wildcard DNS name), or the server makes its own: a CA, name-constrained to ``D``,
``localhost`` and loopback addresses so that trusting it trusts nothing else, and a leaf
certificate it signs. They live in ``<state-dir>/tls/``; clients trust ``ca.pem`` (for the
E2B SDK: ``SSL_CERT_FILE=<state-dir>/tls/ca.pem``). The CA is kept across restarts; the leaf is
made again when it is near its end or names another domain, and both when the domain changed.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_CA_DAYS = 3650
_LEAF_DAYS = 365
_RENEW_BEFORE = datetime.timedelta(days=30)
_LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


class TlsConfigError(ValueError):
    """The operator's TLS options do not make a usable configuration."""


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path | None
    """The CA clients must trust (made by the server); None when the operator gave the certificate."""


def domain_host(domain: str) -> str:
    """The host name of a ``--domain`` value (which may carry ``:port`` when the node is not on 443)."""
    host, sep, port = domain.rpartition(":")
    return host.lower() if sep and port.isdigit() else domain.lower()


def tls_files(
    state_dir: Path, domain: str | None, cert: Path | None, key: Path | None, *, role: str = "node"
) -> TlsFiles | None:
    """What the server serves HTTPS with, or None (no domain and no certificate: plain HTTP). ``role``
    names the server in its CA's name (``warren node CA for D``, ``warren gateway CA for D``)."""
    if (cert is None) != (key is None):
        raise TlsConfigError("--tls-cert and --tls-key go together: give both or neither")
    if cert is not None and key is not None:
        for path in (cert, key):
            if not path.is_file():
                raise TlsConfigError(f"TLS file {path} does not exist")
        return TlsFiles(cert, key, None)
    if domain is None:
        return None
    return ensure_certificate(state_dir / "tls", domain_host(domain), role=role)


def ensure_certificate(directory: Path, host: str, *, role: str = "node") -> TlsFiles:
    """A CA and a leaf for ``host`` and ``*.host`` in ``directory``, made when missing or stale."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = TlsFiles(directory / "cert.pem", directory / "key.pem", directory / "ca.pem")
    ca_key_path = directory / "ca-key.pem"
    assert files.ca is not None
    now = datetime.datetime.now(datetime.UTC)
    ca = _load_ca(files.ca, ca_key_path, host, now)
    if ca is None:
        ca = _make_ca(host, now, role)
        _write(ca_key_path, _key_pem(ca[1]), private=True)
        _write(files.ca, ca[0].public_bytes(serialization.Encoding.PEM))
        files.cert.unlink(missing_ok=True)
    if not _leaf_usable(files.cert, files.key, ca[0], host, now):
        leaf, leaf_key = _make_leaf(ca, host, now)
        _write(files.key, _key_pem(leaf_key), private=True)
        _write(files.cert, leaf.public_bytes(serialization.Encoding.PEM))
    return files


def _load_ca(
    cert_path: Path, key_path: Path, host: str, now: datetime.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or cert.not_valid_after_utc - now < _RENEW_BEFORE:
        return None
    try:
        constraints = cert.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return None
    if x509.DNSName(host) not in (constraints.permitted_subtrees or ()):
        return None  # made for another domain
    return cert, key


def _make_ca(host: str, now: datetime.datetime, role: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"warren {role} CA for {host}")])
    permitted: list[x509.GeneralName] = [
        x509.DNSName(host),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_network("127.0.0.0/8")),
        x509.IPAddress(ipaddress.ip_network("::1/128")),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_CA_KEY_USAGE, critical=True)
        .add_extension(x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _make_leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], host: str, now: datetime.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(host), x509.DNSName(f"*.{host}"), x509.DNSName("localhost")]
    names += [x509.IPAddress(ip) for ip in _LOOPBACK]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"*.{host}")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_LEAF_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _leaf_usable(cert_path: Path, key_path: Path, ca: x509.Certificate, host: str, now: datetime.datetime) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    return (
        cert.issuer == ca.subject
        and cert.not_valid_after_utc - now > _RENEW_BEFORE
        and f"*.{host}" in names.get_values_for_type(x509.DNSName)
        and key.public_key() == cert.public_key()
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    """Written whole under a temporary name, then renamed (a crash leaves the old file or the new one)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
