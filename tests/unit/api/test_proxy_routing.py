"""Which requests the proxy takes: E2B SDKs before 2.9 send ``E2b-Sandbox-Id`` and ``-Port`` (envd's) on
``POST /sandboxes/{id}/connect``, a control-plane call; E2B's API host ignores them, and so must warren,
which serves both planes on one port. envd has no ``/sandboxes`` or ``/v2/sandboxes`` paths."""

from __future__ import annotations

import pytest

from warren.api.proxy.routing import Target, envd_token_target, target_of

HEADERS = [(b"e2b-sandbox-id", b"iabc"), (b"e2b-sandbox-port", b"49983")]


@pytest.mark.parametrize("path", ["/sandboxes/iabc/connect", "/v2/sandboxes/iabc/connect", "/sandboxes"])
def test_control_plane_paths_with_envd_headers_stay_on_the_control_plane(path: str) -> None:
    assert target_of(HEADERS, None, path) is None


@pytest.mark.parametrize("path", ["/process.Process/Start", "/files", "/health", "/sandboxesx", "/"])
def test_envd_paths_go_to_the_sandbox(path: str) -> None:
    assert target_of(HEADERS, None, path) == Target("iabc", 49983)


def test_other_ports_keep_every_path() -> None:
    headers = [(b"e2b-sandbox-id", b"iabc"), (b"e2b-sandbox-port", b"8000")]
    assert target_of(headers, None, "/sandboxes/x") == Target("iabc", 8000)
    assert target_of([(b"host", b"8000-iabc.example.com")], "example.com", "/sandboxes/x") == Target("iabc", 8000)


def _holder(token: str) -> str | None:
    return "iabc" if token == "tok" else None


@pytest.mark.parametrize("path", ["/process.Process/Start", "/filesystem.Filesystem/Stat", "/files"])
def test_an_envd_call_with_only_its_token_goes_to_the_tokens_sandbox(path: str) -> None:
    assert envd_token_target([(b"x-access-token", b"tok")], path, _holder) == Target("iabc", 49983)


@pytest.mark.parametrize(
    ("headers", "path"),
    [([(b"x-access-token", b"other")], "/files"), ([], "/files"),
     ([(b"x-access-token", b"tok")], "/sandboxes"), ([(b"x-access-token", b"tok")], "/health")],
)
def test_no_token_route_otherwise(headers: list[tuple[bytes, bytes]], path: str) -> None:
    assert envd_token_target(headers, path, _holder) is None
