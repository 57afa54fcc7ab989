"""Sealing a build layer (``warren.templates.seal``) at its runtime seam.

The runtime is ``FakeRuntime`` (runc needs root, namespaces and cgroups); its ``export_filesystem`` copies a
prepared tree with the real ``warren.treecopy`` child process, as the OCI runtime does across filesystems.
The layers, their lock and pins are the real ``Layers`` over a real SQLite database.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.framework.fakes import FakeAgent, FakeRuntime
from warren import treecopy
from warren.errors import HostError
from warren.images import LayerStore
from warren.runtime.base import RuntimeKind, SandboxSpec
from warren.store import TemplateRepo
from warren.store.db import Database
from warren.templates.layers import Layers, Usage
from warren.templates.seal import seal
from warren.templates.uploads import UploadStore

KEY = "k" * 64


@pytest.fixture
async def runtime() -> AsyncIterator[FakeRuntime]:
    rt = FakeRuntime(RuntimeKind.RUNC, FakeAgent())
    await rt.start(SandboxSpec("bldtest", RuntimeKind.RUNC, layers=()))
    yield rt


@pytest.fixture
def layers(tmp_path: Path) -> Layers:
    return Layers(layers_dir=tmp_path / "layers", templates=TemplateRepo(Database(tmp_path / "w.db")),
                  image_store=LayerStore(tmp_path / "images"), uploads=UploadStore(tmp_path / "uploads"),
                  usage=Usage)  # fmt: skip


@pytest.fixture
def shm_upper() -> Iterator[Path]:
    """An upper dir with an opaque dir and a whiteout on another filesystem (/dev/shm): a real cross-device copy."""
    if os.geteuid() != 0:
        pytest.skip("whiteouts and trusted xattrs need root")
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        root = Path(other) / "upper"
        (root / "etc" / "opaque").mkdir(parents=True)
        os.setxattr(root / "etc" / "opaque", "trusted.overlay.opaque", b"y")
        os.mknod(root / "etc" / "gone", stat.S_IFCHR, 0)
        (root / "etc" / "motd").write_text("built")
        yield root


async def test_seal_makes_a_pinned_layer(runtime: FakeRuntime, layers: Layers) -> None:
    pinned: list[str] = []
    layer = await seal(runtime, "bldtest", KEY, layers, pinned)
    assert layer.parent == layers.dir and layer.name.startswith("build-" + KEY[:16])
    assert (layer / "from").read_text() == "bldtest"
    assert stat.S_IMODE(layer.stat().st_mode) == 0o755
    assert pinned == [str(layer)] and layers.pinned() == {str(layer)}
    assert await layers.gc() == []  # pinned: kept


async def test_seal_keeps_whiteouts_and_xattrs_across_filesystems(
    runtime: FakeRuntime, layers: Layers, shm_upper: Path
) -> None:
    runtime.exported = shm_upper
    layer = await seal(runtime, "bldtest", KEY, layers, [])
    assert (layer / "etc" / "motd").read_text() == "built"
    assert os.getxattr(layer / "etc" / "opaque", "trusted.overlay.opaque") == b"y"
    assert stat.S_ISCHR(os.lstat(layer / "etc" / "gone").st_mode)
    assert [p.name for p in layers.dir.iterdir()] == [layer.name]


async def test_a_failed_export_leaves_no_layer_and_no_pin(runtime: FakeRuntime, layers: Layers, tmp_path: Path) -> None:
    runtime.exported = tmp_path / "missing"
    pinned: list[str] = []
    with pytest.raises(HostError):
        await seal(runtime, "bldtest", KEY, layers, pinned)
    assert list(layers.dir.iterdir()) == [] and pinned == [] and layers.pinned() == frozenset()


async def test_cancelling_mid_seal_kills_the_copy_and_leaves_no_partial_layer(
    runtime: FakeRuntime, layers: Layers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy child is stopped (SIGSTOP) once the partial layer has entries, so the cancellation lands
    mid-copy however fast the disk is; only a kill can then end it."""
    src = tmp_path / "upper"
    for i in range(20000):
        sub = src / f"d{i // 500}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i}").write_bytes(b"x" * 64)
    runtime.exported = src
    children: list[asyncio.subprocess.Process] = []
    spawn = asyncio.create_subprocess_exec

    async def spy(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        proc = await spawn(*args, **kwargs)
        children.append(proc)
        return proc

    monkeypatch.setattr(treecopy.asyncio, "create_subprocess_exec", spy)
    pinned: list[str] = []
    task = asyncio.create_task(seal(runtime, "bldtest", KEY, layers, pinned))

    def partial() -> list[Path]:
        return [p for p in layers.dir.iterdir() if any(p.iterdir())] if layers.dir.is_dir() else []

    while not partial():
        assert not task.done(), "the seal finished before it could be interrupted"
        await asyncio.sleep(0.001)
    os.kill(children[0].pid, signal.SIGSTOP)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert children[0].returncode == -signal.SIGKILL
    assert list(layers.dir.iterdir()) == []
    assert pinned == [] and layers.pinned() == frozenset()
    assert not layers.lock.locked()
