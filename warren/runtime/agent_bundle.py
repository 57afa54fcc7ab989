"""The guest agent bundle: a self-contained copy of the host CPython plus the guest package.

Every sandbox bind-mounts the bundle read-only at ``/.agent`` and runs :data:`AGENT_ARGV`, so the
agent works on any rootfs, even one without a libc (guest-agent-notes §1, B6)::

    /.agent/bin/python3            patchelf'd: PT_INTERP /.agent/lib/ld-linux-x86-64.so.2, RPATH $ORIGIN/../lib
    /.agent/lib/*.so*              ldd-resolved shared libs + the dynamic loader (RUNPATH $ORIGIN)
    /.agent/lib/python3.X/         stdlib without tests/idle/tkinter/..., precompiled; lib-dynload RUNPATH $ORIGIN/../..
    /.agent/etc/ca-certificates.crt
    /.agent/pkg/warren/guest/      the guest package (pkg/warren/__init__.py is empty)
    /.agent/agent.py               launcher: puts /.agent/pkg on sys.path and calls warren.guest.main.main()

The bundle lives in ``cache_dir/agent-<hash>/``; the hash covers the interpreter (binary, linked libs,
stdlib) and the guest sources. It is built in a temp dir and renamed into place, so concurrent builders
are safe and a present bundle is always complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shutil
import ssl
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from warren.errors import RuntimeFailure
from warren.runtime.base import AGENT_MOUNT, AGENT_PORT
from warren.runtime.oci.command import run_command
from warren.trees import copy_tree, remove_tree, walk

__all__ = ["AGENT_ARGV", "BUNDLE_FORMAT", "agent_environment", "build_agent_bundle"]

BUNDLE_FORMAT = 1
"""Bumped whenever the layout or the build recipe changes, so old cached bundles are not reused."""

AGENT_ARGV = (f"{AGENT_MOUNT}/bin/python3", "-S", "-E", "-B", "-u", f"{AGENT_MOUNT}/agent.py")
"""The agent's command line inside the sandbox."""

LOADER = "ld-linux-x86-64.so.2"

_TOOL_TIMEOUT = 120.0
"""Seconds for one build step (compileall of the stdlib is the slowest, about 10 s on 2 cores)."""

_SKIP_DIRS = {
    "site-packages", "test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "ensurepip",
    "lib2to3", "__pycache__",
}
_SKIP_FILES = (
    "*.pyc", "*.pyo", "*.exe", "_test*.so", "_ctypes_test*.so", "xxlimited*.so", "_xxtestfuzz*.so",
    "_tkinter*.so", "turtle.py",
)

_LAUNCHER = f"""\
import sys
sys.path.insert(0, "{AGENT_MOUNT}/pkg")
from warren.guest.main import main
main()
"""

_INFO_SCRIPT = (
    "import json, sys, sysconfig; "
    "print(json.dumps({'version': '%d.%d' % sys.version_info[:2], 'full': sys.version, "
    "'stdlib': sysconfig.get_paths()['stdlib'], 'dynload': sysconfig.get_config_var('DESTSHARED')}))"
)

_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x")
_LDD_LOADER = re.compile(r"^\s*(/\S*ld-linux[^\s]*)\s+\(0x")


def agent_environment() -> dict[str, str]:
    """Environment every agent gets, before ``SandboxSpec.agent_env`` is applied on top."""
    return {
        "WARREN_AGENT_PORT": str(AGENT_PORT),
        "SSL_CERT_FILE": f"{AGENT_MOUNT}/etc/ca-certificates.crt",
    }


def _default_ca_bundle() -> Path:
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise FileNotFoundError("no CA bundle found on the host")


def _stat_key(path: Path) -> str:
    st = path.stat()
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def _guest_files(guest_src: Path) -> list[Path]:
    """The guest package's source files, in ``os.walk`` order with sorted names (the bundle key hashes them)."""
    files = []
    for visit in walk(guest_src):
        visit.dirs[:] = sorted(d for d in visit.dirs if d != "__pycache__")
        root = Path(guest_src, visit.path)
        files += [root / n for n in sorted(visit.files + visit.other) if not n.endswith((".pyc", ".pyo"))]
    return files


def _bundle_key(python: Path, info: dict[str, str], libs: dict[str, Path], guest_src: Path, ca: Path) -> str:
    h = hashlib.sha256(f"format={BUNDLE_FORMAT}\n{info['full']}\n".encode())
    for item in [python, Path(info["stdlib"]), *sorted(libs.values())]:
        h.update(_stat_key(item).encode() + b"\n")
    h.update(hashlib.sha256(ca.read_bytes()).digest())
    for f in _guest_files(guest_src):
        h.update(str(f.relative_to(guest_src)).encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def _parse_ldd(text: str) -> dict[str, Path]:
    """``{soname: host path}`` for every resolved library in ``ldd`` output, plus the loader."""
    libs: dict[str, Path] = {}
    for line in text.splitlines():
        if m := _LDD_LINE.match(line):
            libs[m.group(1)] = Path(m.group(2))
        elif m := _LDD_LOADER.match(line):
            libs[LOADER] = Path(m.group(1))
    return libs


async def _linked_libs(binaries: Iterable[Path]) -> dict[str, Path]:
    result = await run_command(["ldd", *binaries], timeout=_TOOL_TIMEOUT, check=False)
    if LOADER not in (libs := _parse_ldd(result.stdout_text)):
        raise RuntimeFailure(f"ldd found no {LOADER}: {result.stderr_text[-500:]}")
    return libs


def _copy_stdlib(src: Path, dst: Path) -> None:
    def ignore(name: str) -> bool:
        return name in _SKIP_DIRS or name.startswith("config-") or any(fnmatch.fnmatch(name, p) for p in _SKIP_FILES)

    copy_tree(os.path.realpath(src), dst, ignore=ignore)  # the stdlib path may be a symlink (distros, pyenv)


def _copy_libs(libs: dict[str, Path], dest: Path) -> None:
    for soname, host_path in libs.items():
        shutil.copy2(os.path.realpath(host_path), dest / soname)


def _make_temp_dir(cache_dir: Path, key: str) -> Path:
    cache_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".agent-{key}-", dir=cache_dir))


def _publish(tmp: Path, final: Path) -> None:
    """Rename the finished bundle into place; if a concurrent builder won, keep theirs."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
        with contextlib.suppress(OSError):
            remove_tree(tmp)


def _write_static_parts(tmp: Path, python: Path, info: dict[str, str], libs: dict[str, Path],
                        guest_src: Path, ca: Path) -> list[Path]:
    """Copy everything that needs no external tool; return the ELF files to strip and patch."""
    (tmp / "bin").mkdir()
    (tmp / "lib").mkdir()
    (tmp / "etc").mkdir()
    shutil.copy2(python, tmp / "bin" / "python3")
    stdlib_dst = tmp / "lib" / f"python{info['version']}"
    _copy_stdlib(Path(info["stdlib"]), stdlib_dst)
    _copy_libs(libs, tmp / "lib")
    shutil.copyfile(ca, tmp / "etc" / "ca-certificates.crt")
    pkg = tmp / "pkg" / "warren"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    copy_tree(guest_src, pkg / "guest", ignore=lambda n: n == "__pycache__" or n.endswith(".pyc"))
    (tmp / "agent.py").write_text(_LAUNCHER)
    for visit in walk(tmp):  # symlinks (in `other`) keep their modes
        for names, bits in ((visit.dirs, 0o555), (visit.files, 0o444)):
            for name in names:
                mode = os.stat(name, dir_fd=visit.fd, follow_symlinks=False).st_mode
                os.chmod(name, mode | bits, dir_fd=visit.fd)
    tmp.chmod(0o755)
    return [tmp / "bin" / "python3", *(tmp / "lib" / n for n in libs)]


async def _populate(tmp: Path, python: Path, info: dict[str, str], libs: dict[str, Path],
                    guest_src: Path, ca: Path) -> None:
    await asyncio.to_thread(_write_static_parts, tmp, python, info, libs, guest_src, ca)
    stdlib = tmp / "lib" / f"python{info['version']}"
    dynload = stdlib / "lib-dynload"
    dyn_sos = sorted(dynload.glob("*.so"))
    # Libraries the extension modules need that the interpreter itself does not.
    extra = {k: v for k, v in (await _linked_libs(dyn_sos)).items() if k not in libs}
    await asyncio.to_thread(_copy_libs, extra, tmp / "lib")
    all_libs = sorted(p for p in (tmp / "lib").iterdir() if p.is_file() and ".so" in p.name)
    python_bin = tmp / "bin" / "python3"
    await run_command(["strip", "--strip-debug", python_bin, *all_libs, *dyn_sos], timeout=_TOOL_TIMEOUT)
    await run_command(
        ["patchelf", "--set-interpreter", f"{AGENT_MOUNT}/lib/{LOADER}", "--force-rpath",
         "--set-rpath", "$ORIGIN/../lib", python_bin],
        timeout=_TOOL_TIMEOUT,
    )
    patchable = [p for p in all_libs if p.name != LOADER]
    await run_command(["patchelf", "--set-rpath", "$ORIGIN", *patchable], timeout=_TOOL_TIMEOUT)
    if dyn_sos:
        await run_command(["patchelf", "--set-rpath", "$ORIGIN/../..", *dyn_sos], timeout=_TOOL_TIMEOUT)
    await run_command(
        [python, "-I", "-m", "compileall", "-q", "-j0", "--invalidation-mode", "unchecked-hash",
         "-s", tmp, "-p", AGENT_MOUNT, stdlib, tmp / "pkg"],
        timeout=_TOOL_TIMEOUT,
    )


async def build_agent_bundle(
    cache_dir: Path, guest_src: Path, *, python: Path | None = None, ca_bundle: Path | None = None
) -> Path:
    """Build (or reuse) the agent bundle for ``guest_src`` and return its directory.

    ``python`` defaults to the interpreter running warren (``realpath(sys.executable)``; with pyenv
    ``sys.executable`` may be a shim). ``guest_src`` is the ``warren/guest`` package directory.
    Raises ``RuntimeFailure`` (a ``RuntimeCommandError``) when a build tool fails.
    """
    interpreter = Path(await asyncio.to_thread(os.path.realpath, python or sys.executable))
    ca = ca_bundle or _default_ca_bundle()
    info_out = await run_command([interpreter, "-S", "-E", "-c", _INFO_SCRIPT], timeout=_TOOL_TIMEOUT)
    info: dict[str, str] = json.loads(info_out.stdout)
    libs = await _linked_libs([interpreter])
    key = await asyncio.to_thread(_bundle_key, interpreter, info, libs, guest_src, ca)
    final = cache_dir / f"agent-{key}"
    if await asyncio.to_thread(final.is_dir):
        return final
    try:
        tmp = await asyncio.to_thread(_make_temp_dir, cache_dir, key)
    except OSError as exc:
        raise RuntimeFailure(f"cannot build the agent bundle in {cache_dir}: {exc}") from exc
    try:
        await _populate(tmp, interpreter, info, libs, guest_src, ca)
        await asyncio.to_thread(_publish, tmp, final)
    except OSError as exc:
        with contextlib.suppress(OSError):
            remove_tree(tmp)
        raise RuntimeFailure(f"cannot build the agent bundle in {cache_dir}: {exc}") from exc
    except BaseException:
        with contextlib.suppress(OSError):
            remove_tree(tmp)
        raise
    return final
