"""Registry config (docker config.json, mirrors, insecure hosts) and WWW-Authenticate parsing."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from warren.errors import InvalidRequestError
from warren.images.auth import parse_challenges
from warren.images.config import Credentials, RegistryConfig, load_docker_config


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_docker_config_auths(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "auths": {
                    "https://index.docker.io/v1/": {"auth": _b64("hubuser:hub:pass")},
                    "127.0.0.1:5000": {"username": "u", "password": "p"},
                    "ghcr.io": {"identitytoken": "ignored"},
                },
                "credsStore": "desktop",
            }
        )
    )
    creds = load_docker_config(path)
    assert creds == {"docker.io": Credentials("hubuser", "hub:pass"), "127.0.0.1:5000": Credentials("u", "p")}
    config = RegistryConfig().with_docker_config(path)
    assert config.credentials_for("registry-1.docker.io") == Credentials("hubuser", "hub:pass")
    assert config.credentials_for("ghcr.io") is None
    assert "hub:pass" not in repr(config)


def test_explicit_credentials_win_over_docker_config(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"auths": {"docker.io": {"auth": _b64("a:b")}}}))
    config = RegistryConfig(credentials={"index.docker.io": Credentials("c", "d")}).with_docker_config(path)
    assert config.credentials_for("docker.io") == Credentials("c", "d")


def test_docker_config_missing_and_malformed(tmp_path: Path) -> None:
    assert load_docker_config(tmp_path / "nope.json") == {}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidRequestError):
        load_docker_config(bad)
    bad.write_text(json.dumps({"auths": {"x.io": {"auth": _b64("no-colon")}}}))
    with pytest.raises(InvalidRequestError, match="user:password"):
        load_docker_config(bad)


def test_endpoints_mirrors_then_registry() -> None:
    config = RegistryConfig(mirrors={"docker.io": ("https://mirror.example/", "127.0.0.1:6000")})
    eps = config.endpoints("docker.io")
    assert [(e.base_url, e.host, e.mirror) for e in eps] == [
        ("https://mirror.example", "mirror.example", True),
        ("http://127.0.0.1:6000", "127.0.0.1:6000", True),
        ("https://registry-1.docker.io", "docker.io", False),
    ]


@pytest.mark.parametrize(
    ("host", "insecure"),
    [
        ("localhost:5000", True),
        ("127.0.0.1:5000", True),
        ("127.1.2.3", True),
        ("[::1]:5000", True),
        ("registry.internal:5000", True),  # listed below
        ("ghcr.io", False),
        ("10.0.0.1:5000", False),
    ],
)
def test_insecure_hosts(host: str, insecure: bool) -> None:
    config = RegistryConfig(insecure=frozenset({"registry.internal:5000"}))
    assert config.is_insecure(host) is insecure
    assert config.endpoints(host)[-1].base_url.startswith("http://" if insecure else "https://")


def test_config_validation() -> None:
    with pytest.raises(InvalidRequestError):
        RegistryConfig(max_parallel_downloads=0)


def test_parse_bearer_challenge() -> None:
    [c] = parse_challenges(
        ['Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/x:pull"']
    )
    assert c.scheme == "bearer"
    assert c.params == {
        "realm": "https://auth.docker.io/token",
        "service": "registry.docker.io",
        "scope": "repository:library/x:pull",
    }


def test_parse_several_challenges_and_escapes() -> None:
    got = parse_challenges(['Basic realm="Registry \\"Realm\\"", Bearer realm=https://t/x,error=invalid_token', "Foo"])
    assert [(c.scheme, c.params) for c in got] == [
        ("basic", {"realm": 'Registry "Realm"'}),
        ("bearer", {"realm": "https://t/x", "error": "invalid_token"}),
        ("foo", {}),
    ]
