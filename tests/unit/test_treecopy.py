"""``warren.treecopy``: a tree copy in a child process that a cancellation kills, leaving no partial copy."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from warren import treecopy
from warren.errors import HostError


def _tree(root: Path, files: int) -> Path:
    for i in range(files):
        sub = root / f"d{i // 500}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i}").write_bytes(b"x" * 64)
    os.symlink("/etc/passwd", root / "link")
    return root


async def test_copies_a_tree_with_its_links(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", 10)
    await treecopy.copy_tree(src, tmp_path / "dst")
    assert (tmp_path / "dst" / "d0" / "f3").read_bytes() == b"x" * 64
    assert os.readlink(tmp_path / "dst" / "link") == "/etc/passwd"


async def test_a_failed_copy_raises_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(HostError, match="copying"):
        await treecopy.copy_tree(tmp_path / "missing", tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


async def test_an_existing_destination_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dst").mkdir()
    with pytest.raises(HostError, match="exists"):
        await treecopy.copy_tree(_tree(tmp_path / "src", 1), tmp_path / "dst")
    assert (tmp_path / "dst").is_dir()


async def test_cancelling_kills_the_child_and_removes_the_partial_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child is stopped (SIGSTOP) once it has copied something, so the cancellation lands mid-copy
    however fast the disk is; a real kill then has to end it."""
    src = _tree(tmp_path / "src", 20000)
    dst = tmp_path / "dst"
    children: list[asyncio.subprocess.Process] = []
    spawn = asyncio.create_subprocess_exec

    async def spy(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        proc = await spawn(*args, **kwargs)
        children.append(proc)
        return proc

    monkeypatch.setattr(treecopy.asyncio, "create_subprocess_exec", spy)
    task = asyncio.create_task(treecopy.copy_tree(src, dst))
    while not (dst.is_dir() and any(dst.iterdir())):
        assert not task.done(), "the copy finished before it could be interrupted"
        await asyncio.sleep(0.001)
    os.kill(children[0].pid, signal.SIGSTOP)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert children[0].returncode == -signal.SIGKILL
    assert not dst.exists()


def test_main_reports_a_failure_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert treecopy.main([str(tmp_path / "missing"), str(tmp_path / "dst")]) == 1
    assert "missing" in capsys.readouterr().err
    assert treecopy.main([]) == 2
