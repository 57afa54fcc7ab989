"""Domain mode at the gateway, in-process: sandbox answers of header-mode nodes carry the gateway's domain,
``/health`` names it, and the gateway's CA is its own (``warren gateway CA for D``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from cryptography import x509

from tests.unit.cluster.test_gateway_metrics import KEY, FakeStore, view
from warren.api.models import NO_DOMAIN
from warren.api.tls import TlsConfigError, TlsFiles, tls_files
from warren.cluster.gateway import GatewaySettings, create_gateway_app
from warren.cluster.gateway.routes import Gateway, sandbox_answer
from warren.cluster.gateway.server import startup_message

DOMAIN = "sbx.example:8443"


class NodesAnsweringNoDomain:
    async def forward(self, base_url: str, request: object, body: bytes, *, path: str | None = None) -> httpx.Response:
        return httpx.Response(201, json={"sandboxID": "sbx1", "templateID": "base", "domain": NO_DOMAIN})

    async def call(self, *args: object, **kwargs: object) -> httpx.Response:
        return httpx.Response(404, json={"code": 404, "message": "no"})

    async def aclose(self) -> None:
        pass


async def _gateway(domain: str | None) -> tuple[httpx.AsyncClient, object]:
    settings = GatewaySettings(redis_url="redis://unused", api_key=KEY, domain=domain)
    app, proxy = create_gateway_app(settings, FakeStore([view("a")]), NodesAnsweringNoDomain())  # type: ignore[arg-type]
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", headers={"X-API-Key": KEY})
    return client, proxy


async def test_a_create_answers_the_gateway_domain() -> None:
    client, _ = await _gateway(DOMAIN)
    async with client:
        created = await client.post("/sandboxes", json={"templateID": "base"}, headers={"host": f"api.{DOMAIN}"})
        assert created.status_code == 201, created.text
        assert created.json() == {"sandboxID": "sbx1", "templateID": "base", "domain": DOMAIN}
        assert int(created.headers["content-length"]) == len(created.content)
        health = (await client.get("/health")).json()
        assert health["domain"] == DOMAIN and "tlsCA" not in health


async def test_without_a_domain_the_node_answer_is_passed_as_it_came() -> None:
    client, _ = await _gateway(None)
    async with client:
        created = await client.post("/sandboxes", json={"templateID": "base"})
        assert created.json()["domain"] == NO_DOMAIN
        assert (await client.get("/health")).json()["domain"] is None


def test_every_sandbox_object_of_an_answer_gets_the_domain() -> None:
    gw = Gateway(directory=None, client=None, strategy=None, domain=DOMAIN)  # type: ignore[arg-type]
    fork = [{"sandbox": {"sandboxID": "c1", "domain": NO_DOMAIN}}, {"error": "no room"}]
    out = sandbox_answer(gw, httpx.Response(201, json=fork))
    assert httpx.Response(201, content=out.body).json() == [{"sandbox": {"sandboxID": "c1", "domain": DOMAIN}},
                                                            {"error": "no room"}]  # fmt: skip
    untouched = {"sandboxID": "s", "state": "running"}  # no domain field: none added
    assert sandbox_answer(gw, httpx.Response(200, json=untouched)).body == httpx.Response(200, json=untouched).content
    text = httpx.Response(500, text="oops")
    assert sandbox_answer(gw, text).body == b"oops"


def test_the_gateway_makes_its_own_ca_and_names_it(tmp_path: Path) -> None:
    files = tls_files(tmp_path, DOMAIN, None, None, role="gateway")
    assert files is not None and files.ca == tmp_path / "tls" / "ca.pem"
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    assert ca.subject.rfc4514_string() == "CN=warren gateway CA for sbx.example"
    leaf = x509.load_pem_x509_certificate(files.cert.read_bytes())
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "*.sbx.example" in names.get_values_for_type(x509.DNSName)
    message = startup_message(DOMAIN, files)
    assert f"E2B_DOMAIN={DOMAIN}" in message and f"SSL_CERT_FILE={files.ca}" in message and "--tls-cert" in message
    given = startup_message(DOMAIN, TlsFiles(files.cert, files.key, None))
    assert "SSL_CERT_FILE" not in given
    with pytest.raises(TlsConfigError):
        tls_files(tmp_path, DOMAIN, files.cert, None, role="gateway")
