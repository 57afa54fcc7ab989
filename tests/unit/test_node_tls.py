"""Domain mode's TLS files: the node CA and its wildcard leaf verify for ``<port>-<id>.<domain>`` with
Python's own TLS stack (a real handshake over loopback), are kept across restarts, and are made anew
for another domain; the CA is name-constrained, so it vouches for no other name."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from warren.node_tls import TlsConfigError, domain_host, domain_info, ensure_node_certificate, tls_files


def _handshake(files_cert: Path, files_key: Path, ca: Path, server_name: str) -> None:
    """A TLS handshake to a loopback server serving the leaf, verified against ``ca`` for ``server_name``."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(files_cert, files_key)
    client_ctx = ssl.create_default_context(cafile=str(ca))
    listener = socket.create_server(("127.0.0.1", 0))
    errors: list[BaseException] = []

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (OSError, ssl.SSLError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with socket.create_connection(listener.getsockname()) as raw:
            with client_ctx.wrap_socket(raw, server_hostname=server_name) as tls:
                tls.sendall(b"x")
    finally:
        thread.join(10)
        listener.close()


def test_the_leaf_verifies_for_sandbox_hosts(tmp_path: Path) -> None:
    files = ensure_node_certificate(tmp_path / "tls", "warren.localhost")
    assert files.ca is not None
    for name in ("49983-i8abc.warren.localhost", "8000-x.warren.localhost", "warren.localhost", "localhost"):
        _handshake(files.cert, files.key, files.ca, name)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(files.cert, files.key, files.ca, "8000-x.other.localhost")
    assert (tmp_path / "tls" / "key.pem").stat().st_mode & 0o077 == 0
    assert (tmp_path / "tls" / "ca-key.pem").stat().st_mode & 0o077 == 0


def test_files_are_kept_across_restarts_and_remade_for_another_domain(tmp_path: Path) -> None:
    first = ensure_node_certificate(tmp_path, "a.localhost")
    assert first.ca is not None
    ca, leaf = first.ca.read_bytes(), first.cert.read_bytes()
    again = ensure_node_certificate(tmp_path, "a.localhost")
    assert again.ca is not None and again.ca.read_bytes() == ca and again.cert.read_bytes() == leaf
    other = ensure_node_certificate(tmp_path, "b.localhost")
    assert other.ca is not None and other.ca.read_bytes() != ca
    _handshake(other.cert, other.key, other.ca, "1-x.b.localhost")


def test_options(tmp_path: Path) -> None:
    assert tls_files(tmp_path, None, None, None) is None
    made = tls_files(tmp_path, "w.localhost:8443", None, None)
    assert made is not None and made.ca == tmp_path / "tls" / "ca.pem"
    given = tls_files(tmp_path, "w.localhost", made.cert, made.key)
    assert given is not None and given.ca is None
    with pytest.raises(TlsConfigError, match="go together"):
        tls_files(tmp_path, "w.localhost", made.cert, None)
    with pytest.raises(TlsConfigError, match="does not exist"):
        tls_files(tmp_path, "w.localhost", tmp_path / "nope.pem", made.key)
    assert domain_host("W.Localhost:8443") == "w.localhost" and domain_host("w.localhost") == "w.localhost"
    assert domain_info(None, None)["domain"] is None and "E2B_SANDBOX_URL" in str(domain_info(None, None))
    assert domain_info("w.localhost:8443", made) == {
        "domain": "w.localhost:8443",
        "sandboxUrls": "https://<port>-<sandboxID>.w.localhost:8443",
        "tlsCA": str(made.ca),
    }
