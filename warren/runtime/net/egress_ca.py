"""The node's egress CA: it signs the certificates the egress proxy shows a sandbox for the HTTPS hosts
that have header rules (and only those; every other TLS connection passes through untouched).

The CA (EC P-256) is made once per state dir (``<dir>/ca.pem``, ``<dir>/ca.key`` mode 0600) so that
sandboxes that trusted it keep trusting it across node restarts. Leaf certificates share one key and are
cached per host name.
"""

from __future__ import annotations

import datetime
import os
import ssl
import tempfile
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["EgressCA"]

_LEAF_CACHE = 1024
_CA_NAME = "warren egress CA"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "warren")])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class EgressCA:
    def __init__(self, directory: Path | None) -> None:
        """Load or make the CA in ``directory`` (None: a CA that lives only in this process)."""
        self._dir = directory
        if directory is not None and (directory / "ca.pem").is_file() and (directory / "ca.key").is_file():
            self.cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
            key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{directory / 'ca.key'} is not an EC key")
            self.key = key
        else:
            self.key = ec.generate_private_key(ec.SECP256R1())
            now = datetime.datetime.now(datetime.UTC)
            self.cert = (
                x509.CertificateBuilder()
                .subject_name(_name(_CA_NAME)).issuer_name(_name(_CA_NAME))
                .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=3650))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(self.key, hashes.SHA256())
            )
            if directory is not None:
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                _write(directory / "ca.key", _pem_key(self.key), 0o600)
                _write(directory / "ca.pem", self.pem, 0o644)
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def _leaf(self, host: str) -> bytes:
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(host)).issuer_name(self.cert.subject)
            .public_key(self._leaf_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM) + self.pem

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for ``host`` (HTTP/1.1 only)."""
        ctx = self._contexts.get(host)
        if ctx is not None:
            self._contexts.move_to_end(host)
            return ctx
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        # ssl loads chains from files only: a private temp file, removed at once.
        with tempfile.NamedTemporaryFile("wb", suffix=".pem") as fh:
            fh.write(self._leaf(host) + _pem_key(self._leaf_key))
            fh.flush()
            ctx.load_cert_chain(fh.name)
        self._contexts[host] = ctx
        while len(self._contexts) > _LEAF_CACHE:
            self._contexts.popitem(last=False)
        return ctx


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
