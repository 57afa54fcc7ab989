"""The agent bundle: layout, patched ELF headers, reuse, concurrent builders, and hashing."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.framework.agent import write_standin_guest
from warren.runtime.agent_bundle import build_agent_bundle

pytestmark = [pytest.mark.skipif(shutil.which("patchelf") is None, reason="needs patchelf")]


def _readelf(path: Path, flag: str) -> str:
    return subprocess.run(["readelf", flag, path], capture_output=True, text=True, check=True).stdout


def test_layout(agent_bundle: Path) -> None:
    b = agent_bundle
    assert b.name.startswith("agent-") and b.stat().st_mode & 0o755 == 0o755
    assert "Requesting program interpreter: /.agent/lib/ld-linux-x86-64.so.2" in _readelf(b / "bin/python3", "-l")
    assert "RPATH" in _readelf(b / "bin/python3", "-d") and "$ORIGIN/../lib" in _readelf(b / "bin/python3", "-d")
    assert (b / "lib/ld-linux-x86-64.so.2").is_file()
    libc = b / "lib/libc.so.6"
    assert "$ORIGIN" in _readelf(libc, "-d")
    stdlib = next((b / "lib").glob("python3.*"))
    ssl_so = next((stdlib / "lib-dynload").glob("_ssl*.so"))
    assert "$ORIGIN/../.." in _readelf(ssl_so, "-d")
    for gone in ("test", "idlelib", "tkinter", "ensurepip", "site-packages", "lib2to3"):
        assert not (stdlib / gone).exists(), gone
    assert not list((stdlib / "lib-dynload").glob("_test*"))
    assert list((stdlib / "asyncio" / "__pycache__").glob("*.pyc"))
    assert (b / "etc/ca-certificates.crt").stat().st_size > 1000
    assert (b / "pkg/warren/__init__.py").read_text() == ""
    assert (b / "pkg/warren/guest/main.py").is_file()
    assert 'from warren.guest.main import main' in (b / "agent.py").read_text()


def test_bundle_runs_on_the_host_through_its_own_loader(agent_bundle: Path) -> None:
    """Imports that need the copied shared libraries work without any host library path."""
    out = subprocess.run(
        [agent_bundle / "lib/ld-linux-x86-64.so.2", agent_bundle / "bin/python3", "-S", "-E", "-c",
         "import sys, ssl, sqlite3, hashlib, zlib, lzma, bz2, ctypes, asyncio; print(sys.prefix)"],
        capture_output=True, text=True, check=True, env={},
    ).stdout
    assert out.strip() == str(agent_bundle)


async def test_reuse_concurrency_and_hash(tmp_path: Path) -> None:
    guest = write_standin_guest(tmp_path / "guest")
    cache = tmp_path / "cache"
    first, second = await asyncio.gather(build_agent_bundle(cache, guest), build_agent_bundle(cache, guest))
    assert first == second
    assert sorted(p.name for p in cache.iterdir()) == [first.name]  # the loser's temp dir is gone
    assert await build_agent_bundle(cache, guest) == first
    (guest / "main.py").write_text((guest / "main.py").read_text() + "\n# changed\n")
    changed = await build_agent_bundle(cache, guest)
    assert changed != first
    assert "# changed" in (changed / "pkg/warren/guest/main.py").read_text()
