"""Deterministic OCI layers and image configs for tests: tar members, whiteouts, a busybox rootfs.

``make_layer`` turns a list of tar members into a gzipped layer (same members, same digest);
``layer_from_dir`` does the same for a directory tree. Push them with ``tests.framework.registry``.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "OCI_CONFIG",
    "OCI_INDEX",
    "OCI_LAYER_GZIP",
    "OCI_MANIFEST",
    "Layer",
    "Member",
    "busybox_layer",
    "image_config",
    "layer_from_dir",
    "make_layer",
    "member",
    "opaque",
    "sha256",
    "whiteout",
]

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
Member = tuple[tarfile.TarInfo, bytes | None]


@dataclass(frozen=True)
class Layer:
    blob: bytes
    diff_id: str
    media_type: str = OCI_LAYER_GZIP

    @property
    def digest(self) -> str:
        return sha256(self.blob)

    @property
    def size(self) -> int:
        return len(self.blob)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def member(
    name: str,
    data: bytes | None = None,
    *,
    kind: bytes = tarfile.REGTYPE,
    mode: int = 0o644,
    linkname: str = "",
    uid: int = 0,
    gid: int = 0,
    pax: dict[str, str] | None = None,
) -> Member:
    """One tar member: a file with ``data``, or ``kind`` DIRTYPE / SYMTYPE / LNKTYPE / CHRTYPE / FIFOTYPE."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.uid, info.gid, info.mtime = kind, mode, linkname, uid, gid, 1_700_000_000
    if pax:
        info.pax_headers = dict(pax)
    if kind == tarfile.REGTYPE:
        data = data or b""
        info.size = len(data)
    return info, data


def whiteout(path: str) -> Member:
    """The OCI whiteout deleting ``path`` from lower layers."""
    parent, _, name = path.rpartition("/")
    return member(f"{parent}/.wh.{name}" if parent else f".wh.{name}")


def opaque(directory: str) -> Member:
    """The OCI marker hiding the lower layers' content of ``directory``."""
    return member(f"{directory}/.wh..wh..opq")


def make_layer(members: list[Member], *, level: int = 6) -> Layer:
    """A gzipped layer tar of ``members`` in order (reproducible: same members, same digest)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None and info.isreg() else None)
    raw = buf.getvalue()
    return Layer(blob=gzip.compress(raw, compresslevel=level, mtime=0), diff_id=sha256(raw))


def layer_from_dir(root: Path, *, level: int = 6) -> Layer:
    """A reproducible layer of directory ``root`` (sorted; owners and modes kept, mtimes fixed)."""
    members: list[Member] = []
    for path in sorted(root.rglob("*")):
        rel, st = path.relative_to(root).as_posix(), path.lstat()
        mode, uid, gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
        if stat.S_ISLNK(st.st_mode):
            members.append(member(rel, kind=tarfile.SYMTYPE, linkname=os.readlink(path), uid=uid, gid=gid))
        elif stat.S_ISDIR(st.st_mode):
            members.append(member(rel, kind=tarfile.DIRTYPE, mode=mode, uid=uid, gid=gid))
        else:
            members.append(member(rel, path.read_bytes(), mode=mode, uid=uid, gid=gid))
    return make_layer(members, level=level)


@functools.cache
def busybox_layer() -> Layer:
    """A runnable busybox root filesystem (``/bin/busybox`` and its applet links) built as a directory."""
    busybox = Path("/bin/busybox")
    if not busybox.is_file():
        pytest.skip("needs a static busybox (apt install busybox-static)")
    applets = subprocess.run([busybox, "--list-full"], check=True, capture_output=True, text=True).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "tmp", "proc", "sys", "dev"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "tmp").chmod(0o1777)
        shutil.copy2(busybox, root / "bin/busybox")
        for applet in applets:
            if not (root / applet).exists():
                (root / applet).symlink_to("/bin/busybox")
        (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        return layer_from_dir(root)


def image_config(
    layers: tuple[Layer, ...] | list[Layer],
    *,
    arch: str = "amd64",
    env: tuple[str, ...] = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",),
    cmd: tuple[str, ...] = ("/bin/sh",),
    entrypoint: tuple[str, ...] = (),
    workdir: str = "",
    user: str = "",
) -> bytes:
    cfg: dict[str, object] = {"Env": list(env), "Cmd": list(cmd)}
    if entrypoint:
        cfg["Entrypoint"] = list(entrypoint)
    if workdir:
        cfg["WorkingDir"] = workdir
    if user:
        cfg["User"] = user
    doc = {
        "architecture": arch,
        "os": "linux",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
    }
    return json.dumps(doc, sort_keys=True).encode()
