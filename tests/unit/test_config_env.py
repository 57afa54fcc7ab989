"""Settings.from_env: integer variables go through warren.ints, so a bad value names its variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from warren.config import Settings


def test_integer_variables_are_parsed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WARREN_WARM_POOL", " 3 ")
    monkeypatch.setenv("WARREN_MAX_SANDBOXES", "0")
    settings = Settings.from_env(tmp_path)
    assert (settings.warm_pool_size, settings.max_sandboxes) == (3, 0)


def test_a_bad_integer_names_its_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WARREN_WARM_POOL", "two")
    with pytest.raises(ValueError, match="WARREN_WARM_POOL must be an integer, got 'two'"):
        Settings.from_env(tmp_path)


def test_the_shared_store_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert Settings.from_env(tmp_path).shared_store is None
    monkeypatch.setenv("WARREN_SHARED_STORE", "file:///mnt/warren-shared")
    assert Settings.from_env(tmp_path).shared_store == "file:///mnt/warren-shared"
    assert Settings.from_env(tmp_path, shared_store="s3://b/p").shared_store == "s3://b/p"


@pytest.mark.parametrize(("raw", "public"), [("0", False), ("off", False), (" False ", False), ("1", True)])
def test_metrics_are_public_unless_switched_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raw: str, public: bool
) -> None:
    assert Settings.from_env(tmp_path).metrics_public is True
    monkeypatch.setenv("WARREN_METRICS_PUBLIC", raw)
    assert Settings.from_env(tmp_path).metrics_public is public
