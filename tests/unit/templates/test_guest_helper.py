"""The in-sandbox build helper, run here against a scratch root: accounts, mkdir, COPY semantics."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from warren.templates import guest_helper as helper


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """passwd/group/shadow, home and scratch dirs under ``tmp_path``; the accounts map to our own uid."""
    etc = tmp_path / "etc"
    etc.mkdir()
    uid, gid = os.getuid(), os.getgid()
    (etc / "passwd").write_text(f"root:x:0:0:root:/root:/bin/sh\nuser:x:{uid}:{gid}::/home/user:/bin/sh")
    (etc / "group").write_text(f"root:x:0:\nuser:x:{gid}:\n")
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    for name, value in (("PASSWD", "passwd"), ("GROUP", "group"), ("SHADOW", "shadow")):
        monkeypatch.setattr(helper, name, str(etc / value))
    monkeypatch.setattr(helper, "HOME_ROOT", str(tmp_path / "home"))
    monkeypatch.setattr(helper, "SCRATCH", str(tmp_path / "scratch"))
    return tmp_path


def _tar(path: Path, members: dict[str, bytes | None], *, gzip: bool = True, mode: int = 0o644) -> Path:
    with tarfile.open(path, "w:gz" if gzip else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), mode
                tar.addfile(info, io.BytesIO(data))
    return path


def test_ensure_user_creates_once(root: Path) -> None:
    made = helper.op_ensure_user({"name": "dev"})
    assert made["created"] is True and made["uid"] >= 1000
    passwd = (root / "etc" / "passwd").read_text()
    assert "\ndev:x:" in passwd and passwd.endswith("\n")  # the missing final newline was repaired
    assert "dev:x:" in (root / "etc" / "group").read_text()
    assert (root / "etc" / "shadow").read_text().splitlines()[-1].startswith("dev:!:")
    assert (root / "home" / "dev").is_dir()
    assert helper.op_ensure_user({"name": "dev"})["created"] is False
    assert helper.op_ensure_user({"name": "user"})["created"] is False
    with pytest.raises(helper.Failure):
        helper.op_ensure_user({"name": "bad/name"})


def test_mkdir_gives_created_dirs_to_the_owner(root: Path) -> None:
    target = root / "srv" / "a" / "b"
    assert helper.op_mkdir({"path": str(target), "owner": "user"}) == {"path": str(target)}
    assert target.is_dir() and target.stat().st_uid == os.getuid()
    with pytest.raises(helper.Failure, match="unknown user"):
        helper.op_mkdir({"path": str(root / "x"), "owner": "nobody-here"})


def test_copy_a_file_to_a_path_and_into_a_directory(root: Path) -> None:
    files = {"a.txt": b"A"}
    dest = root / "out" / "renamed.txt"
    tar = _tar(root / "u1.tar", files)
    assert helper.op_copy({"tar": str(tar), "src": "a.txt", "dest": str(dest), "owner": "user", "mode": "0600"})
    assert dest.read_bytes() == b"A" and (dest.stat().st_mode & 0o777) == 0o600
    assert not tar.exists() and not any((root / "scratch").iterdir())  # the upload and unpack dir are gone
    (root / "dir").mkdir()
    tar = _tar(root / "u2.tar", files, gzip=False)
    out = helper.op_copy({"tar": str(tar), "src": "a.txt", "dest": str(root / "dir"), "owner": "user", "mode": ""})
    assert out["target"] == str(root / "dir" / "a.txt") and (root / "dir" / "a.txt").read_bytes() == b"A"
    tar = _tar(root / "u3.tar", files)
    helper.op_copy({"tar": str(tar), "src": "a.txt", "dest": str(root / "new") + "/", "owner": "root", "mode": ""})
    assert (root / "new" / "a.txt").read_bytes() == b"A"


def test_copy_a_directory_merges_its_contents(root: Path) -> None:
    existing = root / "app"
    (existing / "keep").mkdir(parents=True)
    (existing / "keep" / "old.txt").write_text("old")
    tar = _tar(root / "d.tar", {"conf": None, "conf/keep": None, "conf/keep/new.txt": b"new", "conf/top.ini": b"t"})
    helper.op_copy({"tar": str(tar), "src": "conf", "dest": str(existing) + "/", "owner": "user", "mode": ""})
    assert sorted(p.name for p in existing.rglob("*")) == ["keep", "new.txt", "old.txt", "top.ini"]
    tar = _tar(root / "g.tar", {"x.py": b"x", "y.py": b"y"})
    helper.op_copy({"tar": str(tar), "src": "", "dest": str(root / "globbed"), "owner": "user", "mode": "",
                    "glob": True})  # fmt: skip
    assert sorted(p.name for p in (root / "globbed").iterdir()) == ["x.py", "y.py"]


@pytest.mark.parametrize(
    ("name", "kind"), [("../escape", tarfile.REGTYPE), ("a/../../escape", tarfile.REGTYPE), ("dev", tarfile.CHRTYPE)]
)
def test_copy_refuses_unsafe_members(root: Path, name: str, kind: bytes) -> None:
    path = root / "bad.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo(name)
        info.type = kind
        tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    with pytest.raises(tarfile.TarError):
        helper.op_copy({"tar": str(path), "src": "dev", "dest": str(root / "o"), "owner": "root", "mode": ""})
    assert not (root / "escape").exists() and not (root / "scratch" / "escape").exists()
    assert not (root / "o").exists()


def test_copy_keeps_absolute_members_inside(root: Path) -> None:
    tar = _tar(root / "abs.tar", {"/abs.txt": b"in"}, mode=0o664)
    helper.op_copy({"tar": str(tar), "src": "abs.txt", "dest": str(root / "o.txt"), "owner": "root", "mode": ""})
    assert (root / "o.txt").read_bytes() == b"in" and not Path("/abs.txt").exists()
    assert (root / "o.txt").stat().st_mode & 0o777 == 0o664  # modes are kept as uploaded (g+w too)


def test_runs_as_a_script_and_reports_failures(tmp_path: Path) -> None:
    source = Path(helper.__file__).read_text()
    ok = subprocess.run([sys.executable, "-S", "-E", "-c", source, "prepare"], capture_output=True, text=True)
    assert ok.returncode == 0 and set(json.loads(ok.stdout.splitlines()[-1])) == {"bash", "sh"}
    bad = subprocess.run([sys.executable, "-c", source, "copy", json.dumps({"tar": str(tmp_path / "none")})],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 1 and "copy:" in bad.stderr
    assert subprocess.run([sys.executable, "-c", source, "frob"], capture_output=True).returncode == 2
