"""The two built-in templates and the cache that holds them.

    cache_dir/templates/
        .lock                   flock held while anything below is created or replaced
        busybox/template.json   {name, built_at, source, env, workdir, user, recipe}
        busybox/rootfs/
        base/template.json
        base/rootfs/

A template directory appears only complete: it is built under ``.tmp-<name>-<random>`` next to
its final place and renamed into it. :func:`ensure_builtin_templates` is safe to call from
several processes at once (the second waits on the lock and then finds the work done).

Usage::

    templates = ensure_builtin_templates(settings.cache_dir)       # {"busybox": Path, "base": Path}
    layer = import_template(templates["base"], settings.state_dir, "base")
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from warren.errors import HostError, NotFoundError
from warren.templates._fs import exclusive_lock, remove_tree, write_json_atomic
from warren.templates.busybox import DEFAULT_PATH, USER_HOME, build_busybox_rootfs, find_busybox
from warren.templates.debian import SUITE, build_base_rootfs, host_debian_mirror
from warren.trees import fsync_dir

TEMPLATE_META = "template.json"
ROOTFS = "rootfs"
_TMP_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"


class Progress(enum.StrEnum):
    """What :func:`ensure_builtin_templates` reports per template through ``on_progress``."""

    CACHED = "cached"  # already built with the current recipe; nothing done
    BUILDING = "building"  # a build has started (can take a minute for base)
    BUILT = "built"  # the build finished and the template is in place


@dataclass(frozen=True)
class TemplateInfo:
    """The contents of a template's ``template.json``."""

    name: str
    built_at: str
    """RFC 3339, UTC."""
    source: str
    """Human-readable provenance: the busybox binary, or the debootstrap suite and mirror."""
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = USER_HOME
    user: str = "user"
    recipe: int = 0
    """Version of the build recipe; a cached template with an older one is rebuilt."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "built_at": self.built_at,
            "source": self.source,
            "env": dict(self.env),
            "workdir": self.workdir,
            "user": self.user,
            "recipe": self.recipe,
        }


@dataclass(frozen=True)
class BuiltinTemplate:
    """A recipe for one built-in template."""

    name: str
    recipe: int
    """Bump whenever ``build`` changes what it produces."""
    build: Callable[[Path], None]
    source: Callable[[], str]
    env: Mapping[str, str] = field(default_factory=lambda: {"PATH": DEFAULT_PATH})
    workdir: str = USER_HOME
    user: str = "user"


BUILTIN_TEMPLATES: tuple[BuiltinTemplate, ...] = (
    BuiltinTemplate(
        name="busybox",
        recipe=1,
        build=build_busybox_rootfs,
        source=lambda: f"busybox-static {find_busybox()}",
    ),
    BuiltinTemplate(
        name="base",
        recipe=2,  # 2: sudo for `user`
        build=build_base_rootfs,
        source=lambda: f"debootstrap --variant=minbase {SUITE} {host_debian_mirror()}",
    ),
)


def templates_root(cache_dir: Path) -> Path:
    """Where the built-in templates live in the cache."""
    return cache_dir / "templates"


def ensure_builtin_templates(
    cache_dir: Path,
    *,
    names: Iterable[str] | None = None,
    on_progress: Callable[[str, Progress], None] | None = None,
) -> dict[str, Path]:
    """Build every missing (or outdated) built-in template; return ``{name: template_dir}``.

    ``names`` restricts the work to some templates (default: all). Blocks while another process
    holds the cache lock. Raises ``HostError`` if a build fails; templates built before the
    failure stay in place, and the failed one leaves nothing behind.
    """
    wanted = _select(names)
    root = templates_root(cache_dir)
    report = on_progress or (lambda _name, _status: None)
    result: dict[str, Path] = {}
    with exclusive_lock(root / ".lock"):
        _remove_leftovers(root)
        for template in wanted:
            final = root / template.name
            if _is_current(final, template):
                report(template.name, Progress.CACHED)
            else:
                report(template.name, Progress.BUILDING)
                _build_into(root, template)
                report(template.name, Progress.BUILT)
            result[template.name] = final
    return result


def load_template_info(template_dir: Path) -> TemplateInfo:
    """Read ``template_dir/template.json``. Raises ``NotFoundError`` if it is missing or unreadable."""
    path = template_dir / TEMPLATE_META
    try:
        raw = json.loads(path.read_text())
        return TemplateInfo(
            name=str(raw["name"]),
            built_at=str(raw["built_at"]),
            source=str(raw["source"]),
            env={str(k): str(v) for k, v in dict(raw.get("env") or {}).items()},
            workdir=str(raw.get("workdir") or USER_HOME),
            user=str(raw.get("user") or "user"),
            recipe=int(raw.get("recipe") or 0),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NotFoundError(f"no valid template at {template_dir}: {exc}") from exc


def _select(names: Iterable[str] | None) -> list[BuiltinTemplate]:
    if names is None:
        return list(BUILTIN_TEMPLATES)
    by_name = {t.name: t for t in BUILTIN_TEMPLATES}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise NotFoundError(f"no built-in template named {', '.join(unknown)}; have {', '.join(by_name)}")
    return [by_name[n] for n in names]


def _is_current(template_dir: Path, template: BuiltinTemplate) -> bool:
    if not (template_dir / ROOTFS).is_dir():
        return False
    try:
        info = load_template_info(template_dir)
    except NotFoundError:
        return False
    return info.name == template.name and info.recipe == template.recipe


def _build_into(root: Path, template: BuiltinTemplate) -> None:
    tmp = root / f"{_TMP_PREFIX}{template.name}-{secrets.token_hex(4)}"
    final = root / template.name
    try:
        tmp.mkdir(parents=True)
        os.chmod(tmp, 0o755)
        template.build(tmp / ROOTFS)
        info = TemplateInfo(
            name=template.name,
            built_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            source=template.source(),
            env=template.env,
            workdir=template.workdir,
            user=template.user,
            recipe=template.recipe,
        )
        write_json_atomic(tmp / TEMPLATE_META, info.to_json())
        _replace_dir(tmp, final)
    except BaseException:
        with contextlib.suppress(HostError):
            remove_tree(tmp)
        raise


def _replace_dir(new: Path, final: Path) -> None:
    """Move ``new`` to ``final``; an outdated ``final`` is moved aside first, then deleted."""
    old: Path | None = None
    try:
        if final.exists():
            old = final.with_name(f"{_OLD_PREFIX}{final.name}-{secrets.token_hex(4)}")
            os.rename(final, old)
        os.rename(new, final)
        fsync_dir(final.parent)
    except OSError as exc:
        raise HostError(f"cannot move {new} into place at {final}: {exc}") from exc
    if old is not None:
        remove_tree(old)


def _remove_leftovers(root: Path) -> None:
    """Delete what a crashed build left (only called under the cache lock)."""
    for path in root.iterdir():
        if path.name.startswith((_TMP_PREFIX, _OLD_PREFIX)) and path.is_dir():
            remove_tree(path)
