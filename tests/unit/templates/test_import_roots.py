"""Import roots: the setting, its default, and the containment check (resolved paths, no I/O beyond realpath)."""

from __future__ import annotations

from pathlib import Path

import pytest

from warren.config import Settings
from warren.errors import ForbiddenError
from warren.templates.importer import check_import_root


def test_default_is_the_cache_dir(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert settings.allowed_import_roots() == (tmp_path / "cache",)


def test_env_is_colon_separated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARREN_IMPORT_ROOTS", "/srv/a: /srv/b::")
    settings = Settings.from_env(tmp_path)
    assert settings.import_roots == (Path("/srv/a"), Path("/srv/b"))
    assert settings.allowed_import_roots() == (Path("/srv/a"), Path("/srv/b"))


def test_inside_a_root_is_returned_resolved(tmp_path: Path) -> None:
    (tmp_path / "root" / "x").mkdir(parents=True)
    assert check_import_root(tmp_path / "root" / "x" / ".." / "x", [tmp_path / "root"]) == tmp_path / "root" / "x"
    assert check_import_root(tmp_path / "root", [tmp_path / "root"]) == tmp_path / "root"


@pytest.mark.parametrize("path", ["root/../out", "rootx", "link", "/", "root/link-up/x"])
def test_outside_is_forbidden(tmp_path: Path, path: str) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "out")
    (tmp_path / "root" / "link-up").symlink_to(tmp_path / "out")
    with pytest.raises(ForbiddenError, match="WARREN_IMPORT_ROOTS"):
        check_import_root(tmp_path / path, [tmp_path / "root"])


def test_a_symlinked_root_is_resolved_too(tmp_path: Path) -> None:
    (tmp_path / "real" / "x").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert check_import_root(tmp_path / "real" / "x", [tmp_path / "alias"]) == tmp_path / "real" / "x"
