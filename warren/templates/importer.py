"""Copy a rootfs into a node's state dir as a read-only layer.

    state_dir/layers/
        .import.lock              flock held during an import
        <name>-<random>/          one layer: a complete root filesystem, never written to again

Layers are the lowest (read-only) overlayfs directories of sandboxes. A layer on the same
filesystem as its source is a hard-link copy (``trees.copy_tree(hardlink=True)``, as ``cp -al``:
seconds for a Debian rootfs, no extra space); the source must then never be modified in place,
which holds for the template cache because it only ever replaces whole template directories.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Sequence
from pathlib import Path

from warren import trees
from warren.errors import ForbiddenError, HostError, InvalidRequestError, NotFoundError
from warren.templates._fs import exclusive_lock, remove_tree, run
from warren.trees import fsync_dir

LAYERS = "layers"
_TMP_PREFIX = ".tmp-"
COPY_TIMEOUT_S = 1800
"""A multi-gigabyte rootfs on a slow disk takes minutes; half an hour means it is stuck."""

_SLUG_UNSAFE = re.compile(r"[^a-z0-9._-]+")


def import_template(src_rootfs: Path, state_dir: Path, name: str, *, roots: Sequence[Path] | None = None) -> Path:
    """Copy ``src_rootfs`` to a new layer ``state_dir/layers/<layer-id>/`` and return its path.

    ``src_rootfs`` is a root filesystem directory, or a template directory (``template.json`` +
    ``rootfs/``), whose ``rootfs`` is then taken. The layer appears only complete (built under a
    temporary name, then renamed). ``name`` only seeds the layer id, ``<slug(name)>-<random>``.

    With ``roots`` (the API's imports), the source and the rootfs taken from it must resolve to
    directories inside one of them (:func:`check_import_root`); ``None`` is the node's own imports.

    Raises ``ForbiddenError`` for a source outside ``roots``, ``NotFoundError`` for a missing source,
    ``InvalidRequestError`` for one that is not a root filesystem, ``HostError`` when copying fails.
    """
    if roots is not None:
        src_rootfs = check_import_root(src_rootfs, roots)
    source = resolve_rootfs(src_rootfs)
    if roots is not None:
        source = check_import_root(source, roots)
    layers = state_dir / LAYERS
    try:
        layers.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HostError(f"cannot create {layers}: {exc}") from exc
    layer_id = f"{slugify(name)}-{secrets.token_hex(6)}"
    final = layers / layer_id
    tmp = layers / f"{_TMP_PREFIX}{layer_id}"
    with exclusive_lock(layers / ".import.lock"):
        _remove_leftovers(layers)
        try:
            copy_tree(source, tmp)
            run(["sync", "--file-system", tmp], timeout=COPY_TIMEOUT_S)
            os.rename(tmp, final)
            fsync_dir(layers)
        except BaseException as exc:
            with contextlib.suppress(HostError):
                remove_tree(tmp)
            if isinstance(exc, OSError):
                raise HostError(f"cannot import {source} as layer {layer_id}: {exc}") from exc
            raise
    return final


def check_import_root(src: Path, roots: Sequence[Path]) -> Path:
    """``src`` with ``..`` and symlinks resolved, if that is ``roots``' own or below one of them (also resolved).

    Nothing about ``src`` beyond its resolved name is revealed: a missing path outside the roots is
    refused like any other. Raises ``ForbiddenError`` naming the setting that widens the roots.
    """
    real = Path(os.path.realpath(src))
    for root in roots:
        if real.is_relative_to(os.path.realpath(root)):
            return real
    allowed = ":".join(str(r) for r in roots) or "(none)"
    raise ForbiddenError(
        f"{src} is outside the import roots ({allowed}); copy it under one of them, or add its directory "
        "to WARREN_IMPORT_ROOTS (colon-separated) and restart the node"
    )


def resolve_rootfs(src: Path) -> Path:
    """The root filesystem that ``src`` names: itself, or its ``rootfs/`` for a template dir."""
    if not src.is_dir():
        raise NotFoundError(f"{src} is not a directory")
    if (src / "template.json").is_file() and (src / "rootfs").is_dir():
        src = src / "rootfs"
    if not any((src / top).is_dir() or (src / top).is_symlink() for top in ("bin", "usr")):
        raise InvalidRequestError(f"{src} does not look like a root filesystem (no bin/ or usr/)")
    return src.resolve()


def copy_tree(source: Path, dest: Path) -> None:
    """Copy ``source`` to the not yet existing ``dest``: hard links on one filesystem, else a full copy.

    Either way ownership, modes, timestamps, xattrs and symlinks are kept (:func:`warren.trees.copy_tree`:
    iterative, never following a symlink), and a mount below ``source`` is refused. Device nodes other
    than overlayfs whiteouts, and sockets, are not copied.
    """
    if _same_filesystem(source, dest.parent):
        try:
            trees.copy_tree(source, dest, hardlink=True)
            return
        except OSError:
            pass  # e.g. EXDEV through a bind mount, or a full link count: copy instead (dest is gone)
    try:
        trees.copy_tree(source, dest)
    except OSError as exc:
        raise HostError(f"cannot copy {source} to {dest}: {exc}") from exc


def slugify(name: str) -> str:
    """A filesystem-safe, lower-case form of ``name`` for layer ids (``"layer"`` if nothing is left)."""
    slug = _SLUG_UNSAFE.sub("-", name.lower()).strip("-.")[:40].strip("-.")
    return slug or "layer"


def _same_filesystem(a: Path, b: Path) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False


def _remove_leftovers(layers: Path) -> None:
    """Delete what a crashed import left (only called under the import lock)."""
    for path in layers.iterdir():
        if path.name.startswith(_TMP_PREFIX) and path.is_dir():
            remove_tree(path)
