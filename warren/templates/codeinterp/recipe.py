"""The ``code-interpreter-v1`` template as a build of warren's own template builder, on ``base``.

    COPY  warren-ci/ -> /opt/warren-ci/     the server, its kernels, the bootstrap, and wheels/ (fetched on
                                           the host with the host's pip config: :mod:`.wheels`)
    RUN   python3 /opt/warren-ci/ci_bootstrap.py ...   (as root, offline: venv, pip, ipykernel, numpy, ...)
    ENV   MPLBACKEND=module://matplotlib_inline.backend_inline
    start the server on 49999 (its default kernel started), ready when its /health answers 200

The files are uploaded into the node's upload store as the SDK's COPY would be; the request is what a
client would send (``steps.parse_build_request``), so the cache, the log and the seal are the builder's
own. ``RECIPE`` is bumped whenever what the build produces changes (the setup cache then builds again).
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from warren.templates.codeinterp import wheels
from warren.templates.steps import BuildRequest, files_hash_of_tar, parse_build_request

NAME = "code-interpreter-v1"
"""The SDK's default template (``e2b_code_interpreter.constants.DEFAULT_TEMPLATE``)."""
GVISOR_NAME = f"{NAME}-gvisor"
"""The same template on gVisor: sealed as a memory snapshot with its kernel started."""
RECIPE = 1
BASE = "base"
PORT = 49999
CPU_COUNT = 2
MEMORY_MB = 1024
PACKAGES = ("ipykernel", "jupyter_client", "numpy", "pandas", "matplotlib")

DIR = "/opt/warren-ci"
VENV = f"{DIR}/venv"
SANDBOX_FILES = Path(__file__).parent / "sandbox"
FILES = ("ci_bootstrap.py", "ci_kernels.py", "ci_launcher.py", "ci_server.py")
"""What goes into the template (the build bootstrap stays: it is small, and says how the venv was made)."""
COPY_SRC = "warren-ci"

START_CMD = f"{VENV}/bin/python {DIR}/ci_server.py"
READY_CMD = (
    f"{VENV}/bin/python -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:{PORT}/health', timeout=2)\""
)


@dataclass(frozen=True)
class Plan:
    """What a build of the template needs: the tar of its files (on disk), their hash, the build request."""

    files_tar: Path
    files_hash: str
    request: BuildRequest
    wheels: int


def digest() -> str:
    """What the cached layer must have been built from: the recipe, its packages and the sandbox files."""
    hasher = hashlib.sha256(f"{RECIPE} {' '.join(PACKAGES)}".encode())
    for name in FILES:
        hasher.update(name.encode() + b"\0" + (SANDBOX_FILES / name).read_bytes())
    return hasher.hexdigest()


def write_files_tar(dest: Path, wheel_files: list[Path]) -> None:
    """The sandbox files and wheels as the SDK's COPY upload would carry them: ``warren-ci/...``, sorted."""
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in ((COPY_SRC, 0o755), (f"{COPY_SRC}/wheels", 0o755)):
            top = tarfile.TarInfo(name)
            top.type, top.mode = tarfile.DIRTYPE, mode
            tar.addfile(top)
        for name in FILES:
            path = SANDBOX_FILES / name
            info = tarfile.TarInfo(f"{COPY_SRC}/{name}")
            info.size, info.mode = path.stat().st_size, 0o644
            with path.open("rb") as fh:
                tar.addfile(info, fh)
        for path in sorted(wheel_files):
            info = tarfile.TarInfo(f"{COPY_SRC}/wheels/{path.name}")
            info.size, info.mode = path.stat().st_size, 0o644
            with path.open("rb") as fh:
                tar.addfile(info, fh)


def plan(workdir: Path, say: Callable[[str], None]) -> Plan:
    """Download the wheels into ``workdir``, pack the files, and make the build request. Blocking."""
    found = wheels.download(workdir / "wheels", PACKAGES, say)
    tar = workdir / "files.tar"
    write_files_tar(tar, found)
    dest = f"{DIR}/"
    with tar.open("rb") as fh:
        files_hash = files_hash_of_tar(fh, COPY_SRC, dest)
    install = " ".join([f"python3 {DIR}/ci_bootstrap.py", VENV, f"{DIR}/wheels", *PACKAGES])
    body = {
        "fromTemplate": BASE,
        "steps": [
            {"type": "COPY", "args": [COPY_SRC, dest, "root", "0755"], "filesHash": files_hash},
            {"type": "RUN", "args": [f"{install} && rm -rf {DIR}/wheels", "root"]},
            {"type": "ENV", "args": ["MPLBACKEND", "module://matplotlib_inline.backend_inline"]},
        ],
        "startCmd": START_CMD,
        "readyCmd": READY_CMD,
    }
    return Plan(tar, files_hash, parse_build_request(body), len(found))


def variant_request() -> BuildRequest:
    """The gVisor variant: no steps over ``code-interpreter-v1``, the same start and ready commands."""
    return parse_build_request({"fromTemplate": NAME, "steps": [], "startCmd": START_CMD, "readyCmd": READY_CMD})


__all__ = ["GVISOR_NAME", "NAME", "PORT", "RECIPE", "Plan", "plan", "variant_request"]
