"""The built code-interpreter layer in the setup cache, so a machine builds it at most once.

    cache_dir/templates/code-interpreter-v1/
        template.json   {name, recipe, base_built_at, index_url, env, workdir, user, built_at, build_s}
        layer/          the layer the build sealed over ``base`` (overlay whiteouts kept, owners 0-based)

A node whose state dir lacks the template copies ``layer/`` in as a layer of its own (hard links when
on one filesystem) and stacks it on its ``base``. An entry is used only if it was built with the current
``RECIPE``, packages and sandbox files (``recipe.digest``) over the ``base`` now in the cache (same
``built_at``); otherwise the node builds again and
replaces it. Written under the templates cache lock, into a temporary directory renamed into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warren.errors import HostError, NotFoundError
from warren.templates._fs import exclusive_lock, remove_tree, write_json_atomic
from warren.templates.builtin import load_template_info, templates_root
from warren.templates.codeinterp.recipe import NAME, RECIPE, digest
from warren.templates.importer import copy_tree, slugify
from warren.trees import fsync_dir

META = "template.json"
LAYER = "layer"


@dataclass(frozen=True)
class CachedLayer:
    """A usable cache entry: its layer directory and the metadata of the template it makes."""

    layer: Path
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    built_at: str = ""
    build_s: float = 0.0


def entry_dir(cache_dir: Path) -> Path:
    return templates_root(cache_dir) / NAME


def base_built_at(cache_dir: Path) -> str | None:
    try:
        return load_template_info(templates_root(cache_dir) / "base").built_at
    except NotFoundError:
        return None


def load(cache_dir: Path) -> CachedLayer | None:
    """The cached layer if it is current (recipe and base match), else None."""
    entry = entry_dir(cache_dir)
    try:
        raw: dict[str, Any] = json.loads((entry / META).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("recipe") != RECIPE or not (entry / LAYER).is_dir():
        return None
    if raw.get("digest") != digest():
        return None
    if raw.get("base_built_at") != base_built_at(cache_dir):
        return None
    env = raw.get("env") if isinstance(raw.get("env"), dict) else {}
    return CachedLayer(
        layer=entry / LAYER,
        env={str(k): str(v) for k, v in dict(env or {}).items()},
        workdir=str(raw["workdir"]) if raw.get("workdir") else None,
        user=str(raw["user"]) if raw.get("user") else None,
        built_at=str(raw.get("built_at") or ""),
        build_s=float(raw.get("build_s") or 0.0),
    )


def store(cache_dir: Path, layer: Path, meta: dict[str, Any]) -> Path:
    """Copy ``layer`` into the cache as the current entry (replacing an older one); returns its dir."""
    root = templates_root(cache_dir)
    final = entry_dir(cache_dir)
    tmp = root / f".tmp-{NAME}-{secrets.token_hex(4)}"
    with exclusive_lock(root / ".lock"):
        try:
            tmp.mkdir(parents=True)
            os.chmod(tmp, 0o755)
            copy_tree(layer, tmp / LAYER)
            write_json_atomic(tmp / META, {**meta, "name": NAME, "recipe": RECIPE, "digest": digest(),
                                           "base_built_at": base_built_at(cache_dir)})  # fmt: skip
            old = None
            if final.exists():
                old = root / f".old-{NAME}-{secrets.token_hex(4)}"
                os.rename(final, old)
            os.rename(tmp, final)
            fsync_dir(root)
            if old is not None:
                remove_tree(old)
        except BaseException as exc:
            with contextlib.suppress(HostError):
                if tmp.exists():
                    remove_tree(tmp)
            if isinstance(exc, OSError):
                raise HostError(f"cannot store the {NAME} layer in {final}: {exc}") from exc
            raise
    return final


def import_layer(cached: CachedLayer, state_dir: Path) -> Path:
    """Copy the cached layer into ``state_dir/layers/`` as a new layer; returns its path."""
    layers = state_dir / "layers"
    name = f"{slugify(NAME)}-{secrets.token_hex(6)}"
    tmp, final = layers / f".tmp-{name}", layers / name
    try:
        layers.mkdir(parents=True, exist_ok=True)
        copy_tree(cached.layer, tmp)
        os.chmod(tmp, 0o755)
        os.rename(tmp, final)
        fsync_dir(layers)
    except BaseException as exc:
        with contextlib.suppress(HostError):
            if tmp.exists():
                remove_tree(tmp)
        if isinstance(exc, OSError):
            raise HostError(f"cannot import the cached {NAME} layer: {exc}") from exc
        raise
    return final


__all__ = ["CachedLayer", "entry_dir", "import_layer", "load", "store"]
