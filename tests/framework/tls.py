"""The CA of every domain-mode node of a test session, trusted by the test process from its start; and
``loopback_localhost``, for the domain-mode tests' own Python clients.

A root plugin (tests/conftest.py), not an e2e fixture: the SDK builds its TLS clients once per process
and reads ``SSL_CERT_FILE`` then, so the file (the usual public roots plus this CA) must be in place
before *any* test touches the SDK, the cluster suite's included (it runs first).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import certifi
import pytest

from tests.framework.node import DOMAIN_HOST
from warren.node_tls import ensure_node_certificate

__all__ = ["loopback_localhost", "node_ca"]


@pytest.fixture(scope="session", autouse=True)
def node_ca(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The CA of every domain-mode node of the session, trusted by this process from the start.

    The SDK builds its TLS clients once per process and reads ``SSL_CERT_FILE`` then, as a user's
    program would: so the file (the usual public roots plus this CA) is in place before any test runs.
    """
    ca_dir = tmp_path_factory.mktemp("node-ca")
    files = ensure_node_certificate(ca_dir, DOMAIN_HOST)
    assert files.ca is not None
    bundle = ca_dir / "bundle.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes() + b"\n" + files.ca.read_bytes())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SSL_CERT_FILE", str(bundle))
        yield ca_dir


@pytest.fixture
def loopback_localhost(monkeypatch: pytest.MonkeyPatch) -> None:
    """``*.localhost`` names resolve to 127.0.0.1 for Python clients in this process (test-only)."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".localhost"):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
