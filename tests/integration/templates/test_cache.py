"""``ensure_builtin_templates`` with stand-in recipes: atomic, cached, rebuilt on a new recipe, locked."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from warren.errors import HostError, NotFoundError
from warren.templates import builtin
from warren.templates.builtin import BuiltinTemplate, Progress, ensure_builtin_templates, load_template_info


def _recipe(name: str, recipe: int, build: Callable[[Path], None]) -> BuiltinTemplate:
    return BuiltinTemplate(name=name, recipe=recipe, build=build, source=lambda: f"test {name}")


def _writes(marker: str, calls: list[str]) -> Callable[[Path], None]:
    def build(dest: Path) -> None:
        calls.append(marker)
        (dest / "bin").mkdir(parents=True)
        (dest / "bin" / "marker").write_text(marker)

    return build


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "templates").iterdir() if p.name.startswith("."))


def test_builds_once_then_reports_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(builtin, "BUILTIN_TEMPLATES", (_recipe("one", 1, _writes("v1", calls)),))
    seen: list[tuple[str, Progress]] = []
    first = ensure_builtin_templates(tmp_path, on_progress=lambda n, p: seen.append((n, p)))
    second = ensure_builtin_templates(tmp_path, on_progress=lambda n, p: seen.append((n, p)))
    assert first == second == {"one": tmp_path / "templates" / "one"}
    assert calls == ["v1"]
    assert seen == [("one", Progress.BUILDING), ("one", Progress.BUILT), ("one", Progress.CACHED)]
    info = load_template_info(first["one"])
    assert (info.name, info.recipe, info.source, info.user, info.workdir) == (
        "one",
        1,
        "test one",
        "user",
        "/home/user",
    )
    assert (first["one"] / "rootfs/bin/marker").read_text() == "v1"
    assert _leftovers(tmp_path) == [".lock"]


def test_a_new_recipe_replaces_the_cached_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(builtin, "BUILTIN_TEMPLATES", (_recipe("one", 1, _writes("v1", calls)),))
    ensure_builtin_templates(tmp_path)
    monkeypatch.setattr(builtin, "BUILTIN_TEMPLATES", (_recipe("one", 2, _writes("v2", calls)),))
    result = ensure_builtin_templates(tmp_path)
    assert (result["one"] / "rootfs/bin/marker").read_text() == "v2"
    assert load_template_info(result["one"]).recipe == 2
    assert _leftovers(tmp_path) == [".lock"]


def test_a_failed_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(dest: Path) -> None:
        (dest / "half").mkdir(parents=True)
        raise HostError("debootstrap exploded")

    calls: list[str] = []
    monkeypatch.setattr(
        builtin, "BUILTIN_TEMPLATES", (_recipe("good", 1, _writes("g", calls)), _recipe("bad", 1, broken))
    )
    with pytest.raises(HostError, match="exploded"):
        ensure_builtin_templates(tmp_path)
    assert sorted(p.name for p in (tmp_path / "templates").iterdir()) == [".lock", "good"]


def test_leftovers_of_a_crash_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builtin, "BUILTIN_TEMPLATES", (_recipe("one", 1, _writes("v1", [])),))
    (tmp_path / "templates" / ".tmp-one-dead" / "rootfs").mkdir(parents=True)
    (tmp_path / "templates" / ".old-one-dead").mkdir()
    ensure_builtin_templates(tmp_path)
    assert _leftovers(tmp_path) == [".lock"]


def test_names_select_and_unknown_names_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(
        builtin, "BUILTIN_TEMPLATES", (_recipe("a", 1, _writes("a", calls)), _recipe("b", 1, _writes("b", calls)))
    )
    assert list(ensure_builtin_templates(tmp_path, names=["b"])) == ["b"]
    assert calls == ["b"]
    with pytest.raises(NotFoundError):
        ensure_builtin_templates(tmp_path, names=["nope"])


def test_concurrent_callers_build_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    building = threading.Event()
    release = threading.Event()
    calls: list[str] = []

    def slow(dest: Path) -> None:
        building.set()
        assert release.wait(10)
        _writes("v1", calls)(dest)

    monkeypatch.setattr(builtin, "BUILTIN_TEMPLATES", (_recipe("one", 1, slow),))
    results: list[dict[str, Path]] = []
    first = threading.Thread(target=lambda: results.append(ensure_builtin_templates(tmp_path)))
    first.start()
    assert building.wait(10)
    second = threading.Thread(target=lambda: results.append(ensure_builtin_templates(tmp_path)))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # blocked on the cache lock while the first caller builds
    release.set()
    first.join(10)
    second.join(10)
    assert calls == ["v1"]
    assert results[0] == results[1]
