"""Issue 9's smaller hardening items, each against a real node.

Import roots: ``POST /warren/templates/import`` takes only directories under ``WARREN_IMPORT_ROOTS``
(default: the cache dir), after resolving ``..`` and symlinks; anything else is 403.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.framework.node import DEFAULT_CACHE, Node, running_node

BUSYBOX = DEFAULT_CACHE / "templates" / "busybox" / "rootfs"


def _json_error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == status and isinstance(body["message"], str) and body["message"]
    return str(body["message"])


# --- import roots ------------------------------------------------------------------------------


@dataclass
class RootsNode:
    node: Node
    root_a: Path
    root_b: Path
    outside: Path


@pytest.fixture(scope="module")
def roots_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RootsNode]:
    """A node whose import roots are two temp dirs; a busybox rootfs inside and one outside them."""
    if os.geteuid() != 0 or not BUSYBOX.is_dir():
        pytest.skip("needs root and the built-in templates (scripts/setup.sh)")
    base = tmp_path_factory.mktemp("roots")
    root_a, root_b, outside = base / "a", base / "b", base / "outside"
    for d in (root_a, root_b, outside):
        d.mkdir()
    shutil.copytree(BUSYBOX, root_a / "bb", symlinks=True)
    shutil.copytree(BUSYBOX, root_b / "bb", symlinks=True)
    shutil.copytree(BUSYBOX, outside / "bb", symlinks=True)
    env = {"WARREN_IMPORT_ROOTS": f"{root_a}:{root_b}"}
    with running_node(base / "state", extra_env=env) as node:
        yield RootsNode(node, root_a, root_b, outside)


def _import(node: Node, path: Path | str, name: str) -> httpx.Response:
    with node.client() as c:
        return c.post("/warren/templates/import", json={"path": str(path), "name": name})


def test_import_from_each_root_works(roots_node: RootsNode) -> None:
    assert _import(roots_node.node, roots_node.root_a / "bb", "in-a").status_code == 201
    assert _import(roots_node.node, roots_node.root_b / "bb", "in-b").status_code == 201


def test_import_outside_the_roots_is_403_naming_the_setting(roots_node: RootsNode) -> None:
    message = _json_error(_import(roots_node.node, roots_node.outside / "bb", "out"), 403)
    assert "WARREN_IMPORT_ROOTS" in message
    with roots_node.node.client() as c:
        assert c.get("/templates/out").status_code == 404


def test_the_host_root_is_403(roots_node: RootsNode) -> None:
    assert "WARREN_IMPORT_ROOTS" in _json_error(_import(roots_node.node, "/", "host"), 403)


def test_dotdot_escape_is_403(roots_node: RootsNode) -> None:
    path = f"{roots_node.root_a}/../outside/bb"
    _json_error(_import(roots_node.node, path, "dotdot"), 403)
    _json_error(_import(roots_node.node, f"{roots_node.root_a}/../../../../../../", "dotdot2"), 403)


def test_symlink_escape_is_403(roots_node: RootsNode) -> None:
    link = roots_node.root_a / "link"
    link.symlink_to(roots_node.outside / "bb")
    _json_error(_import(roots_node.node, link, "link"), 403)


def test_template_dir_whose_rootfs_points_outside_is_403(roots_node: RootsNode) -> None:
    tpl = roots_node.root_b / "tpl"
    tpl.mkdir()
    (tpl / "template.json").write_text("{}")
    (tpl / "rootfs").symlink_to(roots_node.outside / "bb")
    _json_error(_import(roots_node.node, tpl, "tpl"), 403)


def test_missing_path_outside_the_roots_is_403_not_404(roots_node: RootsNode) -> None:
    """Outside the roots nothing is looked at: the answer does not tell whether a host path exists."""
    _json_error(_import(roots_node.node, "/nonexistent/dir", "gone"), 403)


def test_cache_dir_imports_and_host_root_does_not(node: Node) -> None:
    """The session node (roots: the cache dir and pytest's temp dir): the conftest imported from the
    cache dir; the host's root is refused, also when reached through ``..``."""
    with node.client() as c:
        assert c.get("/templates/base-gvisor").status_code == 200
    assert "WARREN_IMPORT_ROOTS" in _json_error(_import(node, "/", "host-root"), 403)
    _json_error(_import(node, f"{DEFAULT_CACHE}/templates/../../../..", "host-root2"), 403)
