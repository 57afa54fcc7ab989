"""Fixtures for CLI tests: a fake server on loopback and an environment that points at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.unit.cli.fake_server import FakeServer, serving
from warren.cli import config

API_KEY = "test-key"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No WARREN_*/E2B_* variables, an empty config home, and no node api-key file to fall back on."""
    for name in (
        "WARREN_URL",
        "WARREN_API_KEY",
        "E2B_API_URL",
        "E2B_API_KEY",
        "E2B_SANDBOX_URL",
        "E2B_DOMAIN",
        "E2B_DEBUG",
        "WARREN_CACHE_DIR",
        "WARREN_RUNSC",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(config, "DEFAULT_STATE_DIR", tmp_path / "no-state")
    return tmp_path


@pytest.fixture
def server(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServer]:
    with serving() as fake:
        monkeypatch.setenv("WARREN_URL", fake.url)
        monkeypatch.setenv("WARREN_API_KEY", API_KEY)
        yield fake


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()
